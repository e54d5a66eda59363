"""The ledger's schema: Alembic's migrations, run under a lock so two processes opening one empty
database do not both create it."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from importlib.resources import files
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, Engine, Table, text
from sqlalchemy.exc import OperationalError

from gpumeter.billing.ledger.sqlalchemy.store import _MIGRATION_LOCK_KEY, permanent

MIGRATIONS = Path(str(files("gpumeter.billing") / "migrations"))  # package data: alembic needs a folder


@contextlib.contextmanager
def _schema_change(engine: Engine) -> Iterator[Connection]:
    """A transaction that holds the database's schema lock: two processes changing one empty
    database at once would both create the tables; the second waits here and then finds them."""
    with engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            # PostgreSQL's DDL is transactional: the second finds the schema the first committed
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK_KEY})
        elif connection.dialect.name == "sqlite":
            # the same on SQLite: the file's write lock, taken before anything reads the schema, so
            # the second process waits (the busy timeout). pysqlite would begin only at the first
            # write, after both had read "no version" (issue 42)
            try:
                connection.exec_driver_sql("BEGIN IMMEDIATE")
            except OperationalError as exc:
                if not permanent(exc):
                    raise
                # a read-only ledger (reports, audits): readable if at head; a change it needs fails
        yield connection


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Run the Alembic migrations programmatically on ``engine``."""
    migration_log = logging.getLogger("alembic")
    if migration_log.level == logging.NOTSET:  # "Context impl SQLiteImpl.", "setup plugin ..." are noise
        migration_log.setLevel(logging.WARNING)
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with _schema_change(engine) as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, revision)


def create_table(engine: Engine, table: Table) -> None:
    """Create ``table`` unless it exists, under the same lock as the migrations. For a library's own
    table kept in the ledger's database (APScheduler's job store), whose create-if-missing two
    replicas starting on an empty database would race ("table apscheduler_jobs already exists")."""
    with _schema_change(engine) as connection:
        table.create(connection, checkfirst=True)
