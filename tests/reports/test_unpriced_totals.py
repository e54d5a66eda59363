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
import json
from datetime import timedelta

from gpumeter.reports.model import build_report, range_period
from gpumeter.reports.render import RenderOptions, html_text, json_text, summary_csv
from tests.billing.factories import A100, HOUR0
from tests.reports.helpers import two_hours

VR200 = "NVIDIA VR200"
PERIOD = range_period(HOUR0, HOUR0 + timedelta(hours=2))


def _summary_rows(report) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(summary_csv(report))))


def test_the_summary_csv_total_counts_the_unpriced_gpu_hours(tmp_path):
    """The total row's gpu_hours is 4.000000 (before: 2.000000, the priced lines' alone) and equals
    the sum of the rows above it; its cost stays 6.00."""
    ledger = two_hours(
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


def test_a_cluster_of_unpriced_gpus_alone_is_listed_and_each_unpriced_entry_names_its_cluster(tmp_path):
    """Three GPUs in two clusters, both hours; `lab` has unpriced GPUs only:

    | cluster | GPU | h0 | h1 |
    |---|---|---|---|
    | east | GPU-1 A100 | ml-training/trainer | nothing held |
    | east | GPU-VR VR200 | unpriced | unpriced |
    | lab | GPU-VR VR200 | unpriced | unpriced |
    | lab | GPU-VX VR200 | unpriced | unpriced |

    By hand: east costs 3.00 + 3.00 = 6.00 on 2 priced GPU-hours, with 2 unpriced GPU-hours on 1
    GPU; lab costs 0.00 on 0 priced GPU-hours, with 2 x 2 = 4 unpriced GPU-hours on 2 GPUs (GPU-VR
    of east and of lab are two GPUs). Before, lab was in neither the JSON `clusters` nor the HTML
    "Cost per cluster" table, and the one unpriced entry (VR200, 6 GPU-hours on 3 GPUs) named no
    cluster. The summary CSV's total counts 1 + 1 + 6 = 8 GPU-hours, its cost 6.00."""
    ledger = two_hours(
        tmp_path,
        {
            ("east", "GPU-1", A100): {0: ("ml-training", "trainer")},
            ("east", "GPU-VR", VR200): {},
            ("lab", "GPU-VR", VR200): {},
            ("lab", "GPU-VX", VR200): {},
        },
    )
    try:
        report = build_report(ledger, PERIOD, "namespace")
    finally:
        ledger.close()
    doc = json.loads(json_text(report))
    assert [(c["cluster"], c["cost"], c["gpu_hours"], c["unpriced_gpu_hours"]) for c in doc["clusters"]] == [
        ("east", "6.00", "2.000000", "2.000000"),
        ("lab", "0.00", "0.000000", "4.000000"),
    ]
    assert doc["unpriced"] == [
        {"cluster": "east", "gpu_model": VR200, "gpu_hours": "2.000000", "gpus": 1},
        {"cluster": "lab", "gpu_model": VR200, "gpu_hours": "4.000000", "gpus": 2},
    ]
    # the per-model figures the summary CSV and HTML table show stay one row: 6 GPU-hours on 3 GPUs
    assert [(u.model, u.gpu_hours, u.gpus) for u in report.unpriced] == [(VR200, 6, 3)]
    assert _summary_rows(report)[-1]["gpu_hours"] == "8.000000"
    assert _summary_rows(report)[-1]["cost"] == "6.00"

    html = html_text(report, RenderOptions())
    table = html[
        html.index('<table id="clusters">') : html.index("</table>", html.index('<table id="clusters">'))
    ]
    assert '<th class="n">unpriced GPU-hours</th>' in table
    lab = table[table.index('<tr data-cluster="lab">') :]
    lab = lab[: lab.index("</tr>")]
    cells = [c.split("<", 1)[0] for c in lab.split('class="n">')[1:]]
    assert cells == ["0.00", "0.00", "0.00", "0.00", "–", "4.00"], lab
    assert f"{VR200} in lab: 4.00 GPU-hours on 2 GPU(s)" in html


def test_without_clusters_the_unpriced_entries_and_the_html_table_are_as_before(tmp_path):
    """The same GPUs in a store without a cluster label (east's alone): one unpriced entry, no
    `cluster` key, no `clusters` list, no cost-per-cluster table."""
    ledger = two_hours(
        tmp_path, {("", "GPU-1", A100): {0: ("ml-training", "trainer")}, ("", "GPU-VR", VR200): {}}
    )
    try:
        report = build_report(ledger, PERIOD, "namespace")
    finally:
        ledger.close()
    doc = json.loads(json_text(report))
    assert "clusters" not in doc and "only_clusters" not in doc
    assert doc["unpriced"] == [{"gpu_model": VR200, "gpu_hours": "2.000000", "gpus": 1}]
    html = html_text(report, RenderOptions())
    assert 'id="clusters"' not in html and "unpriced GPU-hours</th>" not in html
    assert f"{VR200}: 2.00 GPU-hours on 1 GPU(s)" in html
