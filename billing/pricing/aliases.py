"""NVML device names → price-book model keys (docs/billing.md §3)."""

from __future__ import annotations

from collections.abc import Iterable

# NVML `nvmlDeviceGetName` strings as the exporter reports them in nvidia_gpu_info{model}.
NVML_ALIASES: dict[str, str] = {
    "NVIDIA A100-SXM4-40GB": "A100-40GB",
    "NVIDIA A100-PCIE-40GB": "A100-40GB",
    "NVIDIA A100-SXM4-80GB": "A100-80GB",
    "NVIDIA A100 80GB PCIe": "A100-80GB",
    "NVIDIA A100-PCIE-80GB": "A100-80GB",
    "NVIDIA H100 80GB HBM3": "H100-80GB",
    "NVIDIA H100 PCIe": "H100-80GB",
    "NVIDIA H100 SXM5 80GB": "H100-80GB",
    "NVIDIA H100 NVL": "H100-94GB",
    "NVIDIA H200": "H200-141GB",
    "NVIDIA H200 NVL": "H200-141GB",
    "NVIDIA A30": "A30-24GB",
    "NVIDIA L40S": "L40S-48GB",
    "Tesla T4": "T4-16GB",
    "Tesla V100-SXM2-16GB": "V100-16GB",
    "Tesla V100-PCIE-16GB": "V100-16GB",
    "Tesla V100-SXM2-32GB": "V100-32GB",
    "Tesla V100-PCIE-32GB": "V100-32GB",
    # Blackwell (names as gpumeter/simulator/models.py has them; docs/nvml.md §17 says which are assumed)
    "NVIDIA B200": "B200-180GB",
    "NVIDIA B300 SXM6 AC": "B300-288GB",
    "NVIDIA B300": "B300-288GB",
    "NVIDIA GB200": "GB200-186GB",
    "NVIDIA GB300": "GB300-288GB",
    "NVIDIA RTX PRO 6000 Blackwell Server Edition": "RTX-PRO-6000-96GB",
}

# Compute and memory slices of a whole GPU, per price-book model; 7 and 8 unless listed.
# The RTX PRO 6000 Blackwell has four of each (1g.24gb x4, 2g.48gb x2, 4g.96gb: docs/nvml.md §17.1); B200,
# B300, GB200 and GB300 have A100's and H100's seven and eight.
SLICE_TOTALS: dict[str, tuple[int, int]] = {"A30-24GB": (4, 4), "RTX-PRO-6000-96GB": (4, 4)}


# The MIG profiles each model offers (NVIDIA's MIG user guide, "Supported MIG Profiles"), by
# price-book model; a name's "+me"/"+gfx" variants are the same slices. A profile of a listed model
# that no listed model offers, or with more compute slices than the model has (`5g.99gb`), is not
# billed as a new profile: its GPU-hour is unpriced, with a warning. (Checked against every model's
# names, not only its own: the A100's names on an H100 are what tests and older exporters write.)
_A100_80GB_CLASS = ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")
MIG_PROFILES: dict[str, frozenset[str]] = {
    "A100-40GB": frozenset({"1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"}),
    "A100-80GB": frozenset(_A100_80GB_CLASS),
    "H100-80GB": frozenset(_A100_80GB_CLASS),
    "H100-94GB": frozenset({"1g.12gb", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb"}),
    "H200-141GB": frozenset({"1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"}),
    "A30-24GB": frozenset({"1g.6gb", "2g.12gb", "4g.24gb"}),
}
_ANY_MODEL = frozenset().union(*MIG_PROFILES.values())


def unknown_profile(model_key: str, profiles: Iterable[str]) -> str | None:
    """The first of ``profiles`` (MIG profile names; empty ones skipped) that ``model_key`` cannot
    have: a name no model of `MIG_PROFILES` offers, or more compute slices than it has. None for a
    model without a table."""
    if model_key.upper() not in MIG_PROFILES:
        return None
    compute = slice_totals(model_key)[0]
    for profile in profiles:
        if not profile:
            continue
        base = profile.split("+", 1)[0].lower()
        if base not in _ANY_MODEL or int(base.split("g", 1)[0]) > compute:
            return profile
    return None


def slice_totals(model_key: str) -> tuple[int, int]:
    return SLICE_TOTALS.get(model_key.upper(), (7, 8))


def resolve_model(nvml_name: str, known: set[str], extra: dict[str, str] | None = None) -> str | None:
    """The price-book key for an NVML name, or None. Case-insensitive; a key also matches itself."""
    by_upper = {k.upper(): k for k in known}
    for table in (extra or {}, NVML_ALIASES):
        for alias, model in table.items():
            if alias.upper() == nvml_name.upper() and model.upper() in by_upper:
                return by_upper[model.upper()]
    return by_upper.get(nvml_name.upper())


def canonical_model(nvml_name: str, extra: dict[str, str] | None = None) -> str:
    """The model key an NVML name maps to (for slice totals and labels), else the name itself."""
    for table in (extra or {}, NVML_ALIASES):
        for alias, model in table.items():
            if alias.upper() == nvml_name.upper():
                return model
    return nvml_name
