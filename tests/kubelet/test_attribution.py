"""PodAttribution over the real gRPC stand-in kubelet on a unix socket, driven by the example fleets."""

from __future__ import annotations

import logging

import grpc
import pytest

from gpumeter.exporter.kubelet.attribution import ALLOCATION, LABELS, PodAttribution
from gpumeter.exporter.kubelet.client import KubeletError
from gpumeter.exporter.snapshot import SnapshotBuilder
from gpumeter.simulator.fleet import Fleet, load_fleet, parse_fleet

from .helpers import (
    HOUR,
    allocations,
    expected_allocations,
    inventory,
    kubelet_errors,
    kubelet_up,
    with_kubelet,
    without_resource,
)


def sample(h, devices=None) -> SnapshotBuilder:
    builder = SnapshotBuilder()
    h.attribution.sample(inventory(h.fleet) if devices is None else devices, builder)
    return builder


def by_pod(builder: SnapshotBuilder) -> dict[tuple[str, str], list[tuple[tuple[str, ...], float]]]:
    out: dict[tuple[str, str], list] = {}
    for labels, value in allocations(builder).items():
        out.setdefault((labels[1], labels[2]), []).append((labels, value))
    return out


def test_label_order_is_the_catalogs():
    assert ALLOCATION.labels == LABELS


def test_pod_on_a_whole_gpu(harness):
    h = harness("h200")
    b = sample(h)
    gpus = h.node.gpus
    assert allocations(b) == {
        (
            h.node.name,
            "foundation-models",
            f"pretrain-{i}",
            "trainer",
            "nvidia.com/gpu",
            gpus[i].uuid,
            str(i),
            "",
            "",
            "exclusive",
        ): 1.0
        for i in range(8)
    }
    assert kubelet_up(b) == 1.0
    assert kubelet_errors(b) == 0.0


MIG_CASES = [
    ("h100-mig", "1g.10gb"),
    ("a100-mixed", "3g.20gb"),
    ("a100-mixed", "2g.10gb"),
    ("a100-mixed", "1g.5gb"),
]


@pytest.mark.parametrize(("fleet_name", "profile"), MIG_CASES, ids=[f"{f}-{p}" for f, p in MIG_CASES])
def test_pod_on_each_mig_profile(harness, clock, fleet_name, profile):
    clock.t = 10 * HOUR  # the notebooks (8h-18h) and segmenters (2h-14h) are running too
    h = harness(fleet_name)
    series = allocations(sample(h))
    expected = {}
    for pod in h.fleet.pods_on(h.node.name):
        if not pod.running(clock.t):
            continue
        for device in pod.devices:
            gpu = h.node.gpus[device.gpu]
            instance = next((m for m in gpu.mig if m.gpu_instance_id == device.gpu_instance_id), None)
            if instance is None or instance.profile.name != profile:
                continue
            labels = (h.node.name, pod.namespace, pod.name, pod.container, f"nvidia.com/mig-{profile}",
                      gpu.uuid, str(gpu.index), str(device.gpu_instance_id), profile, "mig")  # fmt: skip
            expected[labels] = 1.0
    assert expected, f"the example fleet has no running pod on {profile}"
    assert {k: v for k, v in series.items() if k[8] == profile} == expected
    # the uuid label is the PARENT GPU's, never the MIG device's
    assert all(k[5].startswith("GPU-") for k in series)


def test_several_pods_on_one_mig_enabled_gpu(harness, clock):
    clock.t = 10 * HOUR
    h = harness("a100-mixed")
    gpu0 = h.node.gpus[0].uuid
    on_gpu0 = {(k[2], k[7], k[8]): v for k, v in allocations(sample(h)).items() if k[5] == gpu0}
    assert on_gpu0 == {
        ("detector-train", "1", "3g.20gb"): 1.0,
        ("tokenizer-svc", "3", "2g.10gb"): 1.0,
        ("embedder-7", "7", "1g.5gb"): 1.0,
    }  # GI 8 (1g.5gb) is unallocated: no series


def test_seven_pods_on_each_h100_split_seven_ways(harness, clock):
    clock.t = 10 * HOUR
    h = harness("h100-mig")
    per_gpu: dict[str, set[str]] = {}
    for k in allocations(sample(h)):
        per_gpu.setdefault(k[6], set()).add(k[7])
    assert per_gpu == {
        str(g): {str(gi) for gi in range(7, 14)} for g in range(8)
    }  # 56 pods, 10h: all running


