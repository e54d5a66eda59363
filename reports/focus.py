"""FOCUS 1.2 cost-and-usage rows from a report, and the project's own schema check.

Mapping (docs/reports.md, "FOCUS 1.2 mapping"): one row per charge line of the ledger, summed
over the report's grain (a UTC day by default, an hour with ``--grain hour``), ``x_``-prefixed custom
columns after the FOCUS columns. The check enforces, row by row, what the same section says focus-validator does
not reliably catch: column presence and order, types, ``T…Z`` dates,
allowed values on every row, the cost identities and the ``x_`` prefix.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterable
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from functools import lru_cache
from pathlib import Path

from gpumeter.billing.models import LineKind
from gpumeter.billing.pricing.currency import MINOR_UNITS
from gpumeter.reports import csvfile
from gpumeter.reports.model import HOUR, WHOLE_GPU, Report, version_label

FOCUS_VERSION = "1.2"
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
HEADER = [c[0] for c in COLUMNS] + [c[0] for c in CUSTOM]
_SPEC = {name: (nullable, kind) for name, nullable, kind in COLUMNS + CUSTOM}

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


def rows(report: Report, *, account: str = "gpumeter", service: str = "Kubernetes GPU") -> list[dict]:
    """The FOCUS rows of a report, in the report's charge order (deterministic)."""
    out = []
    period = report.period
    labels = {v.id: version_label(v) for v in report.price_versions}
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
        if tenant:
            tags["team"] = c.team
            tags["namespace"] = c.namespace
        out.append(
            {
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
                "Tags": json.dumps(tags, sort_keys=True, separators=(",", ":"), ensure_ascii=False),
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
        )
    return out


def write_csv(focus_rows: Iterable[dict], stream: io.TextIOBase, *, keep_formulas: bool = False) -> None:
    """RFC 4180 CSV (`reports.csvfile`): nulls as empty fields, text quoted where it needs it,
    formula-leading text cells defused unless ``keep_formulas``."""
    stream.write(
        csvfile.text(
            HEADER,
            ([row[name] for name in HEADER] for row in focus_rows),
            quote_all=False,
            keep_formulas=keep_formulas,
        )
    )


# --- the schema check ---------------------------------------------------------------------------------


def check_header(header: list[str]) -> list[str]:
    problems = []
    missing = [c for c in MANDATORY if c not in header]
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
    return problems


def check_csv(text: str) -> list[str]:
    """Every problem of a FOCUS CSV document (empty list: conforms to what we check)."""
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader)
    except StopIteration:
        return ["file: empty"]
    problems = check_header(header)
    for number, values in enumerate(reader, start=2):
        if len(values) != len(header):
            problems.append(f"row {number}: {len(values)} fields, header has {len(header)}")
            continue
        problems.extend(check_row(dict(zip(header, values, strict=True)), number))
    return problems


def check_file(path: str | Path) -> list[str]:
    return check_csv(Path(path).read_text(encoding="utf-8"))
