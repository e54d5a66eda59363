"""A ledger holding billing's worked examples (docs/billing.md §8) for November 2026, plus one hour of
October, on SQLite and on the real PostgreSQL server (the billing suite's backends; never skipped).

Built once per session and backend (720 hours of example (c)); tests only read it, apart from
the report runs they record.
"""

from __future__ import annotations

import contextlib
import fcntl
import shutil
import uuid as uuidlib
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import psycopg
import pytest

from gpumeter.billing.allocate import price_gpu_hour
from gpumeter.billing.ledger import MEMORY_URL, open_ledger
from gpumeter.billing.ledger.base import HourRecord
from gpumeter.billing.models import Allocation
from gpumeter.billing.pricing import load_price_book
from tests.billing.conftest import PG_DSN, PG_URL
from tests.billing.conftest import db as db  # re-exported fixtures: the same backends as billing
from tests.billing.conftest import ledger as ledger
from tests.billing.conftest import pg_schema as pg_schema
from tests.billing.conftest import sql_ledger as sql_ledger
from tests.billing.factories import A100, H100, alloc, gpu_hour, mig, write_book
from tests.support import needs

NOV = datetime(2026, 11, 1, tzinfo=UTC)
OCT_HOUR = datetime(2026, 10, 15, 12, tzinfo=UTC)
TEAMS = {
    "team-a": "alpha",
    "ns-a": "alpha",
    "team-b": "beta",
    "inference": "beta",
    "ns-b": "beta",
    "research": "gamma",
}
BOOK = {
    "currency": "USD",
    "versions": [
        {
            "effective_from": "2026-01-01T00:00:00Z",
            "source": "v1",
            "sharing_efficiency": {"time_slicing": "0.75"},
            "utilization_tiers": [
                {"range": [0, 0.3], "efficiency": 0.5},
                {"range": [0.3, 0.7], "efficiency": 0.8},
                {"range": [0.7, 1.0], "efficiency": 1.0},
            ],
            "gpus": {"A100-40GB": {"hourly_rate": "3.00"}, "H100-80GB": {"hourly_rate": "6.88"}},
        },
        {
            "effective_from": "2026-11-16T00:00:00Z",
            "source": "v2",
            "sharing_efficiency": {"time_slicing": "0.75"},
            "utilization_tiers": [
                {"range": [0, 0.3], "efficiency": 0.5},
                {"range": [0.3, 0.7], "efficiency": 0.8},
                {"range": [0.7, 1.0], "efficiency": 1.0},
            ],
            "gpus": {"A100-40GB": {"hourly_rate": "3.00"}, "H100-80GB": {"hourly_rate": "4.90"}},
        },
    ],
}


def _util(allocation: Allocation, value: str) -> Allocation:
    return Allocation(**{**allocation.__dict__, "utilization": Decimal(value)})


def example_hours(names: dict[str, str] | None = None) -> dict[datetime, list]:
    """GPU-hours of examples (a), (b), (d) and an unpriced VR200 at Nov 1 00:00, (c) all November,
    and (a)'s layout held by team-a alone in October. ``names`` renames namespaces/pods."""
    n = names or {}

    def ns(name: str) -> str:
        return n.get(name, name)

    hours: dict[datetime, list] = {}
    a = "GPU-a"
    hours[NOV] = [
        gpu_hour(
            a,
            A100,
            [mig(a, "1", "3g.20gb"), mig(a, "5", "2g.10gb"), mig(a, "13", "1g.5gb"), mig(a, "14", "1g.5gb")],
            [
                _util(alloc(a, ns("team-a"), n.get("a-0", "a-0"), gi="1", profile="3g.20gb"), "0.2"),
                _util(alloc(a, ns("team-b"), "b-0", gi="5", profile="2g.10gb"), "0.6"),
                _util(alloc(a, ns("team-b"), "b-1", gi="13", profile="1g.5gb"), "0.9"),
            ],
            hour=NOV,
        ),
        gpu_hour(
            "GPU-h",
            H100,
            allocations=[
                alloc("GPU-h", ns("inference"), "p1", share="0.25"),
                alloc("GPU-h", ns("inference"), "p2", share="0.25"),
                alloc("GPU-h", ns("inference"), "p3", share="0.25"),
                alloc("GPU-h", ns("inference"), "p4", seconds=1800, share="0.25"),
            ],
            hour=NOV,
        ),
        gpu_hour(
            "GPU-d",
            A100,
            [mig("GPU-d", "1", "3g.20gb"), mig("GPU-d", "2", "3g.20gb")],
            [
                alloc("GPU-d", ns("ns-b"), "b", gi="2", profile="3g.20gb"),
                alloc("GPU-d", ns("ns-a"), "a", gi="1", profile="3g.20gb"),
            ],
            hour=NOV,
        ),
        gpu_hour("GPU-u", "NVIDIA VR200", allocations=[alloc("GPU-u", ns("inference"), "big")], hour=NOV),
    ]
    for i in range(720):
        hour = NOV + timedelta(hours=i)
        held = [alloc("GPU-c", ns("research"), "trainer")] if i < 480 else []
        hours.setdefault(hour, []).append(gpu_hour("GPU-c", H100, allocations=held, hour=hour))
    hours[OCT_HOUR] = [
        gpu_hour(
            a,
            A100,
            [mig(a, "1", "3g.20gb"), mig(a, "5", "2g.10gb"), mig(a, "13", "1g.5gb"), mig(a, "14", "1g.5gb")],
            [alloc(a, ns("team-a"), n.get("a-0", "a-0"), gi="1", profile="3g.20gb")],
            hour=OCT_HOUR,
        )
    ]
    return hours


