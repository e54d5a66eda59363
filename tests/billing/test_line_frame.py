"""The ledger's lines as columns (billing/ledger/frames.py): exactly the lines `Ledger.lines` returns,
on every backend, with money and quantities exact as integers of the stored scale."""

from __future__ import annotations

import itertools
from dataclasses import replace
from datetime import timedelta
from decimal import Decimal

import pandas as pd

from gpumeter.billing.allocate import price_gpu_hour
from gpumeter.billing.ledger import frames
from gpumeter.billing.ledger.base import HourRecord
from gpumeter.billing.models import Device, GpuHour
from gpumeter.billing.pricing.base import version_id
from tests.billing.factories import A100, HOUR0, alloc, book, gpu_hour, mig

H100 = "NVIDIA H100 80GB HBM3"


def _hours(prices, hours: int) -> list[tuple]:
    """A MIG A100 (two holders, an idle instance), a time-sliced H100 and an unpriced GPU, per hour,
    with utilization readings that move from hour to hour (one holder with its own, one without)."""
    out = []
    for h in range(hours):
        hour = HOUR0 + timedelta(hours=h)
        a100 = gpu_hour(
            "GPU-a",
            A100,
            [
                replace(mig("GPU-a", "1", "3g.20gb"), utilization=Decimal("0.125") + Decimal(h) / 10),
                replace(mig("GPU-a", "2", "3g.20gb", seconds=1800), utilization=Decimal("0.75")),
            ],
            [
                alloc("GPU-a", "ns-a", f"a-{h}", gi="1", profile="3g.20gb", share="0.333333333"),
                replace(
                    alloc("GPU-a", "ns-b", "b", gi="2", profile="3g.20gb", seconds=1800),
                    utilization=Decimal("0.5") - Decimal(h) / 8,
                ),
            ],
            hour=hour,
        )
        h100 = gpu_hour(
            "GPU-h",
            H100,
            [],
            [alloc("GPU-h", "ns-a", "x", share="0.5"), alloc("GPU-h", "ns-c", "y", share="0.5")],
            hour=hour,
        )
        h100 = replace(h100, device=replace(h100.device, utilization=Decimal("0.33") * (h % 2)))
        other = GpuHour(hour, Device("GPU-z", "NVIDIA VR200", 3600, "node-z", "0", False), [], [])
        facts = [a100, h100, other]
        lines = [line for gh in facts for line in price_gpu_hour(gh, prices, {"ns-a": "team-a"}).lines]
        out.append((hour, facts, lines))
    return out


def _as_rows(lines) -> list[tuple]:
    rows = [
        (
            line.hour,
            line.kind.value,
            line.namespace,
            line.team,
            line.pod,
            line.container,
            line.uuid,
            line.gpu_instance_id,
            line.mig_profile,
            line.model,
            line.currency,
            line.held_unit.value,
            line.cluster,
            line.quantity,
            line.amount,
            line.held,
            None if line.utilization is None else round(float(line.utilization), 9),
            None if line.efficiency is None else round(float(line.efficiency), 9),
        )
        for line in lines
    ]
    return sorted(rows, key=repr)


def _frame_rows(frame) -> list[tuple]:
    def exact(values, unit):
        return [None if pd.isna(v) else Decimal(int(v)) * unit for v in values]

    def ratio(weighted, known):
        return [round(w / (k / 1e6), 9) if k else None for w, k in zip(weighted, known, strict=True)]

    assert (frame["lines"] == 1).all() and (frame["first_hour"] == frame["bucket"]).all()
    columns = [
        [moment.to_pydatetime() for moment in frame["bucket"]],
        *(list(frame[name].astype(object)) for name in frames.TEXT),
        exact(frame["quantity"], frames.QUANTITY_UNIT),
        exact(frame["amount"], frames.MONEY_UNIT),
        exact(frame["held"], frames.QUANTITY_UNIT),
        ratio(frame["uw"], frame["uq"]),
        ratio(frame["ew"], frame["eq"]),
    ]
    return sorted(zip(*columns, strict=True), key=repr)


