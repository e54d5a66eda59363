"""The report's fact scan in a process of its own (`ScanWorker`), beside the line sums in the report's.

`build_report` reads the period twice: the database sums the lines, and the fact scan reads the
GPU-hours (mostly Python: `reports.splits`). As two threads of one process they ran little faster
than one after the other on two cores (the 10,000-GPU month: 29 s and 36 s alone, ~60 s together).
In a spawned process the scan has a core and an interpreter of its own. It opens the ledger's
database again (`reopen_target`), so a ledger no other process can open (the memory ledger, SQLite
in memory) is scanned in a thread as before, and so is a small period, where starting a process
(~1 s of CPU) would cost more than it saves (`worth_a_process`).
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from typing import Any

from gpumeter.billing.ledger.base import Ledger, SharedUse
from gpumeter.reports.period import HOUR, Period
from gpumeter.reports.splits import FactScan

# GPU-hours in the period (its last stored hour's times its hours) from which the scan gets a
# process: ~140 GPUs over a month, ~4,000 over a day. Below it the scan takes a second or two.
SCAN_PROCESS_FROM = 100_000


def worth_a_process(ledger: Ledger, period: Period, from_gpu_hours: int = SCAN_PROCESS_FROM) -> bool:
    """Whether a SQL ledger's period holds enough GPU-hours for the scan to be worth a process of
    its own: the GPU-hours of its last stored hour, times its hours (two index look-ups)."""
    from sqlalchemy import func, select
    from sqlalchemy.exc import SQLAlchemyError

    from gpumeter.billing.ledger.orm import GpuHourRow

    engine = getattr(ledger, "engine", None)
    if engine is None:
        return False
    hour = GpuHourRow.hour
    try:
        with engine.connect() as connection:
            last = connection.scalar(select(func.max(hour)).where(hour >= period.start, hour < period.end))
            if last is None:
                return False
            gpus = connection.scalar(select(func.count()).select_from(GpuHourRow).where(hour == last))
    except SQLAlchemyError:  # the scan in a thread meets the same fault, and says it as a ledger error
        return False
    return (gpus or 0) * ((period.end - period.start) // HOUR) >= from_gpu_hours


class ScanWorker:
    """The fact scan of ``period`` and the shared GPUs' use, read by a process of its own from the
    ledger at ``target`` (`reopen_target`'s (URL, schema)); `result` waits for them. The process is
    this module run by the same interpreter (``python -m``), not a `multiprocessing` child, which
    would import the caller's own ``__main__`` again. It dies with this one (`die_with_parent`), and
    `close` kills it if it is still reading: a report that failed does not wait out its scan."""

    def __init__(self, target: tuple[str, str | None], period: Period, grain: str) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-m", __name__], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        assert self._process.stdin is not None and self._process.stdout is not None
        with self._process.stdin as asked:
            asked.write(pickle.dumps((target, period, grain, os.getpid())))
        self._answer = self._process.stdout
        self._result: tuple[FactScan, list[SharedUse]] | None = None

    def result(self) -> tuple[FactScan, list[SharedUse]]:
        """The scan and the shared use; the scan's own exception where it failed."""
        if self._result is None:
            data = self._answer.read()
            if not data:
                raise RuntimeError(
                    f"the report's fact scan (process {self._process.pid}) ended without an answer, "
                    f"exit code {self._process.wait()}"
                )
            answer = pickle.loads(data)
            if isinstance(answer, BaseException):
                raise answer
            self._result = answer
        return self._result

    def facts(self) -> FactScan:
        return self.result()[0]

    def shared(self) -> list[SharedUse]:
        return self.result()[1]

    def close(self) -> None:
        if self._result is None:
            self._process.kill()
        self._process.wait()
        self._answer.close()

    def __enter__(self) -> ScanWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def main() -> None:
    """The worker: what to scan read from stdin; the scan and the shared use written to stdout
    pickled, or the exception that stopped them. Anything else printed goes to stderr."""
    answer_to = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    target, period, grain, parent = pickle.load(sys.stdin.buffer)

    from gpumeter.billing.ledger import open_ledger
    from gpumeter.process import die_with_parent, no_collections
    from gpumeter.reports.splits import scan_facts

    die_with_parent(parent)
    url, schema = target
    try:
        ledger = open_ledger(url, schema=schema, migrate=False)
        try:
            with no_collections():
                answer: Any = (
                    scan_facts(ledger, period, grain, splits=True),
                    ledger.shared_use(period.start, period.end),
                )
        finally:
            ledger.close()
    except Exception as exc:  # the report's own process raises it
        answer = exc
    try:
        data = pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # an exception that does not pickle: its text
        data = pickle.dumps(RuntimeError(f"the report's fact scan failed: {answer}"))
    with answer_to:
        answer_to.write(data)


if __name__ == "__main__":
    main()
