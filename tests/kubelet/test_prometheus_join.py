"""End to end: exporter + stand-in kubelet over gRPC → a real Prometheus, which joins pods to MIG
instances by PromQL and gets each pod's memory and SM utilization."""

from __future__ import annotations

import time

import pytest

from gpumeter.exporter.app import build_exporter
from gpumeter.exporter.config import ExporterConfig
from gpumeter.simulator.fleet import load_fleet
from gpumeter.simulator.kubelet import StandInKubelet
from tests.support.servers import PrometheusServer

JOIN_MEMORY = (
    "nvidia_gpu_mig_memory_used_bytes * on(uuid, gpu_instance_id) group_left(namespace, pod, container)"
    ' nvidia_gpu_allocation{gpu_instance_id!=""}'
)
JOIN_UTILIZATION = (
    "nvidia_gpu_mig_sm_utilization_ratio * on(uuid, gpu_instance_id) group_left(namespace, pod)"
    ' nvidia_gpu_allocation{gpu_instance_id!=""}'
)


@pytest.mark.prometheus
def test_prometheus_joins_pods_to_mig_memory_and_sm_utilization(tmp_path, sock):
    fleet = load_fleet("h100-mig")
    node = fleet.nodes[0]
    t0 = time.time()
    with StandInKubelet(fleet, node.name, sock, start=t0 - 9 * 3600):  # 09:00 of day 0: notebooks run
        exporter = build_exporter(
            ExporterConfig(listen="127.0.0.1:0", simulate="h100-mig", kubelet_socket=sock, interval=1),
        ).start()
        try:
            target = f"127.0.0.1:{exporter.port}"
            with PrometheusServer(tmp_path, scrape_targets={"gpumeter-exporter": [target]}) as prom:
                memory = prom.wait_for(JOIN_MEMORY, predicate=lambda r: len(r) == 56, timeout=30)
                utilization = prom.wait_for(JOIN_UTILIZATION, predicate=lambda r: len(r) == 56, timeout=30)
                snapshot = exporter.sampler.snapshot()
        finally:
            exporter.stop()

    by_pod = {r["metric"]["pod"]: r for r in memory}
    ranker = by_pod["ranker-0-7"]["metric"]
    assert ranker["namespace"] == "search-inference" and ranker["container"] == "server"
    assert ranker["gpu"] == "0" and ranker["mig_profile"] == "1g.10gb"
    # the joined value is the instance's own memory series, as the exporter served it
    mig_labels = ("0", node.gpus[0].uuid, "7", "0", "1g.10gb")
    served = snapshot.value("nvidia_gpu_mig_memory_used_bytes", mig_labels)
    assert served is not None and served > 0
    assert abs(float(by_pod["ranker-0-7"]["value"][1]) - served) <= 0.3 * served  # a few samples apart
    assert {r["metric"]["namespace"] for r in utilization} == {
        "search-inference",
        "ml-research",
        "ml-training",
    }
    assert all(0 <= float(r["value"][1]) <= 1 for r in utilization)
    # per namespace, the loaded pods use their instances (search runs at 45 %, notebooks at 25 %)
    search = [float(r["value"][1]) for r in utilization if r["metric"]["namespace"] == "search-inference"]
    assert 0.3 < sum(search) / len(search) < 0.6