def test_the_frame_holds_exactly_the_lines_the_ledger_returns(ledger, tmp_path):
    prices = book(tmp_path, {"A100-40GB": {"hourly_rate": "3.123457"}, "H100-80GB": {"hourly_rate": "6.88"}})
    for hour, facts, lines in _hours(prices, 3):
        ledger.write_hour(HourRecord(hour, facts, lines, prices), source="test")
    end = HOUR0 + timedelta(hours=3)
    frame = frames.line_frame(ledger, HOUR0, end, "hour")
    stored = ledger.lines(HOUR0, end)
    assert len(frame) == len(stored) > 0
    assert list(frame.columns) == list(frames.COLUMNS)
    assert _frame_rows(frame) == _as_rows(stored)
    # money exact: the frame's integers sum to the lines' Decimal total to the last stored digit
    assert Decimal(int(frame["amount"].sum())) * frames.MONEY_UNIT == sum(
        (x.amount for x in stored if x.amount is not None), Decimal(0)
    )
    assert frame["amount"].isna().sum() == sum(x.amount is None for x in stored)
    versions = ledger.price_versions(set(frame["price_version_id"].dropna().astype(int)))
    assert versions and all(v.digest for v in versions.values())
    # by day: the lines in day buckets (the SQL ledger sums a term's lines of a day in one row), exactly
    daily = frames.line_frame(ledger, HOUR0, end, "day")
    assert daily["lines"].sum() == len(stored) and (daily["bucket"] == HOUR0).all()
    assert len(daily) < len(frame) if hasattr(ledger, "engine") else len(daily) == len(frame)
    for name in ("quantity", "held", "uq", "eq"):
        assert daily[name].sum() == frame[name].sum()
    assert daily["amount"].sum() == frame["amount"].sum()
    # the readings' exact sums: each line's reading (10⁻⁹) x its quantity (10⁻⁶), to the last unit
    for name, reading in (("uw_exact", "utilization"), ("ew_exact", "efficiency")):
        known = [(getattr(x, reading), x.quantity) for x in stored if getattr(x, reading) is not None]
        expected = sum(int(r.scaleb(9)) * int(q.scaleb(6)) for r, q in known)
        assert int(frame[name].sum()) == int(daily[name].sum()) == expected
    assert frame["uw_exact"].sum() > 0  # the hours' utilizations were read
    # a range without lines is an empty frame of the same columns
    none = frames.line_frame(ledger, end, end + timedelta(hours=1), "hour")
    assert len(none) == 0 and list(none.columns) == list(frames.COLUMNS)


def test_a_range_is_one_bucket_whose_totals_are_its_lines(ledger, tmp_path):
    """What the previous period's comparison reads (reports.grouped.before): the range's lines in one
    bucket at its start, their money and quantities exactly the lines' sums per what the comparison
    groups by. The SQL ledger sums them per `RANGE_NAMES` and price version and reads no readings."""
    prices = book(tmp_path, {"A100-40GB": {"hourly_rate": "3.123457"}, "H100-80GB": {"hourly_rate": "6.88"}})
    for hour, facts, lines in _hours(prices, 3):
        ledger.write_hour(HourRecord(hour, facts, lines, prices), source="test")
    start, end = HOUR0 - timedelta(hours=1), HOUR0 + timedelta(hours=3)  # an hour before the first line
    stored = ledger.lines(start, end)
    frame = frames.line_frame(ledger, start, end, "range")
    assert list(frame.columns) == list(frames.COLUMNS) and (frame["bucket"] == start).all()
    versions = ledger.price_versions(set(frame["price_version_id"].dropna().astype(int)))

    def summed(rows) -> dict[tuple, list]:
        out: dict[tuple, list] = {}
        for key, lines, quantity, held, amount, first, last in rows:
            totals = out.setdefault(key, [0, Decimal(0), Decimal(0), None, first, last])
            totals[0] += lines
            totals[1] += quantity
            totals[2] += held
            totals[3] = None if amount is None else (totals[3] or Decimal(0)) + amount
            totals[4], totals[5] = min(totals[4], first), max(totals[5], last)
        return out

    def label(stored_id) -> str | None:  # a version as a line names it, not by its row's id
        return None if pd.isna(stored_id) else version_id(versions[int(stored_id)].effective_from)

    got = summed(
        (
            (*(row[name] for name in frames.RANGE_NAMES), label(row["price_version_id"])),
            row["lines"],
            Decimal(int(row["quantity"])) * frames.QUANTITY_UNIT,
            Decimal(int(row["held"])) * frames.QUANTITY_UNIT,
            None if pd.isna(row["amount"]) else Decimal(int(row["amount"])) * frames.MONEY_UNIT,
            row["first_hour"].to_pydatetime(),
            row["last_hour"].to_pydatetime(),
        )
        for _, row in frame.iterrows()
    )
    expected = summed(
        (
            (
                *(
                    getattr(x, name).value if name in ("kind", "held_unit") else getattr(x, name)
                    for name in frames.RANGE_NAMES
                ),
                x.price_version,
            ),
            1,
            x.quantity,
            x.held,
            x.amount,
            x.hour,
            x.hour,
        )
        for x in stored
    )
    assert got == expected and sum(1 for x in stored if x.amount is None) > 0
    if hasattr(ledger, "engine"):
        assert len(frame) == len(got) < len(stored)  # a row per name, and fewer than the lines
        assert (frame[["uq", "eq", "uw_exact", "ew_exact"]] == 0).all().all() and (frame["uw"] == 0).all()
        assert (frame[["pod", "uuid"]].astype(object) == "").all().all()


