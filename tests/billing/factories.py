"""Builders for billing tests: price books written to files, GPU-hours, allocations."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import yaml

from gpumeter.billing.models import Allocation, Device, GpuHour, MigInstance
from gpumeter.billing.pricing import PriceBook, load_price_book

HOUR0 = datetime(2026, 11, 1, tzinfo=UTC)
A100 = "NVIDIA A100-SXM4-40GB"
H100 = "NVIDIA H100 80GB HBM3"
A100_PROFILES = {"1g.5gb": (1, 1), "1g.10gb": (1, 2), "2g.10gb": (2, 2), "3g.20gb": (3, 4), "4g.20gb": (4, 4)}
A100_PROFILES["7g.40gb"] = (7, 8)


def write_book(tmp_path: Path, doc: dict | str, name: str = "prices.yaml") -> Path:
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else yaml.dump(doc, Dumper=_NoAliasDumper, sort_keys=False))
    return path


class _NoAliasDumper(yaml.SafeDumper):
    """Repeated objects written out, not as anchors and aliases (price books refuse aliases)."""

    def ignore_aliases(self, data):
        return True


def book(tmp_path: Path, gpus: dict, **version) -> PriceBook:
    doc = {
        "currency": version.pop("currency", "USD"),
        "versions": [{"effective_from": "2026-01-01T00:00:00Z", "gpus": gpus, **version}],
    }
    return load_price_book(write_book(tmp_path, doc))


def mig(uuid: str, gi: str, profile: str, seconds: int = 3600, slices: dict | None = None) -> MigInstance:
    compute, memory = (slices or A100_PROFILES)[profile]
    return MigInstance(uuid, gi, profile, compute, memory, seconds)


def alloc(
    uuid: str, ns: str, pod: str, seconds: int = 3600, share: str = "1", gi: str = "", profile: str = ""
):
    return Allocation(uuid, ns, pod, "main", seconds, Decimal(share), gi, profile)


def gpu_hour(uuid, model, instances=(), allocations=(), seconds=3600, hour=HOUR0, mig_mode=None) -> GpuHour:
    device = Device(uuid, model, seconds, "node-1", "0", bool(instances) if mig_mode is None else mig_mode)
    return GpuHour(hour, device, list(instances), list(allocations))
