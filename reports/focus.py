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
import re
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from functools import lru_cache
from typing import TYPE_CHECKING, Any, NamedTuple

from gpumeter import contract
from gpumeter.billing.ledger.base import LineTotal
from gpumeter.billing.ledger.types import MONEY_PLACES, QUANTITY_PLACES
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

if TYPE_CHECKING:
    import pandas as pd

QUANTITY_SCALE = 10**QUANTITY_PLACES
QUANTITY_QUANTUM = Decimal(1).scaleb(-QUANTITY_PLACES)  # the ledger's, and pricing's, quantity quantum
MONEY_UNIT = Decimal(1).scaleb(-MONEY_PLACES)


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


def _scaled(value: int, places: int) -> str:
    """An integer of 10⁻``places`` as `_num` writes that decimal: no trailing zeros, no point alone."""
    whole, part = divmod(abs(value), 10**places)
    sign = "-" if value < 0 else ""
    if part:
        return f"{sign}{whole}.{str(part).zfill(places).rstrip('0')}"
    return f"{sign}{whole}"


def _ratio_text(weighted: float, quantity: int) -> str:
    """A quantity-weighted mean (utilization, efficiency) over a quantity of 10⁻⁶, to six places."""
    return _num(Decimal(repr(round(weighted / (quantity / QUANTITY_SCALE), 6)))) if quantity else ""


# json.dumps with these options makes an encoder on every call (twice a row, ~1 million rows a month)
_ENCODE = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode
_STRING = json.encoder.encode_basestring  # a JSON string as _ENCODE writes it (ensure_ascii=False)


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


ZERO = Decimal(0)
TENANT_KINDS = frozenset((LineKind.TENANT.value, LineKind.IDLE_SHARE.value))
# lines whose quantity repeats GPU-hours a tenant line already states (the part of them a discount or
# a tier took off): they weigh nothing when an origin's quantity is split by quantity
_OVERLAPPING = frozenset((LineKind.SHARING_SHORTFALL.value, LineKind.UTILIZATION_SHORTFALL.value))


