"""Backend-parametrised ledger fixture: the same tests run on SQLite and on the real PostgreSQL
server (127.0.0.1:5432, trust auth, user postgres, database test), each run in a fresh schema that is
dropped afterwards. A PostgreSQL server that does not answer fails the test loudly; it never skips."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from gpumeter.billing.ledger.sqlalchemy import open_ledger
from tests.support import needs

PG_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=test"
PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


@pytest.fixture
def pg_schema():
    needs.require("postgres")
    try:
        admin = psycopg.connect(PG_DSN, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        pytest.fail(f"PostgreSQL at 127.0.0.1:5432 (database test) is not reachable: {exc}", pytrace=False)
    schema = f"billing_test_{uuid.uuid4().hex[:12]}"
    admin.execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield schema
    finally:
        admin.execute(f'DROP SCHEMA "{schema}" CASCADE')
        admin.close()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db(request, tmp_path):
    """(url, schema) of an empty database on each backend."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'ledger.db'}", None
    return PG_URL, request.getfixturevalue("pg_schema")


@pytest.fixture
def ledger(db):
    url, schema = db
    ledger = open_ledger(url, schema=schema)
    yield ledger
    assert ledger.engine.pool.checkedout() == 0, "connection leak"
    ledger.close()
