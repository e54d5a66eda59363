"""Ingest, re-price and report when the database misbehaves (issue 13, point 4).

A real Prometheus holds three hours of one H100 held whole by one pod, every name 300+ characters
long; a real PostgreSQL (and SQLite) holds the ledger. Before the ledger caught database errors
(d61e7e3's parent), names were String(255): on PostgreSQL the long names failed their hour with a
chained traceback and nothing in ``ingest_runs``; a connection the server dropped mid-write ended
the ingest with a traceback; an unreachable database was a traceback in every command.

By hand: H100-80GB at $6.88 an hour, the pod holds the GPU every scrape of each hour, so each hour
bills $6.88 to its namespace and three hours $20.64.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import psycopg
import pytest

from gpumeter import contract
from gpumeter.billing.ingest import IngestConfig, ingest_hours
from gpumeter.billing.ledger import open_ledger
from gpumeter.billing.ledger.sqlalchemy import SqlLedger
from gpumeter.billing.pricing import load_price_book
from gpumeter.billing.prom import PrometheusClient
from tests.billing.conftest import PG_DSN, PG_URL, fresh_pg_schema, prometheus_holding
from tests.billing.factories import write_book

pytestmark = pytest.mark.prometheus

D = Decimal
H0 = datetime(2026, 10, 5, tzinfo=UTC)
HOURS = [H0 + timedelta(hours=i) for i in range(3)]
STEP = 30
RATE = D("6.88")
# Kubernetes bounds pod names to 253 characters, but team names, VM names and values from other
# sources are not; 300+ characters overflowed the old String(255) columns on PostgreSQL.
LONG_HOST = "node-" + "h" * 310
LONG_NAMESPACE = "ns-" + "n" * 320
LONG_POD = "pod-" + "p" * 330
LONG_TEAM = "team-" + "t" * 340


def _openmetrics() -> str:
    node = {"hostname": LONG_HOST, "job": "gpumeter", "instance": "node-1:9400"}
    seconds = range(0, len(HOURS) * 3600, STEP)

    def series(name: str, labels: dict) -> list[str]:
        text = ",".join(f'{k}="{v}"' for k, v in labels.items())
        return [f"{name}{{{text}}} 1 {H0.timestamp() + s:.0f}" for s in seconds]

    info = {**node, "gpu": "0", "uuid": "GPU-long", "model": "NVIDIA H100 80GB HBM3", "mig_mode": "Disabled"}
    alloc = {**node, "namespace": LONG_NAMESPACE, "pod": LONG_POD, "container": "main"}
    alloc |= {"resource": "nvidia.com/gpu", "uuid": "GPU-long", "gpu": "0"}
    alloc |= {"gpu_instance_id": "", "mig_profile": ""}
    ksm = {"job": "kube-state-metrics", "namespace": LONG_NAMESPACE, "label_team": LONG_TEAM}
    lines = ["# TYPE nvidia_gpu_info gauge", *series("nvidia_gpu_info", info)]
    lines += ["# TYPE nvidia_gpu_allocation gauge", *series("nvidia_gpu_allocation", alloc)]
    lines += ["# TYPE kube_namespace_labels gauge", *series("kube_namespace_labels", ksm)]
    return "\n".join([*lines, "# EOF"]) + "\n"


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    with prometheus_holding(_openmetrics(), tmp_path_factory.mktemp("long-names")) as server:
        yield server


@pytest.fixture(scope="module")
def book_path(tmp_path_factory):
    doc = {"currency": "USD", "versions": [{"effective_from": "2026-01-01", "gpus": {"H100-80GB": "6.88"}}]}
    return write_book(tmp_path_factory.mktemp("book"), doc, "book.yaml")


@pytest.fixture
def pg_schema_name(request):
    return fresh_pg_schema(request, "billing_dberr")


def _ingest(prometheus, ledger, book_path):
    with PrometheusClient(prometheus.url) as client:
        return ingest_hours(client, ledger, load_price_book(book_path), HOURS, IngestConfig())


def _billed(ledger) -> dict[tuple[str, str, str], Decimal]:
    out: dict[tuple[str, str, str], Decimal] = {}
    for line in ledger.lines(H0, HOURS[-1] + timedelta(hours=1)):
        key = (line.namespace, line.pod, line.team)
        out[key] = out.get(key, D(0)) + line.amount
    return out


def test_names_of_300_characters_are_stored_and_billed(prometheus, sql_ledger, book_path):
    result = _ingest(prometheus, sql_ledger, book_path)
    assert result.failed == []
    assert result.ingested == HOURS  # the long names block no hour of the range
    assert _billed(sql_ledger) == {(LONG_NAMESPACE, LONG_POD, LONG_TEAM): 3 * RATE}  # $20.64
    assert sql_ledger.namespace_teams() == {LONG_NAMESPACE: LONG_TEAM}
    (device,) = sql_ledger.facts(H0)
    assert device.device.hostname == LONG_HOST


@pytest.mark.postgres
def test_a_connection_the_server_drops_mid_write_is_retried(prometheus, pg_schema_name, book_path):
    """An admin connection holds cost_line_groups locked, so the ledger's first write waits on it; then
    the server ends the ledger's backend (pg_terminate_backend, as a restart or failover would). The
    write is retried on a new connection and every hour is billed once."""
    opened = open_ledger(PG_URL, schema=pg_schema_name)
    retries: list[float] = []
    ledger = SqlLedger(opened.engine, retry_delays=(0.05, 0.05, 0.05), sleep=retries.append)
    outcome: dict = {}

    def run():
        try:
            outcome["result"] = _ingest(prometheus, ledger, book_path)
        except BaseException as exc:  # reported by the main thread
            outcome["error"] = exc

    with psycopg.connect(PG_DSN) as admin:
        admin_pid = admin.info.backend_pid
        admin.execute(f'LOCK TABLE "{pg_schema_name}".cost_line_groups IN ACCESS EXCLUSIVE MODE')
        ingest = threading.Thread(target=run, daemon=True)
        ingest.start()
        blocked: list[int] = []
        deadline = time.monotonic() + 60
        with psycopg.connect(PG_DSN, autocommit=True) as watcher:
            while not blocked and time.monotonic() < deadline and ingest.is_alive():
                rows = watcher.execute(
                    "SELECT pid FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))", (admin_pid,)
                ).fetchall()
                blocked = [pid for (pid,) in rows]
                time.sleep(0.05)
            assert blocked, f"the ledger never waited on the locked table: {outcome}"
            for pid in blocked:
                watcher.execute("SELECT pg_terminate_backend(%s)", (pid,))
        admin.rollback()  # the lock goes; the retried write can proceed
    ingest.join(timeout=60)
    try:
        assert "error" not in outcome, outcome.get("error")
        assert len(retries) >= 1, "the dropped connection was not retried"
        result = outcome["result"]
        assert result.failed == [] and result.ingested == HOURS
        assert _billed(ledger) == {(LONG_NAMESPACE, LONG_POD, LONG_TEAM): D("20.64")}
        assert [(run.hour, run.status) for run in ledger.ingest_runs(H0, HOURS[-1] + timedelta(hours=1))] == [
            (hour, contract.INGEST_OK) for hour in HOURS
        ]
    finally:
        ledger.close()


def _cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gpumeter", *argv], capture_output=True, text=True, timeout=120
    )


@pytest.mark.postgres
def test_a_refused_write_records_a_failed_run_and_keeps_the_earlier_hours(
    prometheus, pg_schema_name, book_path
):
    """The server refuses the second hour's lines (a CHECK constraint an admin added): not
    transient, so no retry. The hour is recorded failed with the server's reason, the range stops
    there, the first hour stays billed, and the CLI says so in one line."""
    open_ledger(PG_URL, schema=pg_schema_name).close()  # migrated
    with psycopg.connect(PG_DSN, autocommit=True) as admin:
        admin.execute(
            f'ALTER TABLE "{pg_schema_name}".cost_line_groups ADD CONSTRAINT frozen_hour '
            f"CHECK (hour <> '{HOURS[1].isoformat()}')"
        )
    run = _cli(
        "billing", "ingest", "--db", PG_URL, "--db-schema", pg_schema_name, "--prices", str(book_path),
        "--prometheus", prometheus.url, "--from", HOURS[0].isoformat(), "--to", (HOURS[-1] + timedelta(hours=1)).isoformat(),
        "--no-progress",
    )  # fmt: skip
    assert run.returncode == 1, run.stderr
    assert "Traceback" not in run.stderr
    errors = run.stderr.strip().splitlines()
    assert len(errors) == 1, run.stderr
    assert HOURS[1].isoformat() in errors[0] and "frozen_hour" in errors[0]

    with psycopg.connect(PG_DSN, autocommit=True) as admin:
        runs = admin.execute(
            f'SELECT hour, status, error FROM "{pg_schema_name}".ingest_runs ORDER BY hour, id'
        ).fetchall()
        billed = admin.execute(
            f'SELECT hour, sum(amount) FROM "{pg_schema_name}".cost_lines GROUP BY hour ORDER BY hour'
        ).fetchall()
    utc = [(hour.replace(tzinfo=UTC), status) for hour, status, _ in runs]  # stored naive, in UTC
    assert utc == [
        (HOURS[0], contract.INGEST_OK),
        (HOURS[1], contract.INGEST_FAILED),
    ]
    assert "frozen_hour" in runs[1][2]
    assert [(hour.replace(tzinfo=UTC), amount) for hour, amount in billed] == [(HOURS[0], RATE)]


UNREACHABLE = "postgresql+psycopg://postgres@127.0.0.1:1/test"


@pytest.mark.parametrize(
    "argv",
    [
        ["billing", "ingest", "--prometheus", "http://127.0.0.1:1", "--from", "2026-10-05T00:00:00Z",
         "--to", "2026-10-05T03:00:00Z", "--no-progress"],
        ["billing", "price", "--from", "2026-10-05T00:00:00Z", "--to", "2026-10-05T03:00:00Z"],
        ["report", "--period", "2026-10", "--no-record"],
    ],
    ids=["ingest", "price", "report"],
)  # fmt: skip
def test_an_unreachable_database_is_one_line(argv, book_path, tmp_path):
    if argv[0] == "billing":
        argv = [*argv, "--prices", str(book_path)]
    else:
        argv = [*argv, "--out", str(tmp_path / "out")]
    run = _cli(*argv, "--db", UNREACHABLE)
    assert run.returncode != 0
    assert "Traceback" not in run.stderr
    errors = run.stderr.strip().splitlines()
    assert len(errors) == 1, run.stderr
    assert errors[0].startswith("error: ") and "127.0.0.1:1" in errors[0], errors[0]
