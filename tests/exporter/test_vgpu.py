"""vGPU on a hypervisor host: the stand-in NVML answers the vGPU calls as nvml.h
says a driver does (NOT_SUPPORTED on a GPU not in host vGPU mode, the two-call list APIs, the
lastSeenTimeStamp rule), and the vgpu collector turns them into nvidia_vgpu_* series and
nvidia_gpu_allocation{sharing="vgpu"} held by each VM."""

from __future__ import annotations

import pynvml as N
import pytest

from gpumeter.simulator.device import SimulatedNode
from gpumeter.simulator.fleet import FleetError, load_fleet, parse_fleet
from gpumeter.simulator.nvml import SimulatedNvml

from .conftest import ManualClock

FLEET = "shared-modes"
VGPU_NODE = "gpu-shared-vgpu-01"
GiB = 1024**3


@pytest.fixture
def nvml():
    """pynvml bound to a stand-in for one node; yields (node, clock)."""
    opened = []

    def bind(node_name: str):
        clock = ManualClock()
        node = SimulatedNode(load_fleet(FLEET), node_name, clock=clock)
        lib = SimulatedNvml(node)
        with N.libLoadLock:
            N.nvmlLib = lib
            N._nvmlGetFunctionPointer_cache = {}
        N.nvmlInit()
        opened.append(lib)
        return node, clock

    yield bind
    for _ in opened:
        N.nvmlShutdown()
    with N.libLoadLock:
        N.nvmlLib = None
        N._nvmlGetFunctionPointer_cache = {}


def _code(call, *args) -> int:
    with pytest.raises(N.NVMLError) as caught:
        call(*args)
    return caught.value.value


def test_a_gpu_not_in_host_vgpu_mode_refuses_every_vgpu_call(nvml):
    nvml("gpu-shared-ts-01")  # bare metal: exclusive, MIG and time-sliced GPUs
    for index in range(3):
        handle = N.nvmlDeviceGetHandleByIndex(index)
        assert N.nvmlDeviceGetVirtualizationMode(handle) == N.NVML_GPU_VIRTUALIZATION_MODE_NONE
        assert _code(N.nvmlDeviceGetActiveVgpus, handle) == N.NVML_ERROR_NOT_SUPPORTED
        assert _code(N.nvmlDeviceGetVgpuUtilization, handle, 0) == N.NVML_ERROR_NOT_SUPPORTED
        # a type this board has, asked of a GPU the vGPU manager does not own: still "not supported on
        # target device" only where the board lacks the type; an H100 has it
        assert N.nvmlVgpuTypeGetMaxInstances(handle, 1104) == 4  # H100XM-20C: 80 / 20
    # instance 0 is an invalid argument, an unknown instance is not found (nvml.h)
    assert _code(N.nvmlVgpuInstanceGetType, 0) == N.NVML_ERROR_INVALID_ARGUMENT
    assert _code(N.nvmlVgpuInstanceGetVmID, 3_000_000) == N.NVML_ERROR_NOT_FOUND
    assert _code(N.nvmlVgpuTypeGetName, 7) == N.NVML_ERROR_INVALID_ARGUMENT


def test_a_vgpu_host_lists_its_vms_vgpus_with_type_vm_framebuffer_and_license(nvml):
    node, _clock = nvml(VGPU_NODE)
    handle = N.nvmlDeviceGetHandleByIndex(0)
    assert N.nvmlDeviceGetVirtualizationMode(handle) == N.NVML_GPU_VIRTUALIZATION_MODE_HOST_VGPU
    instances = N.nvmlDeviceGetActiveVgpus(handle)
    specs = node.spec.gpus[0].vgpus
    assert len(instances) == len(specs) == 3
    for instance, spec in zip(instances, specs, strict=True):
        type_id = N.nvmlVgpuInstanceGetType(instance)
        assert N.nvmlVgpuTypeGetName(type_id) == "NVIDIA H100XM-20C"
        assert N.nvmlVgpuTypeGetFramebufferSize(type_id) == 20 * GiB
        assert N.nvmlVgpuTypeGetMaxInstances(handle, type_id) == 4
        # pynvml's convertStrBytes decodes a returned bytes, not one inside a tuple: the ID stays bytes
        assert N.nvmlVgpuInstanceGetVmID(instance) == (spec.vm_id.encode(), N.NVML_VGPU_VM_ID_UUID)
        assert N.nvmlVgpuInstanceGetUUID(instance) == spec.uuid
        licensed = spec.license == "licensed"
        assert N.nvmlVgpuInstanceGetLicenseInfo_v2(instance).isLicensed == int(licensed)
        assert N.nvmlVgpuInstanceGetLicenseStatus(instance) == int(licensed)
    # a type ID is no instance and an instance no type ID
    assert _code(N.nvmlVgpuTypeGetName, instances[0]) == N.NVML_ERROR_INVALID_ARGUMENT
    assert _code(N.nvmlVgpuInstanceGetUUID, type_id) == N.NVML_ERROR_NOT_FOUND


