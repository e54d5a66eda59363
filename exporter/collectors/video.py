"""Video encoder and decoder utilization: nvmlDeviceGetEncoderUtilization / nvmlDeviceGetDecoderUtilization,
a percentage over the driver's own sampling period. NVML has no field ID for them, so two calls per GPU
per cycle; none on MIG-enabled GPUs, where the driver answers NOT_SUPPORTED (remembered after the first
refusal, like every unsupported call) and nvidia-smi prints N/A.
"""

from __future__ import annotations

import pynvml as N

from gpumeter import contract

from . import register_collector

ENGINES = (
    (contract.ENCODER_UTILIZATION, "encoder_utilization", N.nvmlDeviceGetEncoderUtilization),
    (contract.DECODER_UTILIZATION, "decoder_utilization", N.nvmlDeviceGetDecoderUtilization),
)


@register_collector("video")
class VideoCollector:
    def update(self, device, out) -> None:
        if device.mig_enabled:
            return
        for name, key, function in ENGINES:
            answer = device.call(key, function, device.handle)
            if answer is not None and 0 <= answer[0] <= 100:  # [utilization %, sampling period µs]
                out.add(name, device.labels, answer[0] / 100)
