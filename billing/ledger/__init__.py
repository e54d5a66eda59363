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


def reopen_target(ledger: Ledger) -> tuple[str, str | None] | None:
    """What another process opens this ledger's database with, (its URL as given, a password in it
    included; its PostgreSQL schema), for `open_ledger`; None where no other process can: the memory
    ledger, and a SQLite database in memory."""
    engine = getattr(ledger, "engine", None)
    if engine is None:
        return None
    url = engine.url
    if url.get_backend_name() == "sqlite":
        database = url.database or ""
        if database in ("", ":memory:") or "mode=memory" in database or url.query.get("mode") == "memory":
            return None
        return url.render_as_string(hide_password=False), None
    schema = None
    if engine.dialect.name == "postgresql":
        # the schema the ledger's search path names, which SQLAlchemy learns at the first connection
        if engine.dialect.default_schema_name is None:
            with engine.connect():
                pass
        schema = engine.dialect.default_schema_name
    return url.render_as_string(hide_password=False), schema
