"""FOCUS's origin charges in the ledger's integers (docs/reports.md, "FOCUS origin charges"): a
report's charges a grain bucket at a time as columns (`Bucket`), grouped into origins, one GPU's
charge for one bucket under one price-book version (`Origin`), each origin's quantity split among its
rows by largest remainder (`split`). Quantities are integers of 10⁻⁶ GPU-hours and amounts of 10⁻⁴ of
the currency, as the ledger stores them, written as the decimals they stand for (`scaled`)."""

from __future__ import annotations

import hashlib
import itertools
import json
import operator
from collections import defaultdict
from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta
from decimal import Decimal
from functools import lru_cache
from typing import TYPE_CHECKING, NamedTuple

from gpumeter.billing.ledger.base import LineTotal
from gpumeter.billing.ledger.types import MONEY_PLACES, QUANTITY_PLACES, RATIO_PLACES
from gpumeter.billing.models import LineKind
from gpumeter.reports.model import HOUR, Report, version_label

if TYPE_CHECKING:
    import pandas as pd

QUANTITY_SCALE = 10**QUANTITY_PLACES
EXACT_SCALE = 10 ** (RATIO_PLACES + QUANTITY_PLACES)  # a reading x a quantity (`Bucket.uw_exact`)
QUANTITY_QUANTUM = Decimal(1).scaleb(-QUANTITY_PLACES)  # the ledger's, and pricing's, quantity quantum
MONEY_UNIT = Decimal(1).scaleb(-MONEY_PLACES)
TENANT_KINDS = frozenset((LineKind.TENANT.value, LineKind.IDLE_SHARE.value))
# lines whose quantity repeats GPU-hours a tenant line already states (the part of them a discount or
# a tier took off): they weigh nothing when an origin's quantity is split by quantity
OVERLAPPING = frozenset((LineKind.SHARING_SHORTFALL.value, LineKind.UTILIZATION_SHORTFALL.value))


def num(value: Decimal | None) -> str:
    if value is None:
        return ""
    text = format(value, "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


@lru_cache(maxsize=65_536)  # a month's FOCUS rows state few distinct figures ~400,000 times at 1,000 GPUs
def scaled(value: int, places: int) -> str:
    """An integer of 10⁻``places`` as `num` writes that decimal: no trailing zeros, no point alone."""
    whole, part = divmod(abs(value), 10**places)
    sign = "-" if value < 0 else ""
    if part:
        return f"{sign}{whole}.{str(part).zfill(places).rstrip('0')}"
    return f"{sign}{whole}"


def nearest(numerator: int, denominator: int) -> int:
    """The integer nearest ``numerator / denominator``, a tie to the even one (as Decimal rounds by
    default), below zero as above it."""
    quotient, rest = divmod(abs(numerator), abs(denominator))
    if 2 * rest > abs(denominator) or (2 * rest == abs(denominator) and quotient & 1):
        quotient += 1
    return -quotient if (numerator < 0) != (denominator < 0) else quotient


def rounded(numerator: int, denominator: int, places: int) -> float:
    """``numerator / denominator`` rounded half to even at ``places`` decimals, as a float: what
    ``float(round(Decimal(numerator) / Decimal(denominator), places))`` gives (a test compares them),
    worked out in integers (a fifth of the time; ~100,000 rows a month at 1,000 GPUs take two each)."""
    scale = 10**places
    quotient = nearest(numerator * scale, denominator)
    # a zero keeps the sign Decimal gives it (0 / -5 is -0)
    if not quotient and ((numerator < 0) != (denominator < 0) if numerator else denominator < 0):
        return -0.0
    return quotient / scale


def mean_millionths(weighted: int, quantity: int) -> int | None:
    """A quantity-weighted mean (utilization, efficiency) in millionths, rounded half to even, from its
    exact sum ``weighted`` (10⁻¹⁵: a reading's 10⁻⁹ x a quantity's 10⁻⁶) over ``quantity`` (10⁻⁶); None
    without a quantity. In integers, so a mean lying half-way at the seventh place rounds by the rule
    and not by a float's last bit."""
    if not quantity:
        return None
    return nearest(weighted, quantity * 10 ** (RATIO_PLACES - 6))  # weighted / (quantity x 10⁹) x 10⁶


def mean_text(weighted: int, quantity: int) -> str:
    """`mean_millionths` as FOCUS writes a decimal (`scaled`); empty without a quantity."""
    millionths = mean_millionths(weighted, quantity)
    return "" if millionths is None else scaled(millionths, 6)


RATIO_UNITS = 10**12  # AllocatedRatio's places


def split(units: int, weights: list[int]) -> list[int]:
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


class Bucket(NamedTuple):
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
    # the readings' weighted sums exactly, integers of 10⁻¹⁵ (billing/ledger/frames.py EXACT)
    uw_exact: list[int]
    ew_exact: list[int]

    @classmethod
    def of_frame(cls, c: pd.DataFrame) -> Bucket:
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
            uw_exact=ints("uw_exact"),
            ew_exact=ints("ew_exact"),
        )

    @classmethod
    def of_lines(cls, charges: list[LineTotal]) -> Bucket:
        """A bucket's charges given as `LineTotal`s (a report whose charges were set by hand)."""

        def units_of(value: Decimal, unit: Decimal) -> int:
            return int((value / unit).to_integral_exact())

        text = {name: [getattr(c, name) for c in charges] for name in _TEXT_FIELDS}
        return cls(
            bucket=charges[0].bucket,
            **text,
            price_version_id=[c.price_version_id for c in charges],
            quantity=[units_of(c.quantity, QUANTITY_QUANTUM) for c in charges],
            amount=[None if c.amount is None else units_of(c.amount, MONEY_UNIT) for c in charges],
            uw=[c.utilization_weighted for c in charges],
            uq=[units_of(c.utilization_quantity, QUANTITY_QUANTUM) for c in charges],
            ew=[c.efficiency_weighted for c in charges],
            eq=[units_of(c.efficiency_quantity, QUANTITY_QUANTUM) for c in charges],
            held=[units_of(c.held, QUANTITY_QUANTUM) for c in charges],
            slice_hours=[units_of(Report.slices(c), QUANTITY_QUANTUM) for c in charges],
            # a `LineTotal` carries its weighted sums as floats: as near as they give
            uw_exact=[round(c.utilization_weighted * EXACT_SCALE) for c in charges],
            ew_exact=[round(c.efficiency_weighted * EXACT_SCALE) for c in charges],
        )


