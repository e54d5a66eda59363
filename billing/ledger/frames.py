"""A range's priced lines as columns (a pandas DataFrame), read in one query: what reports group
from (reports/model.py) instead of summing line objects one at a time.

A row is the lines of one bucket of hours ("hour": each line alone, "day": a UTC day's) that charge
one term: the same GPU, holder, quantity, amount and price version (billing/ledger/terms.py). The SQL
ledger sums them per (bucket, term id) in the database and joins the terms' names to the sums, so
a month of 10,000 GPUs crosses into Python as ~1 million rows, not its 22 million lines.

Money and quantities stay exact: they are integers of the ledger's own scale (amounts in 1e-4 of the
currency, quantities in 1e-6 GPU-hours, as NUMERIC(20, 4) and NUMERIC(18, 6) store them), summed as
int64 and turned back into `Decimal` only by whoever shows them. Utilization and efficiency are
report-only ratios: ``uw``/``ew`` are float sums of ratio x GPU-hours, ``uq``/``eq`` the exact
GPU-hours where the ratio is known, as `LineTotal` carries them. The SQL ledger sums a row's readings
exactly, as integers of 1e-9 (their stored places), so its ``uw``/``ew`` do not depend on the order in
which the database met the lines (SQLite and PostgreSQL give the same floats), and carries those sums
exactly too (``uw_exact``/``ew_exact``, integers of 1e-15), which a bucket's mean is rounded from.

pandas is imported here and by reports only: the exporter never loads it (tests/exporter/test_imports.py).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from decimal import ROUND_HALF_UP, Decimal
from typing import TYPE_CHECKING, Any

import pandas as pd
from pandas.api.types import union_categoricals

from gpumeter.billing.ledger.types import MONEY_PLACES, QUANTITY_PLACES, RATIO_PLACES
from gpumeter.billing.models import day_windows
from gpumeter.process import usable_cpus

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from gpumeter.billing.ledger.base import Ledger
    from gpumeter.billing.models import Line

QUANTITY_SCALE = 10**QUANTITY_PLACES  # quantity, held
MONEY_SCALE = 10**MONEY_PLACES  # amount
RATIO_SCALE = 10**RATIO_PLACES  # a reading (utilization, efficiency), as the SQL ledger sums them
EXACT_SCALE = RATIO_SCALE * QUANTITY_SCALE  # a reading x a quantity (``uw_exact``, ``ew_exact``)
QUANTITY_UNIT, MONEY_UNIT = Decimal(1).scaleb(-QUANTITY_PLACES), Decimal(1).scaleb(-MONEY_PLACES)

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
# integers of the stored scale, summed over the row's lines; amount is nullable (unpriced lines have none)
SCALED = ("quantity", "amount", "held", "uq", "eq")
# the readings' exact sums of ratio x GPU-hours, integers of 10⁻¹⁵ (a reading's 10⁻⁹ x a quantity's
# 10⁻⁶): what a bucket's mean is rounded from (FOCUS), where the floats ``uw``/``ew`` serve sums across
# buckets (a month's sum of a fleet's would pass int64). A day's row holds at most 24 x 10⁹ x 10⁶
EXACT = ("uw_exact", "ew_exact")
COLUMNS = (
    "bucket",
    "first_hour",
    "last_hour",
    "lines",
    *TEXT,
    "price_version_id",
    *SCALED,
    "uw",
    "ew",
    *EXACT,
)
CHUNK = 50_000  # rows turned into columns at a time: the row tuples of one chunk are all that is held (~1 KiB a row)
# "range": the whole range's lines in one bucket (at its start), what a comparison with the previous
# period reads (reports.grouped.before); the SQL ledger sums them per RANGE_NAMES, no readings read
GRAINS = ("hour", "day", "range")
# what a range's row names on the SQL ledger (its pod, container, GPU and instance empty): what the
# comparison groups by (reports.grouped.Probe), the kind, and what money is in and under
RANGE_NAMES = ("kind", "namespace", "team", "mig_profile", "model", "currency", "held_unit", "cluster")
# SQLite: the places of a set of terms whose readings a line group's row gives as columns of its own
# (`_sqlite_line_sums`). Each costs every group a look-up in its JSON, held or not: with the bench's
# sets of at most 7 lines, 7 columns took the 1,000-GPU month's sums 8.1 -> 4.9 s, 16 columns 7.6 s and
# 32 columns 12.0 s, so places past this are summed line by line, as before
READING_COLUMNS = 12


def line_frame(ledger: Ledger, start: datetime, end: datetime, grain: str = "day") -> pd.DataFrame:
    """The lines of the hours in [start, end) summed per ``grain`` bucket and term (COLUMNS), in no
    particular order; by "hour", one row a line; by "range", one bucket at ``start``, whose rows the
    SQL ledger sums per `RANGE_NAMES` and price version, without readings (zero). A ledger answers
    from its own store where it can (`line_frame` method); any other is read through
    `Ledger.line_totals`."""
    if grain not in GRAINS:
        raise ValueError(f"unknown grain {grain!r}")
    own = getattr(ledger, "line_frame", None)
    if own is not None:
        return own(start, end, grain)
    return from_totals(ledger.line_totals(start, end, grain))


def _scaled(value: Decimal | None, scale: int) -> int | None:
    if value is None:
        return None
    return int(
        (value * scale).to_integral_value(rounding=ROUND_HALF_UP)
    )  # SQL's round(): half away from zero


def _exact_weighted(reading: Decimal | None, quantity: int | None) -> int:
    """A line's reading x its quantity, exactly: an integer of 10⁻¹⁵ (EXACT); 0 without a reading."""
    units = _scaled(reading, RATIO_SCALE)
    return 0 if units is None or quantity is None else units * quantity