def test_four_pods_time_slicing_one_gpu(harness):
    h = harness("a100-mixed")
    gpu4 = h.node.gpus[4]
    shared = {k: v for k, v in allocations(sample(h)).items() if k[5] == gpu4.uuid}
    assert shared == {
        (
            h.node.name,
            "data-eng",
            f"etl-{r}",
            "worker",
            "nvidia.com/gpu.shared",
            gpu4.uuid,
            "4",
            "",
            "",
            "time_slicing",
        ): 0.25
        for r in range(4)
    }
    assert sum(shared.values()) == pytest.approx(1.0)


def test_two_replicas_in_one_container_are_one_series(harness):
    fleet = parse_fleet(
        {
            "nodes": [{"name": "n1", "gpus": [{"model": "A100-SXM4-40GB", "count": 1, "time_slicing": 4}]}],
            "pods": [
                {"namespace": "a", "name": "greedy", "node": "n1", "devices": [{"gpu": 0, "replica": 0},
                                                                              {"gpu": 0, "replica": 2}]},
                {"namespace": "b", "name": "modest", "node": "n1", "devices": [{"gpu": 0, "replica": 1}]},
            ],
        }
    )  # fmt: skip
    h = harness(fleet)
    series = allocations(sample(h))
    uuid = fleet.nodes[0].gpus[0].uuid
    assert series == {
        ("n1", "a", "greedy", "main", "nvidia.com/gpu.shared", uuid, "0", "", "", "time_slicing"): 0.5,
        ("n1", "b", "modest", "main", "nvidia.com/gpu.shared", uuid, "0", "", "", "time_slicing"): 0.25,
    }


def test_a_pod_that_ends_is_gone_the_next_sample(harness, clock):
    h = harness("a100-mixed")  # pretrain-0 runs 0h-20h every 24h on GPU 3
    gpu3 = h.node.gpus[3].uuid
    clock.t = 20 * HOUR - 1
    assert [k[2] for k in allocations(sample(h)) if k[5] == gpu3] == ["pretrain-0"]
    clock.t = 20 * HOUR
    b = sample(h)
    assert [k for k in allocations(b) if k[5] == gpu3] == []
    assert not any(k[2] == "pretrain-0" for k in allocations(b))  # no stale labels anywhere
    assert kubelet_up(b) == 1.0
    clock.t = 24 * HOUR  # and back the next day
    assert [k[2] for k in allocations(sample(h)) if k[5] == gpu3] == ["pretrain-0"]


def test_notebooks_come_and_go(harness, clock):
    h = harness("a100-mixed")  # notebook-0/1 hold GPU 5 from 9h to 17h
    gpu5 = h.node.gpus[5].uuid
    seen = []
    for hour in (8, 9, 16, 17):
        clock.t = hour * HOUR
        seen.append(sorted((k[2], v) for k, v in allocations(sample(h)).items() if k[5] == gpu5))
    assert seen == [
        [],
        [("notebook-0", 0.25), ("notebook-1", 0.25)],
        [("notebook-0", 0.25), ("notebook-1", 0.25)],
        [],
    ]


def test_slow_kubelet_keeps_allocations_for_keep_cycles_then_drops_them(harness):
    """The slow kubelet holds its answers until the fault is lifted and the client's deadline is
    short meanwhile; healthy answers get a deadline only a hang reaches. So the cycles fail by order,
    never because a loaded machine answered a healthy call late."""
    h = harness("h200", timeout=30.0, keep_cycles=2)
    good = allocations(sample(h))
    assert len(good) == 8
    h.kubelet.set_fault(delay_s=3600)
    h.client.timeout = 0.2
    for cycle in (1, 2):
        b = sample(h)
        assert kubelet_up(b) == 0.0
        assert kubelet_errors(b) == cycle
        assert allocations(b) == good, f"failed cycle {cycle}: the last good allocations are kept"
    b = sample(h)
    assert (kubelet_up(b), kubelet_errors(b), allocations(b)) == (0.0, 3.0, {})
    h.kubelet.set_fault()
    h.client.timeout = 30.0
    b = sample(h)
    assert (kubelet_up(b), kubelet_errors(b), allocations(b)) == (1.0, 3.0, good)