_TEXT_FIELDS = (*Bucket._fields[1:11], "cluster")  # the charge's keys (`reports.grouped.KEYS`) that are text


def buckets(charges: Sequence[LineTotal]) -> Iterator[Bucket]:
    """The report's charges a bucket at a time, in its order: from their columns, or from `LineTotal`s.
    ValueError where a bucket comes back after another: its origin charges would be cut in two."""
    from gpumeter.reports.grouped import Charges  # pandas: loaded by a report that writes FOCUS

    if isinstance(charges, Charges):
        runs: Iterator[Bucket] = map(Bucket.of_frame, charges.buckets())
    else:
        runs = (Bucket.of_lines(list(run)) for _, run in itertools.groupby(charges, key=_BUCKET))
    done: set[datetime] = set()
    for b in runs:
        if b.bucket in done:
            raise ValueError(f"charges: not in bucket order (bucket {b.bucket.isoformat()} met twice)")
        done.add(b.bucket)
        yield b


_BUCKET = operator.attrgetter("bucket")


class Origin:
    """An origin charge (docs/reports.md, "FOCUS origin charges"): one GPU's charge for one bucket (an
    hour, or a UTC day at day grain) under one price-book version. Its rows are the GPU's ledger lines
    of the bucket; they share every FOCUS dimension, and their summable metrics add up to it. In
    integers: ``billed`` of 10⁻⁴, ``parts`` (each row's share of the quantity, by largest remainder)
    of 10⁻⁶."""

    __slots__ = (
        "_ratios",
        "billed",
        "charge",
        "parts",
        "quantity",
        "rate",
        "rate_places",
        "rate_units",
        "rows",
        "span",
        "unpriced",
    )

    def __init__(self, b: Bucket, rows: list[int], rate: Decimal | None, present: Decimal | None):
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
        capacity = [0 if b.kind[i] in OVERLAPPING else b.quantity[i] for i in rows]
        # the GPU-hours present: from the facts where known, else what the capacity lines state
        if present is None:
            units = sum(capacity)
            self.quantity = Decimal(units) * QUANTITY_QUANTUM
        else:
            units = int((present / QUANTITY_QUANTUM).to_integral_value())
            self.quantity = present
        self.parts = split(units, amounts if self.billed else capacity)
        # each row's AllocatedRatio in 10⁻¹², split so that the origin's ratios sum to exactly 1 (FOCUS
        # 1.3 AllocatedMethodDetails: "MUST be equal to 1"), not each rounded on its own
        self._ratios = dict(
            zip(rows, split(RATIO_UNITS, amounts if self.billed else self.parts), strict=True)
        )
        self.charge = ""  # x_OriginCharge as JSON text, written once for its rows (`Allocations`)
        # ChargePeriodStart/End where its GPU's bucket has the origins of two price versions: the hours
        # its version priced (`origins`); None: the bucket's
        self.span: tuple[datetime, datetime | None] | None = None

    def list_cost(self, part: int) -> str:
        """The list cost of ``part`` (10⁻⁶ GPU-hours) at the origin's rate, as `num` writes it."""
        return (
            "0" if self.rate is None else scaled(self.rate_units * part, self.rate_places + QUANTITY_PLACES)
        )

    def ratio(self, row: int) -> float:
        """AllocatedRatio of the bucket's ``row``: its share of the origin's billed cost, or where
        nothing was billed (a rate of 0, or unpriced) of the quantity it was given, to 12 places."""
        return self._ratios[row] / RATIO_UNITS


