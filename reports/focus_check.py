"""The project's own schema check of a FOCUS file, row by row (docs/reports.md, "Checks"): what
focus-validator does not reliably catch — column presence and order, types, ``T…Z`` dates, allowed
values on every row, the cost identities, the ``x_`` prefix and order, and in 1.3 and 1.4 the
allocation columns' rules and the ratios of each origin charge summing to 1."""

from __future__ import annotations

import csv
import io
import json
import re
from collections import defaultdict
from decimal import Decimal, InvalidOperation
from pathlib import Path

from gpumeter.billing.pricing.currency import MINOR_UNITS
from gpumeter.reports.focus_columns import (
    COLUMN_SPEC,
    MANDATORY,
    MANDATORY_13,
    MANDATORY_14,
    METHOD_IDS,
    SERVICE_SUBCATEGORIES,
)

_DECIMAL = re.compile(r"^-?\d+(\.\d+)?([eE][-+]?\d+)?$")
_DATETIME = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$")
_CUSTOM = re.compile(r"^x_[A-Z][A-Za-z0-9]*$")
_UNIT = re.compile(
    r"^(\d+ )?([A-Za-z]+(-[A-Za-z]+)?(-(Years|Months|Days|Hours|Minutes|Seconds))?"
    r"|[A-Za-z]+/(Year|Month|Day|Hour|Minute|Second))$"
)


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
        elif name not in COLUMN_SPEC:
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
        if column not in COLUMN_SPEC:
            continue
        nullable, kind = COLUMN_SPEC[column]
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
    # FOCUS 1.2-1.4 listunitprice.md, contractedunitprice.md
    for price in ("ListUnitPrice", "ContractedUnitPrice"):
        if get(price) is None and (
            (category in ("Usage", "Purchase") and not correction) or row.get("SkuPriceId")
        ):
            bad(price, f"must not be null on {category} rows or where SkuPriceId is set")
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


def check_ratios(focus_rows: list[dict]) -> list[str]:
    """The AllocatedRatio of the rows of one origin charge (a GPU's split lines of one bucket, named
    by each row's ``x_OriginCharge``) sum to exactly 1 (FOCUS 1.3 AllocatedMethodDetails: "MUST be
    equal to 1"), added as the decimals written, not as floats."""
    sums: dict[tuple[str, str, str, str], Decimal] = defaultdict(Decimal)
    for row in focus_rows:
        if row.get("AllocatedMethodId"):
            details = json.loads(row["AllocatedMethodDetails"], parse_float=Decimal)
            origin = details.get("x_OriginCharge") or {}
            key = (
                str(origin.get("ResourceId")),
                str(origin.get("ChargePeriodStart")),
                str(origin.get("SkuPriceId")),
                str(origin.get("SubAccountId")),
            )
            sums[key] += sum((Decimal(e.get("AllocatedRatio", 0)) for e in details["Elements"]), Decimal(0))
    return [
        f"origin charge {uuid} at {start}: AllocatedRatio sums to {total}, not 1"
        for (uuid, start, *_), total in sorted(sums.items())
        if total != 1
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
