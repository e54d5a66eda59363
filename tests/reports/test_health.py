"""The fleet-health report from a real Prometheus holding a history built here (backfilled by promtool)
and a real ledger: every figure against numbers worked out by hand below, escaping, CLI and Chromium.

The history: 10 days, 2026-10-01T00Z .. 2026-10-11T00Z (240 h), a sample every 5 minutes, plus 2 h
before (the counters' values before the period) and 4 h after (events that must not count).

| GPU | model, node | utilization | events in the period |
|---|---|---|---|
| GPU-a0 | A100, node-a | 0.9 | XID 48 at h50 and h150 (critical); HW thermal 100 s -> 1900 s at h10 (0.5 h); XID 48 again at h241 (after) |
| GPU-a1 | A100, node-a | 0.5 | XID 31 at h20, h30, exporter restart h40-h60 (counter gone), again at h60 (3, application); 3 rows remapped (uncorrected) at h190; remap pending h180-h200; remap failure from h200 |
| GPU-v0 | V100, node-v | 0.2 | XID 94 5 -> 6 at h70 (counter from before: 1 event, hardware); retired pages corrected 50, uncorrected 14 -> 16 at h50 -> 18 at h230; retirement pending h230-h235; SW thermal 0 -> 3600 s at h20 (1 h); sw_power_cap (not thermal) +99999 s |
| GPU-v1 | V100, node-v | 0.2 | lost h100-h110 (nvidia_gpu_up 0, 10 h) with XID 79 at h100 |
| GPU-h0 | H100, node-h, MIG 3g + 2g + 1g (one slice uncovered) | SM 0.6, 0.3, 0.0 | XID 13 7 -> 8 at h5, unscraped h-0.5..h1; XID 92 9 before, 1 from h0 (restart) |
| GPU-a2 | A100, node-a, MIG 3g | none (no GPM on Ampere) | none |
"""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

import gpumeter
from gpumeter.billing.allocate import price_gpu_hour
from gpumeter.billing.ledger import open_ledger
from gpumeter.billing.ledger.base import HourRecord
from gpumeter.billing.models import Allocation
from gpumeter.billing.pricing import load_price_book
from gpumeter.billing.prom import PrometheusClient
from gpumeter.reports.health import build_health, maturity_level, xid_class
from gpumeter.reports.model import range_period
from tests.billing.conftest import QUERY_BACKENDS, prometheus_holding, serve_history
from tests.billing.factories import alloc, gpu_hour, write_book
from tests.reports import browser

pytestmark = [pytest.mark.prometheus]

START = datetime(2026, 10, 1, tzinfo=UTC)
END = START + timedelta(hours=240)
STEP = 300
A100, V100, H100 = "NVIDIA A100-SXM4-40GB", "Tesla V100-SXM2-32GB", "NVIDIA H100 80GB HBM3"
# uuid: model, node, utilization (None: a GPU in MIG mode, no whole-GPU utilization)
GPUS = {"GPU-a0": (A100, "node-a", 0.9), "GPU-a1": (A100, "node-a", 0.5), "GPU-a2": (A100, "node-a", None)}
GPUS |= {"GPU-v0": (V100, "node-v", 0.2), "GPU-v1": (V100, "node-v", 0.2), "GPU-h0": (H100, "node-h", None)}
# (uuid, gpu_instance_id, profile, compute slices, SM utilization or None)
MIG = [
    ("GPU-h0", "1", "3g.40gb", 3, 0.6),
    ("GPU-h0", "2", "2g.20gb", 2, 0.3),
    ("GPU-h0", "3", "1g.10gb", 1, 0.0),
]
MIG += [("GPU-a2", "1", "3g.20gb", 3, None)]
PWN = "document.documentElement.setAttribute('data-pwned','1')"
EVIL_TEAM = f'=HYPERLINK("x")<script>{PWN}</script>'


def _lost(uuid: str, h: float) -> bool:
    return uuid == "GPU-v1" and 100 <= h < 110


def _step(h: float, changes: list[tuple[float, float]]) -> float | None:
    """The value of a step function: ``changes`` is [(from hour, value)], None before the first."""
    value = None
    for since, v in changes:
        if h >= since:
            value = v
    return value