def from_lines(lines: Iterable[tuple[Line, int | None]], grain: str = "day") -> pd.DataFrame:
    """The frame of stored lines, each with the id of the price version that priced it (the memory
    ledger), a row a line: whoever groups them sums a bucket's lines of one term."""
    rows = []
    for line, version_id in lines:
        quantity = _scaled(line.quantity, QUANTITY_SCALE)
        hours = line.quantity
        u, e = line.utilization, line.efficiency
        rows.append(
            (
                line.hour
                if grain == "hour"
                else line.hour.replace(hour=0, minute=0, second=0, microsecond=0),
                line.hour,
                line.hour,
                1,
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
                quantity,
                _scaled(line.amount, MONEY_SCALE),
                _scaled(line.held, QUANTITY_SCALE),
                0 if u is None else quantity,
                0 if e is None else quantity,
                0.0 if u is None else float(u * hours),
                0.0 if e is None else float(e * hours),
                _exact_weighted(u, quantity),
                _exact_weighted(e, quantity),
            )
        )
    return _frame([_chunk(rows, hours_as="datetime")])


def from_totals(totals: Iterable[Any]) -> pd.DataFrame:
    """The frame of `LineTotal`s (a ledger without a reader of its own): a row a total."""
    rows = [
        (
            t.bucket,
            t.first_hour,
            t.last_hour,
            t.lines,
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
            _scaled(t.utilization_quantity, QUANTITY_SCALE),
            _scaled(t.efficiency_quantity, QUANTITY_SCALE),
            t.utilization_weighted,
            t.efficiency_weighted,
            # a `LineTotal` carries its weighted sums as floats: as near as they give
            round(t.utilization_weighted * EXACT_SCALE),
            round(t.efficiency_weighted * EXACT_SCALE),
        )
        for t in totals
    ]
    return _frame([_chunk(rows, hours_as="datetime")])


def _scaled_sql(column: str, scale: int) -> str:
    """SQL for a stored decimal as an integer of its stored ``scale`` (exact on SQLite's decimal text too)."""
    return f"CAST(round({column} * {scale}) AS BIGINT)"


