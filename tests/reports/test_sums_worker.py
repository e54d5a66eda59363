"""The report's line sums in a process of their own (reports/sums_worker.py): the same report as the
sums made in the report's process, their failure told to the report, and no worker left reading after
the report is gone."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest

from gpumeter.billing.ledger import open_ledger, reopen_target
from gpumeter.billing.pricing import load_price_book
from gpumeter.reports.model import ReportError, build_report, month_period
from gpumeter.reports.render import FORMATS, RenderOptions, render
from gpumeter.reports.run import generate
from gpumeter.reports.sums_worker import SumsLost, SumsWorker, sums_apart, worth_a_process
from tests.billing.conftest import PG_DSN, PG_URL
from tests.billing.factories import write_book
from tests.reports import synthetic
from tests.support.pids import alive

NOVEMBER = month_period("2026-11")


def _book(tmp_path: Path):
    return load_price_book(write_book(tmp_path, synthetic.BOOK))


def _day_of_four_gpus(tmp_path: Path):
    """(URL, ledger): a SQLite file holding November's first day of 4 GPUs."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    ledger = open_ledger(url)
    synthetic.fill(ledger, _book(tmp_path), NOVEMBER.start, 1, 4)
    return url, ledger


def _files(report, out: Path) -> dict[str, str]:
    return render(report, out, FORMATS, RenderOptions(generated_at=datetime(2026, 12, 1, tzinfo=UTC)))


@pytest.mark.spawns
def test_a_report_summed_by_its_own_process_is_the_one_summed_in_the_reports(sql_ledger, tmp_path):
    """Every file, FOCUS's splits and origin charges included, byte for byte, on SQLite and PostgreSQL."""
    book = _book(tmp_path)
    synthetic.fill(sql_ledger, book, NOVEMBER.start, 2, 24)
    assert reopen_target(sql_ledger) is not None
    # 24 GPUs in the last hour, over November's 720 hours: 17,280 GPU-hours, so by default summed
    # here; on PostgreSQL whatever the size (its server sums)
    sqlite = sql_ledger.engine.dialect.name == "sqlite"
    assert not worth_a_process(sql_ledger, NOVEMBER, cpus=2)
    assert worth_a_process(sql_ledger, NOVEMBER, from_gpu_hours=17_280, cpus=2) is sqlite
    assert not worth_a_process(sql_ledger, NOVEMBER, from_gpu_hours=17_281, cpus=2)
    assert not worth_a_process(sql_ledger, NOVEMBER, from_gpu_hours=17_280, cpus=1)  # they would take turns
    assert not worth_a_process(
        sql_ledger, month_period("2026-12"), from_gpu_hours=1, cpus=2
    )  # nothing stored
    # October's two days too: the comparison reads the month before, the worker's second answer
    synthetic.fill(sql_ledger, book, NOVEMBER.previous().start, 2, 24)
    here = build_report(sql_ledger, NOVEMBER, sums_process=False)
    apart = build_report(sql_ledger, NOVEMBER, sums_process=True)
    assert apart.total_change.previous and apart.total_change == here.total_change
    assert _files(apart, tmp_path / "process") == _files(here, tmp_path / "here")
    alone = build_report(sql_ledger, NOVEMBER, compare=False, sums_process=True)  # one answer only
    assert alone.total_change.previous is None and alone.total == here.total