def _history() -> str:
    """OpenMetrics text of the history in the module docstring, family by family, time-major."""
    dev = {u: f'gpu="{i}",uuid="{u}"' for i, u in enumerate(GPUS)}
    families: dict[str, list] = {
        "nvidia_gpu_info": [
            (
                f'{dev[u]},model="{m}",hostname="{n}",mig_mode="{"disabled" if x else "enabled"}"',
                lambda h: 1.0,
            )
            for u, (m, n, x) in GPUS.items()
        ],
        "nvidia_gpu_mig_info": [
            (f'{dev[u]},gpu_instance_id="{gi}",mig_profile="{p}",compute_slices="{c}"', lambda h: 1.0)
            for u, gi, p, c, _ in MIG
        ],
        "nvidia_gpu_mig_sm_utilization_ratio": [
            (f'{dev[u]},gpu_instance_id="{gi}"', lambda h, x=x: x) for u, gi, _, _, x in MIG if x is not None
        ],
        "nvidia_gpu_up": [(dev[u], lambda h, u=u: 0.0 if _lost(u, h) else 1.0) for u in GPUS],
        "nvidia_gpu_utilization_ratio": [
            (dev[u], lambda h, u=u, x=x: None if _lost(u, h) else x)
            for u, (_, _, x) in GPUS.items()
            if x is not None
        ],
        "nvidia_gpu_xid_errors_total": [
            (f'{dev["GPU-a0"]},xid="48"', lambda h: _step(h, [(50, 1), (150, 2), (241, 3)])),
            (
                f'{dev["GPU-a1"]},xid="31"',
                lambda h: None if 40 <= h < 60 else _step(h, [(20, 1), (30, 2), (60, 1)]),
            ),
            (f'{dev["GPU-v0"]},xid="94"', lambda h: _step(h, [(-2, 5), (70, 6)])),
            (f'{dev["GPU-v1"]},xid="79"', lambda h: _step(h, [(100, 1)])),
            # not scraped in the half hour around the start: 7 before, still 7, then 8 at h5 (1 event)
            (f'{dev["GPU-h0"]},xid="13"', lambda h: None if -0.5 <= h < 1 else _step(h, [(-2, 7), (5, 8)])),
            # the exporter restarted at the start: 9 before, then its first event at h0 (1 event, not -8)
            (f'{dev["GPU-h0"]},xid="92"', lambda h: _step(h, [(-2, 9), (0, 1)])),
        ],
        "nvidia_gpu_remapped_rows_total": [
            (f'{dev["GPU-a1"]},error_type="uncorrected"', lambda h: _step(h, [(-2, 0), (190, 3)])),
            (f'{dev["GPU-a1"]},error_type="corrected"', lambda h: 0.0),
        ],
        "nvidia_gpu_remapped_rows_pending": [(dev["GPU-a1"], lambda h: 1.0 if 180 <= h < 200 else 0.0)],
        "nvidia_gpu_remapped_rows_failure": [(dev["GPU-a1"], lambda h: 1.0 if h >= 200 else 0.0)],
        "nvidia_gpu_retired_pages_total": [
            (f'{dev["GPU-v0"]},error_type="corrected"', lambda h: 50.0),
            (
                f'{dev["GPU-v0"]},error_type="uncorrected"',
                lambda h: _step(h, [(-2, 14), (50, 16), (230, 18)]),
            ),
        ],
        "nvidia_gpu_retired_pages_pending": [(dev["GPU-v0"], lambda h: 1.0 if 230 <= h < 235 else 0.0)],
        "nvidia_gpu_clocks_event_seconds_total": [
            (f'{dev["GPU-a0"]},reason="hw_thermal"', lambda h: _step(h, [(-2, 100), (10, 1900)])),
            (f'{dev["GPU-v0"]},reason="sw_thermal"', lambda h: _step(h, [(-2, 0), (20, 3600)])),
            (f'{dev["GPU-v0"]},reason="sw_power_cap"', lambda h: _step(h, [(-2, 0), (20, 99999)])),
        ],
    }
    first, last = int(START.timestamp() - 2 * 3600), int(END.timestamp() + 4 * 3600)
    out = []
    for family, series in families.items():
        out.append(f"# TYPE {family} unknown")
        for t in range(first, last, STEP):
            h = (t - START.timestamp()) / 3600
            for labels, value in series:
                v = value(h)
                if v is not None:
                    out.append(f'{family}{{{labels},job="gpumeter-exporter",instance="x"}} {v} {t}')
    out.append("# EOF")
    return "\n".join(out) + "\n"