def read_sql(
    engine: Engine, start: datetime, end: datetime, grain: str = "day", reading_columns: int = READING_COLUMNS
) -> pd.DataFrame:
    """The SQL ledger's lines of [start, end) summed per bucket and term id by the database, the
    terms' names joined to the sums: one query, in day-aligned windows on parallel connections where
    the range is long (the database sums outside the GIL). Money and quantities come back as
    integers of their stored scale and hours as epoch seconds (no Decimal or datetime object per
    row), a chunk of rows at a time into columns. (``reading_columns``: `_sqlite_line_sums`'.)"""

    if grain == "range":
        return _read_range(engine, start, end)
    if engine.dialect.name == "sqlite":
        sums = _sqlite_line_sums(grain, _widest_set(engine), reading_columns)
    else:
        sums = _postgresql_line_sums(grain)
    quantity = _scaled_sql("t.quantity", QUANTITY_SCALE)

    def epoch(column: str) -> str:
        return _epoch(engine, column)

    query = (
        f"SELECT {epoch('s.bucket')}, {epoch('s.first_hour')}, {epoch('s.last_hour')}, s.lines, "
        + ", ".join(f"t.{name}" for name in TEXT)
        + f", t.price_version_id, s.lines * {quantity}, "
        f"CASE WHEN t.amount IS NULL THEN NULL ELSE s.lines * {_scaled_sql('t.amount', MONEY_SCALE)} END, "
        f"s.lines * {_scaled_sql('t.held', QUANTITY_SCALE)}, s.u_known * {quantity}, s.e_known * {quantity}, "
        f"CAST(coalesce(s.u_sum, 0) AS DOUBLE PRECISION) / {RATIO_SCALE}.0 * CAST(t.quantity AS DOUBLE PRECISION), "
        f"CAST(coalesce(s.e_sum, 0) AS DOUBLE PRECISION) / {RATIO_SCALE}.0 * CAST(t.quantity AS DOUBLE PRECISION), "
        f"CAST(coalesce(s.u_sum, 0) * {quantity} AS BIGINT), CAST(coalesce(s.e_sum, 0) * {quantity} AS BIGINT) "
        f"FROM ({sums}) AS s JOIN cost_line_terms AS t ON t.id = s.term_id"
    )

    def fetch(window: tuple[datetime, datetime]) -> list[dict[str, Any]]:
        # the driver's own rows: SQLAlchemy's Row for each of ~1 million cost as much as making the columns
        parts = _stream(engine, query, window[0], window[1], (), "gpumeter_line_sums")
        return [_chunk(part, hours_as="epoch") for part in parts]

    windows = _day_windows(start, end)
    if len(windows) == 1:
        return _frame(fetch(windows[0]))
    with ThreadPoolExecutor(max_workers=len(windows)) as pool:
        return _frame([chunk for chunks in pool.map(fetch, windows) for chunk in chunks])


def _widest_set(engine: Engine) -> int:
    """The number of lines of the ledger's largest set of terms (0 without any)."""
    from sqlalchemy import text

    with engine.connect() as conn:
        return int(
            conn.execute(text("SELECT coalesce(max(pos) + 1, 0) FROM cost_line_set_terms")).scalar_one()
        )


def _exact(reading: str) -> str:
    """SQL for a reading (JSON text of a decimal, or null) as an integer of 10⁻⁹, its stored places:
    summed so, a total does not depend on the order in which the database meets the lines."""
    return f"CAST(round(CAST({reading} AS DOUBLE PRECISION) * {RATIO_SCALE}) AS BIGINT)"


def _line_by_line(bucket: str, reading: str, join_readings: str, within: str, places: str = "") -> str:
    """The lines of each (bucket, term) counted and their readings summed line by line, straight from
    the line groups and their sets (what the `cost_lines` view expands, without joining each line to
    its term): (bucket, term_id, first_hour, last_hour, lines, u_known, e_known, u_sum, e_sum).
    ``reading``: a line's reading by its index in [efficiency, utilization], from ``join_readings``;
    ``places``: a condition on the sets' places taken (`m.pos`)."""
    efficiency, utilization = _exact(reading.format(0)), _exact(reading.format(1))
    return (
        f"SELECT {bucket} AS bucket, m.term_id AS term_id, min(g.hour) AS first_hour, "
        f"max(g.hour) AS last_hour, count(*) AS lines, count({utilization}) AS u_known, "
        f"count({efficiency}) AS e_known, sum({utilization}) AS u_sum, sum({efficiency}) AS e_sum "
        f"FROM cost_line_groups AS g JOIN cost_line_set_terms AS m ON m.set_id = g.set_id{places} "
        f"{join_readings} WHERE {within} GROUP BY 1, 2"
    )


