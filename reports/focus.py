"""FOCUS 1.3 (default) and 1.2 cost-and-usage rows from a report, and the project's own schema check.

Mapping (docs/reports.md, "FOCUS mapping"): one row per charge line of the ledger, summed over the
report's grain (a UTC day by default, an hour with ``--grain hour``), ``x_``-prefixed custom columns
after the FOCUS columns. 1.3 adds split cost allocation: every line of a GPU-hour whose cost was split
among holders (MIG instances, replicas, fractional grants, vGPUs) is an allocated charge of the GPU's
cost, its method in ``AllocatedMethodId`` (the catalog ``METHODS``) and its figures in
``AllocatedMethodDetails``. The check enforces, row by row, what the same section says focus-validator
does not reliably catch: column presence and order, types, ``T…Z`` dates, allowed values on every
row, the cost identities, the ``x_`` prefix, and in 1.3 the allocation columns' rules.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from functools import lru_cache
from pathlib import Path

from gpumeter import contract
from gpumeter.billing.ledger.base import LineTotal
from gpumeter.billing.models import LineKind
from gpumeter.billing.pricing.currency import MINOR_UNITS
from gpumeter.reports import csvfile
from gpumeter.reports.model import HOUR, Holding, Report, version_label

VERSIONS = ("1.3", "1.4", "1.2")  # the first is the default (docs/reports.md, "FOCUS 1.4")
FOCUS_VERSION = VERSIONS[0]

# (column, nullable, type) in output order. Types: decimal, datetime, string, json, or an allowed-value set.
CHARGE_CATEGORIES = {"Usage", "Purchase", "Tax", "Credit", "Adjustment"}
CHARGE_CLASSES = {"Correction"}
CHARGE_FREQUENCIES = {"One-Time", "Recurring", "Usage-Based"}
PRICING_CATEGORIES = {"Standard", "Dynamic", "Committed", "Other"}
SERVICE_CATEGORIES = {
    "AI and Machine Learning",
    "Analytics",
    "Business Applications",
    "Compute",
    "Databases",
    "Developer Tools",
    "Multicloud",
    "Identity",
    "Integration",
    "Internet of Things",
    "Management and Governance",
    "Media",
    "Migration",
    "Mobile",
    "Networking",
    "Security",
    "Storage",
    "Web",
    "Other",
}
SERVICE_SUBCATEGORIES = {
    "Compute": {
        "Bare Metal",
        "Containers",
        "End User Computing",
        "Quantum Compute",
        "Serverless Compute",
        "Virtual Machines",
        "Other (Compute)",
    },
    "AI and Machine Learning": {
        "AI Platforms",
        "Bots",
        "Generative AI",
        "Machine Learning",
        "Natural Language Processing",
        "Other (AI and Machine Learning)",
    },
}

COLUMNS: list[tuple[str, bool, object]] = [
    ("BilledCost", False, "decimal"),
    ("BillingAccountId", False, "string"),
    ("BillingAccountName", True, "string"),
    ("BillingCurrency", False, "currency"),
    ("BillingPeriodEnd", False, "datetime"),
    ("BillingPeriodStart", False, "datetime"),
    ("ChargeCategory", False, CHARGE_CATEGORIES),
    ("ChargeClass", True, CHARGE_CLASSES),
    ("ChargeDescription", True, "string"),
    ("ChargeFrequency", False, CHARGE_FREQUENCIES),
    ("ChargePeriodEnd", False, "datetime"),
    ("ChargePeriodStart", False, "datetime"),
    ("ConsumedQuantity", True, "decimal"),
    ("ConsumedUnit", True, "unit"),
    ("ContractedCost", False, "decimal"),
    ("ContractedUnitPrice", True, "decimal"),
    ("EffectiveCost", False, "decimal"),
    ("InvoiceId", True, "string"),
    ("InvoiceIssuerName", False, "string"),
    ("ListCost", False, "decimal"),
    ("ListUnitPrice", True, "decimal"),
    ("PricingCategory", True, PRICING_CATEGORIES),
    ("PricingQuantity", True, "decimal"),
    ("PricingUnit", True, "unit"),
    ("ProviderName", False, "string"),
    ("PublisherName", False, "string"),
    ("ResourceId", True, "string"),
    ("ResourceName", True, "string"),
    ("ResourceType", True, "string"),
    ("ServiceCategory", False, SERVICE_CATEGORIES),
    ("ServiceName", False, "string"),
    ("ServiceSubcategory", True, "subcategory"),
    ("SkuId", True, "string"),
    ("SkuPriceId", True, "string"),
    ("SubAccountId", True, "string"),
    ("SubAccountName", True, "string"),
    ("SubAccountType", True, "string"),
    ("Tags", True, "json"),
]
MANDATORY = {
    "BilledCost",
    "BillingAccountId",
    "BillingAccountName",
    "BillingCurrency",
    "BillingPeriodEnd",
    "BillingPeriodStart",
    "ChargeCategory",
    "ChargeClass",
    "ChargeDescription",
    "ChargePeriodEnd",
    "ChargePeriodStart",
    "ContractedCost",
    "EffectiveCost",
    "InvoiceIssuerName",
    "ListCost",
    "PricingQuantity",
    "PricingUnit",
    "ProviderName",
    "PublisherName",
    "ServiceCategory",
    "ServiceName",
}
CUSTOM: list[tuple[str, bool, object]] = sorted(  # alphabetical (docs/reports.md, "Custom columns")
    [
        ("x_Cluster", True, "string"),  # the ledger line's cluster, where it names one
        ("x_Container", True, "string"),
        ("x_GpuHours", False, "decimal"),  # the weighted GPU-hours the ledger line states
        ("x_GpuInstanceId", True, "string"),
        ("x_GpuModel", True, "string"),
        ("x_GpuUtilizationAvg", True, "decimal"),
        ("x_GpuUuid", False, "string"),
        ("x_LineKind", False, {kind.value for kind in LineKind}),
        ("x_MigProfile", True, "string"),
        ("x_Namespace", False, "string"),
        ("x_Pod", True, "string"),
        ("x_PriceBookVersion", True, "string"),
        ("x_SliceHours", True, "decimal"),
        ("x_Team", True, "string"),
        ("x_Unpriced", False, {"true", "false"}),
        ("x_UtilizationEfficiency", True, "decimal"),
    ]
)
# FOCUS 1.3: the 1.2 columns (ProviderName and PublisherName deprecated, still mandatory) and these
# (tests/reports/data/focus-1.3-columns.json names the spec text of each).
ADDED_IN_13: list[tuple[str, bool, object]] = [
    ("AllocatedMethodDetails", True, "allocation"),
    ("AllocatedMethodId", True, "string"),
    ("AllocatedResourceId", True, "string"),
    ("AllocatedResourceName", True, "string"),
    ("AllocatedTags", True, "json"),
    ("ContractApplied", True, "json"),  # null: no contract commitments
    ("HostProviderName", False, "string"),
    ("ServiceProviderName", False, "string"),
]
COLUMNS_13 = sorted(COLUMNS + ADDED_IN_13)
MANDATORY_13 = MANDATORY | {"HostProviderName", "ServiceProviderName"}
# FOCUS 1.4's cost-and-usage dataset: 1.3's columns less ProviderName and PublisherName, which 1.4
# removes (docs/reports.md, "FOCUS 1.4"); its new columns are conditional on features gpumeter has not
REMOVED_IN_14 = {"ProviderName", "PublisherName"}
COLUMNS_14 = [c for c in COLUMNS_13 if c[0] not in REMOVED_IN_14]
MANDATORY_14 = MANDATORY_13 - REMOVED_IN_14
HEADER = [c[0] for c in COLUMNS] + [c[0] for c in CUSTOM]  # 1.2
HEADERS = {
    "1.2": HEADER,
    "1.3": [c[0] for c in COLUMNS_13] + [c[0] for c in CUSTOM],
    "1.4": [c[0] for c in COLUMNS_14] + [c[0] for c in CUSTOM],
}
_SPEC = {name: (nullable, kind) for name, nullable, kind in COLUMNS_13 + CUSTOM}


@dataclass(frozen=True)
class Method:
    """A split cost allocation method: its AllocatedMethodId and what it splits by (docs/reports.md,
    "Allocation methods"; docs/billing.md names the rule of each)."""

    id: str
    usage_unit: str  # AllocatedMethodDetails' UsageUnit: what the holder's UsageQuantity counts
    policy: str  # the price-book setting that chose the split (x_Policy)
    what: str


# by sharing mode (contract.SHARING_*), plus "usage" (a replica split by use) and the idle spread
METHODS: dict[str, Method] = {
    contract.SHARING_MIG: Method(
        "gpumeter.mig-slice-weight", "Slice-Hours", "slice_weight", "MIG instance by its slice weight"
    ),
    contract.SHARING_TIME_SLICING: Method(
        "gpumeter.time-slicing-share", "GPU-Hours", "sharing_split", "time-sliced replica by its share"
    ),
    contract.SHARING_MPS: Method(
        "gpumeter.mps-share", "GPU-Hours", "sharing_split", "MPS replica by its share"
    ),
    contract.SHARING_FRACTIONAL: Method(
        "gpumeter.fractional-grant", "GPU-Hours", "slice_weight", "fractional grant by the fraction granted"
    ),
    contract.SHARING_VGPU: Method(
        "gpumeter.vgpu-share", "GPU-Hours", "sharing_split", "VM's vGPU by its share"
    ),
    "usage": Method(
        "gpumeter.usage-split", "GPU-Hours", "sharing_split", "replicas' pot split by their processes' use"
    ),
    LineKind.IDLE_SHARE: Method(
        "gpumeter.idle-spread", "GPU-Hours", "idle", "idle capacity spread by tenant amounts"
    ),
    # a whole GPU held by one holder for part of its hours, or by holders one after another
    "whole": Method("gpumeter.whole-gpu-time", "GPU-Hours", "", "whole GPU by the hours each holder held it"),
}
WHOLE_GPU_METHOD = "whole"
_PRECEDENCE = list(METHODS)  # a platform line takes the first method among its GPU-hour's holders

_DECIMAL = re.compile(r"^-?\d+(\.\d+)?([eE][-+]?\d+)?$")
_DATETIME = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$")
_CUSTOM = re.compile(r"^x_[A-Z][A-Za-z0-9]*$")
_UNIT = re.compile(
    r"^(\d+ )?([A-Za-z]+(-[A-Za-z]+)?(-(Years|Months|Days|Hours|Minutes|Seconds))?"
    r"|[A-Za-z]+/(Year|Month|Day|Hour|Minute|Second))$"
)

DESCRIPTIONS: dict[str, str] = {  # by line kind (LineKind is a str)
    LineKind.TENANT: "GPU usage",
    LineKind.IDLE_SHARE: "Idle GPU capacity spread to the tenant (idle: spread)",
    LineKind.SHARING_SHORTFALL: "Sharing-efficiency shortfall (platform discount on shared GPUs)",
    LineKind.UNALLOCATED: "Unallocated GPU capacity",
    LineKind.STRANDED: "Stranded GPU capacity (no MIG instance covers it)",
}


@lru_cache(maxsize=8192)
def _ts(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _num(value: Decimal | None) -> str:
    if value is None:
        return ""
    text = format(value, "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def _json(doc: dict) -> str:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _one(values: Iterable) -> object:
    """One value where the hours of a row agree, else all of them, sorted; None where none is known."""
    distinct = sorted({v for v in values if v is not None})
    if not distinct:
        return None
    return distinct[0] if len(distinct) == 1 else distinct


def _figure(value: Decimal | None) -> float | None:
    return None if value is None else float(round(value, 6))


def _efficiency(body: dict, mode: str) -> Decimal:
    """The sharing efficiency of a mode in a stored price-version body (PriceVersion.efficiency)."""
    given = body.get("sharing_efficiency", {})
    if mode == contract.SHARING_MPS and mode not in given:
        mode = contract.SHARING_TIME_SLICING
    return Decimal(given.get(mode, "1"))


def _method(holding: Holding, body: dict) -> str:
    replica = holding.replica or holding.mode
    if (
        replica in (contract.SHARING_TIME_SLICING, contract.SHARING_MPS)
        and body.get("sharing_split") == "usage"
        and holding.process_use
    ):
        return "usage"
    return holding.mode


class _Origin:
    """An origin charge (docs/reports.md, "FOCUS origin charges"): one GPU's charge for one bucket (an
    hour, or a UTC day at day grain) under one price-book version. Its rows are the GPU's ledger lines
    of the bucket; they share every FOCUS dimension, and their summable metrics add up to it."""

    def __init__(self, report: Report, charges: list[LineTotal], present: Decimal | None):
        first = charges[0]
        self.charges = charges
        self.unpriced = first.amount is None
        self.rate = None if self.unpriced else report.rate(first)
        self.billed = sum((c.amount or ZERO for c in charges), ZERO)
        capacity = [c.quantity if c.kind not in _OVERLAPPING else ZERO for c in charges]
        # the GPU-hours present: from the facts where known, else what the capacity lines state
        self.quantity = present if present is not None else sum(capacity, ZERO)
        weights = [c.amount or ZERO for c in charges] if self.billed else capacity
        self.quantities = _largest_remainder(self.quantity, weights, QUANTITY_QUANTUM)

    def list_cost(self, quantity: Decimal) -> Decimal:
        return ZERO if self.rate is None else self.rate * quantity


QUANTITY_QUANTUM = Decimal("0.000001")
ZERO = Decimal(0)
# lines whose quantity repeats GPU-hours a tenant line already states (the part of them a discount or
# a tier took off): they weigh nothing when an origin's quantity is split by quantity
_OVERLAPPING = {LineKind.SHARING_SHORTFALL, LineKind.UTILIZATION_SHORTFALL}


def _largest_remainder(total: Decimal, weights: list[Decimal], quantum: Decimal) -> list[Decimal]:
    """``total`` split in proportion to ``weights`` into multiples of ``quantum`` that sum to it
    exactly: each part floored, the rest handed out a quantum at a time by largest remainder (first
    listed first on ties). Equal parts where every weight is 0."""
    units = int((total / quantum).to_integral_value())
    if not weights:
        return []
    given = [Fraction(w) for w in weights]
    whole = sum(given, Fraction(0))
    if whole == 0:
        given, whole = [Fraction(1)] * len(weights), Fraction(len(weights))
    exact = [units * w / whole for w in given]
    parts = [math.floor(e) for e in exact]
    order = sorted(range(len(exact)), key=lambda i: (-(exact[i] - parts[i]), i))
    for i in order[: units - sum(parts)]:
        parts[i] += 1
    return [Decimal(p) * quantum for p in parts]


def origins(report: Report) -> dict[int, tuple[_Origin, int]]:
    """id(charge) → (its origin charge, its place among the origin's rows)."""
    grouped: dict[tuple, list[LineTotal]] = defaultdict(list)
    for c in report.charges:
        # the cluster where lines name one: the same UUID in two clusters is two GPUs
        grouped[(c.bucket, c.uuid, getattr(c, "cluster", None) or "", c.price_version_id, c.currency)].append(
            c
        )
    versions: dict[tuple[datetime, str], int] = defaultdict(int)
    for bucket, uuid, *_ in grouped:
        versions[(bucket, uuid)] += 1
    out: dict[int, tuple[_Origin, int]] = {}
    for (bucket, uuid, *_), charges in grouped.items():
        gpu = (report.gpus or {}).get((bucket, uuid))
        # a bucket two price versions share: each origin's quantity is what its own lines state
        present = gpu.present if gpu is not None and versions[(bucket, uuid)] == 1 else None
        origin = _Origin(report, charges, present)
        out.update({id(c): (origin, i) for i, c in enumerate(charges)})
    return out


class _Allocations:
    """The FOCUS 1.3 split cost allocation columns of a report's rows (docs/reports.md, "FOCUS 1.3
    split cost allocation"). Every row of an origin charge of more than one row is an allocated
    charge of it: AllocatedRatio its share of the origin's billed cost, the ratios of one origin
    summing to 1; a holder's row names the holder (AllocatedResourceId), a platform line is the
    unallocated portion (no AllocatedResourceId)."""

    def __init__(self, report: Report, origin_of: dict[int, tuple[_Origin, int]]):
        self.report = report
        self.origin_of = origin_of
        self.splits = report.splits
        if self.splits is None:
            raise ValueError("FOCUS 1.3 needs the report built with splits=True (reports.model.read_splits)")
        self.bodies = {v.id: v.body for v in report.price_versions}
        self.labels = {v.id: version_label(v) for v in report.price_versions}
        self.by_gpu: dict[tuple[datetime, str], set[Holding]] = defaultdict(set)
        for bucket, held in self.splits.items():
            for key, holdings in held.items():
                self.by_gpu[(bucket, key[0])] |= holdings

    def _holdings(self, c) -> set[Holding]:
        """The holdings of the split GPU-hours of a charge's bucket: its holder's, for a tenant line;
        its GPU's, for a platform line."""
        if c.kind in (LineKind.TENANT, LineKind.IDLE_SHARE):
            key = (c.uuid, c.gpu_instance_id, c.namespace, c.pod, c.container)
            return self.splits.get(c.bucket, {}).get(key, set())
        return self.by_gpu.get((c.bucket, c.uuid), set())

    def columns(self, c, period_start: str) -> dict[str, str]:
        """AllocatedMethodId, -Details, -ResourceId, -ResourceName and -Tags of charge ``c`` (all null
        where its origin charge is its only row: nothing was split)."""
        origin, _ = self.origin_of[id(c)]
        if len(origin.charges) == 1:
            return dict.fromkeys(ALLOCATION_COLUMNS, "")
        tenant = c.kind in (LineKind.TENANT, LineKind.IDLE_SHARE)
        body = self.bodies.get(c.price_version_id, {})
        holdings = self._holdings(c)
        methods = sorted({_method(h, body) for h in holdings} or {WHOLE_GPU_METHOD}, key=_PRECEDENCE.index)
        if c.kind == LineKind.IDLE_SHARE:
            methods = [LineKind.IDLE_SHARE.value]
        method = METHODS[methods[0]]
        if origin.billed:
            ratio = (c.amount or ZERO) / origin.billed
        else:  # nothing priced (a rate of 0, or unpriced): by the quantity the row was given
            part = origin.quantities[self.origin_of[id(c)][1]]
            ratio = part / origin.quantity if origin.quantity else Decimal(1) / len(origin.charges)
        element: dict[str, object] = {
            "AllocatedRatio": float(round(ratio, 12)),
            "UsageUnit": method.usage_unit if tenant else "GPU-Hours",
            "UsageQuantity": float(c.held if tenant and c.kind == LineKind.TENANT else c.quantity),
        }
        details: dict[str, object] = {
            "Elements": [element],
            "x_OriginCharge": {
                "ResourceId": c.uuid,
                "ChargePeriodStart": period_start,
                "BilledCost": self.report.money(origin.billed),
                "SkuPriceId": _sku_price_id(c, self.labels),
            },
            "x_LineKind": c.kind,
            "x_PriceBookVersion": self.labels.get(c.price_version_id, ""),
        }
        if method.policy:
            details["x_Policy"] = body.get(method.policy, "equal" if method.policy == "sharing_split" else "")
        if len(methods) > 1:
            details["x_Methods"] = [METHODS[m].id for m in methods]
        if c.kind == LineKind.TENANT and holdings:
            details.update(self._figures(c, holdings, body))
        if not tenant:  # the platform's part of the origin charge: the unallocated portion
            return {
                "AllocatedMethodDetails": _json(details),
                "AllocatedMethodId": method.id,
                "AllocatedResourceId": "",
                "AllocatedResourceName": "",
                "AllocatedTags": "",
            }
        holder = {"namespace": c.namespace, "pod": c.pod, "container": c.container, "team": c.team}
        return {
            "AllocatedMethodDetails": _json(details),
            "AllocatedMethodId": method.id,
            "AllocatedResourceId": "/".join(v for v in (c.namespace, c.pod, c.container) if v),
            "AllocatedResourceName": "/".join(v for v in (c.namespace, c.pod) if v),
            "AllocatedTags": _json({f"{TAG_PREFIX}{k}": v for k, v in holder.items() if v}),
        }

    def _figures(self, c, holdings: set[Holding], body: dict) -> dict[str, object]:
        """The parameters the split took: weight, share, efficiency (x_ keys, FOCUS' custom prefix)."""
        figures: dict[str, object] = {}
        modes = {h.mode for h in holdings}
        if contract.SHARING_MIG in modes and c.held:
            # the weight the line was priced at, normalisation included: weighted GPU-hours per
            # instance-hour held (slice-hours / compute slices)
            slices = _one(h.compute_slices for h in holdings)
            if isinstance(slices, int) and slices:
                figures["x_Weight"] = _figure(c.quantity * slices / c.held)
        replicas = [h for h in holdings if (h.replica or h.mode) != contract.SHARING_MIG]
        if replicas:
            figures["x_Share"] = _one(_figure(h.share) for h in replicas)
        grants = [h for h in holdings if h.mode == contract.SHARING_FRACTIONAL]
        if grants:
            figures["x_MemoryShare"] = _one(
                _figure(h.memory_share) for h in grants if h.memory_share is not None
            )
            figures["x_ComputeShare"] = _one(
                _figure(h.compute_share) for h in grants if h.compute_share is not None
            )
        efficiency = set()
        for h in holdings:
            e = Decimal(1) if h.mode == contract.SHARING_FRACTIONAL else _efficiency(body, h.mode)
            if h.replica:
                e *= _efficiency(body, h.replica)
                figures["x_Sharing"] = h.replica
            efficiency.add(_figure(e))
        figures["x_SharingEfficiency"] = _one(efficiency)
        return {key: value for key, value in figures.items() if value is not None}


TAG_PREFIX = "gpumeter/"  # the data generator-defined tag scheme of Tags and AllocatedTags
ALLOCATION_COLUMNS = (
    "AllocatedMethodDetails",
    "AllocatedMethodId",
    "AllocatedResourceId",
    "AllocatedResourceName",
    "AllocatedTags",
)
POOL_ACCOUNT_TYPE, CLUSTER_ACCOUNT_TYPE = "GPU Pool", "Cluster"


def _sku_price_id(c: LineTotal, labels: dict[int, str]) -> str:
    # an unpriced row names no price, even where a version was in effect (x_PriceBookVersion)
    label = "unpriced" if c.amount is None else labels.get(c.price_version_id, "unpriced")  # type: ignore[arg-type]
    return f"{c.model.lower()}:{label}"


def sub_account(c: LineTotal) -> tuple[str, str, str]:
    """SubAccountId, -Name and -Type of a charge: a grouping the whole GPU-hour shares on the
    provider's side (docs/reports.md, "FOCUS origin charges"). The cluster where the ledger line
    names one; else the GPU pool, which is the GPU model here: the ledger keeps no node pool label,
    and docs/capacity.md pools a GPU without one by its model."""
    cluster = getattr(c, "cluster", None)
    if cluster:
        return cluster, cluster, CLUSTER_ACCOUNT_TYPE
    return f"pool/{c.model}", c.model, POOL_ACCOUNT_TYPE


def _charge_period(report: Report, c: LineTotal) -> tuple[datetime, datetime]:
    """The origin charge's period: its bucket (an hour, or a UTC day), within the report's period."""
    length = HOUR if report.grain == "hour" else timedelta(days=1)
    return max(c.bucket, report.period.start), min(c.bucket + length, report.period.end)


def rows(
    report: Report,
    *,
    account: str = "gpumeter",
    service: str = "Kubernetes GPU",
    version: str = FOCUS_VERSION,
) -> list[dict]:
    """The FOCUS rows of a report, in the report's charge order (deterministic): every row of one
    origin charge carries the origin's dimensions; who or what a row charges is in the Allocated*
    (1.3, 1.4) and x_ columns only."""
    if version not in VERSIONS:
        raise ValueError(f"focus version: expected one of {', '.join(VERSIONS)} (value {version!r})")
    out = []
    period = report.period
    labels = {v.id: version_label(v) for v in report.price_versions}
    origin_of = origins(report)
    allocations = _Allocations(report, origin_of) if version != "1.2" else None
    gpus = report.gpus or {}
    for c in report.charges:
        origin, place = origin_of[id(c)]
        mig = bool(c.gpu_instance_id)
        tenant = c.kind in (LineKind.TENANT, LineKind.IDLE_SHARE)
        unpriced = origin.unpriced
        quantity = origin.quantities[place]
        list_cost = origin.list_cost(quantity)
        profile = c.mig_profile if mig else ""
        slices = report.slices(c)
        if unpriced and c.price_version_id is None:
            description = (
                f"Unpriced GPU model {c.model}: no price-book version in effect for the hour; "
                "quantity only, not billed"
            )
        elif unpriced:
            description = (
                f"Unpriced GPU model {c.model}: price-book version {labels.get(c.price_version_id, '')} "
                "has no rate for it; quantity only, not billed"
            )
        else:
            description = f"GPU time on {c.model}, split among its holders and the platform (x_LineKind)"
        start, end = _charge_period(report, c)
        sub = sub_account(c)
        gpu = gpus.get((c.bucket, c.uuid))
        cluster = getattr(c, "cluster", None) or ""
        utilization = (
            Decimal(repr(round(c.utilization_weighted / float(c.utilization_quantity), 6)))
            if c.utilization_quantity
            else None
        )
        efficiency = (
            Decimal(repr(round(c.efficiency_weighted / float(c.efficiency_quantity), 6)))
            if c.efficiency_quantity
            else None
        )
        # the origin's own tags: every row of it carries them; the holder's are AllocatedTags (1.3)
        tags = {"gpu_model": c.model, "pool": c.model}
        if cluster:
            tags["cluster"] = cluster
        row = {
            "BilledCost": _num(c.amount or ZERO),
            "BillingAccountId": account,
            "BillingAccountName": account,
            "BillingCurrency": c.currency,
            "BillingPeriodEnd": _ts(period.end),
            "BillingPeriodStart": _ts(period.start),
            "ChargeCategory": "Usage",
            "ChargeClass": "",
            "ChargeDescription": description,
            "ChargeFrequency": "Usage-Based",
            "ChargePeriodEnd": _ts(end),
            "ChargePeriodStart": _ts(start),
            "ConsumedQuantity": _num(quantity),
            "ConsumedUnit": "GPU-Hours",
            "ContractedCost": _num(list_cost),
            "ContractedUnitPrice": _num(origin.rate),
            "EffectiveCost": _num(c.amount or ZERO),
            "InvoiceId": f"{account}-{period.label}",
            "InvoiceIssuerName": account,
            "ListCost": _num(list_cost),
            "ListUnitPrice": _num(origin.rate),
            "PricingCategory": "Other" if unpriced else "Standard",
            "PricingQuantity": _num(quantity),
            "PricingUnit": "GPU-Hours",
            "ProviderName": account,
            "PublisherName": account,
            "ResourceId": c.uuid,
            # a name a person reads: the node and the GPU's index on it, and the model; null unknown
            "ResourceName": f"{gpu.hostname} GPU {gpu.index} ({c.model})" if gpu and gpu.hostname else "",
            "ResourceType": "GPU",
            "ServiceCategory": "Compute",
            "ServiceName": service,
            "ServiceSubcategory": "Containers",
            "SkuId": f"gpu-{c.model.lower()}",
            "SkuPriceId": _sku_price_id(c, labels),
            "SubAccountId": sub[0],
            "SubAccountName": sub[1],
            "SubAccountType": sub[2],
            "Tags": _json({f"{TAG_PREFIX}{k}": v for k, v in tags.items()}),
            "x_Cluster": cluster,
            "x_Container": c.container,
            "x_GpuHours": _num(c.quantity),
            "x_GpuInstanceId": c.gpu_instance_id,
            "x_GpuModel": c.model,
            "x_GpuUtilizationAvg": _num(utilization),
            "x_GpuUuid": c.uuid,
            "x_LineKind": LineKind.UNPRICED.value if unpriced else c.kind,
            "x_MigProfile": profile,
            "x_Namespace": c.namespace,
            "x_Pod": c.pod,
            "x_PriceBookVersion": labels.get(c.price_version_id, ""),  # type: ignore[arg-type]
            "x_SliceHours": _num(slices) if mig and tenant else "",
            "x_Team": c.team,
            "x_Unpriced": "true" if unpriced else "false",
            "x_UtilizationEfficiency": _num(efficiency),
        }
        if allocations:
            row.update(allocations.columns(c, _ts(start)))
            row.update(ContractApplied="", HostProviderName=account, ServiceProviderName=account)
        out.append(row)
    return out


def write_csv(
    focus_rows: Iterable[dict],
    stream: io.TextIOBase,
    *,
    keep_formulas: bool = False,
    version: str = FOCUS_VERSION,
) -> None:
    """RFC 4180 CSV (`reports.csvfile`): nulls as empty fields, text quoted where it needs it,
    formula-leading text cells defused unless ``keep_formulas``."""
    header = HEADERS[version]
    stream.write(
        csvfile.text(
            header,
            ([row[name] for name in header] for row in focus_rows),
            quote_all=False,
            keep_formulas=keep_formulas,
        )
    )


# --- the schema check ---------------------------------------------------------------------------------


def header_version(header: list[str]) -> str:
    """The FOCUS version of a header: 1.3 and 1.4 name ServiceProviderName, 1.2 does not; 1.4 has no
    ProviderName."""
    if "ServiceProviderName" not in header:
        return "1.2"
    return "1.3" if "ProviderName" in header else "1.4"


def check_header(header: list[str]) -> list[str]:
    problems: list[str] = []
    version = header_version(header)
    mandatory = {"1.2": MANDATORY, "1.3": MANDATORY_13, "1.4": MANDATORY_14}[version]
    custom = [name for name in header if name.startswith("x_")]
    if custom != sorted(custom):
        problems.append("header: custom columns not in alphabetical order")
    missing = [c for c in mandatory if c not in header]
    if missing:
        problems.append(f"header: missing mandatory FOCUS columns {sorted(missing)}")
    seen_custom = False
    for name in header:
        if name.startswith("x_"):
            seen_custom = True
            if not _CUSTOM.match(name):
                problems.append(f"header: custom column {name!r} must be x_ followed by PascalCase")
        elif name not in _SPEC:
            problems.append(f"header: unknown column {name!r} (custom columns need the x_ prefix)")
        elif seen_custom:
            problems.append(f"header: FOCUS column {name!r} after a custom column")
    if len(set(header)) != len(header):
        problems.append("header: duplicate columns")
    return problems


def _decimal(text: str) -> Decimal | None:
    if not _DECIMAL.match(text):
        return None
    try:
        return Decimal(text)
    except InvalidOperation:  # pragma: no cover - the pattern admits only valid numbers
        return None


def check_row(row: dict, line: int) -> list[str]:
    problems: list[str] = []

    def bad(column: str, problem: str) -> None:
        problems.append(f"row {line}: {column}: {problem} (value {row.get(column)!r})")

    for column, value in row.items():
        if column not in _SPEC:
            continue
        nullable, kind = _SPEC[column]
        if value in ("", None):
            if not nullable:
                bad(column, "must not be null")
            continue
        if kind == "decimal" and _decimal(value) is None:
            bad(column, "not a plain decimal number")
        elif kind == "datetime" and not _DATETIME.match(value):
            bad(column, "not a UTC date-time YYYY-MM-DDTHH:mm:ssZ")
        elif kind == "currency" and value not in MINOR_UNITS:
            bad(column, "not an ISO 4217 currency code")
        elif kind == "unit" and not _UNIT.match(value):
            bad(column, "does not follow the FOCUS UnitFormat")
        elif kind == "subcategory":
            allowed = SERVICE_SUBCATEGORIES.get(row.get("ServiceCategory", ""), set())
            if value not in allowed:
                bad(column, f"not allowed for ServiceCategory {row.get('ServiceCategory')!r}")
        elif kind == "json":
            try:
                doc = json.loads(value)
            except ValueError:
                bad(column, "not JSON")
            else:
                if not isinstance(doc, dict) or any(isinstance(v, dict | list) for v in doc.values()):
                    bad(column, "must be a JSON object with scalar values")
        elif kind == "allocation":
            for problem in allocation_details_problems(value):
                bad(column, problem)
        elif isinstance(kind, set) and value not in kind:
            bad(column, f"not one of {sorted(kind)}")

    def get(column: str) -> Decimal | None:
        value = row.get(column) or ""
        return _decimal(value) if value else None

    for start, end in (("ChargePeriodStart", "ChargePeriodEnd"), ("BillingPeriodStart", "BillingPeriodEnd")):
        a, b = row.get(start, ""), row.get(end, "")
        if _DATETIME.match(a or "") and _DATETIME.match(b or "") and not a < b:
            bad(end, f"must be after {start} (start inclusive, end exclusive)")
    category, correction = row.get("ChargeCategory"), row.get("ChargeClass") == "Correction"
    quantity = get("PricingQuantity")
    for cost, price in (("ListCost", "ListUnitPrice"), ("ContractedCost", "ContractedUnitPrice")):
        unit_price, value = get(price), get(cost)
        if (
            unit_price is not None
            and quantity is not None
            and not correction
            and value != unit_price * quantity
        ):
            bad(cost, f"must equal {price} x PricingQuantity = {unit_price * quantity}")
    if category in ("Usage", "Purchase") and not correction and quantity is None:
        bad("PricingQuantity", f"must not be null on {category} rows")
    if category == "Tax" and quantity is not None:
        bad("PricingQuantity", "must be null on Tax rows")
    if bool(row.get("PricingUnit")) != (quantity is not None):
        bad("PricingUnit", "must be null exactly when PricingQuantity is null")
    consumed = get("ConsumedQuantity")
    if category != "Usage" and consumed is not None:
        bad("ConsumedQuantity", "must be null unless ChargeCategory is Usage")
    if category == "Usage" and not correction and consumed is None:
        bad("ConsumedQuantity", "must not be null on Usage rows")
    if bool(row.get("ConsumedUnit")) != (consumed is not None):
        bad("ConsumedUnit", "must be null exactly when ConsumedQuantity is null")
    for column in ("BilledCost", "EffectiveCost", "ListCost", "ContractedCost"):
        value = get(column)
        if value is not None and value < 0 and not correction:
            bad(column, "negative outside a correction")
    if "AllocatedMethodId" in row:  # FOCUS 1.3 split cost allocation
        if bool(row.get("AllocatedMethodDetails")) != bool(row["AllocatedMethodId"]):
            bad("AllocatedMethodDetails", "must be null exactly when AllocatedMethodId is null")
        if bool(row.get("AllocatedResourceName")) != bool(row.get("AllocatedResourceId")):
            bad("AllocatedResourceName", "must be null exactly when AllocatedResourceId is null")
        if row.get("AllocatedResourceId") and not row["AllocatedMethodId"]:
            bad("AllocatedResourceId", "must be null when the charge is not related to a split")
        if row.get("AllocatedTags") and not row["AllocatedMethodId"]:
            bad("AllocatedTags", "must be null when the charge is not related to a split")
        if row["AllocatedMethodId"] and row["AllocatedMethodId"] not in METHOD_IDS:
            bad("AllocatedMethodId", "not a method docs/reports.md documents")
        try:
            tags, allocated = (
                json.loads(row.get("Tags") or "{}"),
                json.loads(row.get("AllocatedTags") or "{}"),
            )
        except ValueError:
            pass  # reported above
        else:
            if isinstance(tags, dict) and isinstance(allocated, dict) and set(tags) & set(allocated):
                bad("AllocatedTags", f"must not repeat tags of Tags {sorted(set(tags) & set(allocated))}")
    return problems


METHOD_IDS = {m.id for m in METHODS.values()}


def allocation_details_problems(value: str) -> list[str]:
    """What is wrong with an AllocatedMethodDetails value (FOCUS 1.3's AllocatedMethodDetails object:
    ``Elements``, an array of objects each with a numeric ``AllocatedRatio``, ``UsageUnit`` a string
    present wherever ``UsageQuantity`` is, a number; other keys ``x_``-prefixed)."""
    try:
        doc = json.loads(value)
    except ValueError:
        return ["not JSON"]
    if not isinstance(doc, dict) or not isinstance(doc.get("Elements"), list) or not doc["Elements"]:
        return ["must be a JSON object whose Elements is a non-empty array"]
    problems = [
        f"key {k!r} is neither FOCUS-defined nor x_-prefixed"
        for k in doc
        if k != "Elements" and not k.startswith("x_")
    ]
    for element in doc["Elements"]:
        if not isinstance(element, dict):
            problems.append("an Elements entry is not an object")
            continue
        ratio = element.get("AllocatedRatio")
        if isinstance(ratio, bool) or not isinstance(ratio, int | float) or not 0 <= ratio <= 1:
            problems.append("AllocatedRatio must be a number in [0, 1]")
        if "UsageQuantity" in element and not isinstance(element.get("UsageUnit"), str):
            problems.append("UsageUnit must be a string where UsageQuantity is given")
        quantity = element.get("UsageQuantity")
        if "UsageQuantity" in element and (
            isinstance(quantity, bool) or not isinstance(quantity, int | float)
        ):
            problems.append("UsageQuantity must be a number")
        extra = set(element) - {"AllocatedRatio", "UsageUnit", "UsageQuantity"}
        problems += [
            f"Elements key {k!r} is neither FOCUS-defined nor x_-prefixed"
            for k in sorted(extra)
            if not k.startswith("x_")
        ]
    return problems


RATIO_TOLERANCE = 1e-9  # the ratios are rounded to 12 places: their sum is 1 to this


def check_ratios(focus_rows: list[dict]) -> list[str]:
    """The AllocatedRatio of the rows of one origin charge (a GPU's split lines of one bucket, named
    by each row's ``x_OriginCharge``) sum to 1 (FOCUS 1.3 AllocatedMethodDetails)."""
    sums: dict[tuple[str, str, str], float] = defaultdict(float)
    for row in focus_rows:
        if row.get("AllocatedMethodId"):
            details = json.loads(row["AllocatedMethodDetails"])
            origin = details.get("x_OriginCharge") or {}
            key = (
                str(origin.get("ResourceId")),
                str(origin.get("ChargePeriodStart")),
                str(origin.get("SkuPriceId")),
            )
            sums[key] += sum(
                e.get("AllocatedRatio", 0) for e in json.loads(row["AllocatedMethodDetails"])["Elements"]
            )
    return [
        f"origin charge {uuid} at {start}: AllocatedRatio sums to {total!r}, not 1"
        for (uuid, start, _), total in sorted(sums.items())
        if abs(total - 1) > RATIO_TOLERANCE
    ]


def check_csv(text: str) -> list[str]:
    """Every problem of a FOCUS CSV document (empty list: conforms to what we check)."""
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader)
    except StopIteration:
        return ["file: empty"]
    problems = check_header(header)
    good = []
    for number, values in enumerate(reader, start=2):
        if len(values) != len(header):
            problems.append(f"row {number}: {len(values)} fields, header has {len(header)}")
            continue
        row = dict(zip(header, values, strict=True))
        found = check_row(row, number)
        problems.extend(found)
        if not found:
            good.append(row)
    return problems + check_ratios(good)


def check_file(path: str | Path) -> list[str]:
    return check_csv(Path(path).read_text(encoding="utf-8"))
