"""Device-ID parsing and resolution: pure functions, every form the device plugins use."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpumeter.exporter.kubelet.devices import (
    DeviceRef,
    Inventory,
    ResolvedDevice,
    is_gpu_resource,
    parse_device_id,
    profile_from_resource,
    replica_counts,
    resolve,
    share,
)
from gpumeter.exporter.snapshot import DeviceIdentity
from gpumeter.simulator.fleet import load_fleet

from .helpers import identity, inventory

UUID = "GPU-90d43427-672f-dc63-dfb5-960b6c458b56"
MIG = "MIG-4a860758-f87b-012f-45ca-a1d5d73c0be3"

PARSE_CASES = {
    UUID: DeviceRef(UUID, UUID, uuid=UUID),
    MIG: DeviceRef(MIG, MIG, uuid=MIG),
    f"{UUID}::3": DeviceRef(f"{UUID}::3", UUID, uuid=UUID, replica=3),
    f"{MIG}::1": DeviceRef(f"{MIG}::1", MIG, uuid=MIG, replica=1),  # EKS: MIG with time-slicing
    f"MIG-{UUID}/7/0": DeviceRef(f"MIG-{UUID}/7/0", f"MIG-{UUID}/7/0", uuid=UUID, gpu_instance_id=7,
                                 compute_instance_id=0),
    "nvidia3": DeviceRef("nvidia3", "nvidia3", gpu_number=3),
    "nvidia0/gi11": DeviceRef("nvidia0/gi11", "nvidia0/gi11", gpu_number=0, gpu_instance_id=11),
    "nvidia0/gi11/vgpu2": DeviceRef("nvidia0/gi11/vgpu2", "nvidia0/gi11", gpu_number=0, gpu_instance_id=11,
                                    replica=2),
    "nvidia5/vgpu0": DeviceRef("nvidia5/vgpu0", "nvidia5", gpu_number=5, replica=0),
}  # fmt: skip


@pytest.mark.parametrize("device_id", list(PARSE_CASES))
def test_parse_every_form(device_id):
    assert parse_device_id(device_id) == PARSE_CASES[device_id]


@pytest.mark.parametrize(
    "device_id",
    ["", "GPU-", "gpu0", "nvidia", "nvidiaX", "nvidia0/gi", "nvidia0/vgpu1::2", "MIG-GPU-xyz/1/0",
     "/dev/nvidia0", "MIG-GPU-90d43427/7", "GPU-90d43427::", "example.com/fpga-0"],
)  # fmt: skip
def test_unknown_forms_are_none(device_id):
    assert parse_device_id(device_id) is None


hex_groups = st.lists(st.text("0123456789abcdef", min_size=1, max_size=12), min_size=1, max_size=5).map(
    "-".join
)
small = st.integers(min_value=0, max_value=10_000)


@given(hex_groups, st.sampled_from(["GPU", "MIG"]), st.none() | small)
def test_uuid_forms_round_trip(body, prefix, replica):
    uuid = f"{prefix}-{body}"
    raw = uuid if replica is None else f"{uuid}::{replica}"
    assert parse_device_id(raw) == DeviceRef(raw, uuid, uuid=uuid, replica=replica)


@given(hex_groups, small, small, st.none() | small)
def test_legacy_mig_round_trip(body, gi, ci, replica):
    base = f"MIG-GPU-{body}/{gi}/{ci}"
    raw = base if replica is None else f"{base}::{replica}"
    ref = parse_device_id(raw)
    assert ref == DeviceRef(raw, base, uuid=f"GPU-{body}", gpu_instance_id=gi, compute_instance_id=ci,
                            replica=replica)  # fmt: skip


@given(small, st.none() | small, st.none() | small)
def test_gke_round_trip(number, gi, vgpu):
    base = f"nvidia{number}" + ("" if gi is None else f"/gi{gi}")
    raw = base + ("" if vgpu is None else f"/vgpu{vgpu}")
    assert parse_device_id(raw) == DeviceRef(raw, base, gpu_number=number, gpu_instance_id=gi, replica=vgpu)


@given(st.text(max_size=80))
def test_parse_never_raises(text):
    ref = parse_device_id(text)
    assert ref is None or isinstance(ref, DeviceRef)


@pytest.mark.parametrize(
    ("resource", "extra", "wanted"),
    [
        ("nvidia.com/gpu", (), True),
        ("nvidia.com/gpu.shared", (), True),
        ("nvidia.com/mig-1g.10gb", (), True),
        ("nvidia.com/mig-", (), False),
        ("nvidia.com/a100", (), False),
        ("nvidia.com/a100", ("nvidia.com/a100",), True),
        ("example.com/fpga", (), False),
        ("cpu", (), False),
        ("nvidia.com/gpumem", (), False),
    ],
)
def test_which_resources_count(resource, extra, wanted):
    assert is_gpu_resource(resource, extra) is wanted


def test_profile_from_resource():
    assert profile_from_resource("nvidia.com/mig-3g.20gb") == "3g.20gb"
    assert profile_from_resource("nvidia.com/gpu") == ""


# --- resolution ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def a100():
    fleet = load_fleet("a100-mixed")
    return fleet.nodes[0].gpus, Inventory.from_devices(inventory(fleet))


def test_resolve_whole_gpu_and_replica(a100):
    gpus, inv = a100
    assert resolve(parse_device_id(gpus[2].uuid), inv) == ResolvedDevice(gpus[2].uuid, 2)
    assert resolve(parse_device_id(f"{gpus[4].uuid}::3"), inv) == ResolvedDevice(gpus[4].uuid, 4)
    assert resolve(parse_device_id(gpus[2].uuid.upper().replace("GPU-", "GPU-")), inv).gpu == 2  # case-blind


def test_resolve_mig_uuid_through_the_inventory(a100):
    gpus, inv = a100
    for gpu in gpus[:2]:
        for m in gpu.mig:
            resolved = resolve(parse_device_id(gpu.mig_uuid(m.gpu_instance_id)), inv)
            assert resolved == ResolvedDevice(gpu.uuid, gpu.index, m.gpu_instance_id, m.profile.name)
            assert resolved.key == (gpu.uuid, m.gpu_instance_id)
    assert resolve(parse_device_id("MIG-00000000-0000-0000-0000-000000000000"), inv) is None


def test_every_mig_form_gives_one_key(a100):
    """dcgm-exporter #272: the same instance named two ways must not become two keys."""
    gpus, inv = a100
    gpu = gpus[1]
    for m in gpu.mig:
        gi = m.gpu_instance_id
        forms = [gpu.mig_uuid(gi), f"MIG-{gpu.uuid}/{gi}/0", f"nvidia{gpu.index}/gi{gi}",
                 f"nvidia1/gi{gi}/vgpu0", f"{gpu.mig_uuid(gi)}::2"]  # fmt: skip
        assert {resolve(parse_device_id(f), inv) for f in forms} == {
            ResolvedDevice(gpu.uuid, 1, gi, m.profile.name)
        }