def _sqlite_line_sums(grain: str, widest: int, reading_columns: int) -> str:
    """SQLite's sums of the lines per (bucket, term), as `_line_by_line` gives them. Hours are stored
    as text, "YYYY-MM-DD HH:MM:SS.ffffff".

    SQLite groups by sorting, so the line groups are summed per (bucket, set of terms) first (a GPU
    keeps its set for hours on end: 30,000 rows for the 1,000-GPU month's 720,000 groups), each
    group's readings taken out of its JSON as a column per place, and the sets' sums are then spread
    over their terms: one sort of the groups instead of one of every line (2.3 million for that month;
    22 million at 10,000 GPUs, where the sums took 89 s, against 52 s so). Places from
    ``reading_columns`` on, where a set has them, are summed line by line as before (each group's
    readings parsed once, json_each), and both parts added per (bucket, term). The bounds of the hours
    are the parameters ?1 and ?2."""
    bucket = "g.hour" if grain == "hour" else "substr(g.hour, 1, 10)"
    within = "g.hour >= ?1 AND g.hour < ?2"
    places = range(min(widest, reading_columns))
    reading = "g.readings ->> '$[{}][{}]'"
    taken = "".join(
        f", {_exact(reading.format(p, 1))} AS u{p}, {_exact(reading.format(p, 0))} AS e{p}" for p in places
    )
    # LIMIT: a subquery SQLite cannot merge into the grouping above, so each reading is taken out once
    groups = f"SELECT {bucket} AS bucket, g.set_id AS set_id, g.hour AS hour{taken} FROM cost_line_groups AS g WHERE {within} LIMIT -1"
    summed = "".join(
        f", count(u{p}) AS uk{p}, count(e{p}) AS ek{p}, sum(u{p}) AS us{p}, sum(e{p}) AS es{p}"
        for p in places
    )
    per_set = (
        f"SELECT bucket, set_id, min(hour) AS first_hour, max(hour) AS last_hour, count(*) AS groups{summed} "
        f"FROM ({groups}) GROUP BY 1, 2"
    )

    def at_place(column: str) -> str:  # the set's sum of its term's place
        if not places:
            return "NULL"
        return "CASE m.pos " + " ".join(f"WHEN {p} THEN s.{column}{p}" for p in places) + " END"

    spread = (
        "SELECT s.bucket AS bucket, m.term_id AS term_id, min(s.first_hour) AS first_hour, "
        "max(s.last_hour) AS last_hour, sum(s.groups) AS lines, "
        f"coalesce(sum({at_place('uk')}), 0) AS u_known, coalesce(sum({at_place('ek')}), 0) AS e_known, "
        f"sum({at_place('us')}) AS u_sum, sum({at_place('es')}) AS e_sum "
        f"FROM ({per_set}) AS s JOIN cost_line_set_terms AS m ON m.set_id = s.set_id AND m.pos < {len(places)} "
        "GROUP BY 1, 2"
    )
    if widest <= len(places):
        return spread
    by_line = _line_by_line(
        bucket,
        "j.value ->> {}",
        "LEFT JOIN json_each(g.readings) AS j ON j.key = m.pos",
        within,
        f" AND m.pos >= {len(places)}",
    )
    return (
        "SELECT bucket, term_id, min(first_hour) AS first_hour, max(last_hour) AS last_hour, sum(lines) AS lines, "
        "sum(u_known) AS u_known, sum(e_known) AS e_known, sum(u_sum) AS u_sum, sum(e_sum) AS e_sum "
        f"FROM ({spread} UNION ALL {by_line}) GROUP BY 1, 2"
    )


def _read_range(engine: Engine, start: datetime, end: datetime) -> pd.DataFrame:
    """The range's lines summed per `RANGE_NAMES`, price version and whether they are priced, in one
    bucket at ``start``: the line groups counted per set of terms (no group's JSON read), the counts
    spread over the sets' terms, the terms' money summed per name. The previous month's comparison
    read the month as the report reads its own, per day and term with every reading: 3.7 s of the
    1,000-GPU report; 12 s as a row a term at 10,000 GPUs (791,155 rows), where it is a few thousand."""

    def total(column: str, scale: int) -> str:
        return f"CAST(sum(s.lines * {_scaled_sql(column, scale)}) AS BIGINT)"

    per_set = (
        "SELECT g.set_id AS set_id, min(g.hour) AS first_hour, max(g.hour) AS last_hour, count(*) AS groups "
        "FROM cost_line_groups AS g WHERE g.hour >= {mark} AND g.hour < {mark} GROUP BY g.set_id"
    )
    per_term = (
        "SELECT m.term_id AS term_id, min(p.first_hour) AS first_hour, max(p.last_hour) AS last_hour, "
        f"sum(p.groups) AS lines FROM ({per_set}) AS p "
        "JOIN cost_line_set_terms AS m ON m.set_id = p.set_id GROUP BY m.term_id"
    )
    first, last = _epoch(engine, "min(s.first_hour)"), _epoch(engine, "max(s.last_hour)")
    named = [f"t.{name}" if name in RANGE_NAMES else "''" for name in TEXT]
    zero = "CAST(0 AS BIGINT)"
    query = (
        f"SELECT {first}, {first}, {last}, CAST(sum(s.lines) AS BIGINT), {', '.join(named)}, t.price_version_id, "
        f"{total('t.quantity', QUANTITY_SCALE)}, "
        f"CASE WHEN count(t.amount) = 0 THEN NULL ELSE {total('t.amount', MONEY_SCALE)} END, "
        f"{total('t.held', QUANTITY_SCALE)}, {zero}, {zero}, CAST(0 AS DOUBLE PRECISION), "
        f"CAST(0 AS DOUBLE PRECISION), {zero}, {zero} "
        f"FROM ({per_term}) AS s JOIN cost_line_terms AS t ON t.id = s.term_id "
        f"GROUP BY {', '.join(f't.{name}' for name in RANGE_NAMES)}, t.price_version_id, t.amount IS NULL"
    )
    parts = _stream(engine, query, start, end, (), "gpumeter_range_sums")
    frame = _frame([_chunk(part, hours_as="epoch") for part in parts])
    return frame.assign(bucket=pd.Timestamp(start).as_unit("us"))


