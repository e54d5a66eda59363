"""A cost line's term: what it charges apart from its hour and the hour's readings (the GPU, who or
what, quantity, amount, price version), stored once in `cost_line_terms` and named by every hour's
line that charges it (migration 0009, docs/billing.md §6.3). The terms of one GPU-hour's lines form
a set, stored once too and named by each hour's line group with that hour's readings (migration 0010).

A term is content-addressed: its digest is the SHA-256 of its canonical text, with each exact value
at the scale its column stores (so a value read back from NUMERIC(20, 4) names the term it was
written as), and two writers storing the same term at once store it once.
"""

from __future__ import annotations

import hashlib
import operator
from decimal import Decimal
from itertools import repeat
from operator import is_not

import orjson

# the stored columns of a term, in the order of its canonical text
COLUMNS = (
    "line_key",
    "uuid",
    "kind",
    "namespace",
    "team",
    "pod",
    "container",
    "gpu_instance_id",
    "mig_profile",
    "model",
    "quantity",
    "amount",
    "currency",
    "price_version_id",
    "held",
    "held_unit",
    "cluster",  # revision 0012: NULL for a line of a store without a cluster label
)
# the columns up to revision 0011, before lines had a cluster (the migrations before 0012 use them)
COLUMNS_0011 = COLUMNS[:-1]
# a Line's fields that make its term (the price version: its id, whose row the ledger names)
LINE_FIELDS = tuple("price_version" if name == "price_version_id" else name for name in COLUMNS[1:])
of_line = operator.attrgetter(*LINE_FIELDS)

# the scale of each exact column (billing/ledger/orm.py: Exact(18, 6), Money() = Exact(20, 4))
_SCALES = {"quantity": Decimal("1e-6"), "amount": Decimal("1e-4"), "held": Decimal("1e-6")}


def _text(name: str, value: object) -> str:
    if value is None:
        return "\x00"
    scale = _SCALES.get(name)
    if scale is not None:
        return format(Decimal(str(value)).quantize(scale), "f")
    return str(value)


def digest(term: dict[str, object]) -> str:
    """The term's content address: every column of COLUMNS (enums as their values). A term without
    a cluster has the address it had before terms had one, so a ledger's terms stay the same terms."""
    text = "\x1f".join(_text(name, getattr(term[name], "value", term[name])) for name in COLUMNS_0011)
    cluster = term.get("cluster")
    if cluster:
        text += f"\x1f{cluster}"
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def set_digest(term_ids: tuple[int, ...]) -> str:
    """A set of terms' content address (`cost_line_sets`): its term ids, in order."""
    return hashlib.sha256(",".join(map(str, term_ids)).encode()).hexdigest()


def readings_text(efficiencies: list[Decimal | None], utilizations: list[Decimal | None]) -> str | None:
    """A line group's readings as `cost_line_groups.readings` stores them: per line, [efficiency,
    utilization], each the exact decimal's text in a JSON string (so no float ever carries it) or
    null; None when every line has neither. The `cost_lines` view reads them back by the line's
    place in its set. (orjson writes a Decimal through its ``__str__``: 2 µs a GPU-hour's group, against 8
    for the same text joined in Python, ~1,000 groups an hour on the 1,000-GPU bench; anything but a
    Decimal or None is refused, not written as whatever its text is.)"""
    # by identity: comparing a Decimal with None asks numbers' ABCs (~0.6 µs a value)
    if not any(map(is_not, efficiencies, repeat(None))) and not any(map(is_not, utilizations, repeat(None))):
        return None
    return orjson.dumps(list(zip(efficiencies, utilizations, strict=True)), default=Decimal.__str__).decode()


def view(dialect: str, columns: tuple[str, ...] = COLUMNS) -> str:
    """The view `cost_lines` (billing/ledger/orm.py COST_LINES) since revision 0010 (``columns``: the
    terms' columns at the revision creating it; COLUMNS_0011 before 0012 added the cluster): each line group's
    set of terms expanded, the Line record's fields per line and hour, as the table of that name was
    up to revision 0008. A line's place in its hour is its group's first place plus its own in the set;
    its readings are taken out of the group's JSON by that place (as exact decimals on PostgreSQL, as
    their text on SQLite, like the columns of `billing.ledger.types.Exact`)."""
    if dialect == "postgresql":
        reading = "CAST(g.readings::json -> m.pos ->> {} AS NUMERIC(12, 9))"
    else:
        reading = "json_extract(g.readings, '$[' || m.pos || '][{}]')"
    return (
        "CREATE VIEW cost_lines AS SELECT g.hour, g.seq + m.pos AS seq, t.line_key, m.term_id, "
        + ", ".join(f"t.{name}" for name in columns[1:])
        + f", {reading.format(0)} AS efficiency, {reading.format(1)} AS utilization "
        "FROM cost_line_groups AS g JOIN cost_line_set_terms AS m ON m.set_id = g.set_id "
        "JOIN cost_line_terms AS t ON t.id = m.term_id"
    )
