"""The report's one pass over a SQL ledger's GPU-hours (reports/splits.py `scan_facts`) reads the
same splits, GPUs and holdings as restoring the facts hour by hour (`read_splits`, `Ledger.holdings`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpumeter.billing.ledger import open_ledger
from gpumeter.billing.pricing import load_price_book
from gpumeter.reports.model import month_period
from gpumeter.reports.splits import read_splits, scan_facts
from tests.billing.factories import write_book
from tests.reports import synthetic

NOVEMBER = month_period("2026-11")


@pytest.fixture(scope="module")
def ledger(tmp_path_factory):
    root = Path(tmp_path_factory.mktemp("scan"))
    book = load_price_book(write_book(root, synthetic.BOOK))
    ledger = open_ledger(f"sqlite:///{root / 'ledger.db'}")
    synthetic.fill(ledger, book, NOVEMBER.start, 2, 24)
    yield ledger
    ledger.close()


@pytest.mark.parametrize("grain", ["day", "hour"])
def test_one_pass_reads_what_the_facts_hour_by_hour_say(ledger, grain):
    gpus: dict = {}
    splits = read_splits(ledger, NOVEMBER, grain, gpus)
    scanned = scan_facts(ledger, NOVEMBER, grain, splits=True)
    assert splits and gpus  # the fleet shares GPUs: MIG instances and time-sliced replicas
    assert scanned.splits == splits
    assert scanned.gpus == gpus
    assert scanned.holdings == ledger.holdings(NOVEMBER.start, NOVEMBER.end)
    assert scan_facts(ledger, NOVEMBER, grain, splits=False).splits is None


def test_replicas_process_use_and_fractional_grants_are_read_as_the_facts_say(sql_ledger, tmp_path):
    """Time-sliced replicas of which one hour reports process use and the next none, MPS, a
    fractional grant, in a named cluster: the holdings' `process_use` follows each hour's readings.
    On SQLite and PostgreSQL (their hours come back as epoch seconds each its own way)."""
    from dataclasses import replace
    from datetime import timedelta
    from decimal import Decimal

    from gpumeter import contract
    from gpumeter.billing.allocate import price_gpu_hour
    from gpumeter.billing.ledger.base import HourRecord
    from gpumeter.billing.models import Device, GpuHour
    from tests.billing.factories import alloc

    book = load_price_book(write_book(tmp_path, synthetic.BOOK))
    ledger = sql_ledger
    for h in range(3):
        hour = NOVEMBER.start + timedelta(hours=h)
        sm = Decimal("0.25") if h == 1 else Decimal(0)
        sliced = [
            replace(
                alloc("GPU-t", "ns-a", "a", share="0.5"),
                sharing=contract.SHARING_TIME_SLICING,
                process_sm=sm,
                process_memory=Decimal(0),
            ),
            replace(
                alloc("GPU-t", "ns-b", "b", share="0.5"),
                sharing=contract.SHARING_TIME_SLICING,
                process_sm=Decimal(0),
                process_memory=Decimal(0),
            ),
        ]
        mps = [replace(alloc("GPU-m", "ns-a", "m", share="0.5"), sharing=contract.SHARING_MPS)]
        fractional = [
            replace(
                alloc("GPU-f", "ns-c", "f", share="0.3"),
                sharing=contract.SHARING_FRACTIONAL,
                memory_share=Decimal("0.25"),
                compute_share=Decimal("0.3"),
            ),
        ]
        facts = [
            GpuHour(
                hour,
                Device(uuid, synthetic.H100, 3600, "node-1", str(i), False, cluster="east"),
                [],
                held,
            )
            for i, (uuid, held) in enumerate([("GPU-t", sliced), ("GPU-m", mps), ("GPU-f", fractional)])
        ]
        lines = [line for gh in facts for line in price_gpu_hour(gh, book, {}).lines]
        ledger.write_hour(HourRecord(hour, facts, lines, book), source="test")
    for grain in ("hour", "day"):
        gpus: dict = {}
        splits = read_splits(ledger, NOVEMBER, grain, gpus)
        scanned = scan_facts(ledger, NOVEMBER, grain, splits=True)
        assert scanned.splits == splits and scanned.gpus == gpus
        assert any(h.process_use for held in splits.values() for hs in held.values() for h in hs)
        assert scanned.holdings == ledger.holdings(NOVEMBER.start, NOVEMBER.end)


def test_a_stopped_scan_stops_at_its_next_chunk_on_every_backend(ledger):
    """The scan runs beside the report's line sums (`build_report`); when the report fails it is told
    to stop rather than read the rest of the month first. SQL ledger and the hour-by-hour reader."""
    import threading

    from gpumeter.billing.ledger.memory import MemoryLedger
    from gpumeter.reports.splits import ScanStopped

    stop = threading.Event()
    stop.set()
    with pytest.raises(ScanStopped):
        scan_facts(ledger, NOVEMBER, "day", splits=True, stop=stop)
    with pytest.raises(ScanStopped):
        scan_facts(MemoryLedger(), NOVEMBER, "day", splits=True, stop=stop)
    # not stopped: read whole, as without the event
    assert scan_facts(ledger, NOVEMBER, "day", splits=True, stop=threading.Event()).gpus


def test_a_report_that_fails_leaves_no_fact_scan_running(ledger):
    """An unknown cluster is refused from the line sums while the scan beside them is reading: the
    error comes out and the scan's thread is gone with it, stopped at its next chunk."""
    import threading

    from gpumeter.reports.model import ReportError, build_report

    with pytest.raises(ReportError, match="no-such-cluster"):
        build_report(ledger, NOVEMBER, "team", clusters=("no-such-cluster",))
    assert not [t for t in threading.enumerate() if t.name.startswith("report-facts")]