def _split(units: int, weights: list[int]) -> list[int]:
    """``units`` split in proportion to integer ``weights`` into integers that sum to it exactly:
    each part floored, the rest handed out one at a time by largest remainder (first listed first on
    ties). Equal parts where every weight is 0. The parts depend only on the weights' proportions."""
    if not weights:
        return []
    whole = sum(weights)
    if whole == 0:
        weights, whole = [1] * len(weights), len(weights)
    parts = [units * w // whole for w in weights]
    short = units - sum(parts)
    if short:
        # the remainder of each part, over ``whole``: a larger share of a unit is a larger remainder
        # (negated where the weights sum below zero, the remainders then lying in (whole, 0])
        sign = 1 if whole > 0 else -1
        rests = [sign * (units * w % whole) for w in weights]
        for i in sorted(range(len(weights)), key=lambda i: (-rests[i], i))[:short]:
            parts[i] += 1
    return parts


def _largest_remainder(total: Decimal, weights: list[Decimal], quantum: Decimal) -> list[Decimal]:
    """``total`` split in proportion to ``weights`` into multiples of ``quantum`` that sum to it
    exactly (`_split`), in integers: the weights scaled to their finest decimal place, so each part's
    floor and remainder are exact integer division (what `Fraction`s worked out, at a fifth of their
    cost)."""
    units = int((total / quantum).to_integral_value())
    if not weights:
        return []
    places = max(0, -min(int(w.as_tuple().exponent) for w in weights))
    return [Decimal(p) * quantum for p in _split(units, [int(w.scaleb(places)) for w in weights])]


class _Bucket(NamedTuple):
    """One grain bucket's charges as Python lists, one per column: quantities and held in integers of
    10⁻⁶, amounts of 10⁻⁴ (None: unpriced), as the ledger stores them (billing/ledger/frames.py)."""

    bucket: datetime
    kind: list[str]
    namespace: list[str]
    team: list[str]
    pod: list[str]
    container: list[str]
    uuid: list[str]
    gpu_instance_id: list[str]
    mig_profile: list[str]
    model: list[str]
    currency: list[str]
    price_version_id: list[int | None]
    cluster: list[str]
    quantity: list[int]
    amount: list[int | None]
    uw: list[float]
    uq: list[int]
    ew: list[float]
    eq: list[int]
    held: list[int]
    slice_hours: list[int]  # `Report.slices`: held where a tenant's lines held slice-hours, else 0

    @classmethod
    def of_frame(cls, c: pd.DataFrame) -> _Bucket:
        """A bucket's rows of the charges' frame (`reports.grouped.Charges.buckets`)."""

        def ints(name: str) -> list[int]:
            return c[name].to_numpy(dtype="int64").tolist()

        def nullable(name: str) -> list[int | None]:
            values = c[name].astype("Int64").astype(object).tolist()
            return [None if v is NA else int(v) for v in values]

        from pandas import NA

        text = {name: c[name].tolist() for name in _TEXT_FIELDS}
        return cls(
            bucket=c["bucket"].iloc[0].to_pydatetime(),
            **text,
            price_version_id=nullable("price_version_id"),
            quantity=ints("quantity"),
            amount=nullable("amount"),
            uw=c["uw"].tolist(),
            uq=ints("uq"),
            ew=c["ew"].tolist(),
            eq=ints("eq"),
            held=ints("held"),
            slice_hours=ints("slice_hours"),
        )

    @classmethod
    def of_lines(cls, charges: list[LineTotal]) -> _Bucket:
        """A bucket's charges given as `LineTotal`s (a report whose charges were set by hand)."""

        def scaled(value: Decimal, unit: Decimal) -> int:
            return int((value / unit).to_integral_exact())

        text = {name: [getattr(c, name) for c in charges] for name in _TEXT_FIELDS}
        return cls(
            bucket=charges[0].bucket,
            **text,
            price_version_id=[c.price_version_id for c in charges],
            quantity=[scaled(c.quantity, QUANTITY_QUANTUM) for c in charges],
            amount=[None if c.amount is None else scaled(c.amount, MONEY_UNIT) for c in charges],
            uw=[c.utilization_weighted for c in charges],
            uq=[scaled(c.utilization_quantity, QUANTITY_QUANTUM) for c in charges],
            ew=[c.efficiency_weighted for c in charges],
            eq=[scaled(c.efficiency_quantity, QUANTITY_QUANTUM) for c in charges],
            held=[scaled(c.held, QUANTITY_QUANTUM) for c in charges],
            slice_hours=[scaled(Report.slices(c), QUANTITY_QUANTUM) for c in charges],
        )


_TEXT_FIELDS = (*_Bucket._fields[1:11], "cluster")  # the charge's keys (`reports.grouped.KEYS`) that are text


def _buckets(charges: Sequence[LineTotal]) -> Iterator[_Bucket]:
    """The report's charges a bucket at a time, in its order: from their columns, or from `LineTotal`s."""
    from gpumeter.reports.grouped import Charges  # pandas: loaded by a report that writes FOCUS

    if isinstance(charges, Charges):
        yield from map(_Bucket.of_frame, charges.buckets())
        return
    done: set[datetime] = set()
    for bucket, run in itertools.groupby(charges, key=_BUCKET):
        if bucket in done:
            raise ValueError(f"charges: not in bucket order (bucket {bucket.isoformat()} met twice)")
        done.add(bucket)
        yield _Bucket.of_lines(list(run))


_BUCKET = operator.attrgetter("bucket")


class _Origin:
    """An origin charge (docs/reports.md, "FOCUS origin charges"): one GPU's charge for one bucket (an
    hour, or a UTC day at day grain) under one price-book version. Its rows are the GPU's ledger lines
    of the bucket; they share every FOCUS dimension, and their summable metrics add up to it. In
    integers: ``billed`` of 10⁻⁴, ``parts`` (each row's share of the quantity, by largest remainder)
    of 10⁻⁶."""

    __slots__ = (
        "billed",
        "cost",
        "parts",
        "quantity",
        "rate",
        "rate_places",
        "rate_units",
        "rows",
        "unpriced",
    )

    def __init__(self, b: _Bucket, rows: list[int], rate: Decimal | None, present: Decimal | None):
        first = rows[0]
        self.rows = len(rows)
        self.unpriced = b.amount[first] is None
        self.rate = None if self.unpriced else rate
        if self.rate is not None:  # the rate as an integer of 10⁻places, for each row's list cost
            exponent = int(self.rate.as_tuple().exponent)
            self.rate_places = max(0, -exponent)
            self.rate_units = int(self.rate.scaleb(self.rate_places))
        amounts = [b.amount[i] or 0 for i in rows]
        self.billed = sum(amounts)
        capacity = [0 if b.kind[i] in _OVERLAPPING else b.quantity[i] for i in rows]
        # the GPU-hours present: from the facts where known, else what the capacity lines state
        if present is None:
            units = sum(capacity)
            self.quantity = Decimal(units) * QUANTITY_QUANTUM
        else:
            units = int((present / QUANTITY_QUANTUM).to_integral_value())
            self.quantity = present
        self.parts = _split(units, amounts if self.billed else capacity)
        self.cost = ""  # the billed cost as JSON text, in the currency's minor unit (`_Allocations`)

    def list_cost(self, part: int) -> str:
        """The list cost of ``part`` (10⁻⁶ GPU-hours) at the origin's rate, as `_num` writes it."""
        return (
            "0" if self.rate is None else _scaled(self.rate_units * part, self.rate_places + QUANTITY_PLACES)
        )

    def ratio(self, amount: int | None, part: int) -> float:
        """AllocatedRatio of a row: its share of the billed cost, or where nothing was billed (a rate
        of 0, or unpriced) of the quantity it was given."""
        if self.billed:
            ratio = Decimal(amount or 0) / Decimal(self.billed)
        elif self.quantity:
            ratio = Decimal(part) * QUANTITY_QUANTUM / self.quantity
        else:
            ratio = Decimal(1) / self.rows
        return float(round(ratio, 12))


def _origins(report: Report, b: _Bucket, rates: _Rates) -> tuple[list[_Origin], list[int]]:
    """Each row's origin charge and its part of the origin's quantity (10⁻⁶ GPU-hours)."""
    grouped: dict[tuple, list[int]] = {}
    # a GPU is (cluster, uuid): the same UUID in two clusters is two GPUs
    for i, key in enumerate(zip(b.cluster, b.uuid, b.price_version_id, b.currency, strict=True)):
        rows = grouped.get(key)
        if rows is None:
            grouped[key] = [i]
        else:
            rows.append(i)
    versions: dict[tuple[str, str], int] = defaultdict(int)
    for cluster, uuid, *_ in grouped:
        versions[(cluster, uuid)] += 1
    gpus = report.gpus or {}
    origin: list[_Origin] = [None] * len(b.kind)  # type: ignore[list-item]
    part = [0] * len(b.kind)
    for (cluster, uuid, version, _), rows in grouped.items():
        gpu = gpus.get((b.bucket, cluster, uuid))
        # a bucket two price versions share: each origin's quantity is what its own lines state
        present = gpu.present if gpu is not None and versions[(cluster, uuid)] == 1 else None
        o = _Origin(b, rows, rates.rate(version, b.model[rows[0]]), present)
        for i, share in zip(rows, o.parts, strict=True):
            origin[i], part[i] = o, share
    return origin, part


class _Rates:
    """Each price-book version's label and rates, looked up once per (version, model)."""

    def __init__(self, report: Report):
        self.labels = {v.id: version_label(v) for v in report.price_versions}
        self.bodies = {v.id: v.body for v in report.price_versions}
        self._rates: dict[tuple[int | None, str], Decimal | None] = {}

    def rate(self, version: int | None, model: str) -> Decimal | None:
        key = (version, model)
        if key not in self._rates:
            rate = self.bodies.get(version, {}).get("rates", {}).get(model)  # type: ignore[arg-type]
            self._rates[key] = Decimal(rate) if rate is not None else None
        return self._rates[key]


_NO_HOLDINGS: frozenset[Holding] = frozenset()
_UNSPLIT = ("",) * len(ALLOCATION_COLUMNS)
# a slot of an allocation's JSON template: the quoted placeholder the template was encoded with
_SLOT = re.compile('"\ue000([A-Z])\ue001"')


def _slot(name: str) -> str:
    return f"\ue000{name}\ue001"


class _Allocations:
    """The FOCUS 1.3 split cost allocation columns of a report's rows (docs/reports.md, "FOCUS 1.3
    split cost allocation"). Every row of an origin charge of more than one row is an allocated
    charge of it: AllocatedRatio its share of the origin's billed cost, the ratios of one origin
    summing to 1; a holder's row names the holder (AllocatedResourceId), a platform line is the
    unallocated portion (no AllocatedResourceId).

    AllocatedMethodDetails is the same document for every row of one kind, price version and set of
    holdings but for a few figures (the ratio, the quantities, the origin's names and cost): it is
    encoded once per such key as a template whose slots the row fills with its figures as JSON."""

    def __init__(self, report: Report, rates: _Rates):
        self.report = report
        self.splits = report.splits
        if self.splits is None:
            raise ValueError("FOCUS 1.3 needs the report built with splits=True (reports.model.read_splits)")
        self.rates = rates
        # a GPU is (cluster, uuid): a holder's key names its cluster in its namespace
        # (`cluster/namespace`, billing.models.cluster_namespace; a namespace has no "/")
        merged: dict[tuple[datetime, str, str], set[Holding]] = defaultdict(set)
        for bucket, held in self.splits.items():
            for key, holdings in held.items():
                merged[(bucket, key[2].rpartition("/")[0], key[0])] |= holdings
        # each distinct set kept once: the templates are keyed by it
        kept: dict[frozenset[Holding], frozenset[Holding]] = {}
        self.by_gpu = {key: kept.setdefault(frozen := frozenset(h), frozen) for key, h in merged.items()}
        self._templates: dict[tuple, tuple[str, str, int]] = {}
        self._holders: dict[tuple[str, str, str, str], tuple[str, str, str]] = {}

    def columns(self, b: _Bucket, i: int, origin: _Origin, part: int, period_start: str) -> tuple[str, ...]:
        """AllocatedMethodDetails, -Id, -ResourceId, -ResourceName and -Tags (ALLOCATION_COLUMNS) of
        row ``i`` of bucket ``b`` (all null where it is its origin's only row: nothing was split);
        ``period_start``: the bucket's ChargePeriodStart as JSON text."""
        if origin.rows == 1:
            return _UNSPLIT
        kind, version, held = b.kind[i], b.price_version_id[i], b.held[i]
        if kind in TENANT_KINDS:  # the holder's holdings
            key = (b.uuid[i], b.gpu_instance_id[i], b.namespace[i], b.pod[i], b.container[i])
            holdings = self.splits.get(b.bucket, {}).get(key, _NO_HOLDINGS)  # type: ignore[union-attr]
            if not isinstance(holdings, frozenset):  # the templates are keyed by it (`Holdings`: any set)
                holdings = frozenset(holdings)
        else:  # the holdings of its GPU's split GPU-hours
            holdings = self.by_gpu.get((b.bucket, b.cluster[i], b.uuid[i]), _NO_HOLDINGS)
        template = self._templates.get((kind, version, holdings, bool(held)))
        if template is None:
            template = self._template(kind, version, holdings, bool(held))
        text, method_id, weighted = template
        tenant = kind in TENANT_KINDS
        quantity = b.quantity[i]
        usage = held if kind == LineKind.TENANT else quantity
        model, cluster = b.model[i], b.cluster[i]
        details = text.format(
            R=repr(origin.ratio(b.amount[i], part)),
            Q=repr(usage / QUANTITY_SCALE),
            U=_STRING(b.uuid[i]),
            S=period_start,
            B=origin.cost or self._cost(origin),
            K=_STRING(_sku_price_id(model, b.amount[i] is None, version, self.rates.labels)),
            A=_STRING(cluster or f"pool/{model}"),
            W=repr(_weight(quantity, weighted, held)) if weighted and held else "",
        )
        if not tenant:  # the platform's part of the origin charge: the unallocated portion
            return details, method_id, "", "", ""
        return (
            details,
            method_id,
            *self._holder(b.namespace[i], b.pod[i], b.container[i], b.team[i], cluster),
        )

    def _cost(self, origin: _Origin) -> str:
        origin.cost = _STRING(self.report.money(Decimal(origin.billed) * MONEY_UNIT))
        return origin.cost

    def _holder(
        self, namespace: str, pod: str, container: str, team: str, cluster: str
    ) -> tuple[str, str, str]:
        """AllocatedResourceId, -ResourceName and -Tags of a holder (kept: a pod is billed every day)."""
        key = (namespace, pod, container, team)
        named = self._holders.get(key)
        if named is None:
            namespace = namespace.removeprefix(f"{cluster}/") if cluster else namespace
            holder = {"namespace": namespace, "pod": pod, "container": container, "team": team}
            named = self._holders[key] = (
                "/".join(v for v in (namespace, pod, container) if v),
                "/".join(v for v in (namespace, pod) if v),
                _json({f"{TAG_PREFIX}{k}": v for k, v in holder.items() if v}),
            )
        return named

    def _template(
        self, kind: str, version: int | None, holdings: frozenset[Holding], held: bool
    ) -> tuple[str, str, int]:
        """The details' template of a key, its method's id, and the compute slices the row's x_Weight
        takes (0: none)."""
        tenant = kind in TENANT_KINDS
        body = self.rates.bodies.get(version, {})  # type: ignore[arg-type]
        methods = sorted(
            {_method(h, body) for h in holdings} or {WHOLE_GPU_METHOD}, key=METHOD_PRECEDENCE.index
        )
        if kind == LineKind.IDLE_SHARE:
            methods = [LineKind.IDLE_SHARE.value]
        method = METHODS[methods[0]]
        details: dict[str, object] = {
            "Elements": [
                {
                    "AllocatedRatio": _slot("R"),
                    "UsageUnit": method.usage_unit if tenant else "GPU-Hours",
                    "UsageQuantity": _slot("Q"),
                }
            ],
            "x_OriginCharge": {
                "ResourceId": _slot("U"),
                "ChargePeriodStart": _slot("S"),
                "BilledCost": _slot("B"),
                "SkuPriceId": _slot("K"),
                "SubAccountId": _slot("A"),
            },
            "x_LineKind": kind,
            "x_PriceBookVersion": self.rates.labels.get(version, ""),  # type: ignore[arg-type]
        }
        if method.policy:
            details["x_Policy"] = body.get(method.policy, "equal" if method.policy == "sharing_split" else "")
        if len(methods) > 1:
            details["x_Methods"] = [METHODS[m].id for m in methods]
        weighted = 0
        if kind == LineKind.TENANT and holdings:
            figures, weighted = _figures(holdings, body)
            if weighted and held:
                figures["x_Weight"] = _slot("W")
            details.update(figures)
        # a slot's placeholder is a JSON string: the row's figure replaces it, quotes and all
        text = _SLOT.sub(r"{\1}", _json(details).replace("{", "{{").replace("}", "}}"))
        template = (text, method.id, weighted)
        self._templates[(kind, version, holdings, held)] = template
        return template


def _figures(holdings: frozenset[Holding], body: dict) -> tuple[dict[str, object], int]:
    """The parameters the split took: share, efficiency (x_ keys, FOCUS' custom prefix), and the
    compute slices its x_Weight is worked out from (0: no weight)."""
    figures: dict[str, object] = {}
    modes = {h.mode for h in holdings}
    weighted = 0
    if contract.SHARING_MIG in modes:
        slices = _one(h.compute_slices for h in holdings)
        if isinstance(slices, int) and slices:
            weighted = slices
    replicas = [h for h in holdings if (h.replica or h.mode) != contract.SHARING_MIG]
    if replicas:
        figures["x_Share"] = _one(_figure(h.share) for h in replicas)
    grants = [h for h in holdings if h.mode == contract.SHARING_FRACTIONAL]
    if grants:
        figures["x_MemoryShare"] = _one(_figure(h.memory_share) for h in grants if h.memory_share is not None)
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
    return {key: value for key, value in figures.items() if value is not None}, weighted


def _weight(quantity: int, slices: int, held: int) -> float:
    """x_Weight: the weight the line was priced at, normalisation included: weighted GPU-hours per
    instance-hour held (slice-hours / compute slices)."""
    return float(round(Decimal(quantity * slices) / Decimal(held), 6))


POOL_ACCOUNT_TYPE, CLUSTER_ACCOUNT_TYPE = "GPU Pool", "Cluster"


@lru_cache(maxsize=4096)
def _origin_tags(model: str, cluster: str) -> str:
    """The origin's own tags: every row of it carries them; the holder's are AllocatedTags (1.3)."""
    tags = {"gpu_model": model, "pool": model}
    if cluster:
        tags["cluster"] = cluster
    return _json({f"{TAG_PREFIX}{k}": v for k, v in tags.items()})


def _sku_price_id(model: str, unpriced: bool, version: int | None, labels: dict[int, str]) -> str:
    # an unpriced row names no price, even where a version was in effect (x_PriceBookVersion)
    label = "unpriced" if unpriced else labels.get(version, "unpriced")  # type: ignore[arg-type]
    return f"{model.lower()}:{label}"


def sub_account(cluster: str, model: str) -> tuple[str, str, str]:
    """SubAccountId, -Name and -Type of a charge: a grouping the whole GPU-hour shares on the
    provider's side (docs/reports.md, "FOCUS origin charges"). The cluster where the ledger line
    names one; else the GPU pool, which is the GPU model here: the ledger keeps no node pool label,
    and docs/capacity.md pools a GPU without one by its model."""
    if cluster:
        return cluster, cluster, CLUSTER_ACCOUNT_TYPE
    return f"pool/{model}", model, POOL_ACCOUNT_TYPE


def _charge_period(report: Report, bucket: datetime) -> tuple[datetime, datetime]:
    """The origin charge's period: its bucket (an hour, or a UTC day), within the report's period."""
    length = HOUR if report.grain == "hour" else timedelta(days=1)
    return max(bucket, report.period.start), min(bucket + length, report.period.end)


def rows(report: Report, **options: Any) -> list[dict]:
    """The FOCUS rows of a report, all at once, each a dict by column (`iter_rows`, whose options it
    takes)."""
    header = HEADERS[options.get("version", FOCUS_VERSION)]
    return [dict(zip(header, row, strict=True)) for row in iter_rows(report, **options)]


def iter_rows(
    report: Report,
    *,
    account: str = "gpumeter",
    service: str = "Kubernetes GPU",
    version: str = FOCUS_VERSION,
    keep_formulas: bool = True,
) -> Iterator[tuple[str, ...]]:
    """The FOCUS rows of a report, each in the column order of ``version`` (`HEADERS`), in the
    report's charge order (deterministic): every row of one origin charge carries the origin's
    dimensions; who or what a row charges is in the Allocated* (1.3, 1.4) and x_ columns only. Made
    a bucket of charges at a time, a column at a time: what is held is one bucket's columns. Text
    cells that a spreadsheet would read as formulas are made inert (`csvfile.neutralise_column`)
    unless ``keep_formulas``."""
    if version not in VERSIONS:
        raise ValueError(f"focus version: expected one of {', '.join(VERSIONS)} (value {version!r})")
    rates = _Rates(report)
    allocations = _Allocations(report, rates) if version != "1.2" else None
    header = HEADERS[version]
    period = report.period
    alike = {  # what every row of the report states alike
        "BillingAccountId": account,
        "BillingAccountName": account,
        "BillingPeriodEnd": _ts(period.end),
        "BillingPeriodStart": _ts(period.start),
        "ChargeCategory": "Usage",
        "ChargeClass": "",
        "ChargeFrequency": "Usage-Based",
        "ConsumedUnit": "GPU-Hours",
        "InvoiceId": f"{account}-{period.label}",
        "InvoiceIssuerName": account,
        "PricingUnit": "GPU-Hours",
        "ProviderName": account,
        "PublisherName": account,
        "ResourceType": "GPU",
        "ServiceCategory": "Compute",
        "ServiceName": service,
        "ServiceSubcategory": "Containers",
        "ContractApplied": "",
        "HostProviderName": account,
        "ServiceProviderName": account,
    }
    if not keep_formulas:
        alike = {name: csvfile.neutralise(value) for name, value in alike.items()}
    for b in _buckets(report.charges):
        columns = _bucket_columns(report, b, rates, allocations)
        if not keep_formulas:
            columns = {name: csvfile.neutralise_column(cells) for name, cells in columns.items()}
        n = len(b.kind)
        yield from zip(
            *(columns[name] if name in columns else itertools.repeat(alike[name], n) for name in header),
            strict=True,
        )


def _bucket_columns(
    report: Report, b: _Bucket, rates: _Rates, allocations: _Allocations | None
) -> dict[str, list[str]]:
    """The columns of one bucket's rows that are not the same for every row of the report."""
    n = len(b.kind)
    labels = rates.labels
    origin, part = _origins(report, b, rates)
    start, end = _charge_period(report, b.bucket)
    charge_start = _ts(start)
    unpriced = [o.unpriced for o in origin]
    mig = [bool(gi) for gi in b.gpu_instance_id]
    descriptions: dict[tuple, str] = {}
    subs = {key: sub_account(*key) for key in set(zip(b.cluster, b.model, strict=True))}
    gpus = report.gpus or {}
    names: dict[tuple[str, str, str], str] = {}

    def description(i: int) -> str:
        key = (unpriced[i], b.price_version_id[i], b.model[i])
        text = descriptions.get(key)
        if text is None:
            text = descriptions[key] = _description(*key, labels)
        return text

    def resource_name(cluster: str, uuid: str, model: str) -> str:
        # a name a person reads: the node and the GPU's index on it, and the model; null unknown
        name = names.get((cluster, uuid, model))
        if name is None:
            gpu = gpus.get((b.bucket, cluster, uuid))
            name = f"{gpu.hostname} GPU {gpu.index} ({model})" if gpu and gpu.hostname else ""
            names[(cluster, uuid, model)] = name
        return name

    billed = [_scaled(a or 0, MONEY_PLACES) for a in b.amount]
    consumed = [_scaled(p, QUANTITY_PLACES) for p in part]
    listed = [o.list_cost(p) for o, p in zip(origin, part, strict=True)]
    unit_prices = [_num(o.rate) for o in origin]
    sub = [subs[key] for key in zip(b.cluster, b.model, strict=True)]
    versions = [labels.get(v, "") for v in b.price_version_id]  # type: ignore[arg-type]
    columns: dict[str, list[str]] = {
        "BilledCost": billed,
        "BillingCurrency": b.currency,
        "ChargeDescription": [description(i) for i in range(n)],
        "ChargePeriodEnd": [_ts(end)] * n,
        "ChargePeriodStart": [charge_start] * n,
        "ConsumedQuantity": consumed,
        "ContractedCost": listed,
        "ContractedUnitPrice": unit_prices,
        "EffectiveCost": billed,
        "ListCost": listed,
        "ListUnitPrice": unit_prices,
        "PricingCategory": ["Other" if u else "Standard" for u in unpriced],
        "PricingQuantity": consumed,
        "ResourceId": b.uuid,
        "ResourceName": [resource_name(*key) for key in zip(b.cluster, b.uuid, b.model, strict=True)],
        "SkuId": [f"gpu-{model.lower()}" for model in b.model],
        "SkuPriceId": [
            _sku_price_id(m, a is None, v, labels)
            for m, a, v in zip(b.model, b.amount, b.price_version_id, strict=True)
        ],
        "SubAccountId": [s[0] for s in sub],
        "SubAccountName": [s[1] for s in sub],
        "SubAccountType": [s[2] for s in sub],
        "Tags": [_origin_tags(m, c) for m, c in zip(b.model, b.cluster, strict=True)],
        "x_Cluster": b.cluster,
        "x_Container": b.container,
        "x_GpuHours": [_scaled(q, QUANTITY_PLACES) for q in b.quantity],
        "x_GpuInstanceId": b.gpu_instance_id,
        "x_GpuModel": b.model,
        "x_GpuUtilizationAvg": [_ratio_text(w, q) for w, q in zip(b.uw, b.uq, strict=True)],
        "x_GpuUuid": b.uuid,
        "x_LineKind": [LineKind.UNPRICED.value if u else k for u, k in zip(unpriced, b.kind, strict=True)],
        "x_MigProfile": [p if m else "" for p, m in zip(b.mig_profile, mig, strict=True)],
        # the namespace as Kubernetes names it: a report names a named cluster's `cluster/namespace`
        # (`billing.models.cluster_namespace`); the FOCUS rows carry the cluster in its own columns
        "x_Namespace": [
            ns.removeprefix(f"{c}/") if c else ns for ns, c in zip(b.namespace, b.cluster, strict=True)
        ],
        "x_Pod": b.pod,
        "x_PriceBookVersion": versions,
        "x_SliceHours": [
            _scaled(s, QUANTITY_PLACES) if m and k in TENANT_KINDS else ""
            for s, m, k in zip(b.slice_hours, mig, b.kind, strict=True)
        ],
        "x_Team": b.team,
        "x_Unpriced": ["true" if u else "false" for u in unpriced],
        "x_UtilizationEfficiency": [_ratio_text(w, q) for w, q in zip(b.ew, b.eq, strict=True)],
    }
    if allocations is not None:
        start_text = _STRING(charge_start)
        allocated = [allocations.columns(b, i, origin[i], part[i], start_text) for i in range(n)]
        columns.update(zip(ALLOCATION_COLUMNS, map(list, zip(*allocated, strict=True)), strict=True))
    return columns


def _description(unpriced: bool, version: int | None, model: str, labels: dict[int, str]) -> str:
    if not unpriced:
        return f"GPU time on {model}, split among its holders and the platform (x_LineKind)"
    if version is None:
        return f"Unpriced GPU model {model}: no price-book version in effect for the hour; quantity only, not billed"
    return (
        f"Unpriced GPU model {model}: price-book version {labels.get(version, '')} "
        "has no rate for it; quantity only, not billed"
    )


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


def report_csv_parts(
    report: Report,
    *,
    account: str = "gpumeter",
    service: str = "Kubernetes GPU",
    version: str = FOCUS_VERSION,
    keep_formulas: bool = False,
) -> Iterator[str]:
    """A report's FOCUS file in parts, made a bucket at a time from the rows in column order, their
    formula-leading text cells made inert column by column there unless ``keep_formulas``."""
    focus_rows = iter_rows(
        report, account=account, service=service, version=version, keep_formulas=keep_formulas
    )
    return csvfile.parts(HEADERS[version], focus_rows, quote_all=False, keep_formulas=True)


# --- the schema check ---------------------------------------------------------------------------------
