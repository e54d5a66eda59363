"""A November 2026 report over billing's worked examples (docs/billing.md §8), checked to the cent in
every format: the model, CSV (summary and lines), JSON, FOCUS and HTML. The expected figures are
worked out by hand here, never computed by the code under test:

(a) A100 3g+2g+1g+1g at Nov 1 00:00: team-a 1.28, team-b 0.86 + 0.43 = 1.29, __unallocated__ 0.43.
(b) H100 time-sliced x4 at Nov 1 00:00 (efficiency 0.75): inference p1-p3 1.29 each + p4 0.65 = 4.52,
    __sharing_shortfall__ 1.50, __unallocated__ 0.86.
(c) H100 all November, v1 6.88 then v2 4.90 from Nov 16: research 2,476.80 + 588.00 = 3,064.80,
    __unallocated__ 240 x 4.90 = 1,176.00.
(d) A100 3g+3g at Nov 1 00:00: ns-a 1.29, ns-b 1.28, __stranded__ 0.43.
Plus an unpriced VR200 hour (1 GPU-hour, no amount) and, in October, (a)'s layout held by team-a only:
team-a 3/7 x 3 = 1.2857 -> 1.29 (largest remainder), __unallocated__ 4/7 x 3 = 1.7142 -> 1.71.

Teams: alpha = team-a + ns-a = 1.28 + 1.29 = 2.57 (October 1.29, change +1.28);
beta = team-b + inference + ns-b = 1.29 + 4.52 + 1.28 = 7.09; gamma = research = 3,064.80.
Platform: __unallocated__ 0.43 + 0.86 + 1,176.00 = 1,177.29; __stranded__ 0.43; __sharing_shortfall__ 1.50.
Total = 3.00 + 6.88 + 4,240.80 + 3.00 = 4,253.68 (October 3.00, change +4,250.68).
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from datetime import UTC, datetime
from decimal import Decimal

import pytest

from gpumeter.billing.allocate import price_gpu_hour
from gpumeter.billing.ledger.base import HourRecord
from gpumeter.reports import focus
from gpumeter.reports.model import build_report, month_period
from gpumeter.reports.render import file_names, render
from gpumeter.reports.run import generate
from tests.billing.factories import A100, HOUR0, alloc, book, gpu_hour, mig
from tests.reports.helpers import html_tables, read_csv

D = Decimal
NOVEMBER = month_period("2026-11")
TEAMS = {"alpha": D("2.57"), "beta": D("7.09"), "gamma": D("3064.80")}
PLATFORM = {"unallocated": D("1177.29"), "stranded": D("0.43"), "sharing_shortfall": D("1.50")}
NAMESPACES = {
    "team-a": D("1.28"),
    "team-b": D("1.29"),
    "inference": D("4.52"),
    "ns-a": D("1.29"),
    "ns-b": D("1.28"),
    "research": D("3064.80"),
    "__unallocated__": D("1177.29"),
    "__stranded__": D("0.43"),
    "__sharing_shortfall__": D("1.50"),
}
TOTAL = D("4253.68")
FIXED_NOW = datetime(2026, 12, 1, 1, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def rendered(worked_ledger, tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    result = generate(worked_ledger, NOVEMBER, "team", ("html", "csv", "json", "focus"), out, now=FIXED_NOW)
    names = file_names(result.report, ("html", "csv", "json", "focus"))
    return result, {fmt: [out / n for n in ns] for fmt, ns in names.items()}


def test_model_figures_to_the_cent(rendered):
    report = rendered[0].report
    assert {g.key: g.usage.cost for g in report.groups} == TEAMS
    assert {p.kind: p.usage.cost for p in report.platform} == PLATFORM
    assert report.total.cost == TOTAL
    assert report.tenants.cost == D("2.57") + D("7.09") + D("3064.80")
    assert [(u.model, u.gpu_hours, u.gpus) for u in report.unpriced] == [("NVIDIA VR200", D("1"), 1)]
    alpha = next(g for g in report.groups if g.key == "alpha")
    assert (alpha.change.previous, alpha.change.delta) == (D("1.29"), D("1.28"))
    assert (report.total_change.previous, report.total_change.delta) == (D("3.00"), D("4250.68"))
    # GPU-hours: alpha 3/7 + 3/7 (6 dp each) = 0.857142; slice-hours: two 3g instances for 1 h = 6.
    assert alpha.usage.gpu_hours == D("0.857142")
    assert alpha.usage.slice_hours == D("6.000")
    beta = next(g for g in report.groups if g.key == "beta")
    # team-b 2/7 + 1/7, inference 0.25 x 3 + 0.125, ns-b 3/7 -> 0.285714 + 0.142857 + 0.875 + 0.428571
    assert beta.usage.gpu_hours == D("1.732142")
    assert beta.usage.slice_hours == D("6.000")  # 2g + 1g + 3g for an hour
    # utilization known on (a) only: beta (2/7 x 0.6 + 1/7 x 0.9) / (3/7) = 0.7; tiers 0.8 and 1.0 -> 2.6/3
    assert beta.usage.utilization == pytest.approx(0.7, abs=1e-5)
    assert beta.usage.efficiency == pytest.approx(2.6 / 3, abs=1e-5)
    assert alpha.usage.utilization == pytest.approx(0.2, abs=1e-9)
    assert alpha.usage.efficiency == pytest.approx(0.5, abs=1e-9)
    gamma = next(g for g in report.groups if g.key == "gamma")
    assert gamma.usage.gpu_hours == D("480") and gamma.usage.slice_hours == 0
    assert [(p.namespace, p.pod, p.usage.cost) for p in report.top_pods[:5]] == [
        ("research", "trainer", D("3064.80")),
        ("inference", "p1", D("1.29")),
        ("inference", "p2", D("1.29")),
        ("inference", "p3", D("1.29")),
        ("ns-a", "a", D("1.29")),
    ]
    days = dict(report.daily)
    # Nov 1: (a) 3.00 + (b) 6.88 + (d) 3.00 + 24 h x 6.88 = 178.00; Nov 16: 24 x 4.90 = 117.60 research
    assert sum(days[datetime(2026, 11, 1).date()].values()) == D("178.00")
    assert days[datetime(2026, 11, 16).date()] == {"gamma": D("117.60")}
    assert days[datetime(2026, 11, 30).date()] == {"__unallocated__": D("117.60")}


def test_grouping_by_namespace_model_profile_and_label(worked_ledger):
    by_ns = build_report(worked_ledger, NOVEMBER, "namespace")
    assert {g.key: g.usage.cost for g in by_ns.groups} == {
        k: v for k, v in NAMESPACES.items() if not k.startswith("__")
    }
    by_model = build_report(worked_ledger, NOVEMBER, "model")
    # A100: 1.28 + 1.29 + 1.29 + 1.28 = 5.14; H100: 4.52 + 3,064.80 = 3,069.32
    assert {g.key: g.usage.cost for g in by_model.groups} == {
        "A100-40GB": D("5.14"),
        "H100-80GB": D("3069.32"),
    }
    by_profile = build_report(worked_ledger, NOVEMBER, "mig_profile")
    # 3g: 1.28 + 1.29 + 1.28 = 3.85; 2g 0.86; 1g 0.43; whole GPUs 4.52 + 3,064.80
    assert {g.key: g.usage.cost for g in by_profile.groups} == {
        "3g.20gb": D("3.85"),
        "2g.10gb": D("0.86"),
        "1g.5gb": D("0.43"),
        "(whole GPU)": D("3069.32"),
    }
    by_label = build_report(worked_ledger, NOVEMBER, "label:team")  # namespace label team (ledger's team)
    assert {g.key: g.usage.cost for g in by_label.groups} == TEAMS


def test_csv_summary_and_lines_to_the_cent(rendered):
    summary_path, lines_path = rendered[1]["csv"]
    rows = {r["group"]: r for r in read_csv(summary_path)}
    assert {k: D(rows[k]["cost"]) for k in TEAMS} == TEAMS
    assert D(rows["__unallocated__"]["cost"]) == D("1177.29")
    assert D(rows["__stranded__"]["cost"]) == D("0.43")
    assert D(rows["__sharing_shortfall__"]["cost"]) == D("1.50")
    assert (
        rows["__unpriced__ NVIDIA VR200"]["cost"] == ""
        and rows["__unpriced__ NVIDIA VR200"]["gpu_hours"] == "1.000000"
    )
    # every row as wide as the header: the unpriced row's versions were once a 17th, headerless field
    assert all(None not in row for row in rows.values())
    assert rows["__unpriced__ NVIDIA VR200"]["price_book_versions"] == rows["alpha"]["price_book_versions"]
    assert rows["__total__"]["cost"] == "4253.68"
    assert (rows["alpha"]["previous_cost"], rows["alpha"]["change"]) == ("1.29", "1.28")
    assert rows["alpha"]["slice_hours"] == "6.000000" and rows["alpha"]["gpu_hours"] == "0.857142"
    assert rows["alpha"]["price_book_versions"].count("@") == 2
    per_ns: dict[str, Decimal] = defaultdict(D)
    for row in read_csv(lines_path):
        if row["cost"]:
            per_ns[row["namespace"]] += D(row["cost"])
    assert dict(per_ns) == NAMESPACES


def test_json_to_the_cent(rendered):
    doc = json.loads(rendered[1]["json"][0].read_text())
    assert {g["group"]: D(g["cost"]) for g in doc["groups"]} == TEAMS
    assert {p["line"]: D(p["cost"]) for p in doc["platform"]} == PLATFORM
    assert doc["totals"]["all"]["cost"] == "4253.68"
    assert doc["totals"]["all"]["change"] == "4250.68"
    alpha = next(g for g in doc["groups"] if g["group"] == "alpha")
    assert (alpha["previous_cost"], alpha["change"]) == ("1.29", "1.28")
    assert doc["unpriced"] == [{"gpu_model": "NVIDIA VR200", "gpu_hours": "1.000000", "gpus": 1}]
    gamma = next(g for g in doc["groups"] if g["group"] == "gamma")
    assert gamma["daily"]["2026-11-15"] == "165.12" and gamma["daily"]["2026-11-16"] == "117.60"


def test_focus_to_the_cent_and_schema_check(rendered):
    path = rendered[1]["focus"][0]
    assert focus.check_file(path) == []
    rows = read_csv(path)
    per_ns: dict[str, Decimal] = defaultdict(D)
    for row in rows:
        per_ns[row["x_Namespace"]] += D(row["BilledCost"])
        assert row["BilledCost"] == row["EffectiveCost"]
    assert per_ns.pop("__unpriced__") == 0
    assert dict(per_ns) == NAMESPACES
    assert sum(D(r["BilledCost"]) for r in rows) == TOTAL
    team_a = next(r for r in rows if r["x_Namespace"] == "team-a")
    # 3g.20gb on A100 at 3.00, billed 1.28 of the GPU-hour's 3.00 (example (a): 1.28, 0.86, 0.43 and
    # 0.43 unallocated): the GPU-hour split by billed cost in millionths, 426,666.67 + 286,666.67 +
    # 143,333.33 + 143,333.33 floored leave 2 for the two largest remainders, team-a's and b-0's:
    # PricingQuantity 0.426667, ListCost 3 x 0.426667 = 1.280001; the four sum to 1 GPU-hour, 3.00
    assert (team_a["PricingQuantity"], team_a["ListUnitPrice"], team_a["ListCost"]) == (
        "0.426667",
        "3",
        "1.280001",
    )
    gpu_a = [
        r for r in rows if r["x_GpuUuid"] == "GPU-a" and r["ChargePeriodStart"] == team_a["ChargePeriodStart"]
    ]
    assert sorted(r["PricingQuantity"] for r in gpu_a) == ["0.143333", "0.143333", "0.286667", "0.426667"]
    assert sum(D(r["ListCost"]) for r in gpu_a) == D("3.00")
    # the holder's own figure, 3 slice-hours, is an x_ column; the origin's unit is the GPU's
    assert (team_a["ConsumedQuantity"], team_a["ConsumedUnit"], team_a["x_SliceHours"]) == (
        "0.426667",
        "GPU-Hours",
        "3",
    )
    assert (team_a["x_MigProfile"], team_a["x_GpuUuid"], team_a["ResourceType"], team_a["ResourceId"]) == (
        "3g.20gb",
        "GPU-a",
        "GPU",
        "GPU-a",
    )
    # the origin charge's SKU is the GPU's, priced by the version in effect; the profile is x_MigProfile
    assert team_a["SkuId"] == "gpu-a100-40gb" and team_a["SkuPriceId"].startswith("a100-40gb:")
    # FOCUS 1.3: the GPU's tags in Tags, the holder's in AllocatedTags (which must not repeat Tags)
    assert json.loads(team_a["Tags"]) == {"gpumeter/gpu_model": "A100-40GB", "gpumeter/pool": "A100-40GB"}
    assert (team_a["SubAccountId"], team_a["SubAccountType"]) == ("pool/A100-40GB", "GPU Pool")
    assert json.loads(team_a["AllocatedTags"]) == {
        "gpumeter/container": "main",
        "gpumeter/namespace": "team-a",
        "gpumeter/pod": "a-0",
        "gpumeter/team": "alpha",
    }
    research = [r for r in rows if r["x_Namespace"] == "research"]
    # one row per UTC day held (Nov 1-20): 15 days x 24 x 6.88 = 165.12 each, 5 days x 24 x 4.90 = 117.60
    assert len(research) == 20
    assert {(r["ListUnitPrice"], r["BilledCost"]) for r in research} == {("6.88", "165.12"), ("4.9", "117.6")}
    assert research[0]["ChargePeriodStart"] == "2026-11-01T00:00:00Z"
    assert research[0]["ChargePeriodEnd"] == "2026-11-02T00:00:00Z"
    # SkuPriceId names the terms that price the model (tests/reports/test_focus13.py: stable over time)
    assert {r["SkuPriceId"] for r in research} == {"h100-80gb:646555eed861", "h100-80gb:3a085df5f3e0"}
    # the platform's lines are told apart by x_LineKind alone: their sub-account is the GPU's pool
    unallocated = [r for r in rows if r["x_LineKind"] == "unallocated"]
    assert unallocated and all(r["SubAccountId"].startswith("pool/") for r in unallocated)
    unpriced = [r for r in rows if r["x_Unpriced"] == "true"]
    # no price, so a list cost and unit prices of 0: FOCUS allows no null unit price on a Usage row
    assert [
        (r["BilledCost"], r["ListCost"], r["ListUnitPrice"], r["ContractedUnitPrice"], r["PricingQuantity"])
        for r in unpriced
    ] == [("0", "0", "0", "0", "1")]


def test_focus_hourly_grain_is_one_row_per_ledger_line(worked_ledger, tmp_path):
    report = build_report(worked_ledger, NOVEMBER, "team", grain="hour")
    render(report, tmp_path, ("focus",))
    rows = read_csv(tmp_path / "gpumeter-2026-11-focus-1.3.csv")
    lines = worked_ledger.lines(NOVEMBER.start, NOVEMBER.end)
    assert len(rows) == len(lines)
    assert sum(D(r["BilledCost"]) for r in rows) == TOTAL
    assert focus.check_file(tmp_path / "gpumeter-2026-11-focus-1.3.csv") == []


def test_html_to_the_cent(rendered):
    text = rendered[1]["html"][0].read_text()
    tables = html_tables(text)
    # amounts are shown with thousands separators: "4,253.68"
    groups = {row[0]: [cell.replace(",", "") for cell in row] for row in tables["groups"][1:]}
    assert {k: D(groups[k][1]) for k in TEAMS} == TEAMS
    assert D(groups["__unallocated__"][1]) == D("1177.29")
    assert D(groups["__stranded__"][1]) == D("0.43")
    assert D(groups["__sharing_shortfall__"][1]) == D("1.50")
    assert groups["total"][1] == "4253.68"
    assert (groups["alpha"][7], groups["alpha"][8]) == ("1.29", "1.28")
    assert "__unpriced__ (NVIDIA VR200)" in groups
    top = tables["top-pods"][1:]
    assert (top[0][0], top[0][1], top[0][5]) == ("research", "trainer", "3,064.80")
    assert 'id="kpi-total">4,253.68<' in text and 'id="kpi-unallocated">1,177.29<' in text
    # one section per team, the plotly library once, the price-book versions and ingest runs named
    assert text.count('<section class="group"') == 3
    assert text.count("plotly.js v") <= 2 and text.count("Plotly.newPlot") == 1
    assert "720 of 720 hours ingested" in text
    for version in rendered[0].report.price_versions:
        assert version.digest in text


def test_same_ledger_renders_byte_identical_csv_focus_and_json(worked_ledger, rendered, tmp_path):
    first = rendered[0]
    again = generate(
        worked_ledger, NOVEMBER, "team", ("csv", "json", "focus"), tmp_path, now=datetime.now(UTC)
    )
    for name, digest in again.files.items():
        assert first.files[name] == digest, name
    assert (tmp_path / "gpumeter-2026-11-focus-1.3.csv").read_bytes() == rendered[1]["focus"][0].read_bytes()


def test_report_names_price_book_versions_and_ingest_runs(rendered, worked_ledger):
    result = rendered[0]
    report = result.report
    assert [v.effective_from.isoformat() for v in report.price_versions] == [
        "2026-01-01T00:00:00+00:00",
        "2026-11-16T00:00:00+00:00",
    ]
    assert report.ingest.hours_in_period == 720 and report.ingest.hours_ingested == 720
    assert report.ingest.missing == [] and report.ingest.runs_used == 720
    manifest = json.loads((result.out_dir / "manifest.json").read_text())
    assert manifest["files"] == result.files
    assert manifest["ingest_runs"]["digest"] == report.ingest.digest
    runs = [r for r in worked_ledger.report_runs(NOVEMBER.start) if r.id == result.run_id]
    assert len(runs) == 1
    assert runs[0].files == result.files and runs[0].status == "ok"
    assert [v["label"] for v in runs[0].price_book_versions] == [
        v["label"] for v in manifest["price_book_versions"]
    ]


def test_html_is_self_contained(rendered):
    text = rendered[1]["html"][0].read_text()
    # no external resource: outside the inline plotly.js bundle, every src/href is an in-page anchor
    from gpumeter.reports.render import plotly_js

    assert text.count(plotly_js()) == 1
    page = text.replace(plotly_js(), "")
    assert re.findall(r'\b(?:src|href)="(?!#)', page) == []
    assert "<link" not in page and "http" not in page


def test_idle_spread_shows_as_the_tenants_idle_share(ledger, tmp_path):
    # billing's idle: spread example: ns-a holds one 3g.20gb of an A100 3g+3g at 3.00; exact tenant
    # 3/7 x 3 = 1.2857.. (floor 1.28, rem .5714), idle share 4/7 x 3 = 1.7142.. (floor 1.71, rem .4285);
    # residue 1 cent to the tenant line: 1.29 + 1.71 = 3.00, nothing left on platform lines.
    prices = book(tmp_path, {"A100-40GB": {"hourly_rate": "3.00"}}, idle="spread")
    u = "GPU-s"
    gh = gpu_hour(
        u,
        A100,
        [mig(u, "1", "3g.20gb"), mig(u, "2", "3g.20gb")],
        [alloc(u, "ns-a", "a", gi="1", profile="3g.20gb")],
    )
    ledger.write_hour(HourRecord(HOUR0, [gh], price_gpu_hour(gh, prices, {"ns-a": "alpha"}).lines, prices))
    report = build_report(ledger, NOVEMBER, "team")
    [alpha] = report.groups
    assert (alpha.key, alpha.usage.cost, alpha.usage.idle_share) == ("alpha", D("3.00"), D("1.71"))
    assert alpha.usage.gpu_hours == D("0.428571")  # held, not the spread idle capacity
    assert report.platform == []
    render(report, tmp_path / "out", ("csv", "focus"))
    rows = {r["group"]: r for r in read_csv(tmp_path / "out" / "gpumeter-2026-11-by-team.csv")}
    assert (rows["alpha"]["cost"], rows["alpha"]["idle_share_cost"]) == ("3.00", "1.71")
    assert focus.check_file(tmp_path / "out" / "gpumeter-2026-11-focus-1.3.csv") == []


def test_an_empty_period_renders_every_format(ledger, tmp_path):
    result = generate(ledger, month_period("2027-02"), "team", ("html", "csv", "json", "focus"), tmp_path)
    report = result.report
    assert report.groups == [] and report.total.cost == 0
    assert report.ingest.hours_ingested == 0 and report.ingest.missing == [
        (report.period.start, report.period.end)
    ]
    focus_path = tmp_path / "gpumeter-2027-02-focus-1.3.csv"
    assert focus_path.read_text().count("\n") == 1 and focus.check_file(focus_path) == []
    assert "0 of 672 hours ingested" in (tmp_path / "gpumeter-2027-02-by-team.html").read_text()