@pytest.fixture(scope="module")
def prom(tmp_path_factory):
    with prometheus_holding(_history(), tmp_path_factory.mktemp("health-prom")) as server:
        yield server


@pytest.fixture(scope="module", params=QUERY_BACKENDS)
def query_backend(request, prom, tmp_path_factory):
    """The history in each query backend billing supports: Prometheus, and VictoriaMetrics (its import
    API), whose PromQL dialect must give the same figures."""
    if request.param == "prometheus":
        yield prom
        return
    root = tmp_path_factory.mktemp("health-vm")
    source = root / "history.om"
    source.write_text(_history())
    server = serve_history(request.param, source, root)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def ledger(tmp_path):
    """Ten hours of tenant lines at the start of the period: alpha holds GPU-a0 busy (0.9); beta holds
    GPU-a1, idle (0.02) for 4 h then at 0.5; a team with a hostile name holds GPU-x idle (0.01) for 1 h.
    A100-40GB at 3.00 an hour."""
    book = load_price_book(
        write_book(
            tmp_path,
            {
                "currency": "USD",
                "versions": [{"effective_from": "2026-01-01T00:00:00Z", "gpus": {"A100-40GB": "3.00"}}],
            },
        )
    )
    teams = {"ns-alpha": "alpha", "ns-beta": "beta", "ns-evil": EVIL_TEAM}

    def busy(a: Allocation, u: str) -> Allocation:
        return Allocation(**{**a.__dict__, "utilization": Decimal(u)})

    led = open_ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    for h in range(10):
        hour = START + timedelta(hours=h)
        hours = [
            gpu_hour(
                "GPU-a0", A100, allocations=[busy(alloc("GPU-a0", "ns-alpha", "train"), "0.85")], hour=hour
            ),
            gpu_hour(
                "GPU-a1",
                A100,
                allocations=[busy(alloc("GPU-a1", "ns-beta", "svc"), "0.02" if h < 4 else "0.5")],
                hour=hour,
            ),
        ]
        if h == 0:
            hours.append(
                gpu_hour(
                    "GPU-x",
                    A100,
                    allocations=[busy(alloc("GPU-x", "ns-evil", "<b>p</b>"), "0.01")],
                    hour=hour,
                )
            )
        lines = [line for gh in hours for line in price_gpu_hour(gh, book, teams).lines]
        led.write_hour(HourRecord(hour, hours, lines, book))
    yield led
    led.close()


PERIOD = range_period(START, END)


