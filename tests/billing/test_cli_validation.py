"""`gpumeter billing` refuses nonsense before it touches anything, and never bills an hour that has
not closed yet."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

import gpumeter
from gpumeter.billing.ledger import open_ledger
from gpumeter.billing.models import hour_floor
from gpumeter.billing.pricing.static import DEFAULT_BOOK
from tests.support.servers import PrometheusServer


def _ingest(tmp_path, *argv: str) -> int:
    db = f"sqlite:///{tmp_path / 'ledger.db'}"
    return gpumeter.main(
        ["billing", "ingest", "--db", db, "--prices", str(DEFAULT_BOOK), "--no-progress", *argv]
    )


@pytest.mark.parametrize(
    ("flag", "value", "said"),
    [
        ("--workers", "0", "at least 1"),
        ("--scrape-interval", "nan", "in [1, 3600]"),
        ("--scrape-interval", "inf", "in [1, 3600]"),
        ("--scrape-interval", "1e-9x", "seconds or 'auto'"),
        ("--scrape-interval", "-30", "in [1, 3600]"),
        ("--scrape-interval", "1e-9", "in [1, 3600]"),
        ("--gap-grace-intervals", "-1", "at least 0"),
        ("--catchup-hours", "0", "at least 1"),
        ("--from", "yesterday", "ISO 8601"),
    ],
)
def test_nonsense_flags_are_refused_naming_the_value(tmp_path, capsys, flag, value, said):
    with pytest.raises(SystemExit) as stopped:
        _ingest(tmp_path, "--prometheus", "http://127.0.0.1:9", flag, value)
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert flag in err and said in err and value in err
    assert not (tmp_path / "ledger.db").exists()  # nothing was opened, let alone written


def test_from_after_to_is_refused(tmp_path, capsys):
    code = _ingest(
        tmp_path,
        "--prometheus",
        "http://127.0.0.1:9",
        "--from",
        "2026-11-02T00:00Z",
        "--to",
        "2026-11-01T00:00Z",
    )
    assert code == 2
    assert "--from must be before --to" in capsys.readouterr().err
    assert not (tmp_path / "ledger.db").exists()


@pytest.mark.prometheus
def test_the_open_hour_and_the_future_are_never_recorded_as_ingested(tmp_path, capsys):
    """An empty Prometheus answers every hour with nothing; the open hour and hours to come must not be
    recorded as done (catch-up would then skip them for good)."""
    server = PrometheusServer(tmp_path / "prom").start()
    try:
        now = datetime.now(UTC)
        start = hour_floor(now) - timedelta(hours=2)
        end = hour_floor(now) + timedelta(hours=3)
        code = _ingest(
            tmp_path, "--prometheus", server.url, "--from", start.isoformat(), "--to", end.isoformat()
        )
    finally:
        server.stop()
    assert code == 0
    assert "past the last closed hour" in capsys.readouterr().err
    ledger = open_ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    try:
        done = ledger.ingested_hours(start, end)
        runs = ledger.ingest_runs(start, end)
    finally:
        ledger.close()
    closed = hour_floor(datetime.now(UTC) - timedelta(minutes=2))
    assert runs and all(run.hour < closed for run in runs), [(r.hour, r.status) for r in runs]
    # nothing was there yet: each closed hour is recorded empty, which catch-up retries
    assert {run.status for run in runs} == {"empty"} and done == set()