def origins(report: Report, b: Bucket, rates: Rates) -> tuple[list[Origin], list[int]]:
    """Each row's origin charge and its part of the origin's quantity (10⁻⁶ GPU-hours)."""
    grouped: dict[tuple, list[int]] = {}
    # a GPU is (cluster, uuid): the same UUID in two clusters is two GPUs
    for i, key in enumerate(zip(b.cluster, b.uuid, b.price_version_id, b.currency, strict=True)):
        rows = grouped.get(key)
        if rows is None:
            grouped[key] = [i]
        else:
            rows.append(i)
    versions: dict[tuple[str, str], set[int | None]] = defaultdict(set)
    for cluster, uuid, version, _ in grouped:
        versions[(cluster, uuid)].add(version)
    gpus = report.gpus or {}
    origin: list[Origin] = [None] * len(b.kind)  # type: ignore[list-item]
    part = [0] * len(b.kind)
    bounds = bucket_bounds(report, b.bucket)
    spanned: dict[tuple[str, str], dict[int | None, Decimal] | None] = {}
    for (cluster, uuid, version, _), rows in grouped.items():
        gpu = gpus.get((b.bucket, cluster, uuid))
        split = len(versions[(cluster, uuid)]) > 1
        if gpu is None:
            present = None
        elif not split:
            present = gpu.present
        else:
            # a bucket two price versions share: each origin's quantity is the GPU's presence in the
            # hours its version priced (`_span_presence`), else what its own lines state
            if (cluster, uuid) not in spanned:
                spanned[(cluster, uuid)] = _span_presence(
                    gpu.present, bounds, versions[(cluster, uuid)], rates
                )
            known = spanned[(cluster, uuid)]
            present = None if known is None else known[version]
        o = Origin(b, rows, rates.rate(version, b.model[rows[0]]), present)
        if split:  # told apart by their periods: each its version's hours
            o.span = rates.span(version)
        for i, share in zip(rows, o.parts, strict=True):
            origin[i], part[i] = o, share
    return origin, part


def bucket_bounds(report: Report, bucket: datetime) -> tuple[datetime, datetime]:
    """A grain bucket (an hour, or a UTC day) within the report's period: its origin charges' period."""
    length = HOUR if report.grain == "hour" else timedelta(days=1)
    return max(bucket, report.period.start), min(bucket + length, report.period.end)


