"""A chargeback report names the GPU-hours a refused reading left unbilled (docs/billing.md §6.5):
before, the hour was listed as "without a successful ingest" while its other lines were in the totals,
and the refused GPU was named only by `billing status`."""

from __future__ import annotations

import dataclasses
import json

from gpumeter.billing.allocate import price_gpu_hour
from gpumeter.billing.ledger.base import HourRecord
from gpumeter.reports.model import HOUR, build_report, month_period
from gpumeter.reports.render import render
from tests.billing.factories import A100, HOUR0, alloc, book, gpu_hour

NOVEMBER = month_period("2026-11")
WHY = "gpu_util ('avg_over_time(…)'): value 'abc' is not a number in [0, 1]"


def _hours(ledger, tmp_path, cluster: str = "") -> None:
    prices = book(tmp_path, {"A100-40GB": {"hourly_rate": "3.00"}})
    for h in range(2):
        hour = HOUR0 + HOUR * h
        hours = []
        for uuid, where in (("GPU-a", cluster), ("GPU-w", "west")) if cluster else (("GPU-a", ""),):
            gh = gpu_hour(uuid, A100, allocations=[alloc(uuid, "ml", "p")], hour=hour)
            gh.device = dataclasses.replace(gh.device, cluster=where)
            hours.append(gh)
        # the second hour: GPU-b's reading refused, the others billed
        refused = ((cluster, "GPU-b", WHY),) if h == 1 else ()
        lines = [line for gh in hours for line in price_gpu_hour(gh, prices).lines]
        ledger.write_hour(HourRecord(hour, hours, lines, prices, refused=refused))


def test_the_report_names_each_refused_gpu_hour(ledger, tmp_path):
    _hours(ledger, tmp_path)
    report = build_report(ledger, NOVEMBER, "team")
    assert report.total.cost == 6  # both hours of GPU-a, 2 x 3.00
    render(report, tmp_path / "out", ("json", "html"))
    doc = json.loads((tmp_path / "out" / "gpumeter-2026-11-by-team.json").read_text())
    assert doc["provenance"]["ingest_runs"]["refused_gpu_hours"] == [
        {"hour": "2026-11-01T01:00:00Z", "cluster": "", "uuid": "GPU-b", "reason": WHY}
    ]
    html = (tmp_path / "out" / "gpumeter-2026-11-by-team.html").read_text()
    assert 'id="refused-gpu-hours"' in html and "GPU-b" in html and "is not a number" in html


def test_a_cluster_report_names_its_clusters_refused_gpu_hours_only(ledger, tmp_path):
    _hours(ledger, tmp_path, cluster="east")
    assert [r["uuid"] for r in _refused(build_report(ledger, NOVEMBER, "team", clusters=("east",)))] == [
        "GPU-b"
    ]
    assert [r["cluster"] for r in _refused(build_report(ledger, NOVEMBER, "team"))] == ["east"]
    assert _refused(build_report(ledger, NOVEMBER, "team", clusters=("west",))) == []


def _refused(report) -> list[dict]:
    return report.ingest.refused_dicts()
