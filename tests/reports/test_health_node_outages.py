"""Node downtime in the fleet-health report's failure statistics (seed 002 §4.1: "GPU drop-offs and
node downtime"): a node none of whose GPUs is reported is down, one outage per run of 5-minute points,
counted once as a failure of the node, of each pool its GPUs are in and of the fleet.

A real Prometheus holds a 100-hour history built by hand, every series sampled at :30 past each
minute (so no sample lies on a 5-minute point's lookback edge):

| node | GPUs | history |
|---|---|---|
| node-a | 2 x A100 | silent h20-h23 (3 h) and h50-h50.5 (30 min) |
| node-b | 1 x H100 | silent from h90 to the end |
| node-c | 1 x A100 | joins at h30 (not down before) |
"""

from __future__ import annotations

import csv
import json
from datetime import UTC, datetime, timedelta

import pytest

import gpumeter
from gpumeter.billing.ledger import open_ledger
from gpumeter.billing.prom import PrometheusClient
from gpumeter.reports.health import build_health
from gpumeter.reports.model import range_period
from tests.billing.conftest import prometheus_holding

pytestmark = [pytest.mark.prometheus]

START = datetime(2026, 10, 1, tzinfo=UTC)
PERIOD = range_period(START, START + timedelta(hours=100))
A100, H100 = "NVIDIA A100-SXM4-40GB", "NVIDIA H100 80GB HBM3"
GPUS = {"GPU-a0": (A100, "node-a"), "GPU-a1": (A100, "node-a"), "GPU-b0": (H100, "node-b")}
GPUS |= {"GPU-c0": (A100, "node-c")}
SILENT = {"node-a": [(20, 23), (50, 50.5)], "node-b": [(90, 200)], "node-c": [(-10, 30)]}


def _answers(node: str, h: float) -> bool:
    return not any(a <= h < b for a, b in SILENT[node])


def _history() -> str:
    out = []
    for family in ("nvidia_gpu_info", "nvidia_gpu_up"):
        out.append(f"# TYPE {family} gauge")
        for t in range(int(START.timestamp()) - 3600 + 30, int(START.timestamp()) + 101 * 3600, 60):
            h = (t - START.timestamp()) / 3600
            for i, (uuid, (model, node)) in enumerate(GPUS.items()):
                if _answers(node, h):
                    extra = (
                        f',model="{model}",hostname="{node}",mig_mode="disabled"'
                        if family == "nvidia_gpu_info"
                        else ""
                    )
                    out.append(f'{family}{{gpu="{i}",uuid="{uuid}"{extra}}} 1 {t}')
    out.append("# EOF")
    return "\n".join(out) + "\n"


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    root = tmp_path_factory.mktemp("node-outages")
    ledger = open_ledger(f"sqlite:///{root / 'ledger.db'}")
    with prometheus_holding(_history(), root) as server, PrometheusClient(server.url) as client:
        yield build_health(client, ledger, PERIOD), server.url, root
    ledger.close()


def test_node_outages_are_counted_once_per_node_and_run(report):
    report, _, _ = report
    # A 5-minute point is absent when no sample lies in the 5 minutes before it: silent from a to b,
    # the points a+5 min ... b are absent, (b - a) x 12 of them. node-a: 36 + 6 points = 3.5 h, two runs.
    # node-b: from h90:05 to the period's last point, h99:55: 119 points = 9.916667 h, one run.
    outages = {n.hostname: (n.outages, n.down_hours) for n in report.node_outages}
    assert outages == {"node-a": (2, pytest.approx(3.5)), "node-b": (1, pytest.approx(119 * 300 / 3600))}
    nodes = dict(report.nodes)
    assert (nodes["node-a"].node_outages, nodes["node-a"].failures) == (2, 2)  # once, not once per GPU
    assert (nodes["node-c"].node_outages, nodes["node-c"].failures) == (0, 0)  # joined late: not down
    pools = dict(report.pools)
    assert (pools[A100].node_outages, pools[A100].failures) == (2, 2)
    assert pools[A100].node_down_hours == pytest.approx(3.5)
    assert (pools[H100].node_outages, pools[H100].failures) == (1, 1)
    fleet = report.fleet
    assert (fleet.node_outages, fleet.failures) == (3, 3)
    assert fleet.node_down_hours == pytest.approx(3.5 + 119 * 300 / 3600)
    assert (
        fleet.lost_incidents == 0
    )  # a GPU whose node is down is not a lost GPU (nvidia_gpu_up absent, not 0)


def test_node_outages_reach_the_csv_json_and_html(report, capsys):
    _, url, root = report
    out = root / "out"
    argv = ["report", "--kind", "health", "--prometheus", url, "--db", f"sqlite:///{root / 'ledger.db'}"]
    argv += ["--from", "2026-10-01T00:00Z", "--to", "2026-10-05T04:00Z", "--out", str(out), "--no-record"]
    assert gpumeter.main(argv) == 0
    assert ", 3 failure(s)," in capsys.readouterr().out
    with next(out.glob("*-pools.csv")).open() as f:
        rows = {(r["level"], r["name"]): r for r in csv.DictReader(f)}
    assert (rows[("node", "node-a")]["node_outages"], rows[("node", "node-a")]["node_down_hours"]) == (
        "2",
        "3.500000",
    )
    assert rows[("fleet", "__fleet__")]["node_outages"] == "3"
    doc = json.loads(next(out.glob("*.json")).read_text())
    assert doc["fleet"]["node_outages"] == 3 and doc["fleet"]["failures"] == 3
    html = next(out.glob("*.html")).read_text()
    assert "node down (times)" in html
