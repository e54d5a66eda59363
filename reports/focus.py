"""FOCUS 1.3 (default), 1.4 and 1.2 cost-and-usage rows from a report.

Mapping (docs/reports.md, "FOCUS mapping"): one row per charge line of the ledger, summed over the
report's grain (a UTC day by default, an hour with ``--grain hour``), ``x_``-prefixed custom columns
after the FOCUS columns. The rows are grouped into origin charges — one GPU's charge for one bucket
under one price-book version — and every row of one carries the origin's dimensions, its summable
metrics adding up to the origin's ("FOCUS origin charges"). 1.3 and 1.4 add split cost allocation:
every row of an origin of more than one row is an allocated charge of it, its method in
``AllocatedMethodId`` (the catalog ``METHODS``) and its figures in ``AllocatedMethodDetails``. The
columns are in `reports.focus_columns`, the schema check in `reports.focus_check`.
"""

from __future__ import annotations

import io
import itertools
import json
import operator
from collections import defaultdict
from collections.abc import Iterable, Iterator
from collections.abc import Set as AbstractSet
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from functools import lru_cache

from gpumeter import contract
from gpumeter.billing.ledger.base import LineTotal
from gpumeter.billing.models import LineKind
from gpumeter.reports import csvfile
from gpumeter.reports.focus_check import check_csv as check_csv
from gpumeter.reports.focus_check import check_file as check_file
from gpumeter.reports.focus_columns import (
    ALLOCATION_COLUMNS,
    FOCUS_VERSION,
    HEADERS,
    METHOD_PRECEDENCE,
    METHODS,
    TAG_PREFIX,
    VERSIONS,
    WHOLE_GPU_METHOD,
)
from gpumeter.reports.focus_columns import COLUMNS as COLUMNS
from gpumeter.reports.model import HOUR, Holding, Report, version_label


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


# json.dumps with these options makes an encoder on every call (twice a row, ~1 million rows a month)
_ENCODE = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode


