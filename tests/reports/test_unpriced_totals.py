"""Unpriced GPU-hours in the chargeback report's totals (a finance analyst's probe of a 3-cluster
month: the summary CSV's `gpu_hours` column did not add up, 10,023.994744 on the total row against
11,455.994744 in the rows above it, the 1,432 GPU-hours of an unpriced workstation GPU left out).

Two hours (h0, h1); A100-40GB at 3.00; NVIDIA VR200 not in the price book:

| cluster | GPU | h0 | h1 |
|---|---|---|---|
| east | GPU-1 A100 | ml-training/trainer | nothing held |
| east | GPU-VR VR200 | unpriced | unpriced |

By hand, `--by namespace`: ml-training 1 GPU-hour, 1 x 3.00 = 3.00; `__unallocated__` 1 GPU-hour,
3.00; `__unpriced__ NVIDIA VR200` 2 GPU-hours, not priced. The rows' GPU-hours add up to
1 + 1 + 2 = 4.000000; the money to 3.00 + 3.00 = 6.00 (an unpriced GPU-hour is billed nothing).
"""

from __future__ import annotations

import csv
import io
from datetime import timedelta

from gpumeter.billing.allocate import price_gpu_hour
from gpumeter.billing.ledger import open_ledger
from gpumeter.billing.ledger.base import HourRecord
from gpumeter.billing.models import Device, GpuHour
from gpumeter.reports.model import build_report, range_period
from gpumeter.reports.render import summary_csv
from tests.billing.factories import A100, HOUR0, alloc, book

VR200 = "NVIDIA VR200"
PERIOD = range_period(HOUR0, HOUR0 + timedelta(hours=2))


def _ledger(tmp_path, gpus: dict):
    """``gpus``: (cluster, uuid, model) -> {hour index: (namespace, pod) held}, for hours 0 and 1."""
    prices = book(tmp_path, {"A100-40GB": "3.00"})
    ledger = open_ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    for h in range(2):
        hour = HOUR0 + timedelta(hours=h)
        hours = [
            GpuHour(
                hour,
                Device(uuid, model, 3600, f"node-{uuid}", "0", cluster=cluster),
                [],
                [alloc(uuid, *held[h])] if h in held else [],
            )
            for (cluster, uuid, model), held in gpus.items()
        ]
        lines = [line for gh in hours for line in price_gpu_hour(gh, prices, {}).lines]
        ledger.write_hour(HourRecord(hour, hours, lines, prices))
    return ledger


def _summary_rows(report) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(summary_csv(report))))


def test_the_summary_csv_total_counts_the_unpriced_gpu_hours(tmp_path):
    """The total row's gpu_hours is 4.000000 (before: 2.000000, the priced lines' alone) and equals
    the sum of the rows above it; its cost stays 6.00."""
    ledger = _ledger(
        tmp_path,
        {
            ("", "GPU-1", A100): {0: ("ml-training", "trainer")},
            ("", "GPU-VR", VR200): {},
        },
    )
    try:
        report = build_report(ledger, PERIOD, "namespace")
    finally:
        ledger.close()
    rows = _summary_rows(report)
    assert [(r["group"], r["cost"], r["gpu_hours"]) for r in rows] == [
        ("ml-training", "3.00", "1.000000"),
        ("__unallocated__", "3.00", "1.000000"),
        ("__unpriced__ NVIDIA VR200", "", "2.000000"),
        ("__total__", "6.00", "4.000000"),
    ]
    *above, total = rows
    assert sum(float(r["gpu_hours"]) for r in above) == float(total["gpu_hours"])
    # the report's own total is the priced lines' (the JSON's totals.all), unchanged
    assert report.total.gpu_hours == 2 and report.money(report.total.cost) == "6.00"
