"""The report's fact scan in a process of its own (reports/scan_worker.py): the same report as the scan
in a thread, its failure told to the report, and no scan left reading after the report is gone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest

from gpumeter.billing.ledger import open_ledger, reopen_target
from gpumeter.billing.pricing import load_price_book
from gpumeter.reports.model import ReportError, build_report, month_period
from gpumeter.reports.render import FORMATS, RenderOptions, render
from gpumeter.reports.scan_worker import ScanWorker, worth_a_process
from tests.billing.conftest import PG_DSN, PG_URL
from tests.billing.factories import write_book
from tests.reports import synthetic

NOVEMBER = month_period("2026-11")


def _files(report, out: Path) -> dict[str, str]:
    return render(report, out, FORMATS, RenderOptions(generated_at=datetime(2026, 12, 1, tzinfo=UTC)))


@pytest.mark.spawns
def test_a_report_scanned_by_its_own_process_is_the_one_scanned_in_a_thread(sql_ledger, tmp_path):
    """Every file, FOCUS's splits and origin charges included, byte for byte, on SQLite and PostgreSQL."""
    book = load_price_book(write_book(tmp_path, synthetic.BOOK))
    synthetic.fill(sql_ledger, book, NOVEMBER.start, 2, 24)
    assert reopen_target(sql_ledger) is not None
    # 24 GPUs in the last hour, over November's 720 hours: 17,280 GPU-hours, so by default a thread
    assert not worth_a_process(sql_ledger, NOVEMBER)
    assert worth_a_process(sql_ledger, NOVEMBER, from_gpu_hours=17_280)
    assert not worth_a_process(sql_ledger, NOVEMBER, from_gpu_hours=17_281)
    assert not worth_a_process(sql_ledger, month_period("2026-12"))  # nothing stored
    in_thread = build_report(sql_ledger, NOVEMBER, scan_process=False)
    in_process = build_report(sql_ledger, NOVEMBER, scan_process=True)
    assert in_process.splits and in_process.splits == in_thread.splits
    assert in_process.gpus and in_process.gpus == in_thread.gpus
    assert _files(in_process, tmp_path / "process") == _files(in_thread, tmp_path / "thread")


def test_ledgers_no_other_process_can_open_are_scanned_in_a_thread(tmp_path):
    memory, in_memory = open_ledger("memory://"), open_ledger("sqlite://")
    file = open_ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    try:
        assert reopen_target(memory) is None
        assert reopen_target(in_memory) is None
        assert reopen_target(file) == (f"sqlite:///{tmp_path / 'ledger.db'}", None)
        with pytest.raises(ValueError, match="cannot be opened by another process"):
            build_report(memory, NOVEMBER, scan_process=True)
    finally:
        for ledger in (memory, in_memory, file):
            ledger.close()


@pytest.mark.spawns
def test_the_scan_process_tells_the_report_what_stopped_it(tmp_path):
    missing = tmp_path / "no-such-folder" / "ledger.db"
    with (
        ScanWorker((f"sqlite:///{missing}", None), NOVEMBER, "day") as worker,
        pytest.raises(Exception, match="unable to open database file"),
    ):
        worker.result()


def _locked(schema: str) -> psycopg.Connection:
    """A transaction holding the schema's gpu_hours locked: a scan of it waits until it ends."""
    admin = psycopg.connect(PG_DSN)
    admin.execute(f'LOCK TABLE "{schema}".gpu_hours IN ACCESS EXCLUSIVE MODE')
    return admin


@pytest.mark.postgres
@pytest.mark.spawns
def test_a_report_that_fails_kills_its_scan(pg_schema, tmp_path):
    """The scan cannot finish while its table is locked: a report that waited for it would hang (the
    test's timeout); it raises its own error instead, and the scan was killed."""
    ledger = open_ledger(PG_URL, schema=pg_schema)
    book = load_price_book(write_book(tmp_path, synthetic.BOOK))
    synthetic.fill(ledger, book, NOVEMBER.start, 1, 4)
    target = reopen_target(ledger)
    assert target == (PG_URL, pg_schema)
    admin = _locked(pg_schema)
    try:
        with pytest.raises(ReportError, match="no line of 2026-11 is in cluster 'nowhere'"):
            build_report(ledger, NOVEMBER, clusters=("nowhere",), scan_process=True)
        worker = ScanWorker(target, NOVEMBER, "day")
        worker.close()
        assert worker._process.returncode == -signal.SIGKILL
    finally:
        admin.close()
        ledger.close()


PARENT = """
import sys
from gpumeter.reports.model import month_period
from gpumeter.reports.scan_worker import ScanWorker
worker = ScanWorker(({url!r}, {schema!r}), month_period("2026-11"), "day")
print(worker._process.pid, flush=True)
sys.stdin.read()  # until killed
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie has exited; only its entry is left
        return stat.read().split(")")[-1].split()[0] != "Z"


@pytest.mark.postgres
@pytest.mark.spawns
def test_a_killed_report_takes_its_scan_with_it(pg_schema, tmp_path):
    """The scan waits on a locked table; its report is killed with SIGKILL, and the scan goes too
    (waited for until it does: the test's timeout bounds it)."""
    ledger = open_ledger(PG_URL, schema=pg_schema)
    ledger.close()
    admin = _locked(pg_schema)
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT.format(url=PG_URL, schema=pg_schema)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    scan = 0
    try:
        scan = int(parent.stdout.readline())
        assert _alive(scan)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        while _alive(scan):
            time.sleep(0.05)
    finally:
        parent.kill()
        parent.stdout.close()
        parent.stdin.close()
        if scan and _alive(scan):  # the failure case: do not leave it waiting
            os.kill(scan, signal.SIGKILL)
        admin.close()
