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


def test_each_gpus_node_and_presence_per_bucket_are_summed_as_hour_by_hour(sql_ledger, tmp_path):
    """The GPUs' buckets are summed by the database: a GPU that moved node within a day is named by the
    bucket's last node, an hour that named none is passed over, each hour's present seconds count
    clamped to the hour and rounded to 10⁻⁶ GPU-hours before they are added, and one UUID in two
    clusters is two GPUs. SQLite and PostgreSQL, against the facts read hour by hour and by hand."""
    from datetime import timedelta
    from decimal import Decimal

    from gpumeter.billing.allocate import price_gpu_hour
    from gpumeter.billing.ledger.base import HourRecord
    from gpumeter.billing.models import Device, GpuHour

    book = load_price_book(write_book(tmp_path, synthetic.BOOK))
    # (hour offset, node, index, present seconds) of GPU-x in cluster "east"; hour 24 is the next day
    east = [(0, "node-1", "0", 3600), (1, "", "", 1), (2, "node-2", "3", 1799), (3, "node-2", "", 3601)]
    east += [(4, "", "", 0), (24, "node-3", "1", 2)]
    for offset, node, index, seconds in east:
        hour = NOVEMBER.start + timedelta(hours=offset)
        facts = [
            GpuHour(
                hour, Device("GPU-x", synthetic.H100, seconds, node, index, False, cluster="east"), [], []
            ),
            GpuHour(hour, Device("GPU-x", synthetic.H100, 3599, "w-9", "7", False, cluster="west"), [], []),
        ]
        lines = [line for gh in facts for line in price_gpu_hour(gh, book, {}).lines]
        sql_ledger.write_hour(HourRecord(hour, facts, lines, book), source="test")
    day, next_day = NOVEMBER.start, NOVEMBER.start + timedelta(days=1)
    gpus = scan_facts(sql_ledger, NOVEMBER, "day", splits=True).gpus
    assert gpus is not None
    east_day = gpus[(day, "east", "GPU-x")]
    assert (east_day.hostname, east_day.index) == ("node-2", "3")  # the day's last node that was named
    # 1 + 1/3600 + 1799/3600 + 1 (3601 clamped) + 0, each to 10⁻⁶: 1 + 0.000278 + 0.499722 + 1
    assert east_day.present == Decimal("2.500000")
    assert gpus[(next_day, "east", "GPU-x")].present == Decimal("0.000556")  # 2/3600
    west_day = gpus[(day, "west", "GPU-x")]
    # five hours of 3599 s: 0.999722 (3599/3600 to 10⁻⁶) each
    assert (west_day.hostname, west_day.index, west_day.present) == ("w-9", "7", Decimal("4.998610"))
    for grain in ("hour", "day"):
        by_hour: dict = {}
        read_splits(sql_ledger, NOVEMBER, grain, by_hour)
        assert scan_facts(sql_ledger, NOVEMBER, grain, splits=True).gpus == by_hour
