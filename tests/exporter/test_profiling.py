"""Profiling metrics through NVML GPM, NVLink traffic counters and video-engine utilization (issue 14,
points 1 and 2), over the stand-in NVML: present per GPU on Hopper, per GPU instance on MIG GPUs,
absent before Hopper; one GPM sample per entity per cycle, spaced as nvml.h requires."""

from __future__ import annotations

import re

import pynvml as N
import pytest

from gpumeter.exporter.doctor import diagnose, render_text
from gpumeter.exporter.simulator.device import NVLINK_DATA_RATE
from gpumeter.exporter.simulator.nvml import GPM_SHARE_OF_SM

PROFILING = (
    "nvidia_gpu_sm_active_ratio",
    "nvidia_gpu_sm_occupancy_ratio",
    "nvidia_gpu_tensor_active_ratio",
    "nvidia_gpu_dram_active_ratio",
    "nvidia_gpu_graphics_engine_active_ratio",
    "nvidia_gpu_fp_active_ratio",
)
GPM_CALLS = ("nvmlGpmSampleGet", "nvmlGpmMigSampleGet", "nvmlGpmMetricsGet")


def lines(text: str, name: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(name + "{")]


def label(line: str, key: str) -> str:
    return re.search(rf'{key}="([^"]*)"', line).group(1)


def value(line: str) -> float:
    return float(line.rsplit(" ", 1)[1])


def two_cycles(sim):
    sim.sample()
    return sim.sample()


def test_whole_gpus_on_hopper_have_every_profiling_metric_with_empty_mig_labels(simulate):
    sim = simulate("h200")
    two_cycles(sim)
    text = sim.text()
    gpus = len(sim.node.gpus)
    for name in PROFILING:
        found = lines(text, name)
        per_gpu = {"nvidia_gpu_tensor_active_ratio": 4, "nvidia_gpu_fp_active_ratio": 3}.get(name, 1)
        assert len(found) == gpus * per_gpu, name
        assert all(label(line, "gpu_instance_id") == "" for line in found)
        assert all(0 <= value(line) <= 1 for line in found)
    # the workload model's shares, worked out here: occupancy and DRAM are fixed shares of SM active
    for sm in lines(text, "nvidia_gpu_sm_active_ratio"):
        gpu = label(sm, "gpu")
        [dram] = [line for line in lines(text, "nvidia_gpu_dram_active_ratio") if label(line, "gpu") == gpu]
        assert value(dram) == pytest.approx(0.47 * value(sm))
        pipes = {
            label(line, "pipe"): value(line)
            for line in lines(text, "nvidia_gpu_tensor_active_ratio")
            if label(line, "gpu") == gpu
        }
        assert set(pipes) == {"any", "hmma", "imma", "dfma"} and pipes["any"] >= pipes["hmma"]
    assert GPM_SHARE_OF_SM[N.NVML_GPM_METRIC_DRAM_BW_UTIL] == 0.47
    # NVLink byte rates from GPM: 18 active links at the model's per-link rate times the GPU's load
    for gpu in sim.node.gpus:
        tx = sim.value(
            "nvidia_gpu_nvlink_transmit_bytes_per_second", gpu=str(gpu.spec.index), uuid=gpu.spec.uuid
        )
        assert tx == pytest.approx(gpu.load * NVLINK_DATA_RATE["tx"] * gpu.model.nvlinks, rel=0.05)


def test_mig_gpus_report_per_gpu_instance_with_mig_labels(simulate):
    sim = simulate("h100-mig")
    two_cycles(sim)
    text = sim.text()
    instances = {(str(g.spec.index), str(m.gpu_instance_id)) for g in sim.node.gpus for m in g.migs}
    found = lines(text, "nvidia_gpu_sm_active_ratio")
    assert {(label(line, "gpu"), label(line, "gpu_instance_id")) for line in found} == instances
    assert all(label(line, "mig_profile") for line in found)
    # billing's per-instance series comes from the same sample pair: the same value
    mig_util = {
        (label(line, "gpu"), label(line, "gpu_instance_id")): value(line)
        for line in lines(text, "nvidia_gpu_mig_sm_utilization_ratio")
    }
    assert {(label(line, "gpu"), label(line, "gpu_instance_id")): value(line) for line in found} == mig_util
    # link traffic belongs to the physical GPU: no GPM rate per instance; field counters per link instead
    assert not lines(text, "nvidia_gpu_nvlink_transmit_bytes_per_second")
    assert lines(text, "nvidia_gpu_nvlink_transmit_bytes_total")


@pytest.mark.parametrize("fleet", ["a100-mixed", "a100-pcie", "v100-t4"])
def test_absent_before_hopper_and_doctor_says_so(simulate, fleet):
    sim = simulate(fleet)
    two_cycles(sim)
    text = sim.text()
    for name in (*PROFILING, "nvidia_gpu_nvlink_transmit_bytes_per_second"):
        assert not lines(text, name), name
    report = render_text(diagnose(sim.lib))
    assert "profiling metrics: absent on" in report
    assert "NVML GPM needs Hopper or later" in report


def test_one_sample_per_entity_per_cycle_and_one_metrics_call(simulate):
    sim = simulate("h100-mig")
    two_cycles(sim)
    before = {name: sim.lib.calls[name] for name in GPM_CALLS}
    sim.sample()
    made = {name: sim.lib.calls[name] - before[name] for name in GPM_CALLS}
    instances = sum(len({m.gpu_instance_id for m in g.migs}) for g in sim.node.gpus)
    assert made == {"nvmlGpmSampleGet": 0, "nvmlGpmMigSampleGet": instances, "nvmlGpmMetricsGet": instances}


def test_samples_closer_than_100ms_are_not_paired(simulate):
    """nvml.h: two GPM samples must be more than 100 ms apart. A cycle too soon after the last sample
    takes none and reports nothing; the next one pairs with the older sample."""
    sim = simulate("h200")
    two_cycles(sim)
    before = sim.lib.calls["nvmlGpmSampleGet"]
    sim.sample(advance=0.05)
    assert sim.lib.calls["nvmlGpmSampleGet"] == before
    assert not lines(sim.text(), "nvidia_gpu_sm_active_ratio")
    sim.sample(advance=0.06)  # 0.11 s after the kept sample
    assert sim.lib.calls["nvmlGpmSampleGet"] == before + len(sim.node.gpus)
    assert len(lines(sim.text(), "nvidia_gpu_sm_active_ratio")) == len(sim.node.gpus)


def test_nvlink_byte_counters_are_kib_fields_times_1024(simulate):
    sim = simulate("h200")
    two_cycles(sim)
    gpu = sim.node.gpus[0]
    for link in range(gpu.model.nvlinks):
        sent = sim.value(
            "nvidia_gpu_nvlink_transmit_bytes_total", gpu="0", uuid=gpu.spec.uuid, link=str(link)
        )
        assert sent == int(gpu.nvlink_bytes[link]["tx"] // 1024) * 1024
        assert sent > 0


def test_video_engine_utilization_on_whole_gpus_only(simulate):
    sim = simulate("a100-mixed")
    two_cycles(sim)
    text = sim.text()
    whole = {str(g.spec.index) for g in sim.node.gpus if not g.mig_enabled}
    migged = {str(g.spec.index) for g in sim.node.gpus if g.mig_enabled}
    assert whole and migged
    for name in ("nvidia_gpu_encoder_utilization_ratio", "nvidia_gpu_decoder_utilization_ratio"):
        assert {label(line, "gpu") for line in lines(text, name)} == whole
