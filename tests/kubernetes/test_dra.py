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

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpumeter import contract
from gpumeter.alerts.files import RULE_FILES
from gpumeter.exporter.app import build_exporter
from gpumeter.exporter.config import ExporterConfig
from gpumeter.exporter.kubernetes import dra
from gpumeter.simulator.device import SimulatedNode
from gpumeter.simulator.dra import compute_domain_uid
from gpumeter.simulator.fleet import load_fleet
from gpumeter.simulator.kubeapi import StandInKubeApi
from gpumeter.simulator.kubelet import StandInKubelet
from gpumeter.simulator.nvml import SimulatedNvml
from tests.kubelet.helpers import Clock
from tests.support import loopback
from tests.support.servers import PrometheusServer, free_port, stop_processes, wait_http_ok

pytestmark = pytest.mark.spawns  # its exporter and stand-ins run as processes

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
            wait_http_ok(f"http://127.0.0.1:{port}/healthz")

        def scrape(naming: str, until=lambda s: True) -> dict[str, list]:
            deadline = time.monotonic() + 30
            while True:
                samples = _samples(loopback.get(f"http://127.0.0.1:{ports[naming]}/metrics", timeout=10).text)
                if until(samples) or time.monotonic() > deadline:
                    return samples
                time.sleep(0.5)

        scrape.port = ports.get  # type: ignore[attr-defined]
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
    # pretrain joined a ComputeDomain through its channel claim: its GPU holding carries the domain's UID
    # (the channel claim's ComputeDomainChannelConfig domainID); the channel itself is no GPU holding
    domains = {
        s.labels["pod"]: s.labels["compute_domain"] for s in samples[contract.DRA_ALLOCATION_INFO.name]
    }
    assert domains.pop("pretrain") == compute_domain_uid("pretrain-domain")
    assert set(domains.values()) == {""}
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


@pytest.mark.prometheus
def test_the_capacity_dashboard_counts_dra_held_gpus_with_the_rest(served, tmp_path):
    """A real Prometheus scraping the live exporter, with the shipped recording rules: the capacity
    dashboard's allocated GPU-equivalents and MIG counts include the GPUs held through DRA claims."""
    served("native", _attributed)
    port = served.port("native")
    with PrometheusServer(
        tmp_path / "prom",
        scrape_targets={"gpumeter-exporter": [f"127.0.0.1:{port}"]},
        rule_files=list(RULE_FILES),
    ) as prometheus:
        # by hand from dra.yaml: pretrain 1 + detector 3/7 + embedder 1/7 + two claims shared 0.5 + 0.5
        (allocated,) = prometheus.wait_for("cluster:nvidia_gpu_allocated_gpu_equivalents:sum > 3", timeout=60)
        assert float(allocated["value"][1]) == pytest.approx(1 + 3 / 7 + 1 / 7 + 2, abs=1e-9)
        migs = prometheus.query(
            'count by (hostname, mig_profile) (nvidia_gpu_allocation{gpu_instance_id!=""})'
        )
        assert {r["metric"]["mig_profile"]: int(r["value"][1]) for r in migs} == {"3g.40gb": 1, "1g.10gb": 1}


def _in_process(fault: str | None, fleet=FLEET, node_name: str = NODE):
    """A node (gpu-dra-01) sampled once in process, the stand-in API answering with ``fault``."""
    clock = Clock(0.0)
    node = SimulatedNode(fleet, node_name, clock=clock, start=0.0)
    directory = tempfile.mkdtemp(prefix="gpm-", dir="/tmp")
    kubelet = StandInKubelet(fleet, node_name, f"{directory}/k.sock", clock=clock, start=0.0).start()
    api = StandInKubeApi(fleet, clock=clock, start=0.0).start()
    api.set_fault(fault)
    config = ExporterConfig(
        listen="127.0.0.1:0", kubelet_socket=f"{directory}/k.sock", hostname=node_name, kube_api=api.base_url
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


_NODE = {"name": "n", "gpus": [{"model": "H100-SXM5-80GB", "dra": True}, {"model": "H100-SXM5-80GB"}]}


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            {"claims": [{"namespace": "a", "name": "c", "node": "n", "devices": [{"gpu": 1}]}]},
            r"claims\[0\].devices\[0\].gpu: not a GPU of n marked dra: true \(got 1\)",
        ),
        (
            {
                "claims": [
                    {"namespace": "a", "name": "c", "node": "n", "devices": [{"gpu": 0}], "sharing": "Fast"}
                ]
            },
            r"claims\[0\].sharing: expected one of TimeSlicing, MPS \(got 'Fast'\)",
        ),
        (
            {"pods": [{"namespace": "a", "name": "p", "node": "n", "devices": [{"gpu": 0}]}]},
            r"pods\[0\].devices\[0\].gpu: GPU 0 of n is handed out by DRA: hold it through a claim",
        ),
        (
            {"pods": [{"namespace": "a", "name": "p", "node": "n", "devices": [{"claim": "nope"}]}]},
            r"pods\[0\].devices\[0\].claim: no claim nope of namespace a on node n",
        ),
        (
            {
                "claims": [
                    {"namespace": "a", "name": "c", "node": "n", "devices": [{"gpu": 0}]},
                    {"namespace": "b", "name": "d", "node": "n", "devices": [{"gpu": 0}]},
                ]
            },
            r"claims: device already allocated to a/c \(got 'b/d'\)",
        ),
    ],
)
def test_bad_dra_entries_in_a_fleet_name_the_field_and_value(extra, message):
    from gpumeter.simulator.fleet import FleetError, parse_fleet

    with pytest.raises(FleetError, match=message):
        parse_fleet({"nodes": [_NODE], **extra}, source="fleet.yaml")