def _postgresql_line_sums(grain: str) -> str:
    """PostgreSQL's sums of the lines per (bucket, term), line by line (it groups by hashing, not
    sorting). Each line's reading is an element of its group's array: 2.0-2.6 times faster than
    `g.readings::json -> m.pos` per line on the 1,000-GPU month (4.0 against 8.1-10.3 s)."""
    return _line_by_line(
        "g.hour" if grain == "hour" else "date_trunc('day', g.hour)",
        "j.value ->> {}",
        "LEFT JOIN LATERAL (SELECT e.value FROM json_array_elements(g.readings::json) "
        "WITH ORDINALITY AS e(value, n) WHERE e.n = m.pos + 1) AS j ON true",
        "g.hour >= {mark} AND g.hour < {mark}",
    )


def _epoch(engine: Engine, column: str) -> str:
    """SQL for a stored hour as epoch seconds (an integer) in the engine's dialect."""
    if engine.dialect.name == "sqlite":
        return f"CAST(strftime('%s', {column}) AS INTEGER)"
    return f"CAST(extract(epoch FROM {column}) AS BIGINT)"


def _day_windows(
    start: datetime, end: datetime, most: int = 4, cores: int | None = None
) -> list[tuple[datetime, datetime]]:
    """[start, end) cut at UTC midnights into at most ``most`` windows (a bucket never straddles one),
    one a core but one: the report's fact scan (reports.splits) reads beside these sums on a core of its
    own. On two cores a second window made the 1,000-GPU month's sums 40 % dearer in CPU (10.7 against
    7.7 s) and `build_report` slower (13.5 against 11.2 s), the scan and the two windows sharing two
    cores."""
    return day_windows(start, end, min(most, (cores or usable_cpus()) - 1))


def _chunk(rows: Sequence[Any], *, hours_as: str) -> dict[str, Any]:
    """One chunk of row tuples (in COLUMNS order) as columns."""
    columns = list(zip(*rows, strict=True)) if rows else [()] * len(COLUMNS)
    out: dict[str, Any] = {}
    for name, values in zip(COLUMNS, columns, strict=True):
        if name in ("bucket", "first_hour", "last_hour"):
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
        elif name in (*SCALED, *EXACT, "lines"):
            out[name] = pd.array(values, dtype="int64")
        else:
            out[name] = pd.array([0.0 if v is None else v for v in values], dtype="float64")
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
    for name in ("bucket", "first_hour", "last_hour"):
        frame[name] = frame[name].astype("datetime64[us, UTC]")
    return frame