def _json(doc: dict) -> str:
    return _ENCODE(doc)


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
    listed first on ties). Equal parts where every weight is 0. In integers: the weights scaled to
    their finest decimal place, so each part's floor and remainder are exact integer division (what
    `Fraction`s worked out, at a fifth of their cost over a month's ~1 million origins' rows)."""
    units = int((total / quantum).to_integral_value())
    if not weights:
        return []
    places = max(0, -min(int(w.as_tuple().exponent) for w in weights))
    scaled = [int(w.scaleb(places)) for w in weights]
    whole = sum(scaled)
    if whole == 0:
        scaled, whole = [1] * len(weights), len(weights)
    parts = [units * w // whole for w in scaled]
    # the remainder of each part, over ``whole``: a larger share of a quantum is a larger remainder
    # (negated where the weights sum below zero, the remainders then lying in (whole, 0])
    sign = 1 if whole > 0 else -1
    rests = [sign * (units * w % whole) for w in scaled]
    order = sorted(range(len(scaled)), key=lambda i: (-rests[i], i))
    for i in order[: units - sum(parts)]:
        parts[i] += 1
    return [Decimal(p) * quantum for p in parts]


def origins(report: Report, charges: Iterable[LineTotal]) -> dict[int, tuple[_Origin, int]]:
    """id(charge) → (its origin charge, its place among the origin's rows), for ``charges`` (the
    report's, or one bucket's of them: an origin never spans two buckets)."""
    grouped: dict[tuple, list[LineTotal]] = defaultdict(list)
    for c in charges:
        # a GPU is (cluster, uuid): the same UUID in two clusters is two GPUs
        grouped[(c.bucket, _cluster(c), c.uuid, c.price_version_id, c.currency)].append(c)
    versions: dict[tuple[datetime, str, str], int] = defaultdict(int)
    for bucket, cluster, uuid, *_ in grouped:
        versions[(bucket, cluster, uuid)] += 1
    out: dict[int, tuple[_Origin, int]] = {}
    for (bucket, cluster, uuid, *_), charges_of in grouped.items():
        gpu = (report.gpus or {}).get((bucket, cluster, uuid))
        # a bucket two price versions share: each origin's quantity is what its own lines state
        present = gpu.present if gpu is not None and versions[(bucket, cluster, uuid)] == 1 else None
        origin = _Origin(report, charges_of, present)
        out.update({id(c): (origin, i) for i, c in enumerate(charges_of)})
    return out


def by_bucket(charges: Iterable[LineTotal]) -> Iterator[list[LineTotal]]:
    """The charges of each bucket in turn, in the report's order (bucket first: `reports.grouped.SORT`),
    so a FOCUS file is made a bucket at a time. ValueError where a bucket comes back after another."""
    done: set[datetime] = set()
    for bucket, run in itertools.groupby(charges, key=_BUCKET):
        if bucket in done:
            raise ValueError(f"charges: not in bucket order (bucket {bucket.isoformat()} met twice)")
        done.add(bucket)
        yield list(run)


_BUCKET = operator.attrgetter("bucket")


class _Allocations:
    """The FOCUS 1.3 split cost allocation columns of a report's rows (docs/reports.md, "FOCUS 1.3
    split cost allocation"). Every row of an origin charge of more than one row is an allocated
    charge of it: AllocatedRatio its share of the origin's billed cost, the ratios of one origin
    summing to 1; a holder's row names the holder (AllocatedResourceId), a platform line is the
    unallocated portion (no AllocatedResourceId)."""

    def __init__(self, report: Report):
        self.report = report
        self.splits = report.splits
        if self.splits is None:
            raise ValueError("FOCUS 1.3 needs the report built with splits=True (reports.model.read_splits)")
        self.bodies = {v.id: v.body for v in report.price_versions}
        self.labels = {v.id: version_label(v) for v in report.price_versions}
        # a GPU is (cluster, uuid): a holder's key names its cluster in its namespace
        # (`cluster/namespace`, billing.models.cluster_namespace; a namespace has no "/")
        self.by_gpu: dict[tuple[datetime, str, str], set[Holding]] = defaultdict(set)
        for bucket, held in self.splits.items():
            for key, holdings in held.items():
                self.by_gpu[(bucket, key[2].rpartition("/")[0], key[0])] |= holdings

    def _holdings(self, c) -> AbstractSet[Holding]:
        """The holdings of the split GPU-hours of a charge's bucket: its holder's, for a tenant line;
        its GPU's, for a platform line."""
        if c.kind in (LineKind.TENANT, LineKind.IDLE_SHARE):
            key = (c.uuid, c.gpu_instance_id, c.namespace, c.pod, c.container)
            return self.splits.get(c.bucket, {}).get(key, set())
        return self.by_gpu.get((c.bucket, _cluster(c), c.uuid), set())

    def columns(self, c, origin: _Origin, place: int, period_start: str) -> dict[str, str]:
        """AllocatedMethodId, -Details, -ResourceId, -ResourceName and -Tags of charge ``c``, the row
        at ``place`` of ``origin`` (all null where that is its only row: nothing was split)."""
        if len(origin.charges) == 1:
            return dict.fromkeys(ALLOCATION_COLUMNS, "")
        tenant = c.kind in (LineKind.TENANT, LineKind.IDLE_SHARE)
        body = self.bodies.get(c.price_version_id, {})
        holdings = self._holdings(c)
        methods = sorted(
            {_method(h, body) for h in holdings} or {WHOLE_GPU_METHOD}, key=METHOD_PRECEDENCE.index
        )
        if c.kind == LineKind.IDLE_SHARE:
            methods = [LineKind.IDLE_SHARE.value]
        method = METHODS[methods[0]]
        if origin.billed:
            ratio = (c.amount or ZERO) / origin.billed
        else:  # nothing priced (a rate of 0, or unpriced): by the quantity the row was given
            part = origin.quantities[place]
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
                "SubAccountId": sub_account(c)[0],
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
        namespace = _namespace(c)
        holder = {"namespace": namespace, "pod": c.pod, "container": c.container, "team": c.team}
        return {
            "AllocatedMethodDetails": _json(details),
            "AllocatedMethodId": method.id,
            "AllocatedResourceId": "/".join(v for v in (namespace, c.pod, c.container) if v),
            "AllocatedResourceName": "/".join(v for v in (namespace, c.pod) if v),
            "AllocatedTags": _json({f"{TAG_PREFIX}{k}": v for k, v in holder.items() if v}),
        }

    def _figures(self, c, holdings: AbstractSet[Holding], body: dict) -> dict[str, object]:
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


