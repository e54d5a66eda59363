"""The fleet-health report's pool table: a GPU's pool is its NVLink domain where that spans nodes (an
NVL72 rack), else its node's pool label (kube_node_labels' label_nvidia_com_gpu_product, what the pool
rules read), else its GPU model; from a real Prometheus
holding a two-day history backfilled by promtool."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpumeter.billing.prom import PrometheusClient
from gpumeter.reports.health import HealthReport, read_devices
from gpumeter.reports.health_render import html_text
from gpumeter.reports.model import Period
from tests.billing.conftest import prometheus_holding

pytestmark = [pytest.mark.prometheus]

START = datetime(2026, 10, 1, tzinfo=UTC)
END = START + timedelta(days=2)
A100, H100 = "NVIDIA A100-SXM4-40GB", "NVIDIA H100 80GB HBM3"
GB200 = "NVIDIA GB200"
# uuid: node, model, utilization
GPUS = {
    "GPU-a": ("node-a", A100, 0.6),
    "GPU-b": ("node-b", A100, 0.2),
    "GPU-h": ("node-h", H100, 0.9),
    "GPU-t1": ("tray-1", GB200, 0.8),
    "GPU-t2": ("tray-2", GB200, 0.4),
}
# node-a, node-h and the trays carry the product label, node-b none: it pools by its model
LABELS = {
    "node-a": "NVIDIA-A100-SXM4-40GB",
    "node-h": "NVIDIA-H100-80GB-HBM3",
    "tray-1": "NVIDIA-GB200",
    "tray-2": "NVIDIA-GB200",
}
# NVLink domains: the two trays share rack R (it spans nodes: one pool, "nvlink-R"); node-h's HGX
# baseboard is its own domain H (one node: it pools by its label as before)
DOMAINS = {"GPU-t1": "R", "GPU-t2": "R", "GPU-h": "H"}


def _history() -> str:
    lines = []
    times = range(int(START.timestamp()), int(END.timestamp()), 300)
    for name, rows in (
        (
            "nvidia_gpu_info",
            [
                (f'gpu="0",uuid="{u}",hostname="{n}",model="{m}",mig_mode="disabled"', 1.0)
                for u, (n, m, _) in GPUS.items()
            ],
        ),
        ("nvidia_gpu_up", [(f'gpu="0",uuid="{u}"', 1.0) for u in GPUS]),
        (
            "nvidia_gpu_fabric_info",
            [
                (
                    f'gpu="0",uuid="{u}",nvlink_domain="{d}",clique_id="1",state="completed",status="success"',
                    1.0,
                )
                for u, d in DOMAINS.items()
            ],
        ),
        ("nvidia_gpu_utilization_ratio", [(f'gpu="0",uuid="{u}"', x) for u, (_, _, x) in GPUS.items()]),
        (
            "kube_node_labels",
            [(f'node="{n}",label_nvidia_com_gpu_product="{p}"', 1.0) for n, p in LABELS.items()],
        ),
    ):
        lines.append(f"# TYPE {name} gauge")
        for labels, value in rows:
            lines += [f"{name}{{{labels}}} {value} {t}" for t in times]
    return "\n".join(lines) + "\n# EOF\n"


def test_pools_by_node_label_else_model(tmp_path):
    with prometheus_holding(_history(), tmp_path) as prom:
        client = PrometheusClient(prom.url)
        try:
            period = Period(START, END, "2026-10-01_2026-10-03")
            gpus = read_devices(client, period)
        finally:
            client.close()
    assert {g.uuid: g.pool for g in gpus} == {
        "GPU-a": LABELS["node-a"],
        "GPU-b": "",
        "GPU-h": LABELS["node-h"],
        "GPU-t1": "nvlink-R",
        "GPU-t2": "nvlink-R",
    }
    report = HealthReport(period, prom.url, "USD", gpus, [])
    pools = {name: (i.gpus, i.utilization) for name, i in report.pools}
    assert pools == {
        "NVIDIA-A100-SXM4-40GB": (1, pytest.approx(0.6)),
        A100: (1, pytest.approx(0.2)),  # node-b has no label: its model
        "NVIDIA-H100-80GB-HBM3": (1, pytest.approx(0.9)),
        "nvlink-R": (2, pytest.approx(0.6)),  # the rack's two trays, one pool: (0.8 + 0.4) / 2
    }
    assert 'data-pool="NVIDIA-A100-SXM4-40GB"' in html_text(report)
