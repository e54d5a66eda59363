"""Profiling metrics through NVML GPM, NVLink traffic counters and video-engine utilization, over the
stand-in NVML: present per GPU on Hopper, per GPU instance on MIG GPUs,
absent before Hopper; one GPM sample per entity per cycle, spaced as nvml.h requires."""

from __future__ import annotations

import re

import pynvml as N
import pytest

from gpumeter.exporter.doctor import diagnose, render_text
from gpumeter.simulator.device import NVLINK_DATA_RATE
from gpumeter.simulator.nvml import GPM_SHARE_OF_SM

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


def test_graphics_engine_activity_is_a_mean_over_the_counter_interval(simulate):
    """Graphics-engine activity takes 1.2 ms of a real H200's 1.23 ms GPM metrics call (docs/real-gpu.md):
    with a counter_interval it is computed every 30 s over a pair of samples 30 s apart, and carried
    between; the other metrics stay per cycle. Its value is then the window's mean: 1.08 x the mean of the
    six 5 s SM-active readings in it (the stand-in's share, GPM_SHARE_OF_SM)."""
    sim = simulate("h200", counter_interval=30.0)
    sim.sample()  # the first sample: the baseline of both pairs, nothing to report yet
    sm, graphics, metric_calls = [], [], []
    for _ in range(12):
        calls = sim.lib.calls["nvmlGpmMetricsGet"]
        sim.sample(5)
        metric_calls.append(sim.lib.calls["nvmlGpmMetricsGet"] - calls)
        text = sim.text()
        sm.append(value(next(x for x in lines(text, "nvidia_gpu_sm_active_ratio") if label(x, "gpu") == "3")))
        found = [x for x in lines(text, "nvidia_gpu_graphics_engine_active_ratio") if label(x, "gpu") == "3"]
        graphics.append(value(found[0]) if found else None)
    gpus = len(sim.node.gpus)
    # one fast metrics call per GPU each cycle, and one more per GPU at 5 s (the first value), 30 s and 60 s
    assert metric_calls == [2 * gpus] + [gpus] * 4 + [2 * gpus] + [gpus] * 5 + [2 * gpus]
    # until the first 30 s window closes, the first 5 s window's value, carried
    assert graphics[:5] == [pytest.approx(1.08 * sm[0])] * 5
    assert graphics[5] == pytest.approx(1.08 * sum(sm[0:6]) / 6)
    assert graphics[6:11] == [graphics[5]] * 5
    assert graphics[11] == pytest.approx(1.08 * sum(sm[6:12]) / 6)
    assert len(set(sm)) > 6  # SM activity moved every cycle, the workload is not flat
    # no sample leaks: per GPU a previous sample, a slow baseline and one spare at most
    assert sim.lib.calls["nvmlGpmSampleAlloc"] <= 3 * gpus


def test_mig_instances_gone_give_their_samples_back(simulate):
    """A MIG reconfiguration ends instances: their previous and slow-metrics samples go back to the
    spares, each once, and serve the new instances, so samples are not allocated again and again."""
    sim = simulate("h100-mig", counter_interval=30.0)
    for _ in range(8):
        sim.sample(5)
    allocated = sim.lib.calls["nvmlGpmSampleAlloc"]
    instances = sum(len({m.gpu_instance_id for m in g.migs}) for g in sim.node.gpus)
    assert allocated <= 3 * instances
    sim.node.inject("mig_reconfigure", 2, layout=["3g.40gb", "3g.40gb"])  # GPU 2: 7 instances -> 2
    sim.sample(5)  # the new instances are sampled before the old ones' samples are freed: at most 2 new
    assert sim.lib.calls["nvmlGpmSampleAlloc"] <= allocated + 2
    allocated = sim.lib.calls["nvmlGpmSampleAlloc"]
    for _ in range(16):
        sim.sample(5)
    text = sim.text()
    assert (
        len(
            {
                label(x, "gpu_instance_id")
                for x in lines(text, "nvidia_gpu_sm_active_ratio")
                if label(x, "gpu") == "2"
            }
        )
        == 2
    )
    assert (
        len([x for x in lines(text, "nvidia_gpu_graphics_engine_active_ratio") if label(x, "gpu") == "2"])
        == 2
    )
    assert sim.lib.calls["nvmlGpmSampleAlloc"] == allocated  # from then on the freed samples serve
    # every sample is in one place only: held by one entity (previous and slow baseline may share it) or spare
    profiling = next(c for c in sim.exporter.sampler.collectors if c.name == "profiling")
    owners: dict[int, set] = {}
    for key, (sample, *_) in [*profiling._previous.items(), *profiling._slow.items()]:
        owners.setdefault(id(sample), set()).add(key)
    assert all(len(keys) == 1 for keys in owners.values())
    spare = [id(s) for s in profiling._spare]
    assert len(spare) == len(set(spare)) and not set(spare) & set(owners)