POOL_ACCOUNT_TYPE, CLUSTER_ACCOUNT_TYPE = "GPU Pool", "Cluster"


@lru_cache(maxsize=4096)
def _origin_tags(model: str, cluster: str) -> str:
    """The origin's own tags: every row of it carries them; the holder's are AllocatedTags (1.3)."""
    tags = {"gpu_model": model, "pool": model}
    if cluster:
        tags["cluster"] = cluster
    return _json({f"{TAG_PREFIX}{k}": v for k, v in tags.items()})


def _sku_price_id(c: LineTotal, labels: dict[int, str]) -> str:
    # an unpriced row names no price, even where a version was in effect (x_PriceBookVersion)
    label = "unpriced" if c.amount is None else labels.get(c.price_version_id, "unpriced")  # type: ignore[arg-type]
    return f"{c.model.lower()}:{label}"


def _cluster(c: LineTotal) -> str:
    """The cluster a ledger line names; "" where the store had no cluster label (or lines predate it)."""
    return getattr(c, "cluster", "") or ""


def _namespace(c: LineTotal) -> str:
    """The namespace as Kubernetes names it: a report names a named cluster's `cluster/namespace`
    (`billing.models.cluster_namespace`); the FOCUS rows carry the cluster in its own columns."""
    cluster = _cluster(c)
    return c.namespace.removeprefix(f"{cluster}/") if cluster else c.namespace


def sub_account(c: LineTotal) -> tuple[str, str, str]:
    """SubAccountId, -Name and -Type of a charge: a grouping the whole GPU-hour shares on the
    provider's side (docs/reports.md, "FOCUS origin charges"). The cluster where the ledger line
    names one; else the GPU pool, which is the GPU model here: the ledger keeps no node pool label,
    and docs/capacity.md pools a GPU without one by its model."""
    cluster = _cluster(c)
    if cluster:
        return cluster, cluster, CLUSTER_ACCOUNT_TYPE
    return f"pool/{c.model}", c.model, POOL_ACCOUNT_TYPE


def _charge_period(report: Report, c: LineTotal) -> tuple[datetime, datetime]:
    """The origin charge's period: its bucket (an hour, or a UTC day), within the report's period."""
    length = HOUR if report.grain == "hour" else timedelta(days=1)
    return max(c.bucket, report.period.start), min(c.bucket + length, report.period.end)


def rows(report: Report, **options: str) -> list[dict]:
    """The FOCUS rows of a report, all at once (`iter_rows`, whose options it takes)."""
    return list(iter_rows(report, **options))


def iter_rows(
    report: Report,
    *,
    account: str = "gpumeter",
    service: str = "Kubernetes GPU",
    version: str = FOCUS_VERSION,
) -> Iterator[dict]:
    """The FOCUS rows of a report, in the report's charge order (deterministic): every row of one
    origin charge carries the origin's dimensions; who or what a row charges is in the Allocated*
    (1.3, 1.4) and x_ columns only. Made a bucket of charges at a time: what is held is one bucket's
    charges and origins."""
    if version not in VERSIONS:
        raise ValueError(f"focus version: expected one of {', '.join(VERSIONS)} (value {version!r})")
    allocations = _Allocations(report) if version != "1.2" else None
    for charges in by_bucket(report.charges):
        yield from _bucket_rows(
            report, charges, origins(report, charges), allocations, account, service, version
        )


