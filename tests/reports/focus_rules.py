"""FOCUS's rules between the rows of a cost-and-usage file, written from the spec's text, not from
the export (reports/focus.py is not imported here, so a mistake made there is not copied in).

The origin charge of a gpumeter row is the GPU's charge for the row's bucket: one GPU for one hour, or
for one UTC day at day grain. What the origin is worth is worked out by the caller from the ledger's
stored facts and lines (`origins_from_ledger`), never from the file. The rules, each with the spec file
that states it (FinOps-Open-Cost-and-Usage-Spec/FOCUS_Spec, specification/):

* ``dimension`` — attributes/data_generator_calculated_split_cost_allocation_handling.md: a dimension
  column of an allocated charge MUST match the origin charge's (so every row of one origin agrees);
  the same for a non-summable metric (``unit-price``: ListUnitPrice, ContractedUnitPrice).
* ``sum`` — the same file: summable metrics of the allocated charges MUST sum to the origin's
  (BilledCost, EffectiveCost, ListCost, ContractedCost to the cent; PricingQuantity, ConsumedQuantity
  exactly); ListCost and ContractedCost of the origin are its unit price times its quantity
  (columns/listcost.md, contractedcost.md).
* ``allocated`` — datasets/cost_and_usage/columns/allocatedmethodid.md, allocatedresourceid.md,
  allocatedresourcename.md, allocatedtags.md: AllocatedMethodId null exactly when a charge is not
  part of a split (an origin of more than one row is split); AllocatedResourceId null on the
  unallocated portion, not null on an allocated portion; AllocatedResourceName null when
  AllocatedResourceId is; AllocatedTags null outside a split and never repeating a tag of Tags.
* ``resource-name`` — columns/resourcename.md: ResourceName MUST NOT duplicate a system-generated
  ResourceId.
* ``tag-prefix`` — columns/tags.md, allocatedtags.md: data generator-defined tag keys MUST carry the
  generator's prefix (gpumeter's: ``gpumeter/``).
* ``custom-order`` — attributes/column_naming_and_ordering.md (custom columns after the FOCUS ones,
  MAY be sorted) and 1.4's custom_column_handling.md: x_ columns after the FOCUS columns, in
  alphabetical order.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal

SUMMABLE_COST = ("BilledCost", "EffectiveCost", "ListCost", "ContractedCost")
SUMMABLE_QUANTITY = ("PricingQuantity", "ConsumedQuantity")
UNIT_PRICES = ("ListUnitPrice", "ContractedUnitPrice")
METRICS = set(SUMMABLE_COST + SUMMABLE_QUANTITY + UNIT_PRICES)
ALLOCATION = {
    "AllocatedMethodDetails",
    "AllocatedMethodId",
    "AllocatedResourceId",
    "AllocatedResourceName",
    "AllocatedTags",
}
# the lines of a GPU-hour no holder is charged for: the unallocated portion of the origin charge
UNALLOCATED_PORTION = {
    "unallocated",
    "stranded",
    "sharing_shortfall",
    "utilization_shortfall",
    "unpriced",
}
TAG_PREFIX = "gpumeter/"
QUANTUM = Decimal("0.000001")  # a GPU-hour's presence, as pricing states quantities
CENT = Decimal("0.01")


@dataclass
class Origin:
    """One GPU's charge for one bucket, from the ledger: what it billed and the GPU-hours present."""

    billed: Decimal = Decimal(0)
    quantity: Decimal = Decimal(0)


def bucket_of(moment: datetime, grain: str) -> datetime:
    return moment if grain == "hour" else moment.replace(hour=0)


OriginKey = tuple[str, str, str]  # (cluster, GPU uuid, bucket start); cluster "" where none is named


def origins_from_ledger(ledger, start: datetime, end: datetime, grain: str) -> dict[OriginKey, Origin]:
    """(cluster, GPU uuid, bucket start ``YYYY-MM-DDTHH:MM:SSZ``) → its origin charge: the sum of the
    ledger's line amounts, and the hours the GPU was present (each hour's present seconds / 3600).
    A GPU is its cluster and UUID: two clusters may hold GPUs of one UUID."""
    out: dict[OriginKey, Origin] = defaultdict(Origin)
    hour = start
    while hour < end:
        key_time = bucket_of(hour, grain).strftime("%Y-%m-%dT%H:%M:%SZ")
        for gpu_hour in ledger.facts(hour):
            device = gpu_hour.device
            seconds = max(0, min(device.present_seconds, 3600))
            present = (Decimal(seconds) / 3600).quantize(QUANTUM)
            out[(device.cluster, device.uuid, key_time)].quantity += present
        hour += timedelta(hours=1)
    for line in ledger.lines(start, end):
        key_time = bucket_of(line.hour.astimezone(UTC), grain).strftime("%Y-%m-%dT%H:%M:%SZ")
        out[(line.cluster, line.uuid, key_time)].billed += line.amount or 0
    return dict(out)


