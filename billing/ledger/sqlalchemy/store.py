"""What every part of the SQL ledger shares: the engine, its errors (retried or told in one line),
the advisory-lock keys, and `SqlStore`, the base each part's class builds on."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from datetime import datetime

from sqlalchemy import Engine, create_engine, make_url, text
from sqlalchemy.exc import DBAPIError, OperationalError, SQLAlchemyError

from gpumeter.billing.ledger.base import LedgerError, LedgerStore
from gpumeter.billing.secrets import redact_url

log = logging.getLogger(__name__)

# Seconds between tries of a ledger operation that lost its connection (a PostgreSQL restart or
# failover takes a few seconds; a transaction that fails is rolled back whole, so a retry is safe).
RETRY_DELAYS = (1.0, 2.0, 4.0, 8.0)
LAYOUTS_KEPT = 50_000  # layouts a ledger remembers, ids and parsed bodies (~1,400 a month on 1,000 GPUs)


def make_engine(url: str, *, schema: str | None = None) -> Engine:
    kwargs: dict = {}
    if url.startswith("sqlite"):
        # timeout: seconds a writer waits for another (ingest workers, the service) to commit
        kwargs["connect_args"] = {"check_same_thread": False, "timeout": 60}
    else:
        kwargs["pool_pre_ping"] = True  # a pooled connection the server dropped is replaced, not used
        # Custom plans only: psycopg prepares a statement on its fifth run, and PostgreSQL then keeps a
        # generic plan made when the ledger was empty. The term look-up (`digest IN (500 values)`) kept a
        # sequential scan that compared each row with each value as the table grew: 0.3 s a query, 52 of
        # the first two hours' 78 s at 10,000 GPUs (docs/performance.md, issue 17, ninth pass).
        given = make_url(url).query.get("options", ())  # a tuple when the URL repeats it
        options = [*((given,) if isinstance(given, str) else given), "-cplan_cache_mode=force_custom_plan"]
        if schema:
            options.append(f"-csearch_path={schema}")
        kwargs["connect_args"] = {"options": " ".join(o for o in options if o)}
    return create_engine(url, **kwargs)


def one_line(exc: BaseException) -> str:
    """The driver's own message, first line only (SQLAlchemy adds the statement and a link)."""
    cause = getattr(exc, "orig", None) or exc
    lines = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {lines[0] if lines else ''}".rstrip(": ")


# Errors no retry cures, though drivers class them "operational" with lost connections (issue 42: a
# read-only ledger was retried 15 s): SQLite's result codes SQLITE_READONLY and SQLITE_FULL
# (sqlite.org/rescode.html, the primary code is the low byte), PostgreSQL's SQLSTATEs disk_full and
# read_only_sql_transaction (postgresql.org/docs/current/errcodes-appendix.html).
_PERMANENT_SQLITE_CODES = {8, 13}
_PERMANENT_SQLSTATES = {"53100", "25006"}


def permanent(exc: BaseException) -> bool:
    """The database refuses every write until someone acts: read-only, or its disk is full."""
    cause = getattr(exc, "orig", None) or exc
    code = getattr(cause, "sqlite_errorcode", None)
    if code is not None and code & 0xFF in _PERMANENT_SQLITE_CODES:
        return True
    return getattr(cause, "sqlstate", None) in _PERMANENT_SQLSTATES


def _transient(exc: Exception, dbapi) -> bool:
    """Lost or refused connections, server shutdowns, deadlocks and lock timeouts: worth another try.
    (COPY runs on the driver's own connection, so its errors come unwrapped, as the driver's.)"""
    if permanent(exc):
        return False
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    return isinstance(exc, OperationalError | getattr(dbapi, "OperationalError", OperationalError))


def _stored(what: str):
    """Run a SqlLedger method, retrying transient database errors (RETRY_DELAYS); any other error,
    or one that outlasts the retries, becomes a one-line LedgerError naming the store."""

    def wrap(method):
        @functools.wraps(method)
        def run(self, *args, **kwargs):
            delays = iter(self.retry_delays)
            dbapi = self.engine.dialect.dbapi
            errors = (SQLAlchemyError, getattr(dbapi, "Error", SQLAlchemyError))
            while True:
                try:
                    return method(self, *args, **kwargs)
                except errors as exc:
                    delay = next(delays, None) if _transient(exc, dbapi) else None
                    if delay is None:
                        raise LedgerError(f"{self.name}: {what}: {one_line(exc)}") from exc
                    log.warning("%s: %s: %s; retrying in %gs", self.name, what, one_line(exc), delay)
                    self.sleep(delay)

        return run

    return wrap


# "gpm" and -1: keeps the migrations' advisory lock apart from others'. It is the database's: the
# schema a migration creates may not exist yet to name.
_MIGRATION_LOCK_KEY = 0x6770_6D00_0000_0000 - 1

# The other locks are one ledger's, not its database's: two ledgers in one PostgreSQL (a schema each,
# as two clusters' are) never wait on each other's hours or re-prices (2026-12-06: a re-price in one
# schema held another schema's ingest). Two 32-bit keys: the ledger, named by the search_path its
# engine sets (`make_engine`) through md5, then the hour's number since 1970, or SERIAL_LOCK.
LEDGER_LOCK = "('x' || substr(md5(current_setting('search_path')), 1, 8))::bit(32)::int"
SERIAL_LOCK = -1  # ingests (shared) against a re-price (exclusive): `serialised`


def _hour_lock_key(hour: datetime) -> int:
    """The second key of one UTC hour's writer lock (the first is the ledger's, LEDGER_LOCK)."""
    return int(hour.timestamp()) // 3600


def _shown(engine: Engine) -> str:
    """The database's URL as shown: no password, in its user info or its query (``?password=``)."""
    return redact_url(engine.url.render_as_string(hide_password=True))


class SqlStore(LedgerStore):
    """The engine and how an operation on it is retried (`_stored`): each part of the SQL ledger
    (writes, reads, service) is one of these, and `SqlLedger` is all of them over one engine."""

    def __init__(
        self,
        engine: Engine,
        *,
        retry_delays: tuple[float, ...] = RETRY_DELAYS,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.engine = engine
        self.name = _shown(engine)
        self.retry_delays, self.sleep = retry_delays, sleep

    def ping(self) -> None:
        with self.engine.connect() as conn:
            conn.execute(text("SELECT 1"))

    def close(self) -> None:
        self.engine.dispose()