def _bucket_rows(
    report: Report,
    charges: list[LineTotal],
    origin_of: dict[int, tuple[_Origin, int]],
    allocations: _Allocations | None,
    account: str,
    service: str,
    version: str,
) -> Iterator[dict]:
    period = report.period
    labels = {v.id: version_label(v) for v in report.price_versions}
    gpus = report.gpus or {}
    # what every row of the bucket states alike, written once (a month of 10,000 GPUs is ~1 million rows)
    start, end = _charge_period(report, charges[0]) if charges else (period.start, period.end)
    charge_start, charge_end = _ts(start), _ts(end)
    period_start, period_end = _ts(period.start), _ts(period.end)
    for c in charges:
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
        sub = sub_account(c)
        cluster = _cluster(c)
        gpu = gpus.get((c.bucket, cluster, c.uuid))
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
        billed, consumed, listed, unit_price = (
            _num(c.amount or ZERO),
            _num(quantity),
            _num(list_cost),
            _num(origin.rate),
        )
        row = {
            "BilledCost": billed,
            "BillingAccountId": account,
            "BillingAccountName": account,
            "BillingCurrency": c.currency,
            "BillingPeriodEnd": period_end,
            "BillingPeriodStart": period_start,
            "ChargeCategory": "Usage",
            "ChargeClass": "",
            "ChargeDescription": description,
            "ChargeFrequency": "Usage-Based",
            "ChargePeriodEnd": charge_end,
            "ChargePeriodStart": charge_start,
            "ConsumedQuantity": consumed,
            "ConsumedUnit": "GPU-Hours",
            "ContractedCost": listed,
            "ContractedUnitPrice": unit_price,
            "EffectiveCost": billed,
            "InvoiceId": f"{account}-{period.label}",
            "InvoiceIssuerName": account,
            "ListCost": listed,
            "ListUnitPrice": unit_price,
            "PricingCategory": "Other" if unpriced else "Standard",
            "PricingQuantity": consumed,
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
            "Tags": _origin_tags(c.model, cluster),
            "x_Cluster": cluster,
            "x_Container": c.container,
            "x_GpuHours": _num(c.quantity),
            "x_GpuInstanceId": c.gpu_instance_id,
            "x_GpuModel": c.model,
            "x_GpuUtilizationAvg": _num(utilization),
            "x_GpuUuid": c.uuid,
            "x_LineKind": LineKind.UNPRICED.value if unpriced else c.kind,
            "x_MigProfile": profile,
            "x_Namespace": _namespace(c),
            "x_Pod": c.pod,
            "x_PriceBookVersion": labels.get(c.price_version_id, ""),  # type: ignore[arg-type]
            "x_SliceHours": _num(slices) if mig and tenant else "",
            "x_Team": c.team,
            "x_Unpriced": "true" if unpriced else "false",
            "x_UtilizationEfficiency": _num(efficiency),
        }
        if allocations:
            row.update(allocations.columns(c, origin, place, charge_start))
            row.update(ContractApplied="", HostProviderName=account, ServiceProviderName=account)
        yield row


def write_csv(
    focus_rows: Iterable[dict],
    stream: io.TextIOBase,
    *,
    keep_formulas: bool = False,
    version: str = FOCUS_VERSION,
) -> None:
    """RFC 4180 CSV (`reports.csvfile`): nulls as empty fields, text quoted where it needs it,
    formula-leading text cells defused unless ``keep_formulas``."""
    for part in csv_parts(focus_rows, keep_formulas=keep_formulas, version=version):
        stream.write(part)


def csv_parts(
    focus_rows: Iterable[dict], *, keep_formulas: bool = False, version: str = FOCUS_VERSION
) -> Iterator[str]:
    """`write_csv`'s text in parts, as the rows are made."""
    header = HEADERS[version]
    return csvfile.parts(
        header,
        ([row[name] for name in header] for row in focus_rows),
        quote_all=False,
        keep_formulas=keep_formulas,
    )


# --- the schema check ---------------------------------------------------------------------------------
