"""Column types shared by the ORM and the migrations.

* `Money`/`Exact`: NUMERIC on PostgreSQL. SQLite has no exact decimal type (NUMERIC has float
  affinity, and SQLAlchemy warns about it), so there the value is stored as its exact decimal text.
  Either way Python sees `decimal.Decimal`.
* `UtcDateTime`: stored as naive UTC on every backend, returned timezone-aware (UTC).
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

from sqlalchemy import DateTime, Numeric, String
from sqlalchemy.types import TypeDecorator


class Exact(TypeDecorator):
    impl = Numeric
    cache_ok = True

    def __init__(self, precision: int = 24, scale: int = 9):
        super().__init__()
        self.precision, self.scale = precision, scale

    def load_dialect_impl(self, dialect):
        if dialect.name == "sqlite":
            return dialect.type_descriptor(String(48))
        return dialect.type_descriptor(Numeric(self.precision, self.scale, asdecimal=True))

    def process_bind_param(self, value, dialect):
        if value is None:
            return None
        value = Decimal(value)
        return str(value) if dialect.name == "sqlite" else value

    def process_result_value(self, value, dialect):
        return None if value is None else Decimal(value)


# the places a ledger line's figures are stored to: readers of its columns scale integers by them
QUANTITY_PLACES = 6  # Exact(18, 6): a line's quantity and held
MONEY_PLACES = 4  # Money(): amounts
RATIO_PLACES = 9  # Exact(12, 9): a line's utilization and efficiency


def Money() -> Exact:
    return Exact(20, MONEY_PLACES)


class UtcDateTime(TypeDecorator):
    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect):
        if value is None:
            return None
        if value.tzinfo is not None:
            value = value.astimezone(UTC).replace(tzinfo=None)
        return value

    def process_result_value(self, value: datetime | None, dialect):
        return None if value is None else value.replace(tzinfo=UTC)
