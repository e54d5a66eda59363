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
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from functools import lru_cache
from pathlib import Path

from gpumeter import contract
from gpumeter.billing.models import LineKind
from gpumeter.billing.pricing.currency import MINOR_UNITS
from gpumeter.reports import csvfile
from gpumeter.reports.model import HOUR, WHOLE_GPU, Holding, Report, version_label

VERSIONS = ("1.3", "1.2")  # the first is the default
FOCUS_VERSION = VERSIONS[0]
PLATFORM_ACCOUNT = ("__platform__", "GPU platform", "Platform")

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
CUSTOM: list[tuple[str, bool, object]] = [
    ("x_GpuModel", True, "string"),
    ("x_MigProfile", True, "string"),
    ("x_GpuUuid", False, "string"),
    ("x_GpuInstanceId", True, "string"),
    (
        "x_LineKind",
        False,
        {kind.value for kind in LineKind},
    ),
    ("x_Team", True, "string"),
    ("x_Namespace", False, "string"),
    ("x_Pod", True, "string"),
    ("x_Container", True, "string"),
    ("x_SliceHours", True, "decimal"),
    ("x_GpuUtilizationAvg", True, "decimal"),
    ("x_UtilizationEfficiency", True, "decimal"),
    ("x_PriceBookVersion", True, "string"),
    ("x_Unpriced", False, {"true", "false"}),
]
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
HEADER = [c[0] for c in COLUMNS] + [c[0] for c in CUSTOM]  # 1.2
HEADERS = {"1.2": HEADER, "1.3": [c[0] for c in COLUMNS_13] + [c[0] for c in CUSTOM]}
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
}
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


class _Allocations:
    """The FOCUS 1.3 split cost allocation columns of a report's rows (docs/reports.md, "FOCUS 1.3
    split cost allocation"). The origin charge of a row is its GPU's split lines of the row's bucket
    (an hour or a UTC day): every such line is an allocated charge of it, AllocatedRatio its share of
    that cost, and the ratios of one origin charge sum to 1."""

    def __init__(self, report: Report):
        self.report = report
        self.splits = report.splits
        if self.splits is None:
            raise ValueError("FOCUS 1.3 needs the report built with splits=True (reports.model.read_splits)")
        self.bodies = {v.id: v.body for v in report.price_versions}
        self.labels = {v.id: version_label(v) for v in report.price_versions}
        self.by_gpu: dict[tuple[datetime, str], set[Holding]] = defaultdict(set)
        for bucket, held in self.splits.items():
            for key, holdings in held.items():
                self.by_gpu[(bucket, key[0])] |= holdings
        # the origin charge of a split row: its GPU's split rows of the same bucket
        self.holdings = {id(c): self._holdings(c) for c in report.charges}
        self.origin: dict[tuple, Decimal] = defaultdict(Decimal)
        self.origin_quantity: dict[tuple, Decimal] = defaultdict(Decimal)
        for c in report.charges:
            if self.holdings[id(c)]:
                self.origin[(c.bucket, c.uuid)] += c.amount or 0
                self.origin_quantity[(c.bucket, c.uuid)] += c.quantity

    def _holdings(self, c) -> set[Holding]:
        """The holdings of the split GPU-hours of a charge's bucket: its holder's, for a tenant line;
        its GPU's, for a platform line."""
        if c.kind in (LineKind.TENANT, LineKind.IDLE_SHARE):
            key = (c.uuid, c.gpu_instance_id, c.namespace, c.pod, c.container)
            return self.splits.get(c.bucket, {}).get(key, set())
        return self.by_gpu.get((c.bucket, c.uuid), set())

    def columns(self, c) -> dict[str, str]:
        """AllocatedMethodId, -Details, -ResourceId, -ResourceName and -Tags of charge ``c`` (all null
        where its GPU-hours were not split)."""
        tenant = c.kind in (LineKind.TENANT, LineKind.IDLE_SHARE)
        body = self.bodies.get(c.price_version_id, {})
        holdings = self.holdings[id(c)]
        if not holdings:
            return dict.fromkeys(ALLOCATION_COLUMNS, "")
        methods = sorted({_method(h, body) for h in holdings}, key=_PRECEDENCE.index)
        if c.kind == LineKind.IDLE_SHARE:
            methods = [LineKind.IDLE_SHARE.value]
        method = METHODS[methods[0]]
        origin = self.origin[(c.bucket, c.uuid)]
        if origin:
            ratio = (c.amount or Decimal(0)) / origin
        else:  # nothing priced (a rate of 0): by quantity
            ratio = c.quantity / self.origin_quantity[(c.bucket, c.uuid)]
        element: dict[str, object] = {
            "AllocatedRatio": float(round(ratio, 12)),
            "UsageUnit": method.usage_unit if tenant else "GPU-Hours",
            "UsageQuantity": float(c.held if tenant and c.kind == LineKind.TENANT else c.quantity),
        }
        details: dict[str, object] = {
            "Elements": [element],
            "x_OriginCharge": {
                "ResourceId": c.uuid,
                "ChargePeriodStart": _ts(c.bucket),
                "BilledCost": self.report.money(origin),
            },
            "x_LineKind": c.kind,
            "x_Policy": body.get(method.policy, "equal" if method.policy == "sharing_split" else ""),
            "x_PriceBookVersion": self.labels.get(c.price_version_id, ""),
        }
        if len(methods) > 1:
            details["x_Methods"] = [METHODS[m].id for m in methods]
        if c.kind == LineKind.TENANT:
            details.update(self._figures(c, holdings, body))
        if not tenant:  # the platform's part of the origin charge: allocated to no resource
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


