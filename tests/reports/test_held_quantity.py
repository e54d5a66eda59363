"""Facts carried, not recomputed: the quantity held and the price version travel on each line from
pricing through the ledger into the report and the FOCUS export (docs/billing.md §4, §7).

The layout makes the `max` slice-weight policy normalise: on an A100-40GB (7 compute, 8 memory
slices) 3g.20gb + 2g.10gb + 1g.5gb + 1g.5gb weigh max(3/7, 4/8) + max(2/7, 2/8) + 2 x max(1/7, 1/8)
= 1/2 + 2/7 + 2/7 = 15/14 of the GPU, so billing scales every weight by 14/15. The tenant on the
3g.20gb instance still *holds* 3 compute slices for each hour: 24 hours are 72 slice-hours. A report
that divided the weighted quantity by the unnormalised weight 1/2 got 24 x 1/2 x 14/15 / (1/2) x 3
= 67.2 instead.
"""

from __future__ import annotations

import csv
import io
import json
from datetime import timedelta
from decimal import Decimal

from gpumeter.billing.allocate import price_gpu_hour
from gpumeter.billing.ledger.base import HourRecord
from gpumeter.billing.models import LineKind, QuantityUnit
from gpumeter.billing.pricing import load_price_book
from gpumeter.reports import render
from gpumeter.reports.model import build_report, range_period
from tests.billing.factories import A100, HOUR0, alloc, gpu_hour, mig, write_book

HOURS = 24
BOUNDARY = HOUR0 + timedelta(hours=12)  # the second price version takes effect half way
BOOK = {
    "currency": "USD",
    "versions": [
        {
            "effective_from": "2026-01-01T00:00:00Z",
            "effective_to": "2026-11-01T12:00:00Z",
            "slice_weight": "max",
            "gpus": {"A100-40GB": {"hourly_rate": "3.00"}},
        },
        {
            "effective_from": "2026-11-01T12:00:00Z",
            "slice_weight": "max",
            "gpus": {"A100-40GB": {"hourly_rate": "3.50"}},
        },
    ],
}


def _fill(ledger, tmp_path):
    book = load_price_book(write_book(tmp_path, BOOK))
    u = "GPU-held"
    for n in range(HOURS):
        hour = HOUR0 + timedelta(hours=n)
        gh = gpu_hour(
            u,
            A100,
            [mig(u, "1", "3g.20gb"), mig(u, "2", "2g.10gb"), mig(u, "3", "1g.5gb"), mig(u, "4", "1g.5gb")],
            [alloc(u, "ml", "trainer", gi="1", profile="3g.20gb")],
            hour=hour,
        )
        ledger.write_hour(HourRecord(hour, [gh], price_gpu_hour(gh, book).lines, book))
    return book


def test_pricing_states_slice_hours_held_under_normalised_max_weights(tmp_path):
    book = load_price_book(write_book(tmp_path, BOOK))
    u = "GPU-held"
    gh = gpu_hour(
        u,
        A100,
        [mig(u, "1", "3g.20gb"), mig(u, "2", "2g.10gb"), mig(u, "3", "1g.5gb"), mig(u, "4", "1g.5gb")],
        [alloc(u, "ml", "trainer", gi="1", profile="3g.20gb")],
    )
    (tenant,) = [line for line in price_gpu_hour(gh, book).lines if line.kind is LineKind.TENANT]
    assert tenant.quantity == Decimal("0.466667")  # 1/2 x 14/15 GPU-hours: what the amount is priced on
    assert (tenant.held, tenant.held_unit) == (Decimal(3), QuantityUnit.SLICE_HOUR)
    assert tenant.amount == Decimal("1.40")  # 3.00 x 7/15


def test_report_and_focus_show_the_slice_hours_held(ledger, tmp_path):
    _fill(ledger, tmp_path)
    period = range_period(HOUR0, HOUR0 + timedelta(hours=HOURS))
    report = build_report(ledger, period, "namespace", compare=False)
    (group,) = [g for g in report.groups if g.key == "ml"]
    assert group.usage.slice_hours == Decimal(HOURS * 3) == 72

    rows = list(csv.DictReader(io.StringIO(_focus_csv(report))))
    mine = [r for r in rows if r["x_Namespace"] == "ml" and r["x_LineKind"] == "tenant"]
    # the slice-hours held are the holder's own figure (x_SliceHours, and AllocatedMethodDetails'
    # UsageQuantity); ConsumedUnit is the origin charge's, the GPU's: GPU-Hours on every row
    assert sum(Decimal(r["x_SliceHours"]) for r in mine) == 72
    assert {r["ConsumedUnit"] for r in rows} == {"GPU-Hours"}
    assert {json.loads(r["AllocatedMethodDetails"])["Elements"][0]["UsageUnit"] for r in mine} == {
        "Slice-Hours"
    }


def test_each_stored_line_names_the_version_that_priced_it(ledger, tmp_path):
    book = _fill(ledger, tmp_path)
    first, second = book.versions
    lines = ledger.lines(HOUR0, HOUR0 + timedelta(hours=HOURS))
    assert lines and all(line.price_version for line in lines)
    assert {line.price_version for line in lines if line.hour < BOUNDARY} == {first.id}
    assert {line.price_version for line in lines if line.hour >= BOUNDARY} == {second.id}
    # and the ledger registered each version's body once, under that id
    totals = ledger.line_totals(HOUR0, HOUR0 + timedelta(hours=HOURS), "hour")
    stored = ledger.price_versions({t.price_version_id for t in totals})
    assert sorted(v.body["rates"]["A100-40GB"] for v in stored.values()) == ["3.00", "3.50"]


def _focus_csv(report) -> str:
    return render.focus_csv(report)
