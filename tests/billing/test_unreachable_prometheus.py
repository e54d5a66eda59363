"""Deadlines and bounds that fit an hourly job (docs/billing.md §6.5).

Before: with default flags a hung Prometheus held an ingest about 12 minutes (each worker's range
query, then its hour-by-hour retry, each waiting the request timeout; the deadline defaulted to the
whole hour); a stopped Prometheus took 8.4 s to report, every worker process started only to find
it gone; the answer cap was not a setting; and an answer cost ~10.8 MiB of memory per MiB. Now one
cheap query finds a stopped or hung Prometheus before any worker starts, the deadline defaults to
20 minutes, the cap is `--max-answer-mib`, and answers are decoded a series at a time.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading

import pytest
from sqlalchemy import text

from gpumeter import contract
from gpumeter.billing.config import Settings
from gpumeter.billing.ingest import IngestConfig
from gpumeter.billing.ledger import open_ledger
from tests.support.servers import AnswerHandler, PrometheusServer, answering

pytestmark = pytest.mark.spawns  # `gpumeter billing ingest` and the memory bench run as processes

WEEK = ("--from", "2026-11-02T00:00Z", "--to", "2026-11-09T00:00Z")


def _ingest(url: str, prometheus: str, *extra: str) -> subprocess.CompletedProcess:
    """`gpumeter billing ingest` with its default flags (two workers, the default deadline) but ``extra``."""
    argv = [sys.executable, "-m", "gpumeter", "billing", "ingest", "--db", url, "--prometheus", prometheus]
    return subprocess.run(
        [*argv, *WEEK, "--no-progress", *extra],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_COLOR": "1"},
    )


def _runs(url: str) -> list[tuple[str, str]]:
    ledger = open_ledger(url)
    try:
        with ledger.engine.connect() as conn:
            return [tuple(r) for r in conn.execute(text("SELECT status, error FROM ingest_runs"))]
    finally:
        ledger.close()


def test_the_default_deadline_is_well_inside_the_hour_it_bills():
    assert Settings().deadline == IngestConfig().deadline == 1200  # the :05 job is done by :25


@pytest.mark.prometheus
def test_a_stopped_prometheus_is_one_failed_hour_before_any_worker_starts(tmp_path):
    server = PrometheusServer(tmp_path / "prom").start()
    stopped = server.url
    server.stop()  # it was there; now nothing listens
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    done = _ingest(url, stopped)
    assert done.returncode == 1, done.stderr
    (line,) = done.stderr.splitlines()  # before: one line per worker task that started and failed
    assert line == (
        f"error: hour 2026-11-02T00:00:00+00:00 not ingested: {stopped}: ConnectError: [Errno 111] "
        "Connection refused"
    ), line
    assert _runs(url) == [(contract.INGEST_FAILED, line.split("not ingested: ", 1)[1])]


def test_a_hung_prometheus_ends_a_default_ingest_within_the_deadline(tmp_path):
    """A real socket that accepts every connection and never answers. The deadline is injected
    small (3 s); the ingest ends, naming the first hour, having waited on one request only (before:
    the range query and the hour-by-hour retry of each worker, each its own wait)."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            accepted.append(connection)  # held open, never read or answered

    threading.Thread(target=accept, daemon=True).start()
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    try:
        done = _ingest(url, f"http://127.0.0.1:{listener.getsockname()[1]}", "--deadline", "3")
    finally:
        listener.close()
        for connection in accepted:
            connection.close()
    assert done.returncode == 1, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("error: hour 2026-11-02T00:00:00+00:00 not ingested: "), line
    assert "Timeout" in line or "deadline" in line, line
    assert len(accepted) == 1
    assert [status for status, _ in _runs(url)] == [contract.INGEST_FAILED]


def test_the_answer_cap_is_a_setting(tmp_path):
    """`--max-answer-mib 1`: a 2 MiB answer is refused as it streams in, in one line."""
    padding = "x" * (2 << 20)

    class Large(AnswerHandler):
        def answer(self) -> None:
            if "vector(1)" in self.form.get("query", ""):  # the reachability query: answered small
                self.send_json({"status": "success", "data": {"resultType": "vector", "result": []}})
                return
            self.send_json(
                {"status": "success", "data": {"resultType": "matrix", "result": []}, "p": padding}
            )

    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    with answering(Large) as prometheus:
        done = _ingest(url, prometheus, "--max-answer-mib", "1", "--workers", "1")
    assert done.returncode == 1, done.stderr
    assert "answer larger than 1048576 bytes" in done.stderr, done.stderr


def test_an_answer_costs_a_bounded_memory_per_mib():
    """The bench of docs/performance.md on a 16 MiB answer: under 4 MiB of peak RSS per MiB of
    answer (measured 2.8; before: 10.8, the whole answer decoded into Python lists at once)."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.bench_answer_memory", "--mib", "16"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    per_mib = float(re.search(r"= ([0-9.]+) MiB per MiB of answer", done.stdout)[1])
    assert per_mib < 4.0, done.stdout
