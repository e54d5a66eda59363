"""The report's line sums in a process of their own (`SumsWorker`), beside the fact scan in the report's.

`build_report` reads the period twice: the database sums the lines (`frames.line_frame`), and the
fact scan reads the GPU-hours (mostly Python: `reports.splits`). As two threads of one process they
ran little faster than one after the other on two cores (the 10,000-GPU month: ~30 and ~33 s alone,
~60 s together). In a process of its own each has a core and an interpreter. The sums go there, not
the scan: their answer is columns (~140 MB for that month, pickled in 0.2 s), where the scan's is
~770 MiB of objects, which both processes would hold at once while it crossed.

Only SQLite sums in the report's own process. PostgreSQL sums in its server's processes, while the
report's thread waits on a socket, so there the two reads ran side by side already (the 1,000-GPU
report: 12.99-13.19 s summed in the report's process, 13.27-13.69 s with the worker). The worker
opens the ledger's database again (`reopen_target`), so SQLite in memory is summed in the report's
process as before, and so is a small period, where starting a process (~1 s of CPU) would cost more
than it saves (`worth_a_process`).
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
from typing import Any

from gpumeter.billing.ledger.base import Ledger
from gpumeter.reports.period import HOUR, Period

# GPU-hours in the period (its last stored hour's times its hours) from which the sums get a
# process: ~140 GPUs over a month, ~4,000 over a day. Below it both reads take a second or two.
SUMS_PROCESS_FROM = 100_000


def worth_a_process(ledger: Ledger, period: Period, from_gpu_hours: int = SUMS_PROCESS_FROM) -> bool:
    """Whether a SQLite ledger's period holds enough GPU-hours for its sums to be worth a process:
    the GPU-hours of its last stored hour, times its hours (two index look-ups)."""
    from sqlalchemy import func, select
    from sqlalchemy.exc import SQLAlchemyError

    from gpumeter.billing.ledger.orm import GpuHourRow

    engine = getattr(ledger, "engine", None)
    if engine is None or engine.dialect.name != "sqlite":
        return False
    hour = GpuHourRow.hour
    try:
        with engine.connect() as connection:
            last = connection.scalar(select(func.max(hour)).where(hour >= period.start, hour < period.end))
            if last is None:
                return False
            gpus = connection.scalar(select(func.count()).select_from(GpuHourRow).where(hour == last))
    except SQLAlchemyError:  # the reads in this process meet the same fault, and say it as a ledger error
        return False
    return (gpus or 0) * ((period.end - period.start) // HOUR) >= from_gpu_hours


class SumsWorker:
    """The line sums of ``period`` by ``grain``, then those of ``previous`` (or None) as one range,
    summed by a process of its own from the ledger at ``target`` (`reopen_target`'s (URL, schema)),
    each sent back as soon as it is made; `lines` and `previous_lines` wait for them in turn.

    The process is this module run by the same interpreter (``python -m``), not a `multiprocessing`
    child, which would import the caller's own ``__main__`` again. It dies with this one
    (`die_with_parent`), and `close` kills it if it is still summing: a report that failed does not
    wait it out."""

    def __init__(
        self, target: tuple[str, str | None], period: Period, grain: str, previous: Period | None
    ) -> None:
        # -P: the working directory not first on the path, where a source checkout's `gpumeter`
        # folder would hide the installed package
        self._process = subprocess.Popen(
            [sys.executable, "-P", "-m", __name__], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        assert self._process.stdin is not None and self._process.stdout is not None
        with self._process.stdin as asked:
            asked.write(pickle.dumps((target, period, grain, previous, os.getpid())))
        self._answers = self._process.stdout
        self._received: list[Any] = []
        self._expected = 1 if previous is None else 2

    def _answer(self, index: int) -> Any:
        """The ``index``-th answer; the exception that stopped the worker where it failed."""
        while len(self._received) <= index:
            try:
                answer = pickle.load(self._answers)
            except EOFError:
                raise RuntimeError(
                    f"the report's line sums (process {self._process.pid}) ended without an answer, "
                    f"exit code {self._process.wait()}"
                ) from None
            if isinstance(answer, BaseException):
                raise answer
            self._received.append(answer)
        return self._received[index]

    def lines(self) -> Any:
        """The period's line frame (`frames.line_frame` by the grain)."""
        return self._answer(0)

    def previous_lines(self) -> Any:
        """The previous period's line frame, one range (`frames.line_frame(…, "range")`)."""
        return self._answer(1)

    def close(self) -> None:
        if len(self._received) < self._expected:
            self._process.kill()
        self._process.wait()
        self._answers.close()

    def __enter__(self) -> SumsWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def main() -> None:
    """The worker: what to sum read from stdin; each frame written to stdout pickled as it is made,
    or the exception that stopped the sums. Anything else printed goes to stderr."""
    # Ctrl-C reaches the terminal's whole process group: the report's process stops and kills this
    # one (`SumsWorker.close`), which has nothing of its own to say about it
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    target, period, grain, previous, parent = pickle.load(sys.stdin.buffer)

    from gpumeter.billing.ledger import frames, open_ledger
    from gpumeter.process import die_with_parent, no_collections

    die_with_parent(parent)
    url, schema = target

    def send(answer: Any) -> None:
        try:
            data = pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:  # an exception that does not pickle: its text
            data = pickle.dumps(RuntimeError(f"the report's line sums failed: {answer}"))
        answers.write(data)
        answers.flush()

    with answers, no_collections():
        try:
            ledger = open_ledger(url, schema=schema, migrate=False)
            try:
                send(frames.line_frame(ledger, period.start, period.end, grain))
                _give_back_memory()
                if previous is not None:
                    send(frames.line_frame(ledger, previous.start, previous.end, "range"))
            finally:
                ledger.close()
        except Exception as exc:  # the report's own process raises it
            send(exc)


def _give_back_memory() -> None:
    """Hand the heap the sums freed back to the system (glibc's malloc_trim): the month's rows and
    chunks, ~450 MiB of the 10,000-GPU month that the process would otherwise hold, beside the report's
    own growth, while it sums the month before."""
    import ctypes

    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)  # not glibc: what was freed stays held
    if trim is not None:
        trim(0)


if __name__ == "__main__":
    main()
