"""GPUs handed out by Dynamic Resource Allocation (fleet dra.yaml), attributed to their pods.

Served live as a user runs it: ``gpumeter simulate kubelet`` (PodResources with dynamic_resources),
``gpumeter simulate kube-api`` (ResourceSlices and ResourceClaims) and ``gpumeter exporter --kube-api``,
each its own process, the exporter scraped over HTTP. Then without the API (forbidden), in process:
what the device names alone attribute, and the metrics that say the rest is not.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpumeter import contract
from gpumeter.exporter.app import build_exporter
from gpumeter.exporter.config import ExporterConfig
from gpumeter.exporter.kubernetes import dra
from gpumeter.exporter.simulator.device import SimulatedNode
from gpumeter.exporter.simulator.fleet import load_fleet
from gpumeter.exporter.simulator.kubeapi import StandInKubeApi
from gpumeter.exporter.simulator.kubelet import StandInKubelet
from gpumeter.exporter.simulator.nvml import SimulatedNvml
from tests.kubelet.helpers import Clock
from tests.support.servers import free_port, stop_processes, wait_http_ok

NODE = "gpu-dra-01"
FLEET = load_fleet("dra")
GPUS = FLEET.node(NODE).gpus
# by hand from dra.yaml: pod -> (gpu, gpu_instance_id, sharing, share, claim)
EXPECTED = {
    ("research", "pretrain"): (0, "", "exclusive", 1.0, "pretrain-gpu"),
    ("vision", "detector"): (1, "1", "mig", 1.0, "detector-mig"),
    ("nlp", "embedder"): (1, "7", "mig", 1.0, "embedder-mig"),
    ("inference", "ranker-0"): (2, "", "time_slicing", 0.5, "shared-ts"),
    ("inference", "ranker-1"): (2, "", "time_slicing", 0.5, "shared-ts"),
    ("inference", "llm-0"): (3, "", "mps", 0.5, "shared-mps"),
    ("inference", "llm-1"): (3, "", "mps", 0.5, "shared-mps"),
}


def _gpumeter(*args: str, cwd: Path, log: Path) -> tuple[subprocess.Popen, Path]:
    with log.open("wb") as out:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpumeter", *args],
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    return proc, log


def _samples(text: str) -> dict[str, list]:
    out: dict[str, list] = defaultdict(list)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name].append(sample)
    return out


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The three commands for gpu-dra-01; yields a function scraping the exporter with a naming."""
    root = tmp_path_factory.mktemp("dra")
    short = Path(tempfile.mkdtemp(prefix="gpm-dra-", dir="/tmp"))  # sun_path is short
    socket = short / "kubelet.sock"
    api_port = free_port()
    processes = [
        _gpumeter("simulate", "kube-api", "--fleet", "dra", "--listen", f"127.0.0.1:{api_port}", cwd=root, log=root / "api.log"),
        _gpumeter("simulate", "kubelet", "--fleet", "dra", "--node", NODE, "--socket", str(socket), cwd=root, log=root / "kubelet.log"),
    ]  # fmt: skip
    ports = {}
    try:
        for naming in ("native", "dcgm"):
            ports[naming] = free_port()
            processes.append(
                _gpumeter(
                    "exporter",
                    *("--simulate", "dra", "--simulate-node", NODE, "--kubelet-socket", str(socket)),
                    *("--kube-api", f"http://127.0.0.1:{api_port}", "--interval", "1"),
                    *("--naming", naming, "--listen", f"127.0.0.1:{ports[naming]}"),
                    cwd=root,
                    log=root / f"exporter-{naming}.log",
                )
            )
        for port in ports.values():
            wait_http_ok(f"http://127.0.0.1:{port}/healthz", timeout=60)

        def scrape(naming: str, until=lambda s: True) -> dict[str, list]:
            deadline = time.monotonic() + 30
            while True:
                samples = _samples(httpx.get(f"http://127.0.0.1:{ports[naming]}/metrics", timeout=10).text)
                if until(samples) or time.monotonic() > deadline:
                    return samples
                time.sleep(0.5)

        yield scrape
    finally:
        left = stop_processes([(p, log) for p, log in processes])
        assert left == [], left


def _attributed(samples) -> bool:
    """Every claim read: until the exporter's first read of a new claim (within seconds, off the
    sampling thread) its devices are attributed from their names, an MPS claim as time-sliced."""
    allocations = samples.get(contract.ALLOCATION.name, [])
    return len(allocations) == len(EXPECTED) and any(s.labels["sharing"] == "mps" for s in allocations)


