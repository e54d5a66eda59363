"""Where the exporter and the stand-in used to agree with each other but not with the driver (issue 12).

Each test drives the exporter over a stand-in that now behaves as nvml.h, DCGM and the NVML change log
say the driver does; each failed on the exporter as it was before its fix.
"""

from __future__ import annotations

import pynvml as N


def test_1_thresholds_are_absolute_while_fields_193_196_read_tlimit_offsets(simulate):
    sim = simulate("h100-mig")
    sim.sampler.sample_once()
    # The stand-in answers fields 193-196 as the driver does: signed offsets from T.Limit.
    handle = N.nvmlDeviceGetHandleByIndex(0)
    fields = [
        N.NVML_FI_DEV_TEMPERATURE_SHUTDOWN_TLIMIT,
        N.NVML_FI_DEV_TEMPERATURE_SLOWDOWN_TLIMIT,
        N.NVML_FI_DEV_TEMPERATURE_GPU_MAX_TLIMIT,
        N.NVML_FI_DEV_TEMPERATURE_MEM_MAX_TLIMIT,
    ]
    offsets = [entry.value.siVal for entry in N.nvmlDeviceGetFieldValues(handle, fields)]
    assert offsets == [87 - 92, 87 - 89, 0, 0]  # gpu_max 87 is T.Limit's zero on this model
    base = {"gpu": "0", "uuid": sim.node.gpus[0].spec.uuid}
    slowdown = sim.value("nvidia_gpu_temperature_threshold_celsius", **base, threshold="slowdown")
    assert 80 <= slowdown <= 100
    assert slowdown == 89  # nvmlDeviceGetTemperatureThreshold(SLOWDOWN), as DCGM reads it
    for threshold, celsius in (("shutdown", 92), ("gpu_max", 87), ("memory_max", 95)):
        assert sim.value("nvidia_gpu_temperature_threshold_celsius", **base, threshold=threshold) == celsius
