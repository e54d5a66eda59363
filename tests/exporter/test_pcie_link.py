"""The PCIe link: current and maximum generation and width, and the bandwidth they give, from the stand-in
NVML through the exporter's own sampler; a link trained down stays down under load, the driver's power
saving lowers it only while the GPU is not in use; MIG device handles are refused, as the stand-in refuses
other properties of the physical GPU."""

from __future__ import annotations

import pynvml as N
import pytest

from gpumeter.exporter import collectors
from gpumeter.exporter.collectors.pcie import LANE_BYTES_PER_SECOND
from gpumeter.exporter.nvml import NvmlSession
from gpumeter.exporter.sampler import Sampler
from gpumeter.simulator.device import SimulatedNode
from gpumeter.simulator.fleet import load_fleet
from gpumeter.simulator.nvml import SimulatedNvml


def _link(node, clock) -> dict[str, dict[str, float]]:
    sampler = Sampler(
        NvmlSession(SimulatedNvml(node)),
        collectors.build(xid_watcher=None, privileged=True),
        hostname="t",
        clock=clock,
        xid_watcher=None,
    )
    try:
        snapshot = sampler.sample_once()
    finally:
        sampler.session.stop()
    names = ("generation", "max_generation", "width", "max_width", "bandwidth_bytes_per_second")
    return {
        name: {labels[0]: value for labels, value in snapshot.samples(f"nvidia_gpu_pcie_link_{name}")}
        for name in names
    }


def test_a_link_trained_down_is_exported_against_its_maximum(clock):
    node = SimulatedNode(load_fleet("h200"), clock=clock)
    node.inject("pcie_downtrain", 0, gen=3, width=8)
    link = _link(node, clock)
    assert (link["generation"]["0"], link["width"]["0"]) == (3, 8)
    assert (link["max_generation"]["0"], link["max_width"]["0"]) == (5, 16)
    assert (link["generation"]["1"], link["width"]["1"]) == (5, 16)
    # gen 3: 8 GT/s, 128b/130b -> 984.6 MB/s a lane; gen 5: 3.938 GB/s a lane
    assert link["bandwidth_bytes_per_second"]["0"] == pytest.approx(8 * 8e9 * 128 / 130 / 8)
    assert link["bandwidth_bytes_per_second"]["1"] == pytest.approx(16 * 3.9384615e9)
    assert LANE_BYTES_PER_SECOND[1] == 250e6 and LANE_BYTES_PER_SECOND[2] == 500e6


def test_power_saving_lowers_the_link_only_while_the_gpu_is_not_in_use(clock):
    node = SimulatedNode(load_fleet("h200"), clock=clock)  # every GPU under steady load (mean 0.8)
    node.inject("pcie_downtrain", 0, gen=1, width=16, power_saving=True)
    clock.advance(10)
    assert _link(node, clock)["generation"]["0"] == 5  # in use: the full link
    node.gpus[0].load = 0.0  # not in use (what the next step computes for an idle GPU)
    assert node.gpus[0].pcie_link() == (1, 16)
    node.clear(0)
    assert node.gpus[0].pcie_link() == (5, 16)


def test_mig_device_handles_are_refused_and_bad_faults_named(clock):
    node = SimulatedNode(load_fleet("h100-mig"), clock=clock)
    session = NvmlSession(SimulatedNvml(node))
    session.start()
    try:
        parent = N.nvmlDeviceGetHandleByIndex(0)
        assert N.nvmlDeviceGetCurrPcieLinkGeneration(parent) == 5
        mig = N.nvmlDeviceGetMigDeviceHandleByIndex(parent, 0)
        for fn in (N.nvmlDeviceGetCurrPcieLinkGeneration, N.nvmlDeviceGetMaxPcieLinkWidth):
            with pytest.raises(N.NVMLError_NotSupported):
                fn(mig)
    finally:
        session.stop()
    with pytest.raises(ValueError, match=r"gen must be 1\.\.5 and width one of 1, 2, 4, 8, 16 up to 16"):
        node.inject("pcie_downtrain", 0, gen=6)
    with pytest.raises(ValueError, match="got gen 3, width 12"):
        node.inject("pcie_downtrain", 0, gen=3, width=12)