def test_dra_pods_are_attributed_exclusive_mig_and_shared_with_shares_at_most_one(served):
    samples = served("native", _attributed)
    got = {
        (s.labels["namespace"], s.labels["pod"]): (
            int(s.labels["gpu"]),
            s.labels["gpu_instance_id"],
            s.labels["sharing"],
            s.value,
            s.labels["resource"],
        )
        for s in samples[contract.ALLOCATION.name]
    }
    assert got == {k: (*v[:4], f"resourceclaim/{v[4]}") for k, v in EXPECTED.items()}
    # the shares of each device sum to at most 1 (the two shared claims' exactly 1)
    per_device: dict[tuple, float] = defaultdict(float)
    for s in samples[contract.ALLOCATION.name]:
        per_device[(s.labels["uuid"], s.labels["gpu_instance_id"])] += s.value
    assert max(per_device.values()) <= 1.0
    assert per_device[(GPUS[2].uuid, "")] == per_device[(GPUS[3].uuid, "")] == 1.0
    # the allocation's uuid is the GPU's: the slice's uuid attribute resolved through NVML
    assert {s.labels["uuid"] for s in samples[contract.ALLOCATION.name]} == {g.uuid for g in GPUS}
    # the claim and the device as the kubelet names it, joinable on the allocation's labels
    info = {
        (s.labels["pod"], s.labels["claim_name"], s.labels["device"])
        for s in samples[contract.DRA_ALLOCATION_INFO.name]
    }
    assert ("detector", "detector-mig", "gpu-1-mig-3g40gb-9-0") in info  # 3g: profile id 9, placement 0
    assert ("embedder", "embedder-mig", "gpu-1-mig-1g10gb-19-0") in info
    assert ("ranker-1", "shared-ts", "gpu-2") in info and len(info) == len(EXPECTED)
    assert [s.value for s in samples[contract.DRA_API_UP.name]] == [1.0]
    assert [s.value for s in samples[contract.DRA_DEVICES_UNRESOLVED.name]] == [0.0]


def test_dcgm_naming_carries_dcgm_exporters_dra_labels(served):
    samples = served(
        "dcgm", lambda s: any("dra_claim_name" in x.labels for x in s.get("DCGM_FI_DEV_GPU_TEMP", []))
    )
    temps = samples["DCGM_FI_DEV_GPU_TEMP"]
    by_pod = {s.labels.get("pod"): s.labels for s in temps}
    ranker = by_pod["ranker-0"]
    assert {k: ranker[k] for k in ranker if k.startswith("dra_")} == {
        "dra_claim_name": "shared-ts",
        "dra_claim_namespace": "inference",
        "dra_driver_name": "gpu.nvidia.com",
        "dra_pool_name": NODE,
        "dra_device_name": "gpu-2",
    }
    detector = by_pod["detector"]
    assert detector["dra_device_name"] == "gpu-1-mig-3g40gb-9-0"
    assert detector["dra_mig_profile"] == "3g.40gb"
    assert detector["dra_mig_device_uuid"] == GPUS[1].mig_uuid(1)
    assert detector["GPU_I_ID"] == "1"


def _in_process(fault: str | None):
    """gpu-dra-01 sampled once in process, the stand-in API answering with ``fault``."""
    clock = Clock(0.0)
    node = SimulatedNode(FLEET, NODE, clock=clock, start=0.0)
    directory = tempfile.mkdtemp(prefix="gpm-", dir="/tmp")
    kubelet = StandInKubelet(FLEET, NODE, f"{directory}/k.sock", clock=clock, start=0.0).start()
    api = StandInKubeApi(FLEET, clock=clock, start=0.0).start()
    api.set_fault(fault)
    config = ExporterConfig(
        listen="127.0.0.1:0", kubelet_socket=f"{directory}/k.sock", hostname=NODE, kube_api=api.base_url
    )
    exporter = build_exporter(config, clock=clock, library=SimulatedNvml(node), node=node)
    try:
        return exporter.sampler.sample_once()
    finally:
        exporter.stop()
        kubelet.stop()
        api.stop()


