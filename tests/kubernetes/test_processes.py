"""Per-process GPU usage mapped to pods, on shared-modes' nodes.

The stand-in NVML lists each running pod's process per device it holds (and the fleet's host
processes), the simulator writes their ``/proc/<pid>/cgroup`` under a temporary ``--proc-root``
(cgroup v2/systemd on the time-slicing node, v1/cgroupfs on the MPS node), and the stand-in Kubernetes
API (real HTTP) lists the pods with their UIDs and container IDs. Expected SM shares are worked out by
hand from the fleet file: a pod's ``utilization`` over the replicas of the GPU it shares, in whole
percent as NVML's samples carry it.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path

import pynvml as N
import pytest

from gpumeter import contract
from gpumeter.exporter.app import build_exporter
from gpumeter.exporter.config import ExporterConfig
from gpumeter.simulator.device import SimulatedNode
from gpumeter.simulator.fleet import FleetError, load_fleet, parse_fleet
from gpumeter.simulator.kubeapi import StandInKubeApi
from gpumeter.simulator.nvml import SimulatedNvml
from tests.kubelet.helpers import Clock
from tests.support.simulated import XID_WAIT_MS

TS, MPS = "gpu-shared-ts-01", "gpu-shared-mps-01"
GIB = 1024**3
MEMORY, SM = contract.PROCESS_MEMORY_USED, contract.PROCESS_SM_UTILIZATION


class Running:
    """One node's exporter with the processes collector, its stand-in API, sampled by hand."""

    def __init__(self, node_name: str, *, kube_api: bool = True, privileged: bool = True, missing=()):
        self.fleet = load_fleet("shared-modes")
        self.clock = Clock(10 * 3600.0)  # 10:00 of day 0: every scheduled pod runs
        self.api = StandInKubeApi(self.fleet, clock=self.clock, start=0.0).start() if kube_api else None
        self.node = SimulatedNode(self.fleet, node_name, clock=self.clock, start=0.0)
        self.node.privileged = privileged
        self.library = SimulatedNvml(self.node, missing=frozenset(missing))
        config = ExporterConfig(
            listen="127.0.0.1:0",
            kubelet_socket=None,
            hostname=node_name,
            kube_api=self.api.base_url if self.api else None,
            enable_collectors=("processes",),
        )
        self.exporter = build_exporter(
            config, clock=self.clock, library=self.library, node=self.node, xid_wait_ms=XID_WAIT_MS
        )

    def sample(self, cycles: int = 2):
        for _ in range(cycles):
            self.clock.t += 5.0
            snapshot = self.exporter.sampler.sample_once()
        return snapshot

    def stop(self) -> None:
        self.exporter.stop()
        if self.api:
            self.api.stop()


@pytest.fixture
def running():
    made: list[Running] = []

    def make(node_name: str, **kwargs) -> Running:
        r = Running(node_name, **kwargs)
        made.append(r)
        return r

    yield make
    for r in made:
        r.stop()


def _rows(snapshot, series) -> dict[tuple[str, str, str, str], float]:
    """(gpu, gpu_instance_id, namespace/pod, container) → value."""
    out = {}
    for labels, value in snapshot.samples(series.name):
        row = dict(zip(series.labels, labels, strict=True))
        out[(row["gpu"], row["gpu_instance_id"], f"{row['namespace']}/{row['pod']}", row["container"])] = (
            value
        )
    return out


def test_each_container_on_a_time_sliced_gpu_gets_its_own_sm_share_and_memory(running):
    snapshot = running(TS).sample()
    sm = _rows(snapshot, SM)
    # by hand: etl-0, -1, -2 put 0.2, 0.6, 0.1 on one of GPU 2's 4 replicas each: 0.2 / 4 = 5 %,
    # 0.6 / 4 = 15 %, 0.1 / 4 = 2.5 % (NVML's whole percent, rounded half to even: 2 %); the host render job
    # (no pod) 10 %; pretrain holds GPU 0 alone at 0.9
    assert sm == {
        ("0", "", "research/pretrain", "trainer"): pytest.approx(0.90),
        ("2", "", "data-eng/etl-0", "worker"): pytest.approx(0.05),
        ("2", "", "data-eng/etl-1", "worker"): pytest.approx(0.15),
        ("2", "", "data-eng/etl-2", "worker"): pytest.approx(0.02),
        ("2", "", "/", ""): pytest.approx(0.10),
    }
    memory = _rows(snapshot, MEMORY)
    # the host job's 1024 MiB, from the fleet file, under pod=""
    assert memory[("2", "", "/", "")] == 1 * GIB
    # MIG GPU 1: memory per GPU instance and holder; no SM series (NVML has no process utilization
    # on a MIG-enabled GPU)
    assert {k for k in memory if k[0] == "1"} == {
        ("1", "1", "vision/detector", "trainer"),
        ("1", "7", "nlp/embedder-7", "server"),
        ("1", "8", "nlp/embedder-8", "server"),
    }
    # a process's memory fits in what its device has in use
    used = {labels[0]: value for labels, value in snapshot.samples(contract.MEMORY_USED.name)}
    for gpu in ("0", "2"):
        assert 0 < sum(v for k, v in memory.items() if k[0] == gpu) <= used[gpu]
    mig_used = {
        labels[2]: value
        for labels, value in snapshot.samples(contract.MIG_MEMORY_USED.name)
        if labels[0] == "1"
    }
    for (_, gi, _, _), value in ((k, v) for k, v in memory.items() if k[0] == "1"):
        assert 0 < value <= mig_used[gi]


