"""Backend-parametrised ledger fixtures, APScheduler's pattern: the same tests run on every
implementation of the ledger interface.

``ledger``: the in-memory ledger, SQLite, and the real PostgreSQL server (127.0.0.1:5432, trust auth,
user postgres, database test) in a fresh schema dropped afterwards. ``sql_ledger``: the SQL backends
only, for tests that hand a database URL to another process or inspect tables. A PostgreSQL server
that does not answer fails the test loudly; it never skips."""

from __future__ import annotations

import contextlib
import subprocess
import uuid
from pathlib import Path

import psycopg
import pytest

from gpumeter.billing.ledger import MEMORY_URL, open_ledger
from tests.support import needs
from tests.support.servers import PrometheusServer, VictoriaMetricsServer, require_binary

PG_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=test"
PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def fresh_pg_schema(request, prefix: str = "billing_test") -> str:
    """A new, empty PostgreSQL schema, dropped when the test ends."""
    needs.require("postgres")
    schema = f"{prefix}_{uuid.uuid4().hex[:12]}"
    try:
        with psycopg.connect(PG_DSN, autocommit=True, connect_timeout=5) as admin:
            admin.execute(f'CREATE SCHEMA "{schema}"')
    except psycopg.OperationalError as exc:
        pytest.fail(f"PostgreSQL at 127.0.0.1:5432 (database test) is not reachable: {exc}", pytrace=False)

    def drop():
        with psycopg.connect(PG_DSN, autocommit=True) as admin:
            admin.execute(f'DROP SCHEMA "{schema}" CASCADE')

    request.addfinalizer(drop)
    return schema


@pytest.fixture
def pg_schema(request):
    return fresh_pg_schema(request)


SQL_BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


def _database(request, tmp_path, backend: str) -> tuple[str, str | None]:
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'ledger.db'}", None
    return PG_URL, request.getfixturevalue("pg_schema")


@pytest.fixture(params=SQL_BACKENDS)
def db(request, tmp_path):
    """(url, schema) of an empty database on each SQL backend."""
    return _database(request, tmp_path, request.param)


def _opened(url: str, schema: str | None):
    ledger = open_ledger(url, schema=schema)
    yield ledger
    if url != MEMORY_URL:
        assert ledger.engine.pool.checkedout() == 0, "connection leak"
    ledger.close()


@pytest.fixture
def sql_ledger(db):
    yield from _opened(*db)


@pytest.fixture(params=["memory", *SQL_BACKENDS])
def ledger(request, tmp_path):
    """Every implementation of the ledger interface: in memory, SQLite and PostgreSQL."""
    if request.param == "memory":
        yield from _opened(MEMORY_URL, None)
    else:
        yield from _opened(*_database(request, tmp_path, request.param))


# Query backends, the same pattern: a module's history fixture takes one of these params and serves
# the same OpenMetrics history from each engine; billing's ledger must not depend on which.
QUERY_BACKENDS = ["prometheus", pytest.param("victoriametrics", marks=pytest.mark.victoriametrics)]


@contextlib.contextmanager
def prometheus_holding(openmetrics: str, root: Path):
    """A real Prometheus with the OpenMetrics text backfilled by promtool, stopped on leaving."""
    source = root / "history.om"
    source.write_text(openmetrics)
    server = serve_history("prometheus", source, root)
    source.unlink()
    try:
        yield server
    finally:
        server.stop()


def serve_history(backend: str, source: Path, root: Path):
    """A started server holding the OpenMetrics history in ``source``: a real Prometheus with the
    history backfilled by promtool, or a real VictoriaMetrics with it posted to its import API."""
    if backend == "prometheus":
        data = root / "data"
        subprocess.run(
            [
                require_binary("promtool"),
                "tsdb",
                "create-blocks-from",
                "openmetrics",
                "--max-block-duration=768h",  # one pass over the file, not one per 2 h block
                str(source),
                str(data),
            ],
            check=True,
            capture_output=True,
        )
        return PrometheusServer(root / "prom", data_dir=data).start()
    server = VictoriaMetricsServer(root / "vm").start()
    try:
        with source.open() as lines:
            server.import_openmetrics(lines)
    except Exception:
        server.stop()
        raise
    return server
