"""A cost line's term: what it charges apart from its hour and the hour's readings (the GPU, who or
what, quantity, amount, price version), stored once in `cost_line_terms` and named by every hour's
line that charges it (migration 0009, docs/billing.md §6.3).

A term is content-addressed: its digest is the SHA-256 of its canonical text, with each exact value
at the scale its column stores (so a value read back from NUMERIC(20, 4) names the term it was
written as), and two writers storing the same term at once store it once.
"""

from __future__ import annotations

import hashlib
import operator
from decimal import Decimal

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
)
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
    """The term's content address: every column of COLUMNS (enums as their values)."""
    text = "\x1f".join(_text(name, getattr(term[name], "value", term[name])) for name in COLUMNS)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


# the view `cost_lines` (billing/ledger/orm.py COST_LINES): the two tables joined, the Line record's
# fields per line and hour, as the table of that name was up to revision 0008
VIEW = (
    "CREATE VIEW cost_lines AS SELECT h.hour, h.seq, h.line_key, h.term_id, "
    + ", ".join(f"t.{name}" for name in COLUMNS[1:])
    + ", h.efficiency, h.utilization "
    "FROM cost_line_hours AS h JOIN cost_line_terms AS t ON t.id = h.term_id"
)
