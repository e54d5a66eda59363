"""The billing ledger: the interface (`base`), and its implementations chosen by URL.

`open_ledger` is the one way in: ``memory://`` gives the in-memory ledger (`memory`, for fast tests),
any SQLAlchemy URL the SQL ledger (`sqlalchemy`: SQLite by default, PostgreSQL in production).
Callers depend on `Ledger`; the concrete SQL ledger is imported only here and by the composition root.
"""

from __future__ import annotations

from gpumeter.billing.ledger.base import Ledger as Ledger
from gpumeter.billing.ledger.base import LockNotAcquired as LockNotAcquired

MEMORY_URL = "memory://"
DEFAULT_URL = "sqlite:///gpumeter-billing.db"  # beside the working directory, for trying it out


def open_ledger(url: str, *, schema: str | None = None, migrate: bool = True) -> Ledger:
    """The ledger at ``url``; the SQL implementation is imported only when asked for (SQLAlchemy
    and Alembic cost the exporter's process nothing)."""
    if url == MEMORY_URL:
        from gpumeter.billing.ledger.memory import MemoryLedger

        return MemoryLedger()
    from gpumeter.billing.ledger import sqlalchemy

    return sqlalchemy.open_ledger(url, schema=schema, migrate=migrate)
