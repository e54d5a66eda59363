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
than it saves, and any period where the report may use one CPU only (`worth_a_process`).

The worker holds the same lines the report's charges are made from, so it also writes the lines CSV
(`reports.lines_file`, ~5 s of one core for that month) while the report's process writes FOCUS, when
`generate` asks for it (`write_lines`); the file is put in place by the report's process with the
others (`reports.files.WrittenApart`).
"""

from __future__ import annotations

import contextlib
import functools
import os
import pickle
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from gpumeter.billing.ledger import reopen_target
from gpumeter.billing.ledger.base import Ledger
from gpumeter.reports.period import HOUR, Period

if TYPE_CHECKING:
    from gpumeter.reports.lines_file import LinesSpec

# GPU-hours in the period (its last stored hour's times its hours) from which the sums get a
# process: ~140 GPUs over a month, ~4,000 over a day. Below it both reads take a second or two.
SUMS_PROCESS_FROM = 100_000


def worth_a_process(
    ledger: Ledger, period: Period, from_gpu_hours: int = SUMS_PROCESS_FROM, cpus: int | None = None
) -> bool:
    """Whether a SQLite ledger's period holds enough GPU-hours for its sums to be worth a process:
    the GPU-hours of its last stored hour, times its hours (two index look-ups), with a second CPU to
    run it on (``cpus``: default `usable_cpus`, a container's CPU limit included). On one CPU the two
    processes only take turns: the 1,000-GPU report took 18.3-19.1 s so, 13.8-13.9 s in one process,
    and 640 MiB against 390 (docs/performance.md)."""
    from sqlalchemy import func, select
    from sqlalchemy.exc import SQLAlchemyError

    from gpumeter.billing.ledger.orm import GpuHourRow
    from gpumeter.process import usable_cpus

    engine = getattr(ledger, "engine", None)
    if engine is None or engine.dialect.name != "sqlite":
        return False
    if (usable_cpus() if cpus is None else cpus) < 2:
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


@contextlib.contextmanager
def sums_apart(
    ledger: Ledger,
    period: Period,
    grain: str,
    previous: Period | None,
    sums_process: bool | None = None,
    *,
    lines_file: Path | None = None,
) -> Iterator[SumsWorker | None]:
    """A `SumsWorker` for the report of ``period`` (``previous``: the period it compares with, or
    None), closed at the end of the block; None where the lines are summed in the report's process:
    ``sums_process`` False, or None and not `worth_a_process`. ValueError where ``sums_process`` is
    True and no other process can open the ledger."""
    target = reopen_target(ledger)
    if sums_process is None:
        sums_process = target is not None and worth_a_process(ledger, period)
    if not sums_process:
        yield None
        return
    if target is None:
        raise ValueError("sums_process: this ledger cannot be opened by another process")
    with SumsWorker(target, period, grain, previous, lines_file=lines_file) as worker:
        yield worker


class SumsLost(RuntimeError):
    """The sums' process ended without the answer waited for: killed (the system out of memory kills
    with SIGKILL) or dead at start. The report fails: its manifest is not written, nor the file the
    process was making."""

    def __init__(self, pid: int, code: int):
        how = f"exit code {code}"
        if code < 0:
            name = signal.Signals(-code).name
            how += f" ({name}{': out of memory?' if name == 'SIGKILL' else ''})"
        super().__init__(f"the report's line sums (process {pid}) ended without an answer, {how}")


class SumsWorker:
    """The line sums of ``period`` by ``grain``, then those of ``previous`` (or None) as one range,
    summed by a process of its own from the ledger at ``target`` (`reopen_target`'s (URL, schema)),
    each sent back as soon as it is made; `lines` and `previous_lines` wait for them in turn. With
    ``lines_file`` (the folder the report's files go to), the process keeps the period's lines there,
    in a file without a name (the report's process groups them meanwhile: not in memory then, and not
    in a /tmp that a pod may keep small), and writes the report's lines CSV from them when asked
    (`write_lines`).

    The process is this module run by the same interpreter (``python -m``), not a `multiprocessing`
    child, which would import the caller's own ``__main__`` again. It dies with this one
    (`die_with_parent`), and `close` kills it if it is still at work: a report that failed does not
    wait it out."""

    def __init__(
        self,
        target: tuple[str, str | None],
        period: Period,
        grain: str,
        previous: Period | None,
        *,
        lines_file: Path | None = None,
    ) -> None:
        # -P: the working directory not first on the path, where a source checkout's `gpumeter`
        # folder would hide the installed package
        self._process = subprocess.Popen(
            [sys.executable, "-P", "-m", __name__], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        assert self._process.stdin is not None and self._process.stdout is not None
        self._asks: IO[bytes] | None = self._process.stdin
        self._ask((target, period, grain, previous, os.getpid(), lines_file))
        if lines_file is None:  # nothing more to ask
            self._done_asking()
        self._answers = self._process.stdout
        self._received: list[Any] = []
        self._expected = 1 if previous is None else 2

    def _ask(self, request: tuple) -> None:
        assert self._asks is not None
        try:
            self._asks.write(pickle.dumps(request))
            self._asks.flush()
        except BrokenPipeError:  # it stopped: its answers say why (`_answer`)
            pass

    def _done_asking(self) -> None:
        """Close the process's input: it reads its end (the lines CSV not asked for: it exits)."""
        if self._asks is not None:
            with contextlib.suppress(BrokenPipeError):  # it stopped: its answers say why
                self._asks.close()
            self._asks = None

    def _answer(self, index: int) -> Any:
        """The ``index``-th answer; the exception that stopped the worker where it failed."""
        while len(self._received) <= index:
            try:
                answer = pickle.load(self._answers)
            except EOFError:
                raise SumsLost(self._process.pid, self._process.wait()) from None
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

    def write_lines(self, temporary: Path, spec: LinesSpec, clusters: tuple[str, ...]) -> Callable[[], str]:
        """Have the process write the lines CSV (`reports.lines_file`) of the period's lines of
        ``clusters`` (all: none named) into the existing file ``temporary``; returns what waits for it
        to be written and gives its SHA-256. Once only, and only with ``lines_file``."""
        if self._asks is None:
            raise RuntimeError("write_lines: asked of a worker not started with lines_file, or twice")
        self._ask((temporary, spec, clusters))
        self._done_asking()
        index = self._expected
        self._expected += 1
        return functools.partial(self._answer, index)

    def close(self) -> None:
        self._done_asking()
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
    asks = sys.stdin.buffer
    target, period, grain, previous, parent, lines_file = pickle.load(asks)

    from gpumeter.billing.ledger import frames, open_ledger
    from gpumeter.process import die_with_parent, give_back_memory, no_collections

    die_with_parent(parent)
    url, schema = target

    def send(data: bytes) -> None:
        answers.write(data)
        answers.flush()

    with answers, no_collections(), contextlib.ExitStack() as closing:
        try:
            # the lines kept for the lines CSV, in the report's folder, nameless: gone whatever happens
            kept = (
                None if lines_file is None else closing.enter_context(tempfile.TemporaryFile(dir=lines_file))
            )
            ledger = open_ledger(url, schema=schema, migrate=False)
            try:
                lines = pickled(frames.line_frame(ledger, period.start, period.end, grain))
                send(lines)
                if kept is not None:  # for the lines CSV: on disk while the report's process groups
                    kept.write(lines)
                del lines
                # the month's rows and chunks freed (~450 MiB at 10,000 GPUs), handed back before the
                # month before is summed, while the report's own memory peaks
                give_back_memory()
                if previous is not None:
                    send(pickled(frames.line_frame(ledger, previous.start, previous.end, "range")))
            finally:
                ledger.close()
            if kept is not None:
                try:
                    temporary, spec, clusters = pickle.load(asks)
                except EOFError:  # not asked for
                    return
                send(pickled(_write_lines(kept, temporary, spec, clusters)))
        except Exception as exc:  # the report's own process raises it
            send(pickled(exc))


def pickled(answer: Any) -> bytes:
    try:
        return pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # an exception that does not pickle: its text
        return pickle.dumps(RuntimeError(f"the report's line sums failed: {answer}"))


def _write_lines(kept: IO[bytes], temporary: Path, spec: LinesSpec, clusters: tuple[str, ...]) -> str:
    """The lines CSV of the period's line frame ``kept`` (pickled) into ``temporary``; the file's
    SHA-256. Its charges are made as the report's process makes them (`reports.model._build_report`),
    a grain bucket at a time: the charges are sorted bucket first and none spans two buckets, so the
    rows are the same, and what is held beside the report's FOCUS is a bucket's charges, not the
    period's (10,000 GPUs: 842 MiB at this process's peak for the whole month's, beside the report's
    1,459)."""
    from gpumeter.reports import grouped, lines_file
    from gpumeter.reports.files import write_whole

    kept.seek(0)
    lines = grouped.name_clusters(pickle.load(kept), clusters)

    def chunks() -> Iterator[Any]:
        for _, bucket in lines.groupby("bucket", sort=True):
            yield from grouped.Charges(grouped.charges(bucket)).chunks()

    return write_whole(temporary, (part.encode("utf-8") for part in lines_file.parts_of(chunks(), spec)))


if __name__ == "__main__":
    main()
