"""The price-book interface: effective-dated versions of per-model hourly rates and policies."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal

from gpumeter.billing.pricing.aliases import resolve_model

SLICE_WEIGHT_POLICIES = ("compute", "memory", "max")
IDLE_POLICIES = ("platform", "spread")
# How a time-sliced or MPS GPU's holders share what they hold between them (docs/billing.md §3.5):
# equally (each its replicas), or by what their processes used (SM time, memory as the tie-breaker).
SHARING_SPLITS = ("equal", "usage")
SHARING_MODES = ("mig", "time_slicing", "mps", "vgpu")
# What a version's utilization tiers do (docs/billing.md §3.7): score each tenant line for the reports
# only, or price it, the tenant paying its tier's efficiency and the platform the rest.
UTILIZATION_TIERS_USES = ("report", "price")


class PriceBookError(ValueError):
    """A price book that cannot be used; the message names the file, the field and the value."""

    def __init__(self, path: str, field_name: str, value: object, problem: str):
        self.path, self.field, self.value, self.problem = str(path), field_name, value, problem
        super().__init__(f"{self.path}: {field_name}: {problem} (value {value!r})")


@dataclass(frozen=True)
class GpuPrice:
    model: str
    hourly_rate: Decimal
    derived: bool = False  # True when computed from purchase price, depreciation, power...


def version_id(effective_from: datetime) -> str:
    """A price version's id: when it takes effect, in UTC (versions of one book never overlap)."""
    return effective_from.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class PriceVersion:
    effective_from: datetime
    effective_to: datetime | None
    gpus: dict[str, GpuPrice]
    source: str = ""
    slice_weight: str = "compute"
    idle: str = "platform"
    sharing_efficiency: dict[str, Decimal] = field(default_factory=dict)
    utilization_tiers: tuple[tuple[Decimal, Decimal, Decimal], ...] = ()
    sharing_split: str = "equal"
    utilization_tiers_use: str = "report"  # UTILIZATION_TIERS_USES

    @property
    def id(self) -> str:
        """The version's key within its price book (versions never overlap): what every line it
        priced carries, and what the ledger registers the version's body under (docs/billing.md §7)."""
        return version_id(self.effective_from)

    def covers(self, hour: datetime) -> bool:
        return self.effective_from <= hour and (self.effective_to is None or hour < self.effective_to)

    def efficiency(self, mode: str) -> Decimal:
        """The sharing efficiency of a mode; MPS replicas take time-slicing's unless given their own
        (the device plugin hands both out the same way, docs/billing.md §3.2)."""
        if mode == "mps" and mode not in self.sharing_efficiency:
            mode = "time_slicing"
        return self.sharing_efficiency.get(mode, Decimal(1))

    @property
    def prices_tiers(self) -> bool:
        """Whether the tiers price tenant lines (utilization_tiers: price, and tiers to price by)."""
        return self.utilization_tiers_use == "price" and bool(self.utilization_tiers)

    def tier_efficiency(self, utilization: Decimal | None) -> Decimal | None:
        """The utilization-tier efficiency of a mean utilization: a score, or under
        ``utilization_tiers: price`` the factor of the tenant's amount; None where unknown."""
        if utilization is None or not self.utilization_tiers:
            return None
        last = len(self.utilization_tiers) - 1
        for i, (low, high, eff) in enumerate(self.utilization_tiers):
            if low <= utilization < high or (i == last and utilization == high):
                return eff
        return None


@dataclass(frozen=True)
class PriceBook:
    currency: str
    versions: tuple[PriceVersion, ...]
    aliases: dict[str, str] = field(default_factory=dict)
    path: str = ""
    digest: str = ""

    def with_utilization_tiers(self, use: str) -> PriceBook:
        """This book with its versions' utilization tiers used as ``use`` says (report | price;
        docs/billing.md §3.7), so a book written for reports, the seed's ConfigMap among them, prices by
        its tiers unchanged. A book priced by its tiers is another book: its digest is this one's and the
        option's, so a ledger registers its versions (whose bodies then say so) apart from this one's."""
        if use not in UTILIZATION_TIERS_USES:
            raise PriceBookError(
                self.path, "utilization_tiers", use, f"expected one of {', '.join(UTILIZATION_TIERS_USES)}"
            )
        if use == "price" and not any(version.utilization_tiers for version in self.versions):
            raise PriceBookError(
                self.path, "utilization_tiers", use, "the price book has no utilization tiers to price by"
            )
        if all(version.utilization_tiers_use == use for version in self.versions):
            return self
        versions = tuple(dataclasses.replace(v, utilization_tiers_use=use) for v in self.versions)
        digest = (
            self.digest
            if use == "report"
            else hashlib.sha256(f"{self.digest}\0tiers={use}".encode()).hexdigest()
        )
        return dataclasses.replace(self, versions=versions, digest=digest)

    def version(self, version_id: str) -> PriceVersion:
        """The version a line's ``price_version`` names."""
        for version in self.versions:
            if version.id == version_id:
                return version
        raise KeyError(f"{self.path or 'price book'}: no version {version_id}")

    def version_at(self, hour: datetime) -> PriceVersion | None:
        for version in self.versions:
            if version.covers(hour):
                return version
        return None

    def version_body(self, version: PriceVersion) -> str:
        """What priced a line under ``version``, as canonical JSON: stored once per version by the
        ledger and shown by reports (docs/billing.md §7)."""
        body: dict[str, object] = {
            "rates": {m: str(p.hourly_rate) for m, p in sorted(version.gpus.items())},
            "derived": sorted(m for m, p in version.gpus.items() if p.derived),
            "slice_weight": version.slice_weight,
            "idle": version.idle,
            "sharing_efficiency": {k: str(v) for k, v in sorted(version.sharing_efficiency.items())},
            "aliases": self.aliases,
        }
        if version.sharing_split != "equal":  # absent at its default: bodies stored before it stay equal
            body["sharing_split"] = version.sharing_split
        if version.prices_tiers:  # likewise: the tiers are in the body only where they priced
            body["utilization_tiers"] = [
                [str(low), str(high), str(eff)] for low, high, eff in version.utilization_tiers
            ]
        return json.dumps(body, sort_keys=True)

    def price(self, hour: datetime, nvml_model: str) -> tuple[PriceVersion | None, GpuPrice | None]:
        version = self.version_at(hour)
        if version is None:
            return None, None
        key = resolve_model(nvml_model, set(version.gpus), self.aliases)
        return version, (version.gpus[key] if key else None)
