"""``--naming dcgm``: dcgm-exporter's names, labels and units over the same snapshot (docs/dcgm-mode.md).

Values are checked against the native snapshot with the unit conversions written out here (not read
from the catalog), labels against the simulated fleet, pods against a stand-in kubelet over a real gRPC
socket, the exposition with promtool, and the whole path with a real Prometheus scraping over HTTP.
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from gpumeter import contract
from gpumeter.exporter import dcgm
from gpumeter.exporter.app import build_exporter
from gpumeter.exporter.config import ExporterConfig
from gpumeter.exporter.render import SnapshotCollector
from gpumeter.exporter.snapshot import CollectorStatus, DeviceIdentity, MigIdentity, Snapshot, SnapshotBuilder
from gpumeter.simulator.device import SimulatedNode
from gpumeter.simulator.fleet import load_fleet
from gpumeter.simulator.kubelet import StandInKubelet
from gpumeter.simulator.nvml import SimulatedNvml
from tests.support import loopback
from tests.support.servers import PrometheusServer, require_binary

FLEETS = ("h100-mig", "a100-mixed", "h200", "workstation")
BASE = {"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION"}
MIG = {"GPU_I_PROFILE", "GPU_I_ID"}
PODS = {"pod", "namespace", "container"}
MIB = 2**20
DOUBLES = {"DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_PROF_PCIE_TX_BYTES"}  # DCGM_FT_DOUBLE, or a DCP rate
# default-counters.csv rows NVML cannot provide: never emitted, not even as 0
NOT_PROVIDED = ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "DCGM_FI_DEV_VGPU_LICENSE_STATUS")


# --- helpers ------------------------------------------------------------------------------------
def samples(sim) -> list[tuple[str, dict[str, str], float]]:
    return [(s.name, s.labels, s.value) for family in sim.exporter.registry.collect() for s in family.samples]


def series(sim, name: str, **labels) -> list[tuple[dict[str, str], float]]:
    return [
        (got, value)
        for n, got, value in samples(sim)
        if n == name and all(got.get(k) == v for k, v in labels.items())
    ]


def one(sim, name: str, **labels) -> float:
    found = series(sim, name, **labels)
    assert len(found) == 1, (name, labels, found)
    return found[0][1]


def native(sim, name: str) -> dict[tuple[str, ...], float]:
    return dict(sim.sampler.snapshot().samples(name))


@pytest.fixture
def sock():
    directory = tempfile.mkdtemp(prefix="gpm-", dir="/tmp")  # sun_path is short: not under tmp_path
    try:
        yield str(Path(directory) / "kubelet.sock")
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def with_kubelet(clock, sock):
    """An exporter in dcgm mode with pod attribution from a stand-in kubelet on a unix socket.

    Built like the ``simulate`` fixture (manual clock, stand-in NVML), with ``kubelet_socket`` set.
    """
    made = []

    def make(fleet_name: str):
        fleet = load_fleet(fleet_name)
        node = SimulatedNode(fleet, clock=clock)
        kubelet = StandInKubelet(fleet, node.spec.name, sock, clock=clock, start=clock.now).start()
        config = ExporterConfig(
            listen="127.0.0.1:0", kubelet_socket=sock, hostname=node.spec.name, interval=5.0, naming="dcgm"
        )
        exporter = build_exporter(config, clock=clock, library=SimulatedNvml(node), node=node)
        made.append((exporter, kubelet))
        return SimpleNamespace(exporter=exporter, sampler=exporter.sampler, node=node, kubelet=kubelet)

    yield make
    for exporter, kubelet in made:
        exporter.sampler.stop()
        kubelet.stop()


def sampled(simulate, fleet: str):
    sim = simulate(fleet, naming="dcgm")
    sim.sampler.sample_once()
    sim.sample()  # GPM utilization needs two samples
    return sim


# --- names, units and values against the native snapshot ----------------------------------------
@pytest.mark.parametrize("fleet", ["h100-mig", "a100-mixed"])
def test_device_fields_are_native_values_in_dcgm_units(simulate, fleet):
    sim = sampled(simulate, fleet)
    checked = 0
    for device in sim.sampler.snapshot().devices:
        key = (str(device.index), device.uuid)
        at = {"UUID": device.uuid}
        expected = {
            "DCGM_FI_DEV_GPU_TEMP": native(sim, "nvidia_gpu_temperature_celsius")[key],
            "DCGM_FI_DEV_MEMORY_TEMP": native(sim, "nvidia_gpu_memory_temperature_celsius")[key],
            "DCGM_FI_DEV_POWER_USAGE": native(sim, "nvidia_gpu_power_watts")[key],
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": native(sim, "nvidia_gpu_energy_joules_total")[key] * 1000,
            "DCGM_FI_DEV_SM_CLOCK": native(sim, "nvidia_gpu_clock_hz")[(*key, "sm")] / 1e6,
            "DCGM_FI_DEV_MEM_CLOCK": native(sim, "nvidia_gpu_clock_hz")[(*key, "memory")] / 1e6,
            "DCGM_FI_DEV_FB_RESERVED": native(sim, "nvidia_gpu_memory_reserved_bytes")[key] // MIB,
            "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": native(sim, "nvidia_gpu_pcie_replay_total")[key],
            "DCGM_FI_PROF_PCIE_TX_BYTES": native(sim, "nvidia_gpu_pcie_tx_bytes_per_second")[key],
            "DCGM_FI_DEV_POWER_VIOLATION": native(sim, "nvidia_gpu_clocks_event_seconds_total")[
                (*key, "sw_power_cap")
            ]
            * 1e9,
            "DCGM_FI_DEV_SLOWDOWN_TEMP": native(sim, "nvidia_gpu_temperature_threshold_celsius")[
                (*key, "slowdown")
            ],
            "DCGM_FI_DEV_XID_ERRORS": 0,
        }
        if device.mig_enabled:
            for name in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_FB_USED"):
                assert not series(sim, name, UUID=device.uuid, GPU_I_ID=None), name
        else:
            expected |= {
                "DCGM_FI_DEV_GPU_UTIL": native(sim, "nvidia_gpu_utilization_ratio")[key] * 100,
                "DCGM_FI_DEV_MEM_COPY_UTIL": native(sim, "nvidia_gpu_memory_utilization_ratio")[key] * 100,
                "DCGM_FI_DEV_FB_USED": native(sim, "nvidia_gpu_memory_used_bytes")[key] // MIB,
                "DCGM_FI_DEV_FB_FREE": native(sim, "nvidia_gpu_memory_free_bytes")[key] // MIB,
                "DCGM_FI_DEV_FB_TOTAL": native(sim, "nvidia_gpu_memory_total_bytes")[key] // MIB,
            }
        instances = {str(m.gpu_instance_id): m.profile for m in device.migs}
        for name, value in expected.items():
            found = series(sim, name, **at)
            assert found, (name, device.index)
            if device.mig_enabled:
                # dcgm-exporter's MIG shape: the device value repeated on each GPU instance (§4, #317)
                assert {labels["GPU_I_ID"]: labels["GPU_I_PROFILE"] for labels, _ in found} == instances, name
                assert len(found) == len(instances), name
            else:
                assert all(labels.keys().isdisjoint(MIG) for labels, _ in found), name
            if name not in DOUBLES:  # DCGM's int64 fields: whole numbers, truncated (dcgm_fields.h)
                value = math.floor(value + 1e-9)
            for _, got in found:
                assert got == pytest.approx(value, abs=1e-6), (name, device.index)
                assert name in DOUBLES or got == int(got), (name, got)
            checked += 1
    assert checked > 90


@pytest.mark.parametrize("fleet", ["h100-mig", "a100-mixed"])
def test_mig_instances_get_their_own_memory_series(simulate, fleet):
    sim = sampled(simulate, fleet)
    used = native(sim, "nvidia_gpu_mig_memory_used_bytes")
    free = native(sim, "nvidia_gpu_mig_memory_free_bytes")
    total = native(sim, "nvidia_gpu_mig_memory_total_bytes")
    assert used
    for (gpu, uuid, gi, _ci, profile), value in used.items():
        at = {"gpu": gpu, "UUID": uuid, "GPU_I_ID": gi, "GPU_I_PROFILE": profile}
        key = (gpu, uuid, gi, _ci, profile)
        assert one(sim, "DCGM_FI_DEV_FB_USED", **at) == value // MIB
        assert one(sim, "DCGM_FI_DEV_FB_FREE", **at) == free[key] // MIB
        assert one(sim, "DCGM_FI_DEV_FB_TOTAL", **at) == total[key] // MIB
    mig_fb = [labels for labels, _ in series(sim, "DCGM_FI_DEV_FB_USED") if "GPU_I_ID" in labels]
    assert len(mig_fb) == len(used)


def test_gpm_sm_utilization_stands_in_for_prof_sm_active_on_hopper_only(simulate):
    sim = sampled(simulate, "h100-mig")
    utilization = native(sim, "nvidia_gpu_mig_sm_utilization_ratio")
    assert len(utilization) == 56
    for (gpu, uuid, gi, _ci, _profile), value in utilization.items():
        got = one(sim, "DCGM_FI_PROF_SM_ACTIVE", gpu=gpu, UUID=uuid, GPU_I_ID=gi)
        assert 0 <= got <= 1 and got == pytest.approx(value, abs=1e-6)  # a ratio, as DCGM's
    a100 = sampled(simulate, "a100-mixed")
    assert not series(a100, "DCGM_FI_PROF_SM_ACTIVE")  # Ampere: no GPM, absent rather than 0


@pytest.mark.parametrize("fleet", FLEETS)
def test_label_set_and_values(simulate, fleet):
    sim = sampled(simulate, fleet)
    spec = load_fleet(fleet).nodes[0]
    devices = {str(d.index): d for d in sim.sampler.snapshot().devices}
    rendered = samples(sim)
    dcgm_series = [(n, labels) for n, labels, _ in rendered if n.startswith("DCGM_")]
    assert dcgm_series
    for name, labels in dcgm_series:
        extra = {"err_code", "err_msg"} if name == "DCGM_FI_DEV_XID_ERRORS" else set()
        assert set(labels) in (BASE | extra, BASE | MIG | extra), (name, labels)
        device = devices[labels["gpu"]]
        assert labels["UUID"] == device.uuid
        assert labels["device"] == f"nvidia{device.minor_number}"
        assert labels["modelName"] == device.model and labels["modelName"].startswith("NVIDIA ")
        assert labels["pci_bus_id"] == device.pci_bus_id
        assert labels["Hostname"] == spec.name
        assert labels["DCGM_FI_DRIVER_VERSION"] == spec.driver_version
        if "GPU_I_ID" in labels:
            mig = {str(m.gpu_instance_id): m for m in device.migs}[labels["GPU_I_ID"]]
            assert labels["GPU_I_PROFILE"] == mig.profile
    names = {n for n, _, _ in rendered}
    assert not any(n.startswith("nvidia_gpu_") for n in names)  # dcgm names only ...
    assert {"gpumeter_exporter_nvml_up", "gpumeter_exporter_build_info"} <= names  # ... and our own meta
    assert names.isdisjoint(NOT_PROVIDED)


def test_counters_keep_their_bare_dcgm_names_and_counter_type(simulate):
    sim = sampled(simulate, "workstation")
    for encode in (generate_latest, generate_openmetrics):
        text = encode(sim.exporter.registry).decode()
        assert "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n" in text
        assert "# TYPE DCGM_FI_DEV_PCIE_REPLAY_COUNTER counter\n" in text
        assert "# TYPE DCGM_FI_DEV_GPU_TEMP gauge\n" in text
        assert re.search(r"^DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION\{", text, re.M)
        assert "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_total" not in text
        assert "_total_total" not in text
        assert "# TYPE gpumeter_exporter_nvml_up gauge\n" in text


def test_xid_errors_is_the_code_of_the_newest_xid(simulate):
    sim = sampled(simulate, "h100-mig")
    uuid = sim.node.gpus[1].spec.uuid
    assert {v for _, v in series(sim, "DCGM_FI_DEV_XID_ERRORS", UUID=uuid)} == {0}
    assert {labels["err_msg"] for labels, _ in series(sim, "DCGM_FI_DEV_XID_ERRORS", UUID=uuid)} == {
        "No Error"
    }
    watcher = sim.sampler.xid_watcher
    sim.node.inject("xid", 1, code=48)
    assert wait_until(lambda: 48 in watcher.counts(uuid))
    sim.clock.advance(10)
    for _ in range(2):
        sim.node.inject("xid", 1, code=13)
    assert wait_until(lambda: watcher.counts(uuid).get(13, (0, 0))[0] == 2)
    sim.sample()
    found = series(sim, "DCGM_FI_DEV_XID_ERRORS", UUID=uuid)
    assert len(found) == len({m.gpu_instance_id for m in sim.node.gpus[1].migs})  # per GPU instance
    for labels, value in found:
        assert value == 13 and labels["err_code"] == "13"  # the last one, not the highest code
        assert labels["err_msg"] == "Graphics Engine Exception"  # NVIDIA's XID catalog text
    # native mode keeps every XID, counted
    assert native(sim, "nvidia_gpu_xid_errors_total")[("1", uuid, "13")] == 2
    assert native(sim, "nvidia_gpu_xid_errors_total")[("1", uuid, "48")] == 1
    assert {v for _, v in series(sim, "DCGM_FI_DEV_XID_ERRORS", UUID=sim.node.gpus[0].spec.uuid)} == {0}


def test_a_lost_gpu_shows_no_dcgm_series(simulate):
    sim = sampled(simulate, "a100-mixed")
    assert series(sim, "DCGM_FI_DEV_GPU_TEMP", gpu="3")
    sim.node.inject("gpu_lost", 3)
    sim.sample()
    assert not [name for name, labels, _ in samples(sim) if name.startswith("DCGM_") and labels["gpu"] == "3"]
    assert series(sim, "DCGM_FI_DEV_GPU_TEMP", gpu="2")  # the others keep flowing


# --- promtool ------------------------------------------------------------------------------------
def expected_lint(text: str) -> set[str]:
    """What promtool says about dcgm-exporter's own names, and nothing else.

    dcgm-exporter's names break three of promtool's lint rules, and a drop-in must keep them: the
    ``modelName`` label is camelCase, counters have no ``_total`` suffix, and
    ``DCGM_FI_DEV_PCIE_REPLAY_COUNTER`` has a type in its name.
    """
    families = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    out = set()
    for name, mtype in families.items():
        if not name.startswith("DCGM_"):
            continue
        out.add(f"{name} label names should be written in 'snake_case' not 'camelCase'")
        if mtype == "counter":
            out.add(f'{name} counter metrics should have "_total" suffix')
        if "counter" in name.lower():
            out.add(f"{name} metric name should not include type 'counter'")
    return out


@pytest.mark.prometheus
@pytest.mark.parametrize("fleet", FLEETS)
def test_promtool_check_metrics(with_kubelet, fleet):
    promtool = require_binary("promtool")
    sim = with_kubelet(fleet)  # pod labels included
    sim.sampler.sample_once()
    sim.exporter.sampler.clock.advance(5)
    sim.sampler.sample_once()
    text = generate_latest(sim.exporter.registry).decode()
    result = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    findings = {line for line in (result.stdout + result.stderr).splitlines() if line.strip()}
    # exit 3 = lint findings only; a parse error or a duplicate series would exit 1
    assert result.returncode in (0, 3), findings
    assert findings == expected_lint(text)
    # with those three dcgm-exporter naming choices taken out, promtool has nothing to say
    clean = re.sub(r"\bmodelName=", "model_name=", text)
    clean = re.sub(r"# TYPE (DCGM_\S+) counter", r"# TYPE \1 untyped", clean)
    clean = clean.replace("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_PCIE_REPLAY")
    result = subprocess.run([promtool, "check", "metrics"], input=clean, capture_output=True, text=True)
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


# --- pods ------------------------------------------------------------------------------------------
def test_pods_on_mig_instances_whole_and_time_sliced_gpus(with_kubelet):
    sim = with_kubelet("a100-mixed")
    sim.sampler.sample_once()
    fleet = load_fleet("a100-mixed")
    gpus = fleet.nodes[0].gpus
    # a MIG instance: matched by GPU index and GPU-instance id (not by the MIG UUID)
    [(labels, _)] = series(sim, "DCGM_FI_DEV_FB_USED", gpu="0", GPU_I_ID="1")
    assert (labels["pod"], labels["namespace"], labels["container"]) == (
        "detector-train",
        "vision",
        "trainer",
    )
    assert series(sim, "DCGM_FI_DEV_FB_FREE", gpu="0", GPU_I_ID="3", pod="tokenizer-svc", namespace="nlp")
    # an instance nobody holds is still shown, without pod labels
    [(labels, _)] = series(sim, "DCGM_FI_DEV_FB_USED", gpu="0", GPU_I_ID="8")
    assert labels.keys().isdisjoint(PODS)
    # the physical GPU's fields repeated per GPU instance with that instance's pod, as dcgm-exporter does,
    # so `DCGM_FI_DEV_GPU_TEMP{pod=...}` and `sum by (pod) (DCGM_FI_DEV_POWER_USAGE)` find the pod
    [(labels, temp)] = series(sim, "DCGM_FI_DEV_GPU_TEMP", gpu="0", GPU_I_ID="1")
    assert labels["pod"] == "detector-train" and labels["GPU_I_PROFILE"]
    [(labels, _)] = series(sim, "DCGM_FI_DEV_GPU_TEMP", gpu="0", GPU_I_ID="8")
    assert labels.keys().isdisjoint(PODS)  # nobody holds instance 8
    assert {v for _, v in series(sim, "DCGM_FI_DEV_GPU_TEMP", gpu="0")} == {temp}
    assert not [lb for lb, _ in series(sim, "DCGM_FI_DEV_GPU_TEMP", gpu="0") if "GPU_I_ID" not in lb]
    # a whole GPU: matched by UUID, every device field
    for name in (
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_XID_ERRORS",
    ):
        [(labels, _)] = series(sim, name, UUID=gpus[2].uuid)
        assert (labels["pod"], labels["namespace"], labels["container"]) == ("labeler", "vision", "main")
    # time-sliced four ways: one series per pod (dcgm-exporter labels only the last one, #307),
    # each with the device's value
    found = series(sim, "DCGM_FI_DEV_GPU_TEMP", UUID=gpus[4].uuid)
    assert sorted(labels["pod"] for labels, _ in found) == [f"etl-{r}" for r in range(4)]
    assert len({value for _, value in found}) == 1
    assert all(labels["namespace"] == "data-eng" for labels, _ in found)
    # pod labels come from the same snapshot's allocation series
    allocations = sim.sampler.snapshot().samples("nvidia_gpu_allocation")
    assert {labels[2] for labels, _ in allocations} >= {"detector-train", "labeler", "etl-0"}


def test_pod_on_h100_mig_instance(with_kubelet):
    sim = with_kubelet("h100-mig")
    sim.sampler.sample_once()
    uuid = sim.node.gpus[2].spec.uuid
    [(labels, value)] = series(sim, "DCGM_FI_DEV_FB_USED", UUID=uuid, GPU_I_ID="9")
    assert (labels["pod"], labels["namespace"], labels["container"]) == (
        "ranker-2-9",
        "search-inference",
        "server",
    )
    assert labels["GPU_I_PROFILE"] == "1g.10gb"
    key = ("2", uuid, "9", "0", "1g.10gb")
    assert value == native(sim, "nvidia_gpu_mig_memory_used_bytes")[key] // MIB  # whole MiB, as DCGM's int64
    # notebooks run 8h-18h: GPU 4's instances are free at the start, shown without pod labels
    assert all(labels.keys().isdisjoint(PODS) for labels, _ in series(sim, "DCGM_FI_DEV_FB_USED", gpu="4"))


# --- rendering a hand-made snapshot ------------------------------------------------------------------
def _snapshot(pods: int, compute_instances: int = 1) -> Snapshot:
    migs = tuple(
        MigIdentity(f"MIG-{ci}", "GPU-b", 1, 5, ci, "3g.40gb", 3, 4) for ci in range(compute_instances)
    )
    devices = (
        DeviceIdentity(0, "GPU-a", "NVIDIA T", "00000000:17:00.0", minor_number=3),
        DeviceIdentity(
            1, "GPU-b", "NVIDIA T", "00000000:27:00.0", minor_number=None, mig_enabled=True, migs=migs
        ),
    )
    out = SnapshotBuilder()
    for d in devices:
        out.add(contract.GPU_INFO, (*d.labels, d.model, d.pci_bus_id, "999.1", "13.0", "x", "h"), 1)
        out.add(contract.TEMPERATURE, d.labels, 50)
        out.add(contract.MEMORY_USED, d.labels, 3 * MIB)
    for m in migs:
        out.add(contract.MIG_MEMORY_USED, m.labels, MIB)
    for p in range(pods):
        labels = ("h", "ns", f"p{p:02d}", "c", "nvidia.com/gpu.shared", "GPU-a", "0", "", "", "time_slicing")
        out.add(contract.ALLOCATION, labels, 1 / pods)
    out.add(
        contract.ALLOCATION,
        ("h", "ns", "mig-pod", "c", "nvidia.com/mig-3g.40gb", "GPU-b", "1", "5", "3g.40gb", "mig"),
        1,
    )
    return out.freeze(
        timestamp=1.0,
        devices=devices,
        nvml_up=True,
        hostname="h",
        collectors=(CollectorStatus("xid", True, 0),),
    )


def _render(snapshot: Snapshot) -> str:
    registry = CollectorRegistry()
    registry.register(SnapshotCollector(lambda: snapshot, naming="dcgm"))
    return generate_latest(registry).decode()


def test_time_sliced_pods_are_bounded(monkeypatch):
    text = _render(_snapshot(pods=3))
    assert len(re.findall(r'^DCGM_FI_DEV_GPU_TEMP\{.*UUID="GPU-a"', text, re.M)) == 3
    monkeypatch.setattr(dcgm, "MAX_PODS_PER_DEVICE", 2)
    text = _render(_snapshot(pods=40))
    temps = re.findall(r'^DCGM_FI_DEV_GPU_TEMP\{.*UUID="GPU-a".*pod="(p\d+)"', text, re.M)
    assert temps == ["p00", "p01"]


def test_compute_instances_collapse_into_their_gpu_instance_and_minor_falls_back_to_index():
    text = _render(_snapshot(pods=0, compute_instances=2))
    fb = re.findall(r"^DCGM_FI_DEV_FB_USED\{(.*)\} (\S+)$", text, re.M)
    assert len(fb) == 2  # GPU-a whole; GPU-b's one GPU instance (two compute instances) once
    mig = [labels for labels, _ in fb if "GPU_I_ID" in labels]
    assert len(mig) == 1 and 'GPU_I_ID="5"' in mig[0] and 'pod="mig-pod"' in mig[0]
    assert 'device="nvidia1"' in mig[0]  # no minor number: nvidia<index>
    assert re.search(r'^DCGM_FI_DEV_GPU_TEMP\{.*UUID="GPU-a".*device="nvidia3"', text, re.M)
    assert 'DCGM_FI_DRIVER_VERSION="999.1"' in text


# --- a real Prometheus scraping a real exporter -----------------------------------------------------
@pytest.mark.prometheus
@pytest.mark.slow
def test_prometheus_scrapes_dcgm_names_with_pods_on_mig(tmp_path, sock):
    fleet = load_fleet("h100-mig")
    kubelet = StandInKubelet(fleet, fleet.nodes[0].name, sock).start()
    exporter = build_exporter(
        ExporterConfig(
            listen="127.0.0.1:0", simulate="h100-mig", kubelet_socket=sock, interval=1, naming="dcgm"
        )
    )
    try:
        exporter.start()
        target = f"127.0.0.1:{exporter.port}"
        with PrometheusServer(tmp_path / "prom", scrape_targets={"gpumeter-exporter": [target]}) as prom:
            uuid = fleet.nodes[0].gpus[0].uuid
            identity = (
                f'gpu="0",UUID="{uuid}",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",'
                f'Hostname="gpu-h100-mig-01",DCGM_FI_DRIVER_VERSION="550.54.15"'
            )
            instance = f'{identity},GPU_I_ID="7",GPU_I_PROFILE="1g.10gb"'
            [temp] = prom.wait_for(f"DCGM_FI_DEV_GPU_TEMP{{{instance}}}")
            assert 20 < float(temp["value"][1]) < 89
            assert temp["metric"]["pci_bus_id"] == "00000000:17:00.0"
            # device fields repeated on each of the 56 GPU instances, as dcgm-exporter reports MIG GPUs
            assert len(prom.wait_for("DCGM_FI_DEV_GPU_TEMP", predicate=lambda r: len(r) == 56)) == 56
            [power] = prom.wait_for(f"DCGM_FI_DEV_POWER_USAGE{{{instance}}}")
            assert 72 <= float(power["value"][1]) <= 700
            [xid] = prom.wait_for(f'DCGM_FI_DEV_XID_ERRORS{{{instance},err_code="0",err_msg="No Error"}}')
            assert float(xid["value"][1]) == 0
            [fb] = prom.wait_for(
                f'DCGM_FI_DEV_FB_USED{{{identity},GPU_I_ID="7",GPU_I_PROFILE="1g.10gb",'
                'pod="ranker-0-7",namespace="search-inference",container="server"}'
            )
            assert 0 < float(fb["value"][1]) <= 10240
            assert len(prom.wait_for("DCGM_FI_DEV_FB_USED", predicate=lambda r: len(r) == 56)) == 56
            # counters arrive under their bare names, typed counter, whichever format was negotiated
            [energy] = prom.wait_for(f"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{instance}}}")
            assert float(energy["value"][1]) > 0
            metadata = loopback.get(f"{prom.url}/api/v1/metadata", timeout=10).json()["data"]
            assert metadata["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"][0]["type"] == "counter"
            assert metadata["DCGM_FI_DEV_FB_USED"][0]["type"] == "gauge"
            assert not any(name.endswith("_total") for name in metadata if name.startswith("DCGM_"))
            assert prom.wait_for('gpumeter_exporter_kubelet_up{job="gpumeter-exporter"} == 1')
            assert not prom.query("DCGM_FI_DEV_GPU_UTIL")  # MIG mode: absent, as in dcgm-exporter
    finally:
        exporter.stop()
        kubelet.stop()


def wait_until(predicate, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False
