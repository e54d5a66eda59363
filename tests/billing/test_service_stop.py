"""`gpumeter billing serve` stops within 2 s on SIGTERM and SIGINT, with the hour in progress either
finished or rolled back, never half-written (a Ctrl-C that waits out a whole catch-up reads as a hang:
`make demo`'s once took 15 s).

A real Prometheus holds the last closed hours of two H100s held whole ($6.88 each: $13.76 an hour);
the service's catch-up runs against a real PostgreSQL schema. To stop it *inside* an hour, an admin
connection holds `cost_line_groups` locked, so the first hour's transaction waits in its DELETE; the
signal comes while it waits. Then either the lock goes 0.3 s later (the hour finishes, nothing after
it is started) or it is held past the grace period (the process ends and PostgreSQL rolls the hour
back).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import psycopg
import pytest

from tests.billing.conftest import PG_DSN, PG_URL, fresh_pg_schema, prometheus_holding
from tests.billing.factories import write_book
from tests.support.servers import free_port

# a wall-clock bound (the 2 s from the signal to the exit): `quiet`, run alone after the other tests
pytestmark = [pytest.mark.postgres, pytest.mark.prometheus, pytest.mark.quiet]

D = Decimal
HOURLY = D("13.76")  # 2 x 6.88
STOP_WITHIN = 2.0  # seconds from the signal to the process's exit
CATCHUP_HOURS = 6


def _last_closed_hour() -> datetime:
    now = datetime.now(UTC) - timedelta(minutes=2)  # ingest's settle delay
    return now.replace(minute=0, second=0, microsecond=0)


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    end = _last_closed_hour()
    start = end - timedelta(hours=CATCHUP_HOURS + 2)
    node = {"hostname": "node-1", "job": "gpumeter", "instance": "node-1:9400"}
    lines = ["# TYPE nvidia_gpu_info gauge"]
    allocs = ["# TYPE nvidia_gpu_allocation gauge"]
    for gpu in ("0", "1"):
        info = {
            **node,
            "gpu": gpu,
            "uuid": f"GPU-{gpu}",
            "model": "NVIDIA H100 80GB HBM3",
            "mig_mode": "Disabled",
        }
        held = {**node, "namespace": "research", "pod": f"r-{gpu}", "container": "main"}
        held |= {
            "resource": "nvidia.com/gpu",
            "uuid": f"GPU-{gpu}",
            "gpu": gpu,
            "gpu_instance_id": "",
            "mig_profile": "",
        }
        for labels, out, name in ((info, lines, "nvidia_gpu_info"), (held, allocs, "nvidia_gpu_allocation")):
            text = ",".join(f'{k}="{v}"' for k, v in labels.items())
            at = start.timestamp()
            while at < end.timestamp() + 30:  # through the first sample after the last closed hour
                out.append(f"{name}{{{text}}} 1 {at:.0f}")
                at += 30
    text = "\n".join([*lines, *allocs, "# EOF"]) + "\n"
    with prometheus_holding(text, tmp_path_factory.mktemp("serve-stop")) as server:
        yield server


@pytest.fixture
def schema(request):
    return fresh_pg_schema(request, "billing_stop")


def _migrated(schema: str) -> None:
    from gpumeter.billing.ledger import open_ledger

    open_ledger(PG_URL, schema=schema).close()


def _start_serve(prometheus, schema, tmp_path) -> subprocess.Popen:
    doc = {"currency": "USD", "versions": [{"effective_from": "2026-01-01", "gpus": {"H100-80GB": "6.88"}}]}
    book = write_book(tmp_path, doc, "book.yaml")
    argv = [sys.executable, "-m", "gpumeter", "billing", "serve", "--db", PG_URL, "--db-schema", schema]
    argv += ["--prices", str(book), "--prometheus", prometheus.url, "--listen", f"127.0.0.1:{free_port()}"]
    argv += ["--catchup-hours", str(CATCHUP_HOURS)]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_blocked(admin_pid: int, serve: subprocess.Popen) -> None:
    """Until a backend waits on the admin's lock: the hour's transaction is open, mid-write."""
    deadline = time.monotonic() + 60
    with psycopg.connect(PG_DSN, autocommit=True) as watcher:
        while time.monotonic() < deadline:
            assert serve.poll() is None, serve.communicate()
            waiting = watcher.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))", (admin_pid,)
            ).fetchone()[0]
            if waiting:
                return
            time.sleep(0.05)
    serve.kill()
    pytest.fail(f"the service never wrote an hour: {serve.communicate()}")


def _ledger(schema: str) -> tuple[dict[datetime, Decimal], dict[datetime, str]]:
    with psycopg.connect(PG_DSN, autocommit=True) as admin:
        lines = admin.execute(f'SELECT hour, sum(amount) FROM "{schema}".cost_lines GROUP BY hour').fetchall()
        runs = admin.execute(
            f"""SELECT hour, status FROM "{schema}".ingest_runs WHERE status <> 'empty' ORDER BY hour, id"""
        ).fetchall()
    return {h.replace(tzinfo=UTC): amount for h, amount in lines}, {h.replace(tzinfo=UTC): s for h, s in runs}


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_serve_stops_within_2s_after_finishing_the_hour_in_progress(prometheus, schema, tmp_path, sig):
    _migrated(schema)
    with psycopg.connect(PG_DSN) as admin:
        admin.execute(f'LOCK TABLE "{schema}".cost_line_groups IN ACCESS EXCLUSIVE MODE')
        serve = _start_serve(prometheus, schema, tmp_path)
        _wait_blocked(admin.info.backend_pid, serve)
        serve.send_signal(sig)
        signalled = time.monotonic()
        time.sleep(0.3)
        admin.rollback()  # the lock goes: the hour in progress can finish
    try:
        serve.wait(timeout=10)
    finally:
        if serve.poll() is None:
            serve.kill()
    took = time.monotonic() - signalled
    print(f"finished the hour and stopped {took:.2f} s after {sig.name}")
    _, err = serve.communicate()
    assert took < STOP_WITHIN, f"stopped after {took:.2f}s: {err[-2000:]}"
    assert serve.returncode == 0, err
    assert "Traceback" not in err
    assert "stopped after 1 hour(s)" in err, err[-2000:]
    billed, runs = _ledger(schema)
    # the one hour in progress is whole; nothing after it was started
    assert list(billed.values()) == [HOURLY], billed
    assert list(runs.items()) == [(next(iter(billed)), "ok")]


def test_serve_rolls_the_hour_back_when_it_cannot_finish_in_time(prometheus, schema, tmp_path):
    _migrated(schema)
    with psycopg.connect(PG_DSN) as admin:
        admin.execute(f'LOCK TABLE "{schema}".cost_line_groups IN ACCESS EXCLUSIVE MODE')
        serve = _start_serve(prometheus, schema, tmp_path)
        _wait_blocked(admin.info.backend_pid, serve)
        serve.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        try:
            serve.wait(timeout=10)
        finally:
            if serve.poll() is None:
                serve.kill()
        took = time.monotonic() - signalled
        admin.rollback()  # only now: the abandoned transaction may go on, and cannot commit
    print(f"rolled back and stopped {took:.2f} s after SIGTERM")
    _, err = serve.communicate()
    assert took < STOP_WITHIN, f"stopped after {took:.2f}s: {err[-2000:]}"
    assert "Traceback" not in err
    assert "rolled back" in err
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the server ends the orphaned backend once the lock goes
        billed, runs = _ledger(schema)
        if not billed and not runs:
            break
        time.sleep(0.1)
    assert (billed, runs) == ({}, {}), "a partial hour survived the stop"
    with psycopg.connect(PG_DSN, autocommit=True) as admin:  # the next start's catch-up is not barred
        assert admin.execute(f'SELECT name, holder FROM "{schema}".billing_locks').fetchall() == []