def test_slow_kubelet_errors_count_once_per_cycle(harness):
    h = harness("h200", timeout=0.2)
    h.kubelet.set_fault(delay_s=3600)  # held until the harness stops it: the deadline always fires
    b = sample(h)
    assert (kubelet_up(b), kubelet_errors(b)) == (0.0, 1.0)
    assert allocations(b) == {}  # nothing good to keep yet


def test_unavailable_kubelet(harness):
    h = harness("h200", keep_cycles=0)
    sample(h)
    h.kubelet.set_fault(error=grpc.StatusCode.UNAVAILABLE)
    b = sample(h)
    assert (kubelet_up(b), kubelet_errors(b), allocations(b)) == (0.0, 1.0, {})


def test_kubelet_gone_and_back(harness, sock):
    h = harness("h200", keep_cycles=1)
    good = allocations(sample(h))
    h.kubelet.stop()  # the kubelet restarts: its socket disappears
    b = sample(h)
    assert (kubelet_up(b), kubelet_errors(b), allocations(b)) == (0.0, 1.0, good)
    b = sample(h)
    assert (kubelet_up(b), kubelet_errors(b), allocations(b)) == (0.0, 2.0, {})
    h.kubelet.start()  # a new socket at the same path; the same client must reconnect
    b = sample(h)
    assert (kubelet_up(b), kubelet_errors(b), allocations(b)) == (1.0, 2.0, good)


FORMS = [("uuid", "mixed"), ("gke", "mixed"), ("legacy-mig", "mixed"), ("uuid", "single"), ("gke", "single"),
         ("legacy-mig", "single")]  # fmt: skip


def _shared_node(strategy: str | None) -> Fleet:
    kubelet = {} if strategy is None else {"kubelet": {"sharing_strategy": strategy}}
    return parse_fleet(
        {
            "nodes": [{"name": "n1", **kubelet, "gpus": [
                {"model": "H100-SXM5-80GB", "count": 1, "time_slicing": 4},
                {"model": "H100-SXM5-80GB", "count": 1},
                {"model": "H100-SXM5-80GB", "count": 1, "mig": ["7g.80gb"]},
            ]}],
            "pods": [
                {"namespace": "inf", "name": "r-{replica}", "node": "n1", "devices": [{"gpu": 0, "replica": "0-3"}]},
                {"namespace": "train", "name": "whole", "node": "n1", "devices": [{"gpu": 1}]},
                {"namespace": "nb", "name": "slice", "node": "n1", "devices": [{"gpu": 2, "gpu_instance_id": 0}]},
            ],
        }
    )  # fmt: skip


@pytest.mark.parametrize(
    ("strategy", "replicas"), [(None, "time_slicing"), ("time-slicing", "time_slicing"), ("mps", "mps")]
)
def test_sharing_says_how_each_holding_is_shared(harness, strategy, replicas):
    """The device plugin gives MPS and time-sliced replicas the same IDs (`<uuid>::<n>`); only the
    node's strategy (GPU Feature Discovery's nvidia.com/gpu.sharing-strategy) tells them apart."""
    h = harness(_shared_node(strategy))
    sharing = {(k[2], k[9]): v for k, v in allocations(sample(h)).items()}
    assert sharing == {
        **{(f"r-{r}", replicas): 0.25 for r in range(4)},
        ("whole", "exclusive"): 1.0,
        ("slice", "mig"): 1.0,
    }


def test_an_unknown_sharing_strategy_names_the_field():
    from gpumeter.simulator.fleet import FleetError

    with pytest.raises(FleetError, match=r"nodes\[0\]\.kubelet\.sharing_strategy.*'timeslicing'"):
        parse_fleet({"nodes": [{"name": "n", "kubelet": {"sharing_strategy": "timeslicing"},
                                "gpus": [{"model": "H100-SXM5-80GB"}]}]})  # fmt: skip


@pytest.mark.parametrize(("device_ids", "strategy"), FORMS, ids=[f"{d}-{s}" for d, s in FORMS])
def test_every_device_id_form_attributes_the_same(harness, clock, device_ids, strategy):
    """Whatever form the device plugin uses, the same pods land on the same GPUs and MIG instances."""
    clock.t = 10 * HOUR
    fleet = with_kubelet(load_fleet("a100-mixed"), device_ids=device_ids, mig_strategy=strategy)
    h = harness(fleet)
    series = allocations(sample(h))
    expected = expected_allocations(fleet, clock.t)
    assert len(expected) == 12
    assert without_resource(series) == expected
    mig_resources = {k[4] for k in series if k[7]}
    mixed = {"nvidia.com/mig-3g.20gb", "nvidia.com/mig-2g.10gb", "nvidia.com/mig-1g.5gb"}
    assert mig_resources == ({"nvidia.com/gpu"} if strategy == "single" else mixed)
    assert {k[4] for k in series if not k[7]} == {"nvidia.com/gpu", "nvidia.com/gpu.shared"}


