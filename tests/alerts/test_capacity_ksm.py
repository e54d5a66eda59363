"""GPU demand and quota from kube-state-metrics, through a real Prometheus.

The stand-in kube-state-metrics (gpumeter/simulator/kube_state_metrics.py, a real HTTP server) serves the
a100-mixed fleet's running pods, two pending GPU pods and a GPU ResourceQuota in kube-state-metrics'
exposition format; a real Prometheus scrapes it under the job `kube-state-metrics` with both rule files
loaded. The capacity rules must compute, from the real scrape, the figures worked out here by hand.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpumeter.alerts import RULE_FILES
from gpumeter.simulator.fleet import load_fleet
from gpumeter.simulator.kube_state_metrics import (
    PendingPod,
    Quota,
    StandInKubeStateMetrics,
    sanitize,
)
from gpumeter.simulator.volcano import StandInVolcano, VolcanoQueue
from tests.support import loopback
from tests.support.servers import PrometheusServer, free_port

ROOT = Path(__file__).resolve().parents[2]


def served_by_command(command: list[str], banner: str) -> str:
    """Run a stand-in command as `gpumeter demo` does, on a free port: its first line starts with
    ``banner``; the /metrics body it serves is returned after SIGTERM has ended it with exit 0."""
    port = free_port()
    proc = subprocess.Popen(
        [*command, "--listen", f"127.0.0.1:{port}"], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().startswith(banner)
        return loopback.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
        proc.stdout.close()


pytestmark = pytest.mark.slow

PENDING = (
    # waited 40 minutes already when the test starts: over GpuDemandPendingTooLong's 30
    PendingPod("research", "wait-3g", "nvidia.com/mig-3g.20gb", 1, created_s=-2400),
    # two whole GPUs, created 10 minutes ago: demand, not yet waiting too long
    PendingPod("vision", "wait-2gpu", "nvidia.com/gpu", 2, created_s=-600),
)
QUOTAS = (
    Quota("vision", "gpus", "requests.nvidia.com/gpu", hard=8, used=6),
    Quota("vision", "cpu", "requests.cpu", hard=100, used=10),
)


def test_kube_state_metrics_sanitises_resource_names_like_the_real_one():
    assert sanitize("nvidia.com/gpu") == "nvidia_com_gpu"
    assert sanitize("nvidia.com/mig-3g.20gb") == "nvidia_com_mig_3g_20gb"
    assert sanitize("nvidia.com/gpu.shared") == "nvidia_com_gpu_shared"


@pytest.mark.prometheus
def test_demand_and_quota_rules_on_a_real_scrape(tmp_path: Path):
    ksm = StandInKubeStateMetrics(load_fleet("a100-mixed"), PENDING, QUOTAS).start()
    try:
        body = loopback.get(f"http://127.0.0.1:{ksm.port}/metrics", timeout=5).text
        assert "# TYPE kube_pod_container_resource_requests gauge" in body
        with PrometheusServer(
            tmp_path / "prometheus",
            scrape_targets={"kube-state-metrics": [f"127.0.0.1:{ksm.port}"]},
            rule_files=RULE_FILES,
        ) as prom:
            prom.wait_for("namespace_resource:kube_resourcequota_gpu_used:ratio", timeout=60)
            prom.wait_for('ALERTS{alertname="GpuDemandPendingTooLong"}', timeout=60)
            now = time.time()

            pending = {
                (r["metric"]["namespace"], r["metric"]["resource"]): float(r["value"][1])
                for r in prom.query("namespace_resource:kube_pod_pending_gpu_requests:sum")
            }
            # only the two pending pods; the fleet's running pods are not demand
            assert pending == {("research", "nvidia_com_mig_3g_20gb"): 1.0, ("vision", "nvidia_com_gpu"): 2.0}

            waits = {
                r["metric"]["pod"]: float(r["value"][1])
                for r in prom.query("namespace_pod_resource:kube_pod_pending_gpu_wait:seconds")
            }
            started = ksm.start_time
            assert set(waits) == {"wait-3g", "wait-2gpu"}
            # created 2400 s and 600 s before the stand-in started; evaluated between then and now (±1 s of
            # kube_pod_created's whole seconds)
            assert 2400 - 1 <= waits["wait-3g"] <= 2400 + (now - started) + 1
            assert 600 - 1 <= waits["wait-2gpu"] <= 600 + (now - started) + 1

            alerts = prom.query('ALERTS{alertname="GpuDemandPendingTooLong"}')
            assert [(a["metric"]["pod"], a["metric"]["alertstate"]) for a in alerts] == [
                ("wait-3g", "pending")
            ]

            quota = prom.query("namespace_resource:kube_resourcequota_gpu_used:ratio")
            assert [
                (q["metric"]["namespace"], q["metric"]["resource"], float(q["value"][1])) for q in quota
            ] == [("vision", "requests.nvidia.com/gpu", 0.75)]

            # the largest MIG profile requested: the pending 3g.20gb (the fleet's running pods hold 3g.20gb,
            # 2g.10gb and 1g.5gb instances too)
            largest = prom.query("cluster:kube_pod_mig_request_compute_slices:max7d")
            assert [float(r["value"][1]) for r in largest] == [3.0]
            running = {
                r["metric"]["resource"]
                for r in prom.query(
                    "kube_pod_container_resource_requests * on(namespace, pod) group_left() "
                    '(kube_pod_status_phase{phase="Running"} == 1)'
                )
            }
            assert {
                "nvidia_com_mig_3g_20gb",
                "nvidia_com_mig_1g_5gb",
                "nvidia_com_gpu",
                "nvidia_com_gpu_shared",
            } <= running
    finally:
        ksm.stop()


@pytest.mark.spawns
def test_the_command_serves_the_pending_pods_and_quotas_it_is_given():
    """`gpumeter simulate kube-state-metrics`, as `gpumeter demo` starts it: a process serving /metrics
    until SIGTERM; bad arguments are one line naming the option and value, exit 2."""
    command = [sys.executable, "-m", "gpumeter", "simulate", "kube-state-metrics", "--fleet", "a100-mixed"]
    bad = subprocess.run([*command, "--pending", "vision/wait"], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2
    assert bad.stderr == (
        "gpumeter simulate kube-state-metrics: --pending: expected NAMESPACE/POD=RESOURCE:QUANTITY:"
        "WAITED_SECONDS (value 'vision/wait')\n"
    )
    body = served_by_command(
        [
            *command,
            "--pending",
            "research/wait-3g=nvidia.com/mig-3g.20gb:1:2400",
            "--quota",
            "vision/gpus=requests.nvidia.com/gpu:8:6",
        ],
        "stand-in kube-state-metrics: ",
    )
    assert (
        'kube_pod_status_phase{namespace="research",pod="wait-3g",uid="research-wait-3g",phase="Pending"} 1'
        in body
    )
    assert 'resource="nvidia_com_mig_3g_20gb",unit="integer"} 1' in body
    assert (
        'kube_resourcequota{namespace="vision",resourcequota="gpus",resource="requests.nvidia.com/gpu",type="hard"} 8'
        in body
    )
    created = [
        ln for ln in body.splitlines() if ln.startswith('kube_pod_created{namespace="research",pod="wait-3g"')
    ]
    assert abs(float(created[0].rsplit(" ", 1)[1]) - (time.time() - 2400)) < 60  # waited 40 minutes


@pytest.mark.prometheus
def test_volcano_queue_rules_on_a_real_scrape(tmp_path: Path):
    """The stand-in volcano-scheduler serves milli-units, as Volcano does; the rules give GPUs.
    research deserves 8, holds 6 and asks for 10 in all: 4 waiting, 0.75 of its share; batch deserves
    4 and holds 6: borrowing, 1.5, nothing waiting."""
    queues = (
        VolcanoQueue("research", deserved=8, allocated=6, requested=10, pending_podgroups=2),
        VolcanoQueue("batch", deserved=4, allocated=6, requested=6),
    )
    volcano = StandInVolcano(queues).start()
    try:
        body = loopback.get(f"http://127.0.0.1:{volcano.port}/metrics", timeout=5).text
        assert (
            'volcano_queue_allocated_scalar_resources{queue_name="research",resource="nvidia.com/gpu"} 6000'
            in body
        )
        with PrometheusServer(
            tmp_path / "prometheus",
            scrape_targets={"volcano-scheduler": [f"127.0.0.1:{volcano.port}"]},
            rule_files=RULE_FILES,
        ) as prom:
            prom.wait_for("queue_resource:volcano_queue_gpu_deserved_used:ratio", timeout=60)

            def by_queue(query: str) -> dict[str, float]:
                return {r["metric"]["queue_name"]: float(r["value"][1]) for r in prom.query(query)}

            assert by_queue("queue_resource:volcano_queue_gpu_waiting:sum") == {"research": 4.0, "batch": 0.0}
            assert by_queue("queue_resource:volcano_queue_gpu_deserved_used:ratio") == {
                "research": 0.75,
                "batch": 1.5,
            }
            assert by_queue("queue:volcano_queue_pod_group_pending:sum") == {"research": 2.0, "batch": 0.0}
    finally:
        volcano.stop()


@pytest.mark.spawns
def test_the_volcano_command_serves_the_queues_it_is_given():
    """`gpumeter simulate volcano`, as `gpumeter demo` starts it: milli-units on /metrics until SIGTERM;
    a bad --queue is one line naming the option and value, exit 2."""
    command = [sys.executable, "-m", "gpumeter", "simulate", "volcano"]
    bad = subprocess.run([*command, "--queue", "research=8:6"], cwd=ROOT, capture_output=True, text=True)
    assert (bad.returncode, bad.stderr) == (
        2,
        "gpumeter simulate volcano: --queue: expected NAME=DESERVED:ALLOCATED:REQUESTED[:PENDING_PODGROUPS] "
        "(value 'research=8:6')\n",
    )
    body = served_by_command(
        [*command, "--queue", "research=8:6:10:2"], "stand-in volcano-scheduler: 1 queue(s)"
    )
    # 6 GPUs allocated: 6000 milli-units, as Volcano keeps scalar resources
    assert (
        'volcano_queue_allocated_scalar_resources{queue_name="research",resource="nvidia.com/gpu"} 6000'
        in body
    )
    assert 'volcano_queue_pod_group_pending_count{queue_name="research"} 2' in body