def test_pynvml_reads_framebuffer_usage_through_a_4_byte_buffer_and_loses_the_high_half(nvml):
    """nvml.h: nvmlVgpuInstanceGetFbUsage(..., unsigned long long *fbUsage). pynvml passes a c_uint, so
    above 4 GiB its answer is the usage modulo 2^32; the collector reads with its own 8-byte buffer."""
    from gpumeter.exporter.collectors.vgpu import read_fb_usage

    node, clock = nvml(VGPU_NODE)
    instance = N.nvmlDeviceGetActiveVgpus(N.nvmlDeviceGetHandleByIndex(0))[0]
    true_bytes = node.vgpus[instance].fb_used_bytes(clock())
    assert true_bytes > 4 * GiB  # a 20 GiB vGPU at 70 % load holds ~11.8 GiB
    assert read_fb_usage(instance) == true_bytes
    assert N.nvmlVgpuInstanceGetFbUsage(instance) == true_bytes % 2**32 != true_bytes


def test_vgpu_utilization_returns_only_samples_newer_than_last_seen(nvml):
    _node, clock = nvml(VGPU_NODE)
    handle = N.nvmlDeviceGetHandleByIndex(0)
    first = N.nvmlDeviceGetVgpuUtilization(handle, 0)  # 0: everything in the driver's buffer
    assert len(first) == 3
    seen = max(s.timeStamp for s in first)
    assert all(0 <= s.smUtil.uiVal <= 100 for s in first)
    # no newer sample yet: nvml.h's NOT_FOUND, not an empty success
    assert _code(N.nvmlDeviceGetVgpuUtilization, handle, seen) == N.NVML_ERROR_NOT_FOUND
    clock.advance(5)
    later = N.nvmlDeviceGetVgpuUtilization(handle, seen)
    assert len(later) == 3 and min(s.timeStamp for s in later) > seen


def test_fleet_refuses_a_vgpu_layout_the_vgpu_manager_would_refuse():
    base = {"nodes": [{"name": "h", "gpus": [{"model": "H100-SXM5-80GB", "vgpus": []}]}]}

    def with_vgpus(vgpus, model="H100-SXM5-80GB"):
        data = {"nodes": [{"name": "h", "gpus": [{"model": model, "vgpus": vgpus}]}]}
        return parse_fleet(data, "f.yaml")

    assert parse_fleet(base, "f.yaml").nodes[0].gpus[0].vgpu_host
    with pytest.raises(FleetError, match=r"f.yaml: nodes\[0\].gpus\[0\].vgpus\[4\].type: at most 4"):
        with_vgpus([{"vm": f"vm{i}", "type": "H100XM-20C"} for i in range(5)])
    with pytest.raises(FleetError, match="one type"):
        with_vgpus([{"vm": "a", "type": "H100XM-20C"}, {"vm": "b", "type": "H100XM-40C"}])
    with pytest.raises(FleetError, match="no vGPU types for T4-16GB"):
        with_vgpus([{"vm": "a", "type": "T4-4C"}], model="T4-16GB")