def _bucket_key(row: dict[str, str], grain: str) -> OriginKey:
    start = datetime.strptime(row["ChargePeriodStart"], "%Y-%m-%dT%H:%M:%SZ")
    return row.get("x_Cluster", ""), row["x_GpuUuid"], bucket_of(start, grain).strftime("%Y-%m-%dT%H:%M:%SZ")


def _dec(text: str) -> Decimal:
    return Decimal(text) if text else Decimal(0)


def rule_problems(
    header: list[str], rows: list[dict[str, str]], grain: str, origins: dict[OriginKey, Origin]
) -> dict[str, list[str]]:
    """Every departure from the rules above, by rule; each rule's list is empty when it holds. An
    origin is a GPU's bucket, as the ledger's facts give it: a bucket that two price versions split is
    two origins of the export (test_focus13's mid-day change checks those), which this does not read."""
    found: dict[str, list[str]] = {
        r: []
        for r in (
            "dimension",
            "unit-price",
            "sum",
            "allocated",
            "resource-name",
            "tag-prefix",
            "custom-order",
        )
    }
    custom = [c for c in header if c.startswith("x_")]
    if custom != sorted(custom) or header[len(header) - len(custom) :] != custom:
        found["custom-order"].append(f"x_ columns {custom} not after the FOCUS columns in alphabetical order")

    by_origin: dict[OriginKey, list[dict[str, str]]] = defaultdict(list)
    for row in rows:
        by_origin[_bucket_key(row, grain)].append(row)
    missing = set(origins) - set(by_origin)
    found["sum"] += [f"origin {key}: no rows" for key in sorted(missing) if origins[key].quantity]
    dimensions = [c for c in header if not c.startswith("x_") and c not in METRICS and c not in ALLOCATION]
    split_aware = "AllocatedMethodId" in header
    for key, group in sorted(by_origin.items()):
        for column in dimensions:
            values = {r[column] for r in group}
            if len(values) > 1:
                found["dimension"].append(f"origin {key}: {column} takes {sorted(values)}")
        for column in UNIT_PRICES:
            values = {r[column] for r in group}
            if len(values) > 1:
                found["unit-price"].append(f"origin {key}: {column} takes {sorted(values)}")
        origin = origins.get(key)
        if origin is None:
            found["sum"].append(f"origin {key}: rows for a GPU-bucket the ledger does not hold")
            continue
        expected = {
            "BilledCost": origin.billed,
            "EffectiveCost": origin.billed,
            "PricingQuantity": origin.quantity,
            "ConsumedQuantity": origin.quantity,
        }
        for cost, price in (("ListCost", "ListUnitPrice"), ("ContractedCost", "ContractedUnitPrice")):
            prices = {r[price] for r in group}
            if len(prices) == 1:
                expected[cost] = _dec(prices.pop()) * origin.quantity
        for column, want in expected.items():
            got = sum((_dec(r[column]) for r in group), Decimal(0))
            exact = got == want if column in SUMMABLE_QUANTITY else got.quantize(CENT) == want.quantize(CENT)
            if not exact:
                found["sum"].append(f"origin {key}: {column} sums to {got}, the origin is {want}")
        if split_aware:
            split = len(group) > 1
            for r in group:
                problems = _allocated_problems(r, split)
                found["allocated"] += [f"origin {key} ({r['x_LineKind']}): {p}" for p in problems]
        for r in group:
            if r["ResourceName"] and r["ResourceName"] == r["ResourceId"]:
                found["resource-name"].append(
                    f"origin {key}: ResourceName repeats ResourceId {r['ResourceId']!r}"
                )
            for column in ("Tags", "AllocatedTags"):
                if r.get(column):
                    bad = sorted(k for k in json.loads(r[column]) if not k.startswith(TAG_PREFIX))
                    if bad:
                        found["tag-prefix"].append(f"origin {key}: {column} keys {bad} lack {TAG_PREFIX!r}")
    return found


def _allocated_problems(r: dict[str, str], split: bool) -> list[str]:
    problems = []
    method = r["AllocatedMethodId"]
    if split and not method:
        problems.append("AllocatedMethodId null on a row of a split origin charge")
    if not split and method:
        problems.append("AllocatedMethodId set on a charge not split")
    if bool(r["AllocatedMethodDetails"]) != bool(method):
        problems.append("AllocatedMethodDetails null exactly when AllocatedMethodId is not")
    unallocated = r["x_LineKind"] in UNALLOCATED_PORTION
    if r["AllocatedResourceId"] and (not method or unallocated):
        problems.append("AllocatedResourceId set on the unallocated portion or outside a split")
    if method and not unallocated and not r["AllocatedResourceId"]:
        problems.append("AllocatedResourceId null on an allocated portion")
    if bool(r["AllocatedResourceName"]) and not r["AllocatedResourceId"]:
        problems.append("AllocatedResourceName set where AllocatedResourceId is null")
    if r["AllocatedTags"]:
        if not method:
            problems.append("AllocatedTags set outside a split")
        repeated = set(json.loads(r["AllocatedTags"])) & set(json.loads(r["Tags"] or "{}"))
        if repeated:
            problems.append(f"AllocatedTags repeats Tags {sorted(repeated)}")
    return problems