@pytest.mark.parametrize("fault", ["forbidden-dra", "unreachable"])
def test_without_the_api_names_alone_attribute_whole_gpus_and_unique_mig_profiles(fault):
    snapshot = _in_process(fault)
    labels = contract.ALLOCATION.labels
    got = {}
    for values, share in snapshot.samples(contract.ALLOCATION.name):
        row = dict(zip(labels, values, strict=True))
        got[(row["namespace"], row["pod"])] = (int(row["gpu"]), row["gpu_instance_id"], row["sharing"], share)
    # gpu-<minor> names its GPU; the MIG GPU's 3g.40gb is the only one of its profile; the two 1g.10gb
    # instances are not told apart by gpu-1-mig-1g10gb-19-0 without the slice (placement unknown to
    # NVML's inventory), so embedder is not attributed. Shared claims: 1/holders, and without the
    # claim's config the driver's default, time-slicing, also for the MPS claim.
    assert got == {
        ("research", "pretrain"): (0, "", "exclusive", 1.0),
        ("vision", "detector"): (1, "1", "mig", 1.0),
        ("inference", "ranker-0"): (2, "", "time_slicing", 0.5),
        ("inference", "ranker-1"): (2, "", "time_slicing", 0.5),
        ("inference", "llm-0"): (3, "", "time_slicing", 0.5),
        ("inference", "llm-1"): (3, "", "time_slicing", 0.5),
    }
    # ... and the metrics say so: the API is down for DRA, one held device maps to nothing
    assert list(snapshot.samples(contract.DRA_API_UP.name)) == [((), 0.0)]
    assert list(snapshot.samples(contract.DRA_DEVICES_UNRESOLVED.name)) == [((), 1.0)]
    errors = dict((v[0], c) for v, c in snapshot.samples(contract.DRA_API_ERRORS.name))
    reason = "forbidden" if fault == "forbidden-dra" else "unreachable"
    assert errors[reason] >= 1 and sum(errors.values()) == errors[reason]


def test_device_names_parse_as_nvidias_driver_writes_them():
    assert dra.parse_device_name("gpu-3") == dra.DeviceName(3)
    assert dra.parse_device_name("gpu-1-mig-1g10gb-19-6") == dra.DeviceName(1, "1g10gb", 19, 6)
    assert dra.parse_device_name("gpu-vfio-0") is None and dra.parse_device_name("nic-0") is None
    assert dra.mig_device_name(0, "1g.10gb+me", 20, 2) == "gpu-0-mig-1g10gbme-20-2"


def test_claim_sharing_comes_from_the_allocations_opaque_config_for_its_request():
    config = {
        "opaque": {
            "driver": "gpu.nvidia.com",
            "parameters": {
                "apiVersion": dra.PARAMETERS_API,
                "kind": "GpuConfig",
                "sharing": {"strategy": "MPS"},
            },
        }
    }
    claim = {
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "a", "driver": "gpu.nvidia.com", "pool": "n", "device": "gpu-0"},
                        {"request": "b", "driver": "gpu.nvidia.com", "pool": "n", "device": "gpu-1"},
                        {"request": "c", "driver": "example.com/nic", "pool": "n", "device": "nic-0"},
                    ],
                    "config": [{"source": "FromClaim", "requests": ["a"], **config}],
                }
            }
        }
    }
    assert dra.claim_strategies(claim) == {("n", "gpu-0"): "MPS", ("n", "gpu-1"): ""}
    # an entry without requests applies to every request; another driver's config is not read
    other = {
        "opaque": {
            "driver": "example.com",
            "parameters": {"kind": "GpuConfig", "sharing": {"strategy": "MPS"}},
        }
    }
    claim["status"]["allocation"]["devices"]["config"] = [{"source": "FromClass", **config}, other]
    assert dra.claim_strategies(claim) == {("n", "gpu-0"): "MPS", ("n", "gpu-1"): "MPS"}


def test_only_the_newest_generation_of_a_pool_is_read():
    def slice_(generation: int, uuid: str) -> dict:
        return {
            "spec": {
                "driver": "gpu.nvidia.com",
                "pool": {"name": "n", "generation": generation},
                "devices": [
                    {"name": "gpu-0", "attributes": {"type": {"string": "gpu"}, "uuid": {"string": uuid}}}
                ],
            }
        }

    devices = dra.slice_devices([slice_(1, "GPU-old"), slice_(2, "GPU-new")])
    assert devices[("n", "gpu-0")].uuid == "GPU-new"