def test_mps_clients_come_from_their_own_call_and_the_server_is_nobodys_on_cgroup_v1(running):
    r = running(MPS)
    snapshot = r.sample()
    sm = _rows(snapshot, SM)
    # by hand: server-0..3 each 0.3 on one of 4 MPS replicas: 7.5 % → NVML's whole percent 8 %
    for replica in range(4):
        assert sm[("0", "", f"inference/server-{replica}", "server")] == pytest.approx(0.08)
    memory = _rows(snapshot, MEMORY)
    # the MPS server runs in the device plugin's pod, which is not in the fleet: summed under pod=""
    assert memory[("0", "", "/", "")] == 256 * 1024 * 1024
    assert len(memory) == 5
    assert r.library.calls["nvmlDeviceGetMPSComputeRunningProcesses_v3"] > 0
    # the fake /proc holds v1 lines, one per controller hierarchy
    pid = 10000  # the node's first pod entry, first device
    text = (Path(r.node.proc_root) / str(pid) / "cgroup").read_text(encoding="utf-8")
    assert text.count("\n") > 1 and "0::" not in text and "/kubepods/burstable/pod" in text


def test_an_unprivileged_exporter_reads_mig_processes_per_instance_with_the_same_result(running):
    privileged = running(TS).sample()
    unprivileged_run = running(TS, privileged=False)
    unprivileged = unprivileged_run.sample()
    assert set(_rows(unprivileged, MEMORY)) == set(_rows(privileged, MEMORY))
    # the parent refused once (NO_PERMISSION, remembered); each of the 4 MIG devices is asked instead
    assert unprivileged_run.library.calls["nvmlDeviceGetComputeRunningProcesses_v3"] > 4


def test_without_a_pod_list_every_process_is_summed_under_the_empty_pod(running):
    snapshot = running(TS, kube_api=False).sample()
    memory = _rows(snapshot, MEMORY)
    assert {k[2] for k in memory} == {"/"}
    # bounded: one series per GPU (and per GPU instance on the MIG GPU)
    assert sorted(k[:2] for k in memory) == [("0", ""), ("1", "1"), ("1", "7"), ("1", "8"), ("2", "")]
    assert _rows(snapshot, SM)[("2", "", "/", "")] == pytest.approx(0.05 + 0.15 + 0.02 + 0.10)


def test_a_driver_without_the_v3_process_calls_loses_only_the_process_series(running):
    snapshot = running(
        TS,
        missing={"nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetMPSComputeRunningProcesses_v3"},
    ).sample()
    # pynvml raises NVMLLibraryMismatchError (not an NVMLError) for the missing _v3: no crash, no series
    assert not snapshot.samples(MEMORY.name)
    assert snapshot.value("gpumeter_exporter_collector_success", ("processes",)) == 1
    assert snapshot.value(contract.MEMORY_USED.name, ("0", snapshot.devices[0].uuid)) is not None


def test_the_stand_in_refuses_process_utilization_on_mig_and_answers_not_found_without_samples(running):
    r = running(TS)
    r.sample(1)
    N.nvmlInit()
    try:
        mig_gpu = N.nvmlDeviceGetHandleByIndex(1)
        with pytest.raises(N.NVMLError_NotSupported):
            N.nvmlDeviceGetProcessUtilization(mig_gpu, 0)
        instance = N.nvmlDeviceGetMigDeviceHandleByIndex(mig_gpu, 0)
        with pytest.raises(N.NVMLError_NotSupported):
            N.nvmlDeviceGetProcessUtilization(instance, 0)
        # MIG devices list their own processes, with their GPU instance IDs
        assert {p.gpuInstanceId for p in N.nvmlDeviceGetComputeRunningProcesses(instance)} <= {1, 7, 8}
        whole = N.nvmlDeviceGetHandleByIndex(2)
        future_us = int((r.clock.t + 3600) * 1e6)
        with pytest.raises(N.NVMLError_NotFound):  # nothing newer than lastSeenTimeStamp
            N.nvmlDeviceGetProcessUtilization(whole, future_us)
        procs = N.nvmlDeviceGetComputeRunningProcesses(whole)
        assert {p.gpuInstanceId for p in procs} == {0xFFFFFFFF}
        assert 2101 in {p.pid for p in procs}
    finally:
        N.nvmlShutdown()