def test_generate_told_to_sum_here_starts_no_process_however_large_the_period(tmp_path):
    """`generate(sums_process=False)` sums in the report's process. It used to hand `build_report`
    no worker and let it decide again: a period past `SUMS_PROCESS_FROM` got a worker anyway."""
    ledger = open_ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    synthetic.fill(ledger, _book(tmp_path), NOVEMBER.end - timedelta(days=1), 1, 140)
    assert worth_a_process(ledger, NOVEMBER, cpus=2)  # 140 GPUs in its last hour, times 720 hours
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    generate(ledger, NOVEMBER, "team", ("csv",), tmp_path / "out", record=False, sums_process=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    # a worker costs a second of CPU at least (an interpreter and pandas), reaped by `close`
    assert after.ru_utime + after.ru_stime == children.ru_utime + children.ru_stime
    ledger.close()


@pytest.mark.spawns
@pytest.mark.parametrize("clusters", [(), ("west",)])
def test_the_lines_csv_the_worker_writes_is_the_one_written_here(sql_ledger, tmp_path, clusters):
    """`generate` with the sums apart has the worker write the lines CSV while this process writes
    the rest: every file is the one written here, with a cluster named too (the worker limits the
    lines to it as the report does), and no temporary file is left."""
    book = _book(tmp_path)
    for month in (NOVEMBER.previous(), NOVEMBER):
        synthetic.fill(sql_ledger, book, month.start, 2, 6, clusters=("west", "east"))
    asked: list[tuple] = []

    def files(name: str, sums_process: bool) -> dict[str, str]:
        out = tmp_path / name
        options = RenderOptions(generated_at=datetime(2026, 12, 1, tzinfo=UTC))
        with sums_apart(
            sql_ledger, NOVEMBER, "day", NOVEMBER.previous(), sums_process, lines_file=tmp_path
        ) as worker:
            report = build_report(sql_ledger, NOVEMBER, clusters=clusters, sums=worker)

            def lines_apart(*args):
                asked.append(args)
                assert worker is not None
                return worker.write_lines(*args)

            written = render(report, out, FORMATS, options, lines_apart=lines_apart if worker else None)
        assert not [p.name for p in out.iterdir() if p.name.endswith(".part")]
        return written

    here, apart = files("here", False), files("apart", True)
    assert [args[2] for args in asked] == [clusters]  # the worker was asked, for the report's clusters
    assert apart == here and "gpumeter-2026-11-lines.csv" in here
    lines = (tmp_path / "apart" / "gpumeter-2026-11-lines.csv").read_text()
    assert ('"east"' in lines) is not bool(clusters)
    # through `generate`, which the CLI and the schedule run
    now = datetime(2026, 12, 1, tzinfo=UTC)
    generated = {
        process: generate(
            sql_ledger,
            NOVEMBER,
            "team",
            FORMATS,
            tmp_path / f"generated-{process}",
            now=now,
            record=False,
            clusters=clusters,
            sums_process=process,
        ).files
        for process in (False, True)
    }
    assert generated[True] == generated[False] == here


@pytest.mark.spawns
def test_a_worker_that_dies_writing_the_lines_csv_leaves_no_part_of_it(tmp_path):
    """Killed once asked: the report fails saying so, and neither the lines CSV nor its temporary
    file is in the folder."""
    url, ledger = _day_of_four_gpus(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    with SumsWorker((url, None), NOVEMBER, "day", None, lines_file=out) as worker:
        report = build_report(ledger, NOVEMBER, compare=False, sums=worker)

        def killed(*args):
            written = worker.write_lines(*args)
            worker._process.kill()
            return written

        with pytest.raises(
            SumsLost, match=r"ended without an answer, exit code -9 \(SIGKILL: out of memory\?\)"
        ):
            render(report, out, FORMATS, lines_apart=killed)
    ledger.close()
    assert "gpumeter-2026-11-lines.csv" not in {p.name for p in out.iterdir()}
    assert not [p.name for p in out.iterdir() if p.name.endswith(".part")]


@pytest.mark.spawns
def test_a_worker_never_asked_for_the_lines_csv_ends_on_its_own(tmp_path):
    """A report without the CSV (or one that failed first) closes the worker: it reads the end of its
    asks and exits, not killed."""
    url, ledger = _day_of_four_gpus(tmp_path)
    ledger.close()
    worker = SumsWorker((url, None), NOVEMBER, "day", NOVEMBER.previous(), lines_file=tmp_path)
    assert len(worker.lines()) and worker.previous_lines() is not None
    worker.close()
    assert worker._process.returncode == 0
    with pytest.raises(RuntimeError, match="not started with lines_file, or twice"):
        worker.write_lines(tmp_path / "lines.csv", None, ())  # type: ignore[arg-type]


def test_ledgers_no_other_process_can_open_are_summed_in_the_reports(tmp_path):
    memory, in_memory = open_ledger("memory://"), open_ledger("sqlite://")
    file = open_ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    try:
        assert reopen_target(memory) is None
        assert reopen_target(in_memory) is None
        assert reopen_target(file) == (f"sqlite:///{tmp_path / 'ledger.db'}", None)
        with pytest.raises(ValueError, match="cannot be opened by another process"):
            build_report(memory, NOVEMBER, sums_process=True)
    finally:
        for ledger in (memory, in_memory, file):
            ledger.close()


@pytest.mark.spawns
def test_the_worker_tells_the_report_what_stopped_it(tmp_path):
    garbled = tmp_path / "ledger.db"
    garbled.write_bytes(b"not a database, " * 256)
    with (
        SumsWorker((f"sqlite:///{garbled}", None), NOVEMBER, "day", None) as worker,
        pytest.raises(Exception, match="file is not a database"),
    ):
        worker.lines()


@pytest.mark.spawns
def test_a_report_that_fails_on_the_workers_lines_raises_its_own_error(sql_ledger, tmp_path):
    book = _book(tmp_path)
    synthetic.fill(sql_ledger, book, NOVEMBER.start, 1, 4)
    with pytest.raises(ReportError, match="no line of 2026-11 is in cluster 'nowhere'"):
        build_report(sql_ledger, NOVEMBER, clusters=("nowhere",), sums_process=True)


@contextlib.contextmanager
def _locked(schema: str) -> Iterator[Callable[[], int]]:
    """A transaction holding the schema's line groups locked while the block runs: sums of them wait.
    Yields how many server processes wait on the lock. A killed worker's server process still waits
    (the server learns its client is gone only when it next writes to it): let in, it raced the
    schema's drop at teardown (a deadlock, one run in three), so it is ended before the lock is let go."""
    admin = psycopg.connect(PG_DSN)
    table = f'"{schema}".cost_line_groups'
    admin.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
    waiters = "FROM pg_locks WHERE NOT granted AND relation = %s::regclass"

    def waiting() -> int:
        return admin.execute(f"SELECT count(*) {waiters}", (table,)).fetchone()[0]

    try:
        yield waiting
    finally:
        while admin.execute(f"SELECT count(pg_terminate_backend(pid)) {waiters}", (table,)).fetchone()[0]:
            time.sleep(0.05)  # until none is left waiting
        admin.close()


@pytest.mark.postgres
@pytest.mark.spawns
def test_a_worker_closed_before_its_answers_is_killed(pg_schema, tmp_path):
    """The sums cannot finish while their table is locked: a close that waited for them would hang
    (the test's timeout); the worker is killed instead. (`build_report` closes it whatever happens.)"""
    ledger = open_ledger(PG_URL, schema=pg_schema)
    target = reopen_target(ledger)
    ledger.close()
    assert target == (PG_URL, pg_schema)
    # a ledger not yet connected (opened without migrating) names its schema too
    unconnected = open_ledger(PG_URL, schema=pg_schema, migrate=False)
    try:
        assert reopen_target(unconnected) == (PG_URL, pg_schema)
    finally:
        unconnected.close()
    with _locked(pg_schema) as waiting:
        worker = SumsWorker(target, NOVEMBER, "day", NOVEMBER.previous())
        while not waiting():  # inside its sums, on the lock
            time.sleep(0.05)
        worker.close()
        assert worker._process.returncode == -signal.SIGKILL


PARENT = """
import sys
from gpumeter.reports.model import month_period
from gpumeter.reports.sums_worker import SumsWorker
worker = SumsWorker(({url!r}, {schema!r}), month_period("2026-11"), "day", None)
print(worker._process.pid, flush=True)
sys.stdin.read()  # until killed
"""


@pytest.mark.postgres
@pytest.mark.spawns
def test_a_killed_report_takes_its_worker_with_it(pg_schema, tmp_path):
    """The sums wait on a locked table; their report is killed with SIGKILL, and the worker goes too
    (waited for until it does: the test's timeout bounds it)."""
    ledger = open_ledger(PG_URL, schema=pg_schema)
    ledger.close()
    with _locked(pg_schema) as waiting:
        parent = subprocess.Popen(
            [sys.executable, "-c", PARENT.format(url=PG_URL, schema=pg_schema)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        worker = 0
        try:
            worker = int(parent.stdout.readline())
            while not waiting():  # inside its sums, on the lock
                time.sleep(0.05)
            assert alive(worker)
            parent.send_signal(signal.SIGKILL)
            parent.wait()
            while alive(worker):
                time.sleep(0.05)
        finally:
            parent.kill()
            parent.stdout.close()
            parent.stdin.close()
            if worker and alive(worker):  # the failure case: do not leave it waiting
                os.kill(worker, signal.SIGKILL)


INTERRUPTED = """
import faulthandler, signal
faulthandler.register(signal.SIGUSR1, all_threads=True)  # where it is, should it hang (the test asks)
from gpumeter.billing.ledger import open_ledger
from gpumeter.reports.model import build_report, month_period
ledger = open_ledger({url!r}, schema={schema!r})
try:
    build_report(ledger, month_period("2026-11"), sums_process=True)
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""


def _children(pid: int) -> list[int]:
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as children:
            found += [int(child) for child in children.read().split()]
    return found


@pytest.mark.postgres
@pytest.mark.spawns
def test_ctrl_c_stops_the_report_and_its_worker_quietly(pg_schema):
    """Ctrl-C reaches the terminal's whole process group: the report stops with its own
    KeyboardInterrupt and kills the worker, which says nothing (no second traceback)."""
    ledger = open_ledger(PG_URL, schema=pg_schema)
    ledger.close()
    with _locked(pg_schema) as waiting:  # the worker waits on the lock until it is killed
        report = subprocess.Popen(
            [sys.executable, "-c", INTERRUPTED.format(url=PG_URL, schema=pg_schema)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # a process group of its own, as a terminal gives a command
        )
        worker = 0
        try:
            while not (children := _children(report.pid)):
                time.sleep(0.05)
            worker = children[0]
            while not waiting():  # the worker inside its sums, waiting
                time.sleep(0.05)
            os.killpg(report.pid, signal.SIGINT)
            try:
                # under the suite's own timeout (300 s): only to say where a hang is, which happened once
                # on a VM loaded far past its two cores, and not in the 11 runs after
                out, err = report.communicate(timeout=240)
            except subprocess.TimeoutExpired:
                os.kill(report.pid, signal.SIGUSR1)
                time.sleep(1)
                report.kill()
                out, err = report.communicate()
                pytest.fail(
                    f"the report hung after Ctrl-C; worker alive: {alive(worker)}; its threads:\n{err}"
                )
            assert out == "interrupted\n"
            assert "Traceback" not in err, err
            while alive(worker):
                time.sleep(0.05)
        finally:
            report.kill()
            if worker and alive(worker):
                os.kill(worker, signal.SIGKILL)


IN_A_CHECKOUT = """
from gpumeter.billing.ledger import open_ledger
from gpumeter.reports.model import build_report, month_period
ledger = open_ledger({url!r})
print(build_report(ledger, month_period("2026-11"), sums_process=True).total.cost)
"""


@pytest.mark.spawns
def test_a_gpumeter_folder_in_the_working_directory_does_not_hide_the_installed_package(tmp_path):
    """Run from a source checkout, `python -m` would import the checkout's `gpumeter` folder before
    the installed package: the worker then died at its imports (seen with the wheel installed; an
    editable install's finder comes first, so there this passes either way)."""
    _, ledger = _day_of_four_gpus(tmp_path)
    here = build_report(ledger, NOVEMBER, sums_process=False).total.cost
    ledger.close()
    checkout = tmp_path / "checkout"
    (checkout / "gpumeter").mkdir(parents=True)
    (checkout / "gpumeter" / "__init__.py").write_text("raise ImportError('the checkout, not the package')\n")
    report = subprocess.run(
        [sys.executable, "-P", "-c", IN_A_CHECKOUT.format(url=f"sqlite:///{tmp_path / 'ledger.db'}")],
        cwd=checkout,
        # as a user's shell has it: the tests' own children run with PYTHONSAFEPATH (tests/conftest.py)
        env={name: value for name, value in os.environ.items() if name != "PYTHONSAFEPATH"},
        capture_output=True,
        text=True,
    )
    assert report.returncode == 0, report.stderr
    assert report.stdout == f"{here}\n"