def gpu_bucket_rows(engine: Engine, start: datetime, end: datetime, step: int) -> Iterator[Sequence[Any]]:
    """The SQL ledger's GPU-hours of [start, end) summed by the database per bucket of ``step`` seconds
    (3600 or 86400, from the epoch: UTC hours or days) and GPU, a chunk of rows at a time in bucket
    order: (bucket as epoch seconds, cluster, uuid, the bucket's last non-empty hostname and GPU index,
    its presence in 10⁻⁶ GPU-hours, its distinct layout ids as "id,id,…" or None). Presence is each
    hour's present seconds (clamped to 0-3600) / 3600 to pricing's quantum 10⁻⁶, summed: s × 10⁶ / 3600
    = s × 2500 / 9 is never half-way between integers, so (s × 5000 + 9) div 18 rounds it as Decimal's
    quantize does. A month of 10,000 GPUs is 7.2 million GPU-hours but ~300,000 such rows."""
    epoch = _epoch(engine, "hour")
    # a value stamped with its hour before a unit separator, so that max() is the last hour's (SQLite's
    # hours are text of one width; PostgreSQL's as zero-padded epoch seconds)
    if engine.dialect.name == "sqlite":
        stamped = "hour || char(31) || {}"
        clamped = "max(0, min(present_seconds, 3600))"
        layouts = "group_concat(DISTINCT layout_id)"
    else:
        stamped = f"lpad(CAST({epoch} AS TEXT), 12, '0') || chr(31) || {{}}"
        clamped = "GREATEST(0, LEAST(present_seconds, 3600))"
        layouts = "string_agg(DISTINCT CAST(layout_id AS TEXT), ',')"
    query = (
        f"SELECT {epoch} / {step} * {step} AS bucket, cluster, uuid, "
        f"max(CASE WHEN hostname <> '' THEN {stamped.format('hostname')} END), "
        f"max(CASE WHEN gpu <> '' THEN {stamped.format('gpu')} END), "
        f"sum(({clamped} * 5000 + 9) / 18), {layouts} "
        "FROM gpu_hours WHERE hour >= {mark} AND hour < {mark} GROUP BY 1, 2, 3 ORDER BY 1"
    )
    for part in _stream(engine, query, start, end, (), "gpumeter_gpu_buckets"):
        yield [
            (bucket, cluster, uuid, _unstamped(host), _unstamped(gpu), present, ids)
            for bucket, cluster, uuid, host, gpu, present, ids in part
        ]


def _unstamped(value: str | None) -> str:
    return "" if value is None else value.partition("\x1f")[2]


def gpu_hour_rows(
    engine: Engine, start: datetime, end: datetime, layouts: Collection[int]
) -> Iterator[Sequence[Any]]:
    """The SQL ledger's GPU-hours of [start, end) holding one of ``layouts``, in one query, a chunk of
    rows at a time, in hour order: (hour as epoch seconds, cluster, uuid, hostname, gpu, present
    seconds, layout id, readings text or None). What those facts say without restoring each GPU-hour's
    objects: the driver's own rows (SQLAlchemy's Row for each cost a third as much again as the
    database's reading them)."""
    among: tuple[str, Any]
    if engine.dialect.name == "sqlite":  # one parameter for any number of ids
        among = ("IN (SELECT value FROM json_each({mark}))", json.dumps(sorted(layouts)))
    else:
        among = ("= ANY({mark})", sorted(layouts))
    query = (
        f"SELECT {_epoch(engine, 'hour')}, cluster, uuid, hostname, gpu, present_seconds, layout_id, "
        f"readings FROM gpu_hours WHERE hour >= {{mark}} AND hour < {{mark}} AND layout_id {among[0]} "
        "ORDER BY hour"
    )  # in hour order, which readers need, and within an hour in the primary key's (no sort on SQLite)
    yield from _stream(engine, query, start, end, (among[1],), "gpumeter_gpu_hours")


def _stream(
    engine: Engine, query: str, start: datetime, end: datetime, values: tuple, name: str
) -> Iterator[Sequence[Any]]:
    """The rows of a query over the ledger's hours [start, end) (``{mark}``: the driver's placeholder,
    the hours first, then ``values``), a chunk at a time through the driver's own cursor. (Every hour
    column is a `UtcDateTime`: gpu_hours' converts the bounds for each.)"""
    from gpumeter.billing.ledger.orm import GpuHourRow

    dialect = engine.dialect
    mark = "?" if dialect.paramstyle == "qmark" else "%s"
    to_driver = GpuHourRow.__table__.c.hour.type.dialect_impl(dialect).bind_processor(dialect)
    hours = (start, end) if to_driver is None else (to_driver(start), to_driver(end))
    with engine.connect() as conn:
        raw: Any = conn.connection.driver_connection
        # PostgreSQL: a named (server-side) cursor, so the rows arrive a chunk at a time
        cursor = raw.cursor() if dialect.name == "sqlite" else raw.cursor(name=name)
        try:
            cursor.execute(query.replace("{mark}", mark), (*hours, *values))
            while part := cursor.fetchmany(CHUNK):
                yield part
        finally:
            cursor.close()
