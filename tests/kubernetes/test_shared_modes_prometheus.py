"""End to end on shared-modes.yaml: one exporter process per node (`gpumeter exporter --simulate`: pynvml
keeps one NVML session per process), each with its stand-in kubelet over gRPC, the fractional node's
also with the stand-in Kubernetes API over HTTP, scraped by a real Prometheus, which returns
allocations with every `sharing` value the fleet produces, shares that fit in each GPU, both
fractions of every fractional grant, and the vGPU host's VMs with their vGPUs (from the stand-in NVML:
the host has no pods)."""

from __future__ import annotations

import contextlib
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest

from gpumeter import contract
from gpumeter.simulator.fleet import load_fleet
from gpumeter.simulator.kubeapi import StandInKubeApi
from gpumeter.simulator.kubelet import StandInKubelet
from tests.support.servers import PrometheusServer, _Process, free_port, wait_http_ok

FLEET = "shared-modes"
# every mode the fleet has a GPU of: every value of `sharing`
PRODUCED = set(contract.SHARING_MODES)
GiB = 1024**3


@pytest.mark.prometheus
def test_prometheus_sees_every_sharing_mode_and_each_gpu_holds_at_most_itself(tmp_path):
    fleet = load_fleet(FLEET)
    t0 = time.time()
    start = t0 - 10 * 3600  # 10:00 of day 0: every scheduled pod runs
    directory = tempfile.mkdtemp(prefix="gpm-", dir="/tmp")  # sun_path is short: not under tmp_path
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, directory, True)
        api = stack.enter_context(StandInKubeApi(fleet, start=start))
        targets = []
        for node in fleet.nodes:
            sock = str(Path(directory) / f"{node.name}.sock")
            stack.enter_context(StandInKubelet(fleet, node.name, sock, start=start))
            port = free_port()
            argv = [
                str(Path(sys.executable).parent / "gpumeter"),
                "exporter",
                f"--simulate={FLEET}",
                f"--simulate-node={node.name}",
                f"--kubelet-socket={sock}",
                f"--listen=127.0.0.1:{port}",
                "--interval=1",
                # per-process usage (issue 15 point 5): the simulator writes each node's /proc
                "--enable-collectors=processes",
                f"--kube-api={api.base_url}",
            ]
            exporter = _Process(argv, tmp_path / f"{node.name}.log")
            stack.callback(exporter.stop)
            wait_http_ok(f"http://127.0.0.1:{port}/metrics", proc=exporter.proc)
            targets.append(f"127.0.0.1:{port}")
        prom = stack.enter_context(PrometheusServer(tmp_path, scrape_targets={"gpumeter-exporter": targets}))
        modes = prom.wait_for(
            "count by (sharing) (nvidia_gpu_allocation)",
            predicate=lambda r: {x["metric"]["sharing"] for x in r} == PRODUCED,
            timeout=40,
        )
        per_gpu = prom.query("sum by (hostname, uuid) (nvidia_gpu_allocation)")
        memory_per_gpu = prom.query(f"sum by (uuid) ({contract.ALLOCATION_MEMORY.name})")
        fractions = prom.query(
            f"{contract.ALLOCATION_MEMORY.name} / on({', '.join(contract.ALLOCATION.labels)}) "
            f'nvidia_gpu_allocation{{sharing="fractional"}}'
        )
        kube_api_up = prom.query("gpumeter_exporter_kube_api_up")
        processes = prom.wait_for(
            f"sum by (hostname, namespace, pod) ({contract.PROCESS_MEMORY_USED.name} * on(uuid) "
            "group_left(hostname) nvidia_gpu_info)",
            predicate=lambda r: len(r) >= 17,
            timeout=40,
        )
        vgpu_info = prom.query(contract.VGPU_INFO.name)
        vgpu_total = prom.query(contract.VGPU_MEMORY_TOTAL.name)
        vm_held = prom.query(
            f'nvidia_gpu_allocation{{sharing="vgpu"}} * on(uuid, pod) group_left(vm_id) '
            f'label_replace({contract.VGPU_INFO.name}, "pod", "$1", "vgpu_uuid", "(.*)")'
        )

    count = {r["metric"]["sharing"]: int(r["value"][1]) for r in modes}
    # from the fleet file: 1 exclusive pod, 3 MIG holders (3g.40gb, two 1g.10gb; the 2g.20gb is free),
    # 3 time-sliced replicas of 4, 4 MPS replicas, 5 fractional grants (3 HAMi, 2 gpushare)
    # and 3 VMs' vGPUs on the vGPU host
    assert count == {"exclusive": 1, "mig": 3, "time_slicing": 3, "mps": 4, "fractional": 5, "vgpu": 3}
    assert {r["metric"]["uuid"] for r in per_gpu} == {gpu.uuid for node in fleet.nodes for gpu in node.gpus}
    mig_gpu = fleet.node("gpu-shared-ts-01").gpus[1].uuid
    whole = {r["metric"]["uuid"]: float(r["value"][1]) for r in per_gpu if r["metric"]["uuid"] != mig_gpu}
    # by hand: exclusive 1, time-sliced 3/4, MPS 4/4, HAMi 0.5 + 0.3 + 10240/81559, gpushare 0.25 + 8/79,
    # vGPU 3 VMs x 1/4 (H100XM-20C: 4 fit an H100)
    assert sorted(whole.values()) == pytest.approx(
        sorted([1.0, 0.75, 1.0, 0.8 + 10240 / 81559, 0.25 + 8 / 79, 0.75])
    )
    assert all(value <= 1 for value in whole.values())
    # a MIG GPU's allocations are per instance (1 each): its instances, not the GPU, are the unit
    assert [float(r["value"][1]) for r in per_gpu if r["metric"]["uuid"] == mig_gpu] == [3.0]
    assert len(memory_per_gpu) == 2 and all(float(r["value"][1]) <= 1 for r in memory_per_gpu)
    # memory / compute per grant, by hand: llm-serve 40960/81559 over 0.5
    ratio = {r["metric"]["pod"]: float(r["value"][1]) for r in fractions}
    assert ratio["llm-serve"] == pytest.approx((40960 / 81559) / 0.5)
    assert ratio["tagger"] == pytest.approx(1.0)  # no core limit: compute = memory
    assert [float(r["value"][1]) for r in kube_api_up] == [1.0] * len(fleet.nodes)
    # per-process series carry the pods the fleet put on each node; the time-slicing node's host render
    # job and the MPS node's MPS server belong to no pod (pod=""), one series each
    seen = {(r["metric"]["hostname"], r["metric"].get("pod", "")) for r in processes}
    expected = {(p.node, p.name) for p in fleet.pods if p.running(10 * 3600)}
    expected |= {("gpu-shared-ts-01", ""), ("gpu-shared-mps-01", "")}
    assert seen == expected
    # the vGPU host: one info series per VM's vGPU, each 20 GiB, and each allocation held by its VM
    vgpus = fleet.node("gpu-shared-vgpu-01").gpus[0].vgpus
    assert {(r["metric"]["vm_id"], r["metric"]["license_state"]) for r in vgpu_info} == {
        (v.vm_id, v.license) for v in vgpus
    }
    assert [float(r["value"][1]) for r in vgpu_total] == [20 * GiB] * 3
    assert {(r["metric"]["namespace"], r["metric"]["vm_id"], float(r["value"][1])) for r in vm_held} == {
        (v.vm_id, v.vm_id, 0.25) for v in vgpus
    }