def test_a_slow_kube_api_never_stalls_a_sampling_cycle():
    """The pod list is fetched on its own thread: while the API holds its answer, the exporter starts and
    cycles go on (shown by order, not by a clock: cycles complete while the request is held), and the
    processes get their pods once the list arrives."""
    fleet = load_fleet("shared-modes")
    start = time.time() - 10 * 3600
    api = StandInKubeApi(fleet, start=start).start()
    api.hold()
    node = SimulatedNode(fleet, TS, clock=time.time, start=start)
    config = ExporterConfig(
        listen="127.0.0.1:0",
        kubelet_socket=None,
        hostname=TS,
        kube_api=api.base_url,
        kubelet_timeout=60.0,
        interval=0.2,
        enable_collectors=("processes",),
    )
    exporter = build_exporter(config, library=SimulatedNvml(node), node=node, xid_wait_ms=XID_WAIT_MS)
    try:
        starting = threading.Thread(target=exporter.start, daemon=True)
        starting.start()
        starting.join(30)  # a hang guard: held, the API never answers
        assert not starting.is_alive(), "the exporter's start waited for the Kubernetes API"
        first = exporter.sampler.snapshot()
        assert {k[2] for k in _rows(first, MEMORY)} == {"/"}  # no pod list yet
        _wait_for(lambda: api.requests >= 1 and exporter.sampler.snapshot().timestamp > first.timestamp + 0.3)
        assert {k[2] for k in _rows(exporter.sampler.snapshot(), MEMORY)} == {"/"}  # cycles ran, still held
        api.release()
        _wait_for(
            lambda: ("0", "", "research/pretrain", "trainer") in _rows(exporter.sampler.snapshot(), MEMORY)
        )
    finally:
        exporter.stop()
        api.stop()


def _wait_for(condition, guard: float = 30.0) -> None:
    """Until ``condition()`` holds; the guard only catches a hang, it is no bound on speed."""
    deadline = time.monotonic() + guard
    while not condition():
        assert time.monotonic() < deadline, "never happened"
        time.sleep(0.05)


def test_fleet_process_fields_are_checked():
    base = {"nodes": [{"name": "n", "gpus": [{"model": "H100-SXM5-80GB"}]}]}
    with pytest.raises(FleetError, match=r"nodes\[0\]\.cgroup\.version.*expected one of v1, v2"):
        parse_fleet({"nodes": [{**base["nodes"][0], "cgroup": {"version": "v3"}}]})
    with pytest.raises(FleetError, match="used by both"):
        parse_fleet(
            {
                "nodes": [{**base["nodes"][0], "host_processes": [{"pid": 5, "gpu": 0}]}],
                "pods": [{"namespace": "a", "name": "p", "node": "n", "devices": [{"gpu": 0}], "pid": 5}],
            }
        )
    with pytest.raises(FleetError, match=r"host_processes\[0\]\.gpu"):
        parse_fleet({"nodes": [{**base["nodes"][0], "host_processes": [{"pid": 5, "gpu": 3}]}]})
    fleet = parse_fleet(
        {"nodes": [{**base["nodes"][0], "cgroup": {"driver": "cgroupfs", "runtime": "crio"}}]}
    )
    assert dataclasses.astuple(fleet.nodes[0].cgroup) == ("v2", "cgroupfs", "crio")


def test_the_history_leaves_the_process_series_out_when_asked():
    import io

    from gpumeter.simulator.history import write_history

    fleet = load_fleet("shared-modes")
    with_processes, without = io.StringIO(), io.StringIO()
    write_history([fleet], 0.0, 600.0, 300.0, with_processes)
    write_history([fleet], 0.0, 600.0, 300.0, without, processes=False)
    assert MEMORY.name in with_processes.getvalue() and SM.name in with_processes.getvalue()
    assert MEMORY.name not in without.getvalue() and SM.name not in without.getvalue()
    assert "nvidia_gpu_allocation{" in without.getvalue()


def test_with_the_api_forbidden_processes_keep_the_last_pods_listed_and_nothing_fails(running):
    r = running(TS)
    before = _rows(r.sample(), MEMORY)
    r.exporter.pod_list.refresh_s = 0.0  # list every cycle: the fault shows at once
    r.api.set_fault("forbidden")
    after = r.sample()
    assert set(_rows(after, MEMORY)) == set(before)  # still named by the last good list
    assert after.value("gpumeter_exporter_collector_success", ("processes",)) == 1
    # without a kubelet (no fractional attribution) the collector reports the API's health, once
    assert after.samples(contract.KUBE_API_UP.name) == ((((), 0.0)),)
    assert after.value(contract.KUBE_API_ERRORS.name, ("forbidden",)) >= 1
