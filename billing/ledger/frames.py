"""A range's priced lines as columns (a pandas DataFrame), one row per line, read in one query: what
reports group from (reports/model.py) instead of summing line objects one at a time.

Money and quantities stay exact: they are integers of the ledger's own scale (amounts in 1e-4 of the
currency, quantities in 1e-6 GPU-hours, as NUMERIC(20, 4) and NUMERIC(18, 6) store them), summed as
int64 and turned back into `Decimal` only by whoever shows them (`to_decimal`). Utilization and
efficiency are report-only ratios and are floats (NaN where unknown), as the ledger's sums have them.

pandas is imported here and by reports only: the exporter never loads it (tests/exporter/test_imports.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from decimal import ROUND_HALF_UP, Decimal
from typing import TYPE_CHECKING, Any

import pandas as pd
from pandas.api.types import union_categoricals

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from gpumeter.billing.ledger.base import Ledger
    from gpumeter.billing.models import Line

QUANTITY_SCALE = 10**6  # Exact(18, 6): quantity, held
MONEY_SCALE = 10**4  # Money() = Exact(20, 4): amount
QUANTITY_UNIT, MONEY_UNIT = Decimal(1).scaleb(-6), Decimal(1).scaleb(-4)

# the text columns, kept as categoricals: a month repeats each name over hundreds of thousands of lines
TEXT = (
    "kind",
    "namespace",
    "team",
    "pod",
    "container",
    "uuid",
    "gpu_instance_id",
    "mig_profile",
    "model",
    "currency",
    "held_unit",
    "cluster",
)
# integers of the stored scale; amount is nullable (an unpriced line has none)
SCALED = ("quantity", "amount", "held")
RATIOS = ("utilization", "efficiency")
COLUMNS = ("hour", *TEXT, "price_version_id", *SCALED, *RATIOS)
CHUNK = 200_000  # rows turned into columns at a time: the row tuples of one chunk are all that is held


def line_frame(ledger: Ledger, start: datetime, end: datetime) -> pd.DataFrame:
    """The lines of the hours in [start, end), one row per line (COLUMNS), in no particular order.
    A ledger answers from its own store where it can (`line_frame` method); any other is read
    through `Ledger.line_totals` by hour, which for a ledger of unique line keys is one row a line."""
    own = getattr(ledger, "line_frame", None)
    if own is not None:
        return own(start, end)
    return from_totals(ledger.line_totals(start, end, "hour"))


def _scaled(value: Decimal | None, scale: int) -> int | None:
    if value is None:
        return None
    return int(
        (value * scale).to_integral_value(rounding=ROUND_HALF_UP)
    )  # SQL's round(): half away from zero


def _ratio(value: Decimal | None) -> float:
    return float("nan") if value is None else float(value)


def from_lines(lines: Iterable[tuple[Line, int | None]]) -> pd.DataFrame:
    """The frame of stored lines, each with the id of the price version that priced it (the memory ledger)."""
    rows = [
        (
            line.hour,
            line.kind.value,
            line.namespace,
            line.team,
            line.pod,
            line.container,
            line.uuid,
            line.gpu_instance_id,
            line.mig_profile,
            line.model,
            line.currency,
            line.held_unit.value,
            line.cluster,
            version_id,
            _scaled(line.quantity, QUANTITY_SCALE),
            _scaled(line.amount, MONEY_SCALE),
            _scaled(line.held, QUANTITY_SCALE),
            _ratio(line.utilization),
            _ratio(line.efficiency),
        )
        for line, version_id in lines
    ]
    return _frame([_chunk(rows, hours_as="datetime")])


def from_totals(totals: Iterable[Any]) -> pd.DataFrame:
    """The frame of hourly `LineTotal`s, one per line (a ledger without a reader of its own)."""
    rows = []
    for t in totals:
        u = t.utilization_weighted / float(t.utilization_quantity) if t.utilization_quantity else None
        e = t.efficiency_weighted / float(t.efficiency_quantity) if t.efficiency_quantity else None
        rows.append(
            (
                t.bucket,
                t.kind,
                t.namespace,
                t.team,
                t.pod,
                t.container,
                t.uuid,
                t.gpu_instance_id,
                t.mig_profile,
                t.model,
                t.currency,
                t.held_unit,
                t.cluster,
                t.price_version_id,
                _scaled(t.quantity, QUANTITY_SCALE),
                _scaled(t.amount, MONEY_SCALE),
                _scaled(t.held, QUANTITY_SCALE),
                float("nan") if u is None else u,
                float("nan") if e is None else e,
            )
        )
    return _frame([_chunk(rows, hours_as="datetime")])


def read_sql(engine: Engine, start: datetime, end: datetime) -> pd.DataFrame:
    """The SQL ledger's lines of [start, end) in one query over the `cost_lines` view: the exact
    columns scaled to integers and the hour as epoch seconds by the database (no Decimal or datetime
    object is made per line), fetched a chunk of rows at a time into columns."""
    from sqlalchemy import BigInteger, Float, bindparam, cast, func, literal_column, select

    from gpumeter.billing.ledger.orm import COST_LINES

    c = COST_LINES.c

    def scaled(column: Any, scale: int) -> Any:
        return cast(func.round(column * literal_column(str(scale))), BigInteger)

    if engine.dialect.name == "sqlite":
        epoch = cast(func.strftime("%s", c.hour), BigInteger)
    else:
        epoch = cast(func.extract("epoch", c.hour), BigInteger)
    query = select(
        epoch,
        *(getattr(c, name) for name in TEXT),
        c.price_version_id,
        scaled(c.quantity, QUANTITY_SCALE),
        scaled(c.amount, MONEY_SCALE),
        scaled(c.held, QUANTITY_SCALE),
        cast(c.utilization, Float),
        cast(c.efficiency, Float),
    ).where(c.hour >= bindparam("lo", type_=c.hour.type), c.hour < bindparam("hi", type_=c.hour.type))
    chunks = []
    with engine.connect() as conn:
        result = conn.execution_options(stream_results=True).execute(query, {"lo": start, "hi": end})
        for part in result.partitions(CHUNK):
            chunks.append(_chunk(part, hours_as="epoch"))
    return _frame(chunks)


def _chunk(rows: Sequence[Any], *, hours_as: str) -> dict[str, Any]:
    """One chunk of row tuples (in COLUMNS order) as columns."""
    columns = list(zip(*rows, strict=True)) if rows else [()] * len(COLUMNS)
    out: dict[str, Any] = {}
    for name, values in zip(COLUMNS, columns, strict=True):
        if name == "hour":
            if hours_as == "epoch":
                out[name] = pd.to_datetime(pd.array(values, dtype="int64"), unit="s", utc=True)
            else:
                out[name] = pd.to_datetime(pd.Series(values, dtype=object), utc=True)
        elif name in TEXT:
            if name == "cluster":  # NULL: a line of a store without a cluster label
                values = tuple("" if v is None else v for v in values)
            out[name] = pd.Categorical(values)
        elif name in ("price_version_id", "amount"):
            out[name] = pd.array(values, dtype="Int64")
        elif name in SCALED:
            out[name] = pd.array(values, dtype="int64")
        else:
            out[name] = pd.array([float("nan") if v is None else v for v in values], dtype="float64")
    return out


def _frame(chunks: list[dict[str, Any]]) -> pd.DataFrame:
    if not chunks:
        chunks = [_chunk([], hours_as="epoch")]
    data: dict[str, Any] = {}
    for name in COLUMNS:
        parts = [chunk[name] for chunk in chunks]
        if name in TEXT:
            data[name] = union_categoricals(parts) if len(parts) > 1 else parts[0]
        elif len(parts) == 1:
            data[name] = parts[0]
        else:
            data[name] = pd.concat([pd.Series(p) for p in parts], ignore_index=True).array
    frame = pd.DataFrame(data)
    frame["hour"] = frame["hour"].astype("datetime64[us, UTC]")
    return frame


def gpu_hour_rows(engine: Engine, start: datetime, end: datetime) -> Iterator[Sequence[Any]]:
    """The SQL ledger's GPU-hours of [start, end) in one query, a chunk of rows at a time, in hour
    order: (hour as epoch seconds, cluster, uuid, hostname, gpu, present seconds, layout id, readings
    text or None). What a month's facts say without restoring each GPU-hour's objects."""
    from sqlalchemy import BigInteger, cast, func, select

    from gpumeter.billing.ledger.orm import GpuHourRow as g

    if engine.dialect.name == "sqlite":
        epoch = cast(func.strftime("%s", g.hour), BigInteger)
    else:
        epoch = cast(func.extract("epoch", g.hour), BigInteger)
    query = (
        select(
            epoch,
            g.cluster,
            g.uuid,
            g.hostname,
            g.gpu,
            g.present_seconds,
            g.layout_id,
            g.readings,
        )
        .where(g.hour >= start, g.hour < end)
        .order_by(g.hour, g.cluster, g.uuid)
    )
    with engine.connect() as conn:
        result = conn.execution_options(stream_results=True).execute(query)
        yield from result.partitions(CHUNK)


def layout_bodies(engine: Engine, ids: Iterable[int]) -> dict[int, str]:
    """The stored layouts of ``ids`` (billing/ledger/layouts.py), a few queries for any number."""
    from sqlalchemy import select

    from gpumeter.billing.ledger.orm import GpuLayout

    wanted, out = sorted(set(ids)), dict[int, str]()
    with engine.connect() as conn:
        for i in range(0, len(wanted), 500):  # within every backend's limit on bound parameters
            batch = wanted[i : i + 500]
            out.update(
                conn.execute(select(GpuLayout.id, GpuLayout.body).where(GpuLayout.id.in_(batch))).all()
            )
    return out