def fill(ledger, book, names: dict[str, str] | None = None) -> None:
    teams = {(names or {}).get(k, k): v for k, v in TEAMS.items()}
    for hour, gpu_hours in sorted(example_hours(names).items()):
        lines = [line for gh in gpu_hours for line in price_gpu_hour(gh, book, teams).lines]
        ledger.write_hour(HourRecord(hour, gpu_hours, lines, book), source="worked-examples")


@contextlib.contextmanager
def _shared_by_the_run(request, tmp_path_factory):
    """A folder of this test run shared by its xdist workers, held under a lock (what one worker
    builds there the others re-use: the folder of each worker's own temporary files sits inside it)."""
    base = tmp_path_factory.getbasetemp()
    run = base if request.getfixturevalue("worker_id") == "master" else base.parent
    with open(run / "shared.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield run


@pytest.fixture(scope="session")
def worked_book(request, tmp_path_factory):
    # one file for every worker: the ledger built once (_sqlite_copy) records the book's path
    with _shared_by_the_run(request, tmp_path_factory) as run:
        path = run / "worked-book" / "prices.yaml"
        if not path.exists():
            path.parent.mkdir()
            write_book(path.parent, BOOK)
    return load_price_book(path)


def _sqlite_copy(request, tmp_path_factory, worked_book) -> Path:
    """A fresh copy of the worked-example ledger on SQLite. The filled file is built once per test run
    and shared by the xdist workers, under a lock: each fill is 720 hour writes, 3 s of CPU, which every
    worker paid for each fixture that wanted one."""
    with _shared_by_the_run(request, tmp_path_factory) as run:
        template = run / "worked-ledger.db"
        if not template.exists():
            building = run / "worked-ledger.building.db"
            ledger = open_ledger(f"sqlite:///{building}")
            try:
                fill(ledger, worked_book)
            finally:
                ledger.close()
            building.rename(template)
    copy = tmp_path_factory.mktemp("ledger") / "ledger.db"
    shutil.copyfile(template, copy)
    return copy


def _worked(request, tmp_path_factory, worked_book):
    if request.param == "memory":
        ledger = open_ledger(MEMORY_URL)
        admin = schema = None
    elif request.param == "sqlite":
        ledger = open_ledger(f"sqlite:///{_sqlite_copy(request, tmp_path_factory, worked_book)}")
        admin = schema = None
    else:
        needs.require("postgres")
        try:
            admin = psycopg.connect(PG_DSN, autocommit=True, connect_timeout=5)
        except psycopg.OperationalError as exc:
            pytest.fail(
                f"PostgreSQL at 127.0.0.1:5432 (database test) is not reachable: {exc}", pytrace=False
            )
        schema = f"reports_test_{uuidlib.uuid4().hex[:12]}"
        admin.execute(f'CREATE SCHEMA "{schema}"')
        ledger = open_ledger(PG_URL, schema=schema)
    try:
        if request.param != "sqlite":  # the SQLite copy is filled already
            fill(ledger, worked_book)
        yield ledger
    finally:
        ledger.close()
        if admin is not None:
            admin.execute(f'DROP SCHEMA "{schema}" CASCADE')
            admin.close()


@pytest.fixture(
    scope="session", params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def worked_ledger(request, tmp_path_factory, worked_book):
    """The worked-example ledger on every ledger implementation (session scope: built once)."""
    yield from _worked(request, tmp_path_factory, worked_book)


@pytest.fixture(scope="session", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def worked_sql_ledger(request, tmp_path_factory, worked_book):
    """The worked-example ledger in a database, for the command line and the scheduled job."""
    yield from _worked(request, tmp_path_factory, worked_book)