def test_legacy_and_gke_mig_with_an_unknown_instance(a100):
    gpus, inv = a100
    assert resolve(parse_device_id(f"MIG-{gpus[0].uuid}/13/0"), inv) is None  # not in NVML's layout
    assert resolve(parse_device_id("nvidia0/gi13"), inv) is None
    assert resolve(parse_device_id("nvidia9"), inv) is None
    assert resolve(parse_device_id(f"MIG-{gpus[2].uuid}/1/0"), inv) is None  # GPU 2 is not in MIG mode
    assert resolve(parse_device_id("nvidia2/gi1"), inv) is None
    assert (
        resolve(parse_device_id("MIG-GPU-00000000-1111-2222-3333-444444444444/1/0"), inv) is None
    )  # no such GPU


def test_mig_ids_on_a_gpu_whose_instances_nvml_could_not_list(a100):
    gpus, _ = a100
    blind = identity(gpus[0])
    blind = DeviceIdentity(blind.index, blind.uuid, blind.model, blind.pci_bus_id, 0, mig_enabled=True)
    inv = Inventory.from_devices([blind])
    ref = parse_device_id(f"MIG-{gpus[0].uuid}/1/0")
    assert resolve(ref, inv, "nvidia.com/mig-3g.20gb") == ResolvedDevice(gpus[0].uuid, 0, 1, "3g.20gb")
    assert resolve(ref, inv, "nvidia.com/gpu") == ResolvedDevice(gpus[0].uuid, 0, 1, "")
    assert resolve(parse_device_id(gpus[0].mig_uuid(1)), inv) is None  # a MIG UUID needs NVML


def test_gke_number_is_the_minor_number_with_index_fallback(a100):
    gpus, _ = a100
    # minor numbers that differ from the index: nvidia<N> follows /dev/nvidia<N>
    swapped = Inventory.from_devices([identity(gpus[0], minor_number=1), identity(gpus[1], minor_number=0)])
    assert resolve(parse_device_id("nvidia0"), swapped) == ResolvedDevice(gpus[1].uuid, 1)
    assert resolve(parse_device_id("nvidia1/gi1"), swapped).uuid == gpus[0].uuid
    # minor numbers unknown: fall back to the index
    unknown = [identity(g) for g in gpus[:3]]
    unknown = [DeviceIdentity(d.index, d.uuid, d.model, d.pci_bus_id, None, migs=d.migs) for d in unknown]
    inv = Inventory.from_devices(unknown)
    assert resolve(parse_device_id("nvidia2"), inv) == ResolvedDevice(gpus[2].uuid, 2)
    # a known minor number that matches nothing is not re-read as an index
    partial = Inventory.from_devices([identity(gpus[0], minor_number=5)])
    assert resolve(parse_device_id("nvidia0"), partial) is None


def test_replicas_counted_by_base_id():
    ids = [f"{UUID}::{r}" for r in range(4)] + ["nvidia1/vgpu0", "nvidia1/vgpu1", UUID, MIG]
    counts = replica_counts(ids)
    assert counts == {UUID: 4, "nvidia1": 2}
    assert share(parse_device_id(f"{UUID}::2"), counts) == 0.25
    assert share(parse_device_id("nvidia1/vgpu1"), counts) == 0.5
    assert share(parse_device_id(UUID), counts) == 1.0
    assert share(parse_device_id("nvidia7/vgpu1"), counts) == 1.0  # unknown replica count: never / 0


@given(st.integers(min_value=1, max_value=64))
def test_replica_shares_sum_to_one(replicas):
    ids = [f"{UUID}::{r}" for r in range(replicas)]
    counts = replica_counts(ids)
    assert sum(share(parse_device_id(i), counts) for i in ids) == pytest.approx(1.0)