def test_the_collector_exports_each_vm_vgpu_and_its_allocation(simulate):
    sim = simulate(FLEET, node=VGPU_NODE)
    sim.sample()
    spec = sim.node.spec.gpus[0]
    gpu = {"gpu": "0", "uuid": spec.uuid}
    for vgpu in spec.vgpus:
        ids = {**gpu, "vgpu_uuid": vgpu.uuid, "vm_id": vgpu.vm_id}
        info = {
            **ids,
            "vm_id_type": "uuid",
            "vgpu_type": "NVIDIA H100XM-20C",
            "max_instances": "4",
            "license_state": vgpu.license,
        }
        assert sim.value("nvidia_vgpu_info", **info) == 1
        assert sim.value("nvidia_vgpu_memory_total_bytes", **ids) == 20 * GiB
        used = sim.value("nvidia_vgpu_memory_used_bytes", **ids)
        assert used == sim.node.vgpus[_instance_of(sim, vgpu)].fb_used_bytes(sim.clock())
        sm = sim.value("nvidia_vgpu_utilization_ratio", **ids, engine="sm")
        assert sm == pytest.approx(vgpu.utilization, abs=0.051)
        assert sim.value("nvidia_vgpu_utilization_ratio", **ids, engine="decoder") == 0
        # the VM holds a quarter of the GPU: 20 GiB of the 4 x 20 GiB the vGPU manager divides
        held = {
            "hostname": VGPU_NODE,
            "namespace": vgpu.vm_id,
            "pod": vgpu.uuid,
            "container": "",
            "resource": "NVIDIA H100XM-20C",
            **gpu,
            "gpu_instance_id": "",
            "mig_profile": "",
            "sharing": "vgpu",
        }
        assert sim.value("nvidia_gpu_allocation", **held) == 0.25
    # the last value is kept while the driver has no newer sample (a second cycle within the same second)
    before = sim.text().count("nvidia_vgpu_utilization_ratio{")
    sim.sample(advance=0.2)
    assert sim.text().count("nvidia_vgpu_utilization_ratio{") == before == 3 * 4
    assert sim.value("gpumeter_exporter_collector_success", collector="vgpu") == 1


def test_the_collector_asks_a_bare_metal_gpu_once_and_never_again(simulate):
    sim = simulate(FLEET, node="gpu-shared-ts-01")
    sim.sample()
    # the one question, asked at discovery, once per GPU
    assert sim.lib.calls["nvmlDeviceGetVirtualizationMode"] == 3
    assert sim.lib.calls["nvmlDeviceGetActiveVgpus"] == 0
    sim.lib.calls.clear()
    sim.sample()
    assert not [name for name in sim.lib.calls if "Vgpu" in name or "Virtualization" in name]
    assert not [line for line in sim.text().splitlines() if line.startswith("nvidia_vgpu_")]
    assert sim.value("gpumeter_exporter_collector_success", collector="vgpu") == 1


def _instance_of(sim, vgpu) -> int:
    return next(i for i, v in sim.node.vgpus.items() if v.spec.uuid == vgpu.uuid)


def test_a_vgpu_call_failing_fails_the_vgpu_collector_alone_and_a_vm_gone_takes_its_series(simulate):
    sim = simulate(FLEET, node=VGPU_NODE)
    sim.sample()
    assert sim.value("nvidia_gpu_temperature_celsius", gpu="0", uuid=sim.node.spec.gpus[0].uuid) is not None
    # the driver errs on the list (nvml.h's catch-all UNKNOWN): the collector fails for this cycle only
    sim.node.gpus[0].nvml_errors["nvmlDeviceGetActiveVgpus"] = N.NVML_ERROR_UNKNOWN
    sim.sample()
    assert sim.value("gpumeter_exporter_collector_success", collector="vgpu") == 0
    assert sim.value("gpumeter_exporter_collector_success", collector="thermal") == 1
    assert "nvidia_vgpu_memory_used_bytes{" not in sim.text()
    del sim.node.gpus[0].nvml_errors["nvmlDeviceGetActiveVgpus"]
    # a VM shut down: its vGPU leaves the driver's list, and its series and allocation leave the next cycle
    gone = next(iter(sim.node.vgpus))
    gone_vm = sim.node.vgpus.pop(gone).spec.vm_id
    sim.sample()
    assert sim.value("gpumeter_exporter_collector_success", collector="vgpu") == 1
    text = sim.text()
    assert gone_vm not in text
    held = [line for line in text.splitlines() if line.startswith("nvidia_gpu_allocation{")]
    assert len(held) == 2 and all('sharing="vgpu"' in line for line in held)


def test_a_driver_without_license_info_v2_still_says_who_is_licensed(simulate):
    sim = simulate(FLEET, node=VGPU_NODE, missing={"nvmlVgpuInstanceGetLicenseInfo_v2"})
    sim.sample()
    states = {
        line.split('license_state="')[1].split('"')[0]
        for line in sim.text().splitlines()
        if line.startswith("nvidia_vgpu_info{")
    }
    assert states == {"licensed", "unlicensed"}  # from nvmlVgpuInstanceGetLicenseStatus's 1 / 0
    assert sim.lib.calls["nvmlVgpuInstanceGetLicenseStatus"] == 3
