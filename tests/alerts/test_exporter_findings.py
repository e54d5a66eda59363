"""What the alerts' templates need from the exporter (found by the end-to-end test).

GpuLost's description lists the pods on the lost GPU (``nvidia_gpu_allocation`` of its instance and uuid),
and the sampler means to keep a lost GPU's identity and allocations ("a lost GPU is still held by its
pod"). On a MIG node it does until the next re-discovery (every 60 s), where a GPU that no longer answers
is rebuilt from ``Sampler._known`` without ``mig_enabled`` and ``migs``: its ``nvidia_gpu_info`` flips to
``mig_mode="disabled"`` (a new info series) and the kubelet's MIG device IDs no longer resolve, so its
allocations vanish. GpuLost fires after 1 minute, that is after that re-discovery, and always says
"Pods on it: none." for a lost MIG GPU; billing stops charging the pods that still hold it.

The sampler now keeps the whole identity (``dataclasses.replace(identity, up=False)``); this test holds it.
"""

from __future__ import annotations

import shutil
import tempfile

from gpumeter.exporter.app import build_exporter
from gpumeter.exporter.config import ExporterConfig
from gpumeter.simulator.kubelet import StandInKubelet


class ManualClock:
    def __init__(self, now: float = 1_790_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def _gpu_series(exporter, gpu: str) -> dict[str, list[dict]]:
    found: dict[str, list[dict]] = {}
    for family in exporter.registry.collect():
        for sample in family.samples:
            if sample.labels.get("gpu") == gpu:
                found.setdefault(sample.name, []).append(sample.labels)
    return found


def test_a_lost_mig_gpu_keeps_its_identity_and_pods_across_rediscovery():
    clock = ManualClock()
    socket_dir = tempfile.mkdtemp(dir="/tmp")
    socket_path = f"{socket_dir}/kubelet.sock"
    exporter = build_exporter(
        ExporterConfig(listen="127.0.0.1:0", simulate="h100-mig", kubelet_socket=socket_path, interval=5),
        clock=clock,
    )
    node = exporter.node
    kubelet = StandInKubelet(node.fleet, node.spec.name, socket_path, clock=clock, start=node.start).start()
    try:
        exporter.sampler.sample_once()
        before = _gpu_series(exporter, "2")
        assert [i["mig_mode"] for i in before["nvidia_gpu_info"]] == ["enabled"]
        assert len(before["nvidia_gpu_allocation"]) == 7
        node.inject("gpu_lost", 2)
        for _ in range(15):  # 75 s: one re-discovery, and GpuLost's `for: 1m` has elapsed
            clock.now += 5
            exporter.sampler.sample_once()
        after = _gpu_series(exporter, "2")
        assert (
            exporter.registry.get_sample_value(
                "nvidia_gpu_up", {"gpu": "2", "uuid": before["nvidia_gpu_up"][0]["uuid"]}
            )
            == 0
        )
        assert [i["mig_mode"] for i in after["nvidia_gpu_info"]] == ["enabled"]
        assert after.get("nvidia_gpu_allocation") == before["nvidia_gpu_allocation"]
    finally:
        exporter.sampler.stop()
        kubelet.stop()
        shutil.rmtree(socket_dir, ignore_errors=True)