def test_the_stand_in_kubelet_keeps_dra_gpus_out_of_the_device_plugins_allocatable():
    kubelet = StandInKubelet(FLEET, "gpu-dra-mixed-01", "/unused", clock=lambda: 0.0, start=0.0)
    ids = {i for d in kubelet.allocatable_response().devices for i in d.device_ids}
    gpus = FLEET.node("gpu-dra-mixed-01").gpus
    assert gpus[0].uuid in ids and gpus[2].uuid not in ids  # GPU 0 the plugin's, GPU 2 the driver's
    assert not any(
        i.startswith("MIG-") and i in {gpus[3].mig_uuid(m.gpu_instance_id) for m in gpus[3].mig} for i in ids
    )
    trainer = next(p for p in kubelet.list_response().pod_resources if p.name == "trainer")
    (container,) = trainer.containers
    assert list(container.devices) == []
    (claim,) = container.dynamic_resources
    assert (claim.claim_name, claim.claim_namespace) == ("trainer-gpu", "ml-training")
    (resource,) = claim.claim_resources
    assert (resource.driver_name, resource.pool_name, resource.device_name) == (
        "gpu.nvidia.com",
        "gpu-dra-mixed-01",
        "gpu-2",
    )
    assert resource.cdi_devices[0].name.startswith("k8s.gpu.nvidia.com/claim=")


def _share_ids(fleet, node: str) -> dict[str, str | None]:
    """Each pod's ClaimResource.share_id as the exporter's client reads it over gRPC."""
    from gpumeter.exporter.kubelet.client import PodResourcesClient

    sock = f"{tempfile.mkdtemp(prefix='gpm-', dir='/tmp')}/k.sock"
    with StandInKubelet(fleet, node, sock, clock=lambda: 0.0, start=0.0), PodResourcesClient(sock) as client:
        return {
            p.name: r.share_id
            for p in client.list()
            for c in p.containers
            for d in c.dynamic_resources
            for r in d.claim_resources
        }


def test_a_device_two_claims_consume_by_capacity_is_split_between_them():
    """Consumable capacity (Kubernetes 1.35+): two claims allocate shares of one GPU, the kubelet
    tells them apart by share_id; each holder gets half, the device's shares sum to 1."""
    from gpumeter.simulator.fleet import parse_fleet

    fleet = parse_fleet(
        {
            "nodes": [{"name": "n", "gpus": [{"model": "H100-SXM5-80GB", "dra": True}]}],
            "claims": [
                {"namespace": "a", "name": "half-1", "node": "n", "devices": [{"gpu": 0, "share_id": "s1"}]},
                {"namespace": "b", "name": "half-2", "node": "n", "devices": [{"gpu": 0, "share_id": "s2"}]},
            ],
            "pods": [
                {"namespace": "a", "name": "p1", "node": "n", "devices": [{"claim": "half-1"}]},
                {"namespace": "b", "name": "p2", "node": "n", "devices": [{"claim": "half-2"}]},
            ],
        },
        source="capacity.yaml",
    )
    assert _share_ids(fleet, "n") == {"p1": "s1", "p2": "s2"}
    assert set(_share_ids(FLEET, NODE).values()) == {None}  # without capacity: unset, not ""
    snapshot = _in_process(None, fleet, "n")
    labels = contract.ALLOCATION.labels
    got = {
        dict(zip(labels, v, strict=True))["pod"]: (dict(zip(labels, v, strict=True))["sharing"], share)
        for v, share in snapshot.samples(contract.ALLOCATION.name)
    }
    assert got == {"p1": ("time_slicing", 0.5), "p2": ("time_slicing", 0.5)}