@pytest.mark.parametrize("device_ids", ["uuid", "gke", "legacy-mig"])
def test_every_device_id_form_on_the_h100_mig_node(harness, clock, device_ids):
    clock.t = 10 * HOUR
    fleet = with_kubelet(load_fleet("h100-mig"), device_ids=device_ids)
    h = harness(fleet)
    series = allocations(sample(h))
    assert len(series) == 56
    assert without_resource(series) == expected_allocations(fleet, clock.t)


def test_extra_resource_names(harness):
    fleet = with_kubelet(load_fleet("h200"), extra_resources=("nvidia.com/h200",))
    h = harness(fleet)
    b = sample(h)
    assert allocations(b) == {}  # not a resource we were told about: ignored
    assert kubelet_up(b) == 1.0
    h.attribution = PodAttribution(h.client, h.node.name, extra_resources=("nvidia.com/h200",))
    series = allocations(sample(h))
    assert len(series) == 8
    assert {k[4] for k in series} == {"nvidia.com/h200"}


def test_unresolvable_device_ids_are_logged_once_and_skipped(harness, caplog):
    h = harness("h200")
    devices = inventory(h.fleet)[:6]  # NVML does not see GPUs 6 and 7
    with caplog.at_level(logging.WARNING, logger="gpumeter.exporter.kubelet.attribution"):
        for _ in range(3):
            b = sample(h, devices)
    assert len(allocations(b)) == 6
    unresolved = [r for r in caplog.records if "cannot resolve device" in r.getMessage()]
    assert len(unresolved) == 2
    assert {h.node.gpus[6].uuid, h.node.gpus[7].uuid} == {r.args[0] for r in unresolved}


def test_never_raises():
    class Broken:
        socket_path = "/broken"

        def list(self):
            raise RuntimeError("a bug, not a kubelet error")

        def allocatable(self):
            raise KubeletError("nope")

    attribution = PodAttribution(Broken(), "node-1")
    builder = SnapshotBuilder()
    attribution.sample((), builder)
    attribution.sample((), builder)
    assert builder.series["gpumeter_exporter_kubelet_up"] == [((), 0.0), ((), 0.0)]
    assert builder.series["gpumeter_exporter_kubelet_errors_total"] == [((), 1.0), ((), 2.0)]
    assert ALLOCATION.name not in builder.series


def test_nvml_down_attributes_nothing_and_logs_nothing(harness, caplog):
    h = harness("h200")
    with caplog.at_level(logging.WARNING, logger="gpumeter.exporter.kubelet.attribution"):
        b = sample(h, ())  # the sampler passes no devices while NVML is down
    assert (kubelet_up(b), allocations(b)) == (1.0, {})
    assert not [r for r in caplog.records if "cannot resolve" in r.getMessage()]
    assert len(allocations(sample(h))) == 8  # back as soon as NVML is


def test_pure_allocations_with_replicas_missing_from_allocatable():
    from gpumeter.exporter.kubelet.client import (
        AllocatableResources,
        ContainerDevices,
        ContainerResources,
        PodResources,
    )

    fleet = load_fleet("a100-mixed")
    gpu4 = fleet.nodes[0].gpus[4].uuid
    pods = [
        PodResources("ns", f"p{r}", (ContainerResources("c", (ContainerDevices("nvidia.com/gpu.shared",
                                                                               (f"{gpu4}::{r}",)),)),))
        for r in range(2)
    ]  # fmt: skip
    attribution = PodAttribution(None, "node")
    found = attribution.allocations(pods, AllocatableResources(), inventory(fleet))
    assert [(a.pod, a.share) for a in found] == [("p0", 0.5), ("p1", 0.5)]  # a lower bound, never / 0
    counted = attribution.allocations(
        pods,
        AllocatableResources(
            (ContainerDevices("nvidia.com/gpu.shared", tuple(f"{gpu4}::{r}" for r in range(4))),)
        ),
        inventory(fleet),
    )
    assert [(a.pod, a.share) for a in counted] == [("p0", 0.25), ("p1", 0.25)]