def test_figures_match_the_hand_worked_history(query_backend, ledger):
    with PrometheusClient(query_backend.url) as client:
        report = build_health(client, ledger, PERIOD)
    gpus = {g.uuid: g for g in report.gpus}
    assert set(gpus) == set(GPUS)

    # hours in service: 240 each; GPU-v1 lost for h100-h110: 240 - 10 = 230
    assert {u: g.hours_up for u, g in gpus.items()} == {
        "GPU-a0": 240,
        "GPU-a1": 240,
        "GPU-a2": 240,
        "GPU-h0": 240,
        "GPU-v0": 240,
        "GPU-v1": 230,
    }
    # XIDs in the period; a0's third XID 48 (h241) is after it; a1's counter restarted and still counts 3
    assert gpus["GPU-a0"].xids == {48: 2}
    assert gpus["GPU-a1"].xids == {31: 3}
    assert gpus["GPU-v0"].xids == {94: 1}  # 5 before the period, 6 after h70
    assert gpus["GPU-v1"].xids == {79: 1}
    assert gpus["GPU-h0"].xids == {13: 1, 92: 1}  # across a scrape gap and a restart at the start
    assert (gpus["GPU-v1"].lost_incidents, gpus["GPU-v1"].lost_hours) == (1, 10.0)  # 120 points x 5 min
    assert gpus["GPU-a1"].remapped_rows == {"uncorrected": 3}
    assert gpus["GPU-a1"].remap_pending and gpus["GPU-a1"].remap_failure
    assert gpus["GPU-v0"].retired_pages == {"uncorrected": 4}  # 14 -> 16 -> 18
    assert gpus["GPU-v0"].retired_uncorrected_recent == 2  # h230 is in the last 7 days (from h72), h50 is not
    assert gpus["GPU-v0"].retired_pending
    # thermal: a0 HW 1800 s = 0.5 h; v0 SW 3600 s = 1 h; sw_power_cap is not thermal
    assert gpus["GPU-a0"].thermal_hours == pytest.approx(0.5)
    assert gpus["GPU-v0"].thermal_hours == pytest.approx(1.0)

    pools = dict(report.pools)
    # utilization: the H100 in MIG mode from its instances' SM utilization by compute slices over 7 (the
    # uncovered slice idle): (3 x 0.6 + 2 x 0.3 + 1 x 0.0) / 7 = 2.4 / 7; the A100 in MIG mode is not measured.
    assert gpus["GPU-h0"].utilization == pytest.approx(2.4 / 7) and gpus["GPU-a2"].utilization is None
    # A100 (0.9 + 0.5) / 2 = 0.7 -> level 3 (3 GPUs, 2 measured); H100 0.342857 -> level 2; V100 0.2 -> level 1;
    # fleet (0.9 + 0.5 + 0.2 + 0.2 + 2.4 / 7) / 5 = 0.428571 -> level 2
    assert (pools[A100].gpus, pools[A100].measured) == (3, 2)
    assert pools[A100].utilization == pytest.approx(0.7) and pools[A100].maturity == 3
    assert pools[H100].maturity == 2
    assert pools[V100].utilization == pytest.approx(0.2) and pools[V100].maturity == 1
    assert report.fleet.utilization == pytest.approx((1.8 + 2.4 / 7) / 5) and report.fleet.maturity == 2
    # failures: a0 2 (XID 48 twice); v1 1 (XID 79 and the loss are one fall off the bus); XID 31, 94 are not
    # A100: 3 x 240 = 720 GPU-hours / 2 = MTBF 360 h, AFR 2 x 8760 / 720 = 24.33; V100: 470 / 1 = 470 h;
    # H100: no failure, no MTBF; fleet: (720 + 240 + 470) / 3 = 476.67 h
    assert (pools[A100].failures, pools[A100].hours_up, pools[A100].mtbf_hours) == (2, 720, 360.0)
    assert pools[A100].annualized_failure_rate == pytest.approx(2 * 8760 / 720)
    assert (pools[V100].failures, pools[V100].hours_up, pools[V100].mtbf_hours) == (1, 470, 470.0)
    assert pools[V100].annualized_failure_rate == pytest.approx(8760 / 470)
    assert (pools[H100].failures, pools[H100].mtbf_hours, pools[H100].annualized_failure_rate) == (
        0,
        None,
        0.0,
    )
    assert report.fleet.mtbf_hours == pytest.approx(1430 / 3)
    # incidents by model (= by node here)
    assert pools[A100].xids == {"critical": 2, "hardware": 0, "application": 3}
    assert pools[V100].xids == {"critical": 1, "hardware": 1, "application": 0}
    assert (pools[V100].lost_gpus, pools[V100].lost_incidents, pools[V100].retired_pages) == (1, 1, 4)
    assert (pools[A100].remapped_rows, pools[A100].pending, pools[V100].pending) == (3, 1, 1)
    assert dict(report.nodes)["node-a"].xids == pools[A100].xids

    # RMA: a1 row-remap failure; v0 50 + 18 = 68 >= 63 retired pages, and 18 > 15 DBE with 2 > 1 in the week;
    # a0 XID 48 twice; v1 fell off the bus once only: not a candidate
    rma = {g.uuid: g.rma_reasons for g in report.rma}
    assert set(rma) == {"GPU-a0", "GPU-a1", "GPU-v0"}
    assert any("row-remap failure" in r for r in rma["GPU-a1"])
    assert len(rma["GPU-v0"]) == 2 and "68 retired pages" in rma["GPU-v0"][0]
    assert "XID 48/95 x2" in rma["GPU-a0"][0]

    # teams from the ledger: alpha 10 h x 3.00 = 30.00 at 0.85 (level 4, no waste); beta 30.00 at
    # (4 x 0.02 + 6 x 0.5) / 10 = 0.308 (level 2), 4 idle hours = 12.00; the hostile team 1 idle hour = 3.00
    teams = {t.team: t for t in report.teams}
    assert [t.team for t in report.teams] == ["beta", EVIL_TEAM, "alpha"]  # most waste first
    assert (teams["alpha"].cost, teams["alpha"].idle_hours, teams["alpha"].maturity) == (
        Decimal("30.00"),
        0,
        4,
    )
    assert teams["beta"].utilization == pytest.approx(0.308) and teams["beta"].maturity == 2
    assert (teams["beta"].idle_hours, teams["beta"].idle_cost) == (Decimal(4), Decimal("12.00"))
    assert report.waste == (Decimal(5), Decimal("15.00"))


