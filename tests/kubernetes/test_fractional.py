"""Fractional holdings (HAMi, gpushare) read from the pods in the Kubernetes API.

The exporter runs on shared-modes' fractional node with the stand-in NVML, the stand-in kubelet
(gRPC, unix socket) and the stand-in Kubernetes API (HTTP on loopback). Expected fractions are worked
out by hand from the fleet file (H100 80GB: 81559 MiB, gpushare's ALIYUN_COM_GPU_MEM_DEV 79 GiB).
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from pathlib import Path

import httpx
import pytest

from gpumeter import contract
from gpumeter.exporter.app import build_exporter
from gpumeter.exporter.config import ConfigError, ExporterConfig
from gpumeter.exporter.kubernetes.api import KubeApiError, PodLister
from gpumeter.exporter.kubernetes.fractional import HAMI_ALLOCATED, grants_of
from gpumeter.simulator.device import SimulatedNode
from gpumeter.simulator.fleet import FleetError, load_fleet, parse_fleet
from gpumeter.simulator.kubeapi import StandInKubeApi
from gpumeter.simulator.kubelet import StandInKubelet
from gpumeter.simulator.nvml import SimulatedNvml
from tests.kubelet.helpers import Clock
from tests.support.simulated import XID_WAIT_MS

NODE = "gpu-shared-frac-01"
TOKEN = "stand-in-service-account-token"
H100_MIB = 81559

# (namespace, pod, container) → (resource, gpu, memory fraction, compute fraction), by hand
EXPECTED = {
    ("genai", "llm-serve", "server"): ("nvidia.com/gpu", "0", 40960 / H100_MIB, 0.50),
    ("research", "notebook", "jupyter"): ("nvidia.com/gpu", "0", 20480 / H100_MIB, 0.30),
    # no core limit: compute taken as the memory fraction
    ("data-eng", "batch-embed", "worker"): ("nvidia.com/gpu", "0", 10240 / H100_MIB, 10240 / H100_MIB),
    ("vision", "ocr", "server"): ("aliyun.com/gpu-mem", "1", 16 / 79, 0.25),
    ("nlp", "tagger", "server"): ("aliyun.com/gpu-mem", "1", 8 / 79, 8 / 79),
}
# with the API down, what the kubelet says: HAMi's fake IDs are 1 of its 10 splits of the GPU, gpushare's
# one per GiB (16 and 8 of 79), all read as time-sliced replicas
FALLBACK = {
    ("genai", "llm-serve", "server"): 1 / 10,
    ("research", "notebook", "jupyter"): 1 / 10,
    ("data-eng", "batch-embed", "worker"): 1 / 10,
    ("vision", "ocr", "server"): 16 / 79,
    ("nlp", "tagger", "server"): 8 / 79,
}


def _node_fleet():
    fleet = load_fleet("shared-modes")
    return dataclasses.replace(fleet, nodes=(fleet.node(NODE),), pods=fleet.pods_on(NODE))


class Running:
    def __init__(self, tmp_path: Path, token: str | None = TOKEN, token_file: str | None = None):
        self.fleet = _node_fleet()
        self.clock = Clock(0.0)
        self.directory = tempfile.mkdtemp(prefix="gpm-", dir="/tmp")
        sock = str(Path(self.directory) / "kubelet.sock")
        self.kubelet = StandInKubelet(self.fleet, NODE, sock, clock=self.clock, start=0.0).start()
        self.api = StandInKubeApi(self.fleet, clock=self.clock, start=0.0, token=TOKEN).start()
        if token_file is None:
            token_file = str(tmp_path / "token")
            Path(token_file).write_text(f"{token}\n" if token else "", encoding="utf-8")
        config = ExporterConfig(
            listen="127.0.0.1:0",
            kubelet_socket=sock,
            hostname=NODE,
            kube_api=self.api.base_url,
            kube_api_token_file=token_file,
            kube_api_refresh=0.0,  # list every cycle: the faults show at once
        )
        node = SimulatedNode(self.fleet, clock=self.clock, start=0.0)
        self.exporter = build_exporter(
            config, clock=self.clock, library=SimulatedNvml(node), node=node, xid_wait_ms=XID_WAIT_MS
        )

    def sample(self) -> dict[str, list[tuple[dict[str, str], float]]]:
        self.clock.t += 5.0
        snapshot = self.exporter.sampler.sample_once()
        out = {}
        for series in contract.EXPORTER_SERIES:
            rows = snapshot.series.get(series.name, ())
            out[series.name] = [
                (dict(zip(series.labels, labels, strict=True)), value) for labels, value in rows
            ]
        return out

    def stop(self) -> None:
        self.exporter.sampler.stop()
        self.kubelet.stop()
        self.api.stop()
        shutil.rmtree(self.directory, ignore_errors=True)


@pytest.fixture
def running(tmp_path):
    made: list[Running] = []

    def make(**kwargs) -> Running:
        r = Running(tmp_path, **kwargs)
        made.append(r)
        return r

    yield make
    for r in made:
        r.stop()


def _by_container(rows) -> dict[tuple[str, str, str], tuple[dict[str, str], float]]:
    return {
        (labels["namespace"], labels["pod"], labels["container"]): (labels, value) for labels, value in rows
    }


def test_each_grant_is_one_fractional_allocation_with_both_fractions(running):
    r = running()
    series = r.sample()
    allocations = _by_container(series[contract.ALLOCATION.name])
    memory = _by_container(series[contract.ALLOCATION_MEMORY.name])
    compute = _by_container(series[contract.ALLOCATION_COMPUTE.name])
    assert set(allocations) == set(EXPECTED) == set(memory) == set(compute)
    gpus = {gpu.index: gpu.uuid for gpu in r.fleet.nodes[0].gpus}
    for key, (resource, gpu, mem, comp) in EXPECTED.items():
        labels, value = allocations[key]
        assert labels["sharing"] == "fractional"
        assert (labels["resource"], labels["gpu"], labels["uuid"]) == (resource, gpu, gpus[int(gpu)])
        assert labels["gpu_instance_id"] == labels["mig_profile"] == ""
        assert value == pytest.approx(comp)  # the allocation's value is the compute fraction
        assert memory[key] == (labels, pytest.approx(mem))
        assert compute[key] == (labels, pytest.approx(comp))
    # each GPU's grants fit in it
    for gpu in ("0", "1"):
        assert sum(v for labels, v in series[contract.ALLOCATION.name] if labels["gpu"] == gpu) <= 1
        assert sum(v for labels, v in series[contract.ALLOCATION_MEMORY.name] if labels["gpu"] == gpu) <= 1
    assert series[contract.KUBE_API_UP.name] == [({}, 1.0)]
    assert all(v == 0 for _, v in series[contract.KUBE_API_ERRORS.name])


@pytest.mark.parametrize(
    ("fault", "token", "reason"),
    [
        ("unreachable", TOKEN, "unreachable"),
        ("forbidden", TOKEN, "forbidden"),
        (None, "a-wrong-token", "unauthorized"),  # the stand-in refuses a token it does not know
    ],
)
def test_without_the_api_fractional_holdings_are_what_the_kubelet_says_and_a_metric_says_so(
    running, fault, token, reason
):
    r = running(token=token)
    r.api.set_fault(fault)
    series = r.sample()  # the exporter keeps serving: no exception
    assert series[contract.KUBE_API_UP.name] == [({}, 0.0)]
    errors = {labels["reason"]: v for labels, v in series[contract.KUBE_API_ERRORS.name]}
    assert errors[reason] == 1 and sum(errors.values()) == 1
    allocations = _by_container(series[contract.ALLOCATION.name])
    assert {k: v for k, (_, v) in allocations.items()} == pytest.approx(FALLBACK)
    assert {labels["sharing"] for labels, _ in allocations.values()} == {"time_slicing"}
    assert series[contract.ALLOCATION_MEMORY.name] == series[contract.ALLOCATION_COMPUTE.name] == []
    assert series[contract.KUBELET_UP.name] == [({}, 1.0)]
    if fault is not None:  # the API answers again: the grants are back on the next list
        r.api.set_fault(None)
        series = r.sample()
        assert series[contract.KUBE_API_UP.name] == [({}, 1.0)]
        assert {labels["sharing"] for labels, _ in series[contract.ALLOCATION.name]} == {"fractional"}
        errors = {labels["reason"]: v for labels, v in series[contract.KUBE_API_ERRORS.name]}
        assert errors[reason] == 1  # a counter: the past failure stays counted


def test_a_missing_token_file_is_an_unauthorized_list_not_a_crash(running, tmp_path):
    r = running(token_file=str(tmp_path / "no-such-token"))
    series = r.sample()
    assert series[contract.KUBE_API_UP.name] == [({}, 0.0)]
    errors = {labels["reason"]: v for labels, v in series[contract.KUBE_API_ERRORS.name]}
    assert errors["unauthorized"] == 1


def test_hami_annotation_entries_follow_init_then_app_containers():
    # HAMi Resourcereqs/GetNextDeviceRequest: init containers first, then spec.containers; ';' ends an entry
    pod = {
        "metadata": {
            "namespace": "ml",
            "name": "p",
            "annotations": {
                HAMI_ALLOCATED: "GPU-aaaa,NVIDIA,1024,10:;;GPU-bbbb,NVIDIA,2048,0:GPU-cccc,NVIDIA,4096,40:;"
            },
        },
        "spec": {
            "initContainers": [{"name": "warmup"}],
            "containers": [{"name": "sidecar"}, {"name": "main"}],
        },
        "status": {"phase": "Running"},
    }
    grants = [(g.container, g.uuid, g.memory_mib, g.compute_fraction) for g in grants_of(pod)]
    assert grants == [
        ("warmup", "GPU-aaaa", 1024, 0.10),
        ("main", "GPU-bbbb", 2048, None),  # 0 cores: no core limit
        ("main", "GPU-cccc", 4096, 0.40),
    ]
    pod["status"]["phase"] = "Succeeded"  # devices released
    assert grants_of(pod) == []


@pytest.mark.parametrize(
    ("annotations", "message"),
    [
        ({HAMI_ALLOCATED: "GPU-aaaa,NVIDIA,1024:;"}, "has 3 fields, not 4"),
        ({HAMI_ALLOCATED: "GPU-aaaa,NVIDIA,lots,10:;"}, "must be integers"),
        ({"ALIYUN_COM_GPU_MEM_IDX": "one", "ALIYUN_COM_GPU_MEM_DEV": "79"}, "ALIYUN_COM_GPU_MEM_IDX='one'"),
        ({"ALIYUN_COM_GPU_MEM_IDX": "0", "ALIYUN_COM_GPU_MEM_DEV": "0"}, "must be above 0"),
    ],
)
def test_an_unreadable_annotation_is_an_error_naming_it(annotations, message):
    pod = {"metadata": {"annotations": annotations}, "spec": {"containers": [{"name": "c"}]}}
    with pytest.raises(ValueError, match=message):
        grants_of(pod)


def test_in_cluster_config_reads_the_service_account_and_the_service_address(tmp_path):
    (tmp_path / "token").write_text(TOKEN, encoding="utf-8")
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"kind": "PodList", "items": [{"metadata": {"name": "x"}}]})

    lister = PodLister.in_cluster(
        {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "6443"},
        service_account=tmp_path,
        transport=httpx.MockTransport(handler),
    )
    assert lister.list_pods("node-a") == [{"metadata": {"name": "x"}}]
    (request,) = seen
    assert str(request.url) == "https://[fd00::1]:6443/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-a"
    assert request.headers["Authorization"] == f"Bearer {TOKEN}"
    with pytest.raises(KubeApiError, match="KUBERNETES_SERVICE_HOST is not set"):
        PodLister.in_cluster({}, service_account=tmp_path)


def test_in_cluster_outside_a_cluster_is_a_config_error():
    with pytest.raises(ConfigError, match="kube_api: not in a cluster"):
        build_exporter(
            dataclasses.replace(ExporterConfig(), kubelet_socket="/nonexistent.sock", kube_api="in-cluster"),
            library=object(),
            privileged=True,
        )


def test_a_grant_on_a_gpu_the_fleet_cannot_give_is_refused_naming_the_field():
    fleet = {
        "nodes": [{"name": "n", "gpus": [{"model": "H100-SXM5-80GB", "fractional": "gpushare"}]}],
        "pods": [{"namespace": "a", "name": "p", "node": "n", "devices": [{"gpu": 0, "memory_mib": 1500}]}],
    }
    with pytest.raises(FleetError, match=r"pods\[0\]\.devices\[0\]\.memory_mib.*multiple of 1024"):
        parse_fleet(fleet)


def test_an_outage_is_logged_once_not_every_list(running, caplog):
    r = running()
    r.api.set_fault("forbidden")
    with caplog.at_level("WARNING", logger="gpumeter.exporter.kubernetes.fractional"):
        for _ in range(4):
            r.sample()
    assert len([m for m in caplog.messages if "listing the pods" in m and "403 Forbidden" in m]) == 1
    errors = {labels["reason"]: v for labels, v in r.sample()[contract.KUBE_API_ERRORS.name]}
    assert errors["forbidden"] == 5  # but every failure is counted
