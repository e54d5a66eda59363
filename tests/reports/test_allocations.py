"""`gpumeter report --kind allocations` (seed 002 §5's allocation audit): every holding's holder,
device, start and end from the ledger's hourly facts, as CSV and HTML, with its resolution stated.
Starts and ends below are worked out by hand from the seconds written into the ledger."""

from __future__ import annotations

import csv
from datetime import UTC, datetime, timedelta

from markupsafe import escape

import gpumeter
from gpumeter.billing.allocate import price_gpu_hour
from gpumeter.billing.ledger import open_ledger
from gpumeter.billing.ledger.base import HourRecord
from gpumeter.reports.allocations import RESOLUTION
from tests.billing.factories import A100, alloc, book, gpu_hour, mig

DAY = datetime(2026, 11, 3, tzinfo=UTC)  # the period: one day, 2026-11-03
U = "GPU-a100-0"
COLUMNS = ("pod", "team", "gpu_instance_id", "mig_profile", "start", "end", "start_known", "end_known", "hours", "held_seconds")  # fmt: skip


def _hour(i: int) -> datetime:
    return DAY + timedelta(hours=i)


def _write(ledger, prices, hour_index: int, holders: list[tuple[str, str, str, int]]) -> None:
    """One A100 in MIG mode (3g.20gb GI 1, 2g.10gb GI 2) for the hour; holders (ns, pod, GI, seconds)."""
    hour = _hour(hour_index)
    profiles = {"1": "3g.20gb", "2": "2g.10gb"}
    instances = [mig(U, gi, profile) for gi, profile in profiles.items()]
    held = [alloc(U, ns, pod, seconds, gi=gi, profile=profiles[gi]) for ns, pod, gi, seconds in holders]
    gh = gpu_hour(U, A100, instances, held, hour=hour)
    priced = price_gpu_hour(gh, prices, {"research": "gamma", "search": "beta"})
    ledger.write_hour(HourRecord(hour, [gh], priced.lines, prices), source="test")


def test_allocations_report_places_each_holding_and_says_how_well(tmp_path, capsys):
    prices = book(tmp_path, {"A100-40GB": {"hourly_rate": "3.00"}})
    db = tmp_path / "ledger.sqlite"
    ledger = open_ledger(f"sqlite:///{db}")
    # train-0 on GI 1: 40 min of hour 10, all of 11, 15 min of 12 -> 10:20 to 12:15, both exact.
    # probe-0 on GI 2: 30 min somewhere in hour 11 only -> the hour, 11:00 to 12:00, both "hour".
    # serve-0 on GI 2: all of hours 0-2 from the day's start -> starts at the period's edge, ends 03:00.
    # late-0 on GI 1: from 22:50 (10 min of hour 22) and all of hour 23 -> on past the period's end.
    for i in range(24):
        holders = []
        if i in (10, 11, 12):
            holders.append(("research", "train-0", "1", {10: 2400, 11: 3600, 12: 900}[i]))
        if i == 11:
            holders.append(("search", "probe-0", "2", 1800))
        if i in (0, 1, 2):
            holders.append(("search", "serve-0", "2", 3600))
        if i in (22, 23):
            holders.append(("research", "late-0", "1", {22: 600, 23: 3600}[i]))
        _write(ledger, prices, i, holders)
    ledger.close()

    out = tmp_path / "out"
    argv = ["report", "--kind", "allocations", "--db", f"sqlite:///{db}", "--out", str(out)]
    assert gpumeter.main([*argv, "--from", "2026-11-03", "--to", "2026-11-04", "--no-record"]) == 0
    assert "4 allocation(s), facts of 24/24 hours" in capsys.readouterr().out
    (name,) = [p.name for p in out.glob("*.csv")]
    with (out / name).open() as f:
        got = [tuple(r[c] for c in COLUMNS) for r in csv.DictReader(f)]
    assert got == [
        ("serve-0", "beta", "2", "2g.10gb", "2026-11-03T00:00:00Z", "2026-11-03T03:00:00Z", "period", "exact", "3", "10800"),
        ("train-0", "gamma", "1", "3g.20gb", "2026-11-03T10:20:00Z", "2026-11-03T12:15:00Z", "exact", "exact", "3", "6900"),
        ("probe-0", "beta", "2", "2g.10gb", "2026-11-03T11:00:00Z", "2026-11-03T12:00:00Z", "hour", "hour", "1", "1800"),
        ("late-0", "gamma", "1", "3g.20gb", "2026-11-03T22:50:00Z", "2026-11-04T00:00:00Z", "exact", "period", "2", "4200"),
    ]  # fmt: skip
    with (out / name).open() as f:
        row = next(csv.DictReader(f))
    assert (row["node"], row["gpu"], row["gpu_uuid"], row["container"]) == ("node-1", "0", U, "main")
    html = next(out.glob("*.html")).read_text()
    assert str(escape(RESOLUTION)) in html and "train-0" in html and "2026-11-03T10:20:00Z" in html


def test_allocations_report_refuses_a_format_it_does_not_have(tmp_path, capsys):
    db = tmp_path / "ledger.sqlite"
    open_ledger(f"sqlite:///{db}").close()
    argv = ["report", "--kind", "allocations", "--db", f"sqlite:///{db}", "--format", "focus"]
    assert gpumeter.main([*argv, "--out", str(tmp_path / "out")]) == 2
    assert (
        capsys.readouterr().err.strip()
        == "error: format: the allocations report has csv, html (value 'focus')"
    )