def test_maturity_levels_and_xid_classes():
    # seed 003: level 1 < 30 %, 2 from 30 %, 3 from 50 %, 4 above 80 %, 5 above 90 %
    assert [maturity_level(u) for u in (0.0, 0.29, 0.3, 0.5, 0.8, 0.9, None)] == [1, 1, 2, 3, 4, 5, None]
    assert [xid_class(x) for x in (79, 31, 94, 999)] == ["critical", "application", "hardware", "hardware"]


def test_the_xid_classes_are_the_alerts_classes():
    """The report classes XIDs as GpuXidCritical and GpuXidApplication do (one catalog, two readers)."""
    import re
    from pathlib import Path

    import yaml

    from gpumeter.reports.health import APPLICATION_XIDS, CRITICAL_XIDS

    rules = yaml.safe_load((Path(__file__).parents[2] / "alerts" / "gpumeter-alerts.yaml").read_text())
    alerts = {r["alert"]: r["expr"] for g in rules["groups"] for r in g["rules"] if "alert" in r}

    def codes(alert: str) -> set[int]:
        return {int(x) for x in re.search(r'xid=~"([\d|]+)"', alerts[alert]).group(1).split("|")}

    assert codes("GpuXidCritical") == CRITICAL_XIDS
    assert codes("GpuXidApplication") == APPLICATION_XIDS


@pytest.mark.chromium
def test_cli_renders_html_csv_json_with_hostile_names_inert(prom, ledger, tmp_path, capsys):
    url = ledger.engine.url.render_as_string(hide_password=False)
    out = tmp_path / "out"
    argv = ["report", "--kind", "health", "--db", url, "--prometheus", prom.url]
    argv += ["--from", "2026-10-01T00:00Z", "--to", "2026-10-11T00:00Z", "--out", str(out)]
    assert gpumeter.main(argv) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert (
        "health 2026-10-01_2026-10-11: 6 GPU(s), 3 failure(s), 3 RMA candidate(s), idle 15.00 USD" in printed
    )
    label = "gpumeter-health-2026-10-01_2026-10-11"
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [
            f"{label}.html",
            f"{label}.json",
            f"{label}-pools.csv",
            f"{label}-gpus.csv",
            f"{label}-teams.csv",
            "manifest-health.json",
        ]
    )
    html = (out / f"{label}.html").read_text()
    assert "<script>document" not in html and "&lt;script&gt;document" in html
    teams = list(csv.DictReader(io.StringIO((out / f"{label}-teams.csv").read_text())))
    assert [t["team"] for t in teams][1] == "'" + EVIL_TEAM  # a spreadsheet never evaluates it
    assert teams[0] == {
        "team": "beta",
        "gpu_hours": "10.000000",
        "cost": "30.00",
        "currency": "USD",
        "mean_utilization": "0.308000",
        "maturity_level": "2",
        "unmeasured_gpu_hours": "0.000000",
        "idle_gpu_hours": "4.000000",
        "idle_cost": "12.00",
    }
    doc = json.loads((out / f"{label}.json").read_text())
    assert doc["schema"] == "gpumeter.health/1" and doc["teams"][1]["team"] == EVIL_TEAM
    assert doc["fleet"]["failures"] == 3 and doc["waste"]["idle_cost"] == "15.00"
    assert [r["pool"] for r in doc["pools"]] == [A100, H100, V100]
    pools = list(csv.DictReader(io.StringIO((out / f"{label}-pools.csv").read_text())))
    assert [(r["level"], r["name"], r["mtbf_hours"]) for r in pools if r["level"] != "node"] == [
        ("pool", A100, "360.000000"),
        ("pool", H100, ""),  # no failure: no MTBF
        ("pool", V100, "470.000000"),
        ("fleet", "__fleet__", "476.666667"),
    ]
    runs = [r for r in ledger.report_runs() if r.grouping == "health"]
    assert len(runs) == 1 and set(runs[0].files) == {
        p for p in json.loads((out / "manifest-health.json").read_text())["files"]
    }

    # in Chromium: both charts drawn, no script error, the hostile team name inert
    run = browser.load(out / f"{label}.html", tmp_path / "chromium")
    assert run.console == [], run.console
    assert "data-js-errors" not in run.root_attrs and "data-pwned" not in run.root_attrs
    assert run.root_attrs["data-charts"] == "2" and run.root_attrs.get("data-charts-drawn") == "2", (
        run.root_attrs
    )