TAG_PREFIX = "gpumeter/"  # AllocatedTags' data generator-defined tag scheme
ALLOCATION_COLUMNS = (
    "AllocatedMethodDetails",
    "AllocatedMethodId",
    "AllocatedResourceId",
    "AllocatedResourceName",
    "AllocatedTags",
)


def rows(
    report: Report,
    *,
    account: str = "gpumeter",
    service: str = "Kubernetes GPU",
    version: str = FOCUS_VERSION,
) -> list[dict]:
    """The FOCUS rows of a report, in the report's charge order (deterministic)."""
    if version not in VERSIONS:
        raise ValueError(f"focus version: expected one of {', '.join(VERSIONS)} (value {version!r})")
    out = []
    period = report.period
    labels = {v.id: version_label(v) for v in report.price_versions}
    allocations = _Allocations(report) if version == "1.3" else None
    for c in report.charges:
        mig = bool(c.gpu_instance_id)
        tenant = c.kind in (LineKind.TENANT, LineKind.IDLE_SHARE)
        unpriced = c.amount is None
        rate = None if unpriced else report.rate(c)
        slices = report.slices(c)
        amount = Decimal(0) if unpriced else c.amount
        list_cost = (rate * c.quantity) if rate is not None else Decimal(0)
        profile = c.mig_profile if mig else ""
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
        elif c.kind == LineKind.TENANT:
            what = f"MIG {c.mig_profile} instance" if mig else "whole GPU"
            description = f"GPU usage: {what} on {c.model}"
        else:
            description = DESCRIPTIONS.get(c.kind, c.kind)
        sub = (c.namespace, c.namespace, "Namespace") if tenant else PLATFORM_ACCOUNT
        consumed, consumed_unit = (
            (slices, "Slice-Hours") if (mig and tenant and slices) else (c.quantity, "GPU-Hours")
        )
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
        tags = {"gpu_model": c.model, "kind": c.kind, "mig_profile": profile or WHOLE_GPU}
        allocated = allocations.columns(c) if allocations else {}
        if tenant and not allocated.get("AllocatedTags"):  # else the holder's tags are AllocatedTags
            tags["team"] = c.team
            tags["namespace"] = c.namespace
        row = {
            "BilledCost": _num(amount),
            "BillingAccountId": account,
            "BillingAccountName": account,
            "BillingCurrency": c.currency,
            "BillingPeriodEnd": _ts(period.end),
            "BillingPeriodStart": _ts(period.start),
            "ChargeCategory": "Usage",
            "ChargeClass": "",
            "ChargeDescription": description,
            "ChargeFrequency": "Usage-Based",
            "ChargePeriodEnd": _ts(c.last_hour + HOUR),
            "ChargePeriodStart": _ts(c.first_hour),
            "ConsumedQuantity": _num(consumed),
            "ConsumedUnit": consumed_unit,
            "ContractedCost": _num(list_cost),
            "ContractedUnitPrice": _num(rate),
            "EffectiveCost": _num(amount),
            "InvoiceId": f"{account}-{period.label}",
            "InvoiceIssuerName": account,
            "ListCost": _num(list_cost),
            "ListUnitPrice": _num(rate),
            "PricingCategory": "Other" if unpriced else "Standard",
            "PricingQuantity": _num(c.quantity),
            "PricingUnit": "GPU-Hours",
            "ProviderName": account,
            "PublisherName": account,
            "ResourceId": f"{c.uuid}/{c.gpu_instance_id}" if mig else c.uuid,
            "ResourceName": f"{c.namespace}/{c.pod}" if (tenant and c.pod) else c.uuid,
            "ResourceType": "MIG Instance" if mig else "GPU",
            "ServiceCategory": "Compute",
            "ServiceName": service,
            "ServiceSubcategory": "Containers",
            "SkuId": f"mig-{c.mig_profile}" if mig else f"gpu-{c.model.lower()}",
            # an unpriced row names no price, even where a version was in effect (x_PriceBookVersion)
            "SkuPriceId": f"{c.model.lower()}:{profile or 'whole'}:"
            + ("unpriced" if unpriced else labels.get(c.price_version_id, "unpriced")),
            "SubAccountId": sub[0],
            "SubAccountName": sub[1],
            "SubAccountType": sub[2],
            "Tags": _json(tags),
            "x_GpuModel": c.model,
            "x_MigProfile": profile,
            "x_GpuUuid": c.uuid,
            "x_GpuInstanceId": c.gpu_instance_id,
            "x_LineKind": LineKind.UNPRICED.value if unpriced else c.kind,
            "x_Team": c.team,
            "x_Namespace": c.namespace,
            "x_Pod": c.pod,
            "x_Container": c.container,
            "x_SliceHours": _num(slices) if mig and tenant else "",
            "x_GpuUtilizationAvg": _num(utilization),
            "x_UtilizationEfficiency": _num(efficiency),
            "x_PriceBookVersion": labels.get(c.price_version_id, ""),
            "x_Unpriced": "true" if unpriced else "false",
        }
        if allocations:
            row.update(allocated)
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
    """The FOCUS version of a header: 1.3 names ServiceProviderName, 1.2 does not."""
    return "1.3" if "ServiceProviderName" in header else "1.2"


def check_header(header: list[str]) -> list[str]:
    problems = []
    mandatory = MANDATORY_13 if header_version(header) == "1.3" else MANDATORY
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
    sums: dict[tuple[str, str], float] = defaultdict(float)
    for row in focus_rows:
        if row.get("AllocatedMethodId"):
            details = json.loads(row["AllocatedMethodDetails"])
            origin = details.get("x_OriginCharge") or {}
            key = (str(origin.get("ResourceId")), str(origin.get("ChargePeriodStart")))
            sums[key] += sum(
                e.get("AllocatedRatio", 0) for e in json.loads(row["AllocatedMethodDetails"])["Elements"]
            )
    return [
        f"origin charge {uuid} at {start}: AllocatedRatio sums to {total!r}, not 1"
        for (uuid, start), total in sorted(sums.items())
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