def _span_presence(
    present: Decimal, bounds: tuple[datetime, datetime], versions: set[int | None], rates: Rates
) -> dict[int | None, Decimal] | None:
    """Per version of a GPU's bucket that ``versions`` split, the GPU-hours it was present in the
    hours the version priced (`Rates.span`, within ``bounds``), from its presence over the bucket
    (each hour's present seconds / 3600 to 6 places, summed: `reports.splits.GpuBucket`). The bucket's
    sum tells each hour's apart where the GPU was present the whole of every hour of it (the sum is
    the bucket's hours: each hour's is 1, so each version's is its hours) or of none (0); None where it
    does not (present part of the bucket), or where the versions' hours do not make up the bucket's."""
    start, end = bounds
    hours: dict[int | None, Decimal] = {}
    for version in versions:
        span = rates.span(version)
        if span is None:
            return None
        first, last = max(start, span[0]), end if span[1] is None else min(end, span[1])
        hours[version] = Decimal(max(0, (last - first) // HOUR))
    whole = Decimal((end - start) // HOUR)
    if sum(hours.values()) != whole:
        return None
    if present == whole:
        return hours
    if present == 0:
        return dict.fromkeys(hours, Decimal(0))
    return None


class Rates:
    """Each price-book version's label and rates, looked up once per (version, model)."""

    def __init__(self, report: Report):
        self.labels = {v.id: version_label(v) for v in report.price_versions}
        self.bodies = {v.id: v.body for v in report.price_versions}
        # the hours each version priced: an hour takes the version in effect at its start
        # (`PriceBook.version_at`), so from the first whole hour of its effective_from on
        self.spans = {
            v.id: (_hour_ceiling(v.effective_from), _hour_ceiling(v.effective_to) if v.effective_to else None)
            for v in report.price_versions
        }
        self.currencies = {v.id: v.currency for v in report.price_versions}
        self._rates: dict[tuple[int | None, str], Decimal | None] = {}
        self._sku_prices: dict[tuple[int | None, str], str] = {}

    def rate(self, version: int | None, model: str) -> Decimal | None:
        key = (version, model)
        if key not in self._rates:
            rate = self.bodies.get(version, {}).get("rates", {}).get(model)  # type: ignore[arg-type]
            self._rates[key] = Decimal(rate) if rate is not None else None
        return self._rates[key]

    def sku_price_id(self, model: str, unpriced: bool, version: int | None) -> str:
        """SkuPriceId: ``<model>:<12 hex digits>``, a digest of the terms that price the model under
        ``version`` (its currency and rate, and the version's idle policy, slice weight, sharing
        efficiencies and utilization tiers). FOCUS: it "MUST remain consistent over time", so a new
        version or an edit of the book that leaves the model's terms as they were keeps it, where the
        version's own digest (`x_PriceBookVersion`) changes with any byte of the file. An unpriced row
        names no price: ``<model>:unpriced``."""
        key = (version, model)
        known = self._sku_prices.get(key)
        if known is None:
            body = self.bodies.get(version)  # type: ignore[arg-type]
            rate = None if body is None else body.get("rates", {}).get(model)
            if rate is None:
                known = f"{model.lower()}:unpriced"
            else:
                terms = {k: v for k, v in body.items() if k not in _NOT_A_MODELS_TERMS}  # type: ignore[union-attr]
                terms.update(currency=self.currencies.get(version), rate=str(rate))  # type: ignore[arg-type]
                digest = hashlib.sha256(json.dumps(terms, sort_keys=True).encode()).hexdigest()
                known = f"{model.lower()}:{digest[:12]}"
            self._sku_prices[key] = known
        return f"{model.lower()}:unpriced" if unpriced else known

    def span(self, version: int | None) -> tuple[datetime, datetime | None] | None:
        """[start, end) of the hours ``version`` priced (end None: open), or None where unknown."""
        return self.spans.get(version)  # type: ignore[arg-type]


# what a version body holds that is not a term of one model's price: the other models' rates, the
# names it knows them by, and which of its rates were derived (the rate itself is taken apart)
_NOT_A_MODELS_TERMS = frozenset({"rates", "aliases", "derived"})


def _hour_ceiling(at: datetime) -> datetime:
    floor = at.replace(minute=0, second=0, microsecond=0)
    return floor if floor == at else floor + timedelta(hours=1)


POOL_ACCOUNT_TYPE, CLUSTER_ACCOUNT_TYPE = "GPU Pool", "Cluster"


def sub_account(cluster: str, model: str) -> tuple[str, str, str]:
    """SubAccountId, -Name and -Type of a charge: a grouping the whole GPU-hour shares on the
    provider's side (docs/reports.md, "FOCUS origin charges"). The cluster where the ledger line
    names one; else the GPU pool, which is the GPU model here: the ledger keeps no node pool label,
    and docs/capacity.md pools a GPU without one by its model."""
    if cluster:
        return cluster, cluster, CLUSTER_ACCOUNT_TYPE
    return f"pool/{model}", model, POOL_ACCOUNT_TYPE