def test_cli_refuses_focus_and_a_missing_prometheus(ledger, tmp_path, capsys):
    url = ledger.engine.url.render_as_string(hide_password=False)
    base = ["report", "--kind", "health", "--db", url, "--period", "2026-10", "--out", str(tmp_path / "o")]
    assert gpumeter.main([*base, "--format", "focus", "--prometheus", "http://127.0.0.1:1"]) == 2
    assert "format: the health report has html, csv, json (value 'focus')" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
    assert gpumeter.main([*base, "--prometheus", "http://127.0.0.1:1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: http://127.0.0.1:1: ConnectError") and err.count("\n") == 1


def test_monthly_job_renders_health_beside_the_chargeback(prom, ledger, tmp_path):
    from gpumeter.billing.config import Settings
    from gpumeter.reports.schedule import ReportSchedule
    from gpumeter.service import monthly_report

    url = ledger.engine.url.render_as_string(hide_password=False)
    schedule = ReportSchedule(out_dir=str(tmp_path), formats="html,csv,focus", spare_policy="0.5").as_dict()
    assert schedule["kinds"] == "chargeback,health"  # both by default
    now = datetime(2026, 11, 1, 1, 0, tzinfo=UTC)
    message = monthly_report(Settings(db=url, prometheus=prom.url).as_dict(), schedule, now=now)
    assert "failed" not in message
    month = tmp_path / "2026-10"
    assert (month / "gpumeter-2026-10-by-team.html").exists()  # the chargeback
    assert (month / "gpumeter-health-2026-10.html").exists() and (
        month / "gpumeter-health-2026-10-gpus.csv"
    ).exists()
    pools = list(csv.DictReader(io.StringIO((month / "gpumeter-health-2026-10-pools.csv").read_text())))
    # GPUMETER_REPORT_SPARE_POLICY reached the report: the A100 pool's 20 GPU-hours (a0 and a1 for 10
    # hours; GPU-x, which Prometheus never saw, pools apart by its lines' model), all held, never spare,
    # under the policy in each of its 10 hours
    a100 = next(r for r in pools if r["level"] == "pool" and r["name"] == A100)
    assert (a100["spare_policy"], a100["gpu_hours_billed"], a100["hours_below_spare_policy"]) == (
        "0.5",
        "20",
        "10",
    )
    doc = json.loads((month / "manifest-health.json").read_text())
    assert doc["trigger"] == "schedule" and doc["period"]["label"] == "2026-10"
    assert [r.grouping for r in ledger.report_runs() if r.trigger == "schedule"] == ["team", "health"]

    # Prometheus gone: the chargeback is still written, the job's result names the failed health report
    again = tmp_path / "again"
    schedule = ReportSchedule(out_dir=str(again)).as_dict()
    message = monthly_report(Settings(db=url, prometheus="http://127.0.0.1:1").as_dict(), schedule, now=now)
    assert "health report failed: PrometheusUnreachable: http://127.0.0.1:1: ConnectError" in message
    assert (again / "2026-10" / "gpumeter-2026-10-by-team.html").exists()
    assert not (again / "2026-10" / "gpumeter-health-2026-10.html").exists()


def test_history_refuses_incidents_nvml_would_not_report(tmp_path, capsys):
    """`gpumeter simulate history --incident`: a row remap on a GPU in MIG mode is refused, as NVML refuses
    nvmlDeviceGetRemappedRows there (docs/nvml.md §7); a GPU the fleets lack and a bad spelling too. One
    line naming the option and value, exit 2, nothing written."""
    out = tmp_path / "h.om"
    base = ["simulate", "history", "--fleet", "a100-mixed", "--from", "2026-10-01", "--to", "2026-10-02"]
    base += ["--out", str(out), "--incident"]
    cases = {
        "gpu-a100-mixed-01/0:row_remap=2@2026-10-01T03:00": "GPU 0 of gpu-a100-mixed-01 is in MIG mode",
        "gpu-a100-mixed-01/9:xid=48@2026-10-01T03:00": "no GPU 9 on a node 'gpu-a100-mixed-01'",
        "gpu-a100-mixed-01/2:meltdown@2026-10-01T03:00": "expected NODE/GPU:KIND[=VALUE]@WHEN",
    }
    for incident, message in cases.items():
        assert gpumeter.main([*base, incident]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    assert not out.exists()
