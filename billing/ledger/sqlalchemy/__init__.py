"""The ledger on SQLAlchemy 2: SQLite file by default, PostgreSQL by URL. Schema by Alembic.

One class per part of the `Ledger` interface, each in its own module over the shared engine
(`store`): what ingest writes (`writes`, building an hour's rows in `rows`), what reports read
(`reads`) and what the service keeps (`service`); the schema's migrations are in `schema`.
`SqlLedger` is all of them over one engine, and `open_ledger` opens one.
"""

from __future__ import annotations

from sqlalchemy.exc import SQLAlchemyError

from gpumeter.billing.ledger.base import Ledger, LedgerError
from gpumeter.billing.ledger.sqlalchemy.reads import SqlReads
from gpumeter.billing.ledger.sqlalchemy.rows import SQLITE_ROWS as SQLITE_ROWS
from gpumeter.billing.ledger.sqlalchemy.schema import MIGRATIONS as MIGRATIONS
from gpumeter.billing.ledger.sqlalchemy.schema import create_table as create_table
from gpumeter.billing.ledger.sqlalchemy.schema import upgrade as upgrade
from gpumeter.billing.ledger.sqlalchemy.service import SqlService
from gpumeter.billing.ledger.sqlalchemy.store import RETRY_DELAYS as RETRY_DELAYS
from gpumeter.billing.ledger.sqlalchemy.store import _shown
from gpumeter.billing.ledger.sqlalchemy.store import make_engine as make_engine
from gpumeter.billing.ledger.sqlalchemy.store import one_line as one_line
from gpumeter.billing.ledger.sqlalchemy.store import permanent as permanent
from gpumeter.billing.ledger.sqlalchemy.writes import SqlWrites
from gpumeter.billing.secrets import redact_url


class SqlLedger(SqlWrites, SqlReads, SqlService, Ledger):
    """The whole ledger on one engine: each part's methods from its own class."""


def open_ledger(url: str, *, schema: str | None = None, migrate: bool = True) -> SqlLedger:
    """The SQL ledger at ``url``, migrated to head; LedgerError (one line) when it cannot be opened."""
    try:
        engine = make_engine(url, schema=schema)
    except (SQLAlchemyError, ImportError, ValueError) as exc:
        raise LedgerError(f"{redact_url(url)}: not a usable database URL: {one_line(exc)}") from exc
    try:
        if migrate:
            upgrade(engine)
    except SQLAlchemyError as exc:
        engine.dispose()
        name = _shown(engine)
        raise LedgerError(f"{name}: cannot open the ledger: {one_line(exc)}") from exc
    return SqlLedger(engine)
