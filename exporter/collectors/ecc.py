"""ECC error counts (volatile), row remapping (Ampere and later) and retired pages (before Ampere, which
remap rows instead), all from batched field values; a generation's missing half is absent, never 0."""

from __future__ import annotations

import pynvml as N

from gpumeter import contract

from . import register_collector

ECC = {"corrected": N.NVML_FI_DEV_ECC_SBE_VOL_TOTAL, "uncorrected": N.NVML_FI_DEV_ECC_DBE_VOL_TOTAL}
REMAPPED = {"corrected": N.NVML_FI_DEV_REMAPPED_COR, "uncorrected": N.NVML_FI_DEV_REMAPPED_UNC}
RETIRED = {"corrected": N.NVML_FI_DEV_RETIRED_SBE, "uncorrected": N.NVML_FI_DEV_RETIRED_DBE}


@register_collector("ecc")
class EccCollector:
    def fields(self, device):
        ids = [
            *ECC.values(),
            *REMAPPED.values(),
            N.NVML_FI_DEV_REMAPPED_PENDING,
            N.NVML_FI_DEV_REMAPPED_FAILURE,
            *RETIRED.values(),
            N.NVML_FI_DEV_RETIRED_PENDING,
        ]
        return [(field, 0) for field in ids]

    def update(self, device, out) -> None:
        labels = device.labels
        for error_type, field in ECC.items():
            if (value := device.field(field)) is not None:
                out.add(contract.ECC_ERRORS, (*labels, error_type), value)
        for error_type, field in REMAPPED.items():
            if (value := device.field(field)) is not None:
                out.add(contract.REMAPPED_ROWS, (*labels, error_type), value)
        if (pending := device.field(N.NVML_FI_DEV_REMAPPED_PENDING)) is not None:
            out.add(contract.REMAPPED_ROWS_PENDING, labels, 1 if pending else 0)
        if (failure := device.field(N.NVML_FI_DEV_REMAPPED_FAILURE)) is not None:
            out.add(contract.REMAPPED_ROWS_FAILURE, labels, 1 if failure else 0)
        for error_type, field in RETIRED.items():
            if (value := device.field(field)) is not None:
                out.add(contract.RETIRED_PAGES, (*labels, error_type), value)
        if (pending := device.field(N.NVML_FI_DEV_RETIRED_PENDING)) is not None:
            out.add(contract.RETIRED_PAGES_PENDING, labels, 1 if pending else 0)