def test_a_ledger_without_a_reader_of_its_own_is_read_through_hourly_totals(tmp_path):
    from gpumeter.billing.ledger.memory import MemoryLedger

    class Plain(MemoryLedger):
        line_frame = None  # as a ledger without its own reader

    ledger = Plain()
    prices = book(tmp_path, {"A100-40GB": {"hourly_rate": "3.00"}, "H100-80GB": {"hourly_rate": "6.88"}})
    for hour, facts, lines in _hours(prices, 2):
        ledger.write_hour(HourRecord(hour, facts, lines, prices), source="test")
    end = HOUR0 + timedelta(hours=2)
    assert _frame_rows(frames.line_frame(ledger, HOUR0, end, "hour")) == _as_rows(ledger.lines(HOUR0, end))


def test_a_long_range_is_summed_in_day_windows_one_a_core_but_the_scans():
    month = (HOUR0.replace(hour=0), HOUR0.replace(hour=0) + timedelta(days=30))
    assert frames._day_windows(*month, cores=2) == [month]  # the fact scan has the other core
    windows = frames._day_windows(*month, cores=4)
    assert len(windows) == 3 and windows[0][0] == month[0] and windows[-1][1] == month[1]
    assert all(a[1] == b[0] and a[1].hour == 0 for a, b in itertools.pairwise(windows))
    assert len(frames._day_windows(*month, cores=16)) == 4  # at most four connections


def test_sqlite_sums_a_sets_places_as_columns_and_the_places_past_them_line_by_line(sql_ledger, tmp_path):
    """However many of a set's places are summed as columns of its groups (`READING_COLUMNS`), the
    rest line by line, the frame holds the same lines and readings (PostgreSQL sums line by line)."""
    tiers = [{"range": [0, 0.3], "efficiency": 0.5}, {"range": [0.3, 1.0], "efficiency": 0.9}]
    rates = {"A100-40GB": {"hourly_rate": "3.123457"}, "H100-80GB": {"hourly_rate": "6.88"}}
    prices = book(tmp_path, rates, utilization_tiers=tiers)
    for hour, facts, lines in _hours(prices, 3):
        sql_ledger.write_hour(HourRecord(hour, facts, lines, prices), source="test")
    end = HOUR0 + timedelta(hours=3)
    engine = sql_ledger.engine
    widest = frames._widest_set(engine)
    assert widest >= 3  # the A100's set: so that 1 and 2 leave places to be summed line by line
    stored = _as_rows(sql_ledger.lines(HOUR0, end))
    daily, order = None, ["uuid", "kind", "namespace", "pod", "gpu_instance_id"]
    for columns in (0, 1, 2, widest, frames.READING_COLUMNS):
        assert _frame_rows(frames.read_sql(engine, HOUR0, end, "hour", reading_columns=columns)) == stored
        by_day = frames.read_sql(engine, HOUR0, end, "day", reading_columns=columns)
        by_day = by_day.sort_values(order, ignore_index=True)
        assert by_day["lines"].sum() == len(stored)
        if daily is None:
            daily = by_day
        else:
            pd.testing.assert_frame_equal(by_day, daily, check_exact=False, rtol=1e-12)
    assert daily is not None
    assert (daily[["uq", "eq", "uw", "ew", "uw_exact", "ew_exact"]].sum() > 0).all()  # both kinds summed
