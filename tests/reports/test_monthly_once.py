"""Two replicas of `billing serve` both run the monthly job at 01:00 on the 1st. Each rendered and
recorded the month into the one shared folder, at once (a probe of the service under faults). The job
now holds the ledger's report lock, and a report a scheduled run already rendered for the month into
that folder is left as it is: the month is rendered and recorded once.

The worked-example month (tests/reports/conftest.py `fill`) in a SQLite ledger; the chargeback only
(the health report needs a Prometheus)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gpumeter.billing.config import Settings
from gpumeter.billing.ledger import open_ledger
from gpumeter.reports.schedule import REPORT_LOCK, ReportSchedule, run_monthly
from tests.reports.conftest import fill

NOW = datetime(2026, 12, 1, 1, 0, tzinfo=UTC)


@pytest.fixture
def url(tmp_path, worked_book):
    ledger = open_ledger(f"sqlite:///{tmp_path / 'jobs.db'}")
    fill(ledger, worked_book)
    ledger.close()
    return f"sqlite:///{tmp_path / 'jobs.db'}"


def _scheduled(url: str) -> list[tuple[str, str]]:
    ledger = open_ledger(url)
    try:
        return [(r.grouping, r.status) for r in ledger.report_runs() if r.trigger == "schedule"]
    finally:
        ledger.close()


def test_the_month_is_rendered_once_whichever_replica_comes_second(url, tmp_path):
    settings = Settings(db=url).as_dict()
    schedule = ReportSchedule(
        out_dir=str(tmp_path / "reports"), kinds="chargeback", by="team,namespace"
    ).as_dict()
    first = run_monthly(settings, schedule, NOW, holder="billing-0:1:aaaa")
    assert first.succeeded == ("chargeback_report",) and first.failed == {}
    files = sorted((tmp_path / "reports" / "2026-11").iterdir())
    stamps = {path.name: path.stat().st_mtime_ns for path in files}
    assert _scheduled(url) == [("team", "ok"), ("namespace", "ok")]

    second = run_monthly(settings, schedule, NOW, holder="billing-1:1:bbbb")
    assert second.succeeded == ("chargeback_report",) and second.failed == {}
    assert second.message.startswith("rendered 0 file(s) for 2026-11") and "rendered before" in second.message
    assert _scheduled(url) == [("team", "ok"), ("namespace", "ok")]  # recorded once
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "reports" / "2026-11").iterdir()} == stamps

    # a grouping added to the schedule since: only the month's missing chargeback is rendered again
    more = ReportSchedule(out_dir=str(tmp_path / "reports"), kinds="chargeback", by="team,namespace,model")
    third = run_monthly(settings, more.as_dict(), NOW, holder="billing-1:1:bbbb")
    assert third.succeeded == ("chargeback_report",)
    assert [g for g, _ in _scheduled(url)] == ["team", "namespace", "team", "namespace", "model"]


def test_a_replica_finding_the_report_lock_held_skips(url, tmp_path):
    ledger = open_ledger(url)
    try:
        assert ledger.acquire_lock(REPORT_LOCK, "billing-0:1:aaaa", NOW, 1800)  # the other replica, rendering
        schedule = ReportSchedule(out_dir=str(tmp_path / "reports"), kinds="chargeback").as_dict()
        outcome = run_monthly(Settings(db=url).as_dict(), schedule, NOW, holder="billing-1:1:bbbb")
    finally:
        ledger.close()
    assert outcome.message == "skipped 2026-11: another replica is rendering the monthly reports"
    assert outcome.succeeded == () and outcome.failed == {}
    assert not (tmp_path / "reports" / "2026-11").exists() and _scheduled(url) == []
