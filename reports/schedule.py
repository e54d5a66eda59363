"""The billing service's monthly job: render last month's reports on the 1st into a directory.

Configured by environment (the billing service's settings are plain values pickled into the job
store; these travel with the job the same way):

| variable | default | meaning |
|---|---|---|
| `GPUMETER_REPORT_DIR` | `reports-out` | output directory; each period goes to `DIR/<YYYY-MM>/` |
| `GPUMETER_REPORT_CRON` | (1st of the month, 01:00 UTC) | crontab line, UTC, e.g. `30 2 1 * *` |
| `GPUMETER_REPORT_BY` | `team` | grouping(s), comma-separated: team, namespace, model, mig_profile, label:KEY |
| `GPUMETER_REPORT_FORMATS` | `html,csv,json,focus` | formats |
| `GPUMETER_REPORT_LABELS` | (none) | namespace labels YAML for label:KEY |
| `GPUMETER_REPORT_KINDS` | `chargeback,health` | which reports: the chargeback, the fleet-health report (reads the service's Prometheus) |
| `GPUMETER_REPORT_SPARE_POLICY` | `0.10` | the fleet-health report's spare policy: the share of each pool's GPUs to keep spare |
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import tempfile
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from apscheduler.triggers.cron import CronTrigger

log = logging.getLogger(__name__)
KINDS = ("chargeback", "health")  # GPUMETER_REPORT_KINDS: the two reports the monthly job renders


@dataclass
class ReportSchedule:
    out_dir: str = "reports-out"
    cron: str = ""  # empty: the 1st of every month at 01:00 UTC
    by: str = "team"
    formats: str = "html,csv,json,focus"
    labels: str = ""
    kinds: str = "chargeback,health"
    spare_policy: str = ""  # empty: the health report's default (seed 002's 10 %)

    @classmethod
    def from_env(cls, environ: dict | None = None) -> ReportSchedule:
        env = os.environ if environ is None else environ
        return cls(
            out_dir=env.get("GPUMETER_REPORT_DIR", cls.out_dir),
            cron=env.get("GPUMETER_REPORT_CRON", cls.cron),
            by=env.get("GPUMETER_REPORT_BY", cls.by),
            formats=env.get("GPUMETER_REPORT_FORMATS", cls.formats),
            labels=env.get("GPUMETER_REPORT_LABELS", cls.labels),
            kinds=env.get("GPUMETER_REPORT_KINDS", cls.kinds),
            spare_policy=env.get("GPUMETER_REPORT_SPARE_POLICY", cls.spare_policy),
        )

    def as_dict(self) -> dict:
        return asdict(self)

    def check(self) -> None:
        """Refuse a setting the monthly job would fail on, at the service's start rather than on the
        1st of next month. Raises ReportError naming the variable and its value."""
        from gpumeter.reports import health, health_render, render
        from gpumeter.reports.model import GROUPINGS_EXPECTED, Grouping, ReportError
        from gpumeter.reports.run import load_labels

        def refuse(variable: str, problem: str, value: str) -> None:
            raise ReportError(f"{variable}: {problem} (value {value!r})")

        try:
            self.trigger()
        except ValueError as exc:
            refuse("GPUMETER_REPORT_CRON", f"not a crontab line: {exc}", self.cron)
        kinds = _listed(self.kinds)
        if not kinds or set(kinds) - set(KINDS):
            refuse("GPUMETER_REPORT_KINDS", f"expected some of {', '.join(KINDS)}", self.kinds)
        formats = _listed(self.formats)
        known = set(render.FORMATS) | set(health_render.FORMATS)
        if not formats or set(formats) - known:
            refuse("GPUMETER_REPORT_FORMATS", f"expected some of {', '.join(sorted(known))}", self.formats)
        by = _listed(self.by)
        if not by:
            refuse("GPUMETER_REPORT_BY", "expected one grouping or more", self.by)
        for part in by:
            try:
                Grouping.parse(part)
            except ReportError:
                refuse("GPUMETER_REPORT_BY", f"{part!r}: {GROUPINGS_EXPECTED}", self.by)
        if self.spare_policy:
            try:
                health.spare_policy(self.spare_policy)
            except ValueError as exc:
                raise ReportError(f"GPUMETER_REPORT_SPARE_POLICY: {exc}") from None
        if self.labels:
            try:
                load_labels(self.labels)
            except ReportError as exc:
                raise ReportError(f"GPUMETER_REPORT_LABELS: {exc}") from None
        if "html" in formats:
            try:  # the templates ship as package data: a broken install fails here, not on the 1st
                render.check_templates()
            except Exception as exc:
                raise ReportError(f"GPUMETER_REPORT_FORMATS: html cannot be rendered: {exc}") from None
        _check_writable("GPUMETER_REPORT_DIR", Path(self.out_dir))

    def trigger(self) -> CronTrigger:
        if self.cron.strip():
            return CronTrigger.from_crontab(self.cron, timezone=UTC)
        return CronTrigger(day=1, hour=1, minute=0, timezone=UTC)


def _check_writable(variable: str, folder: Path) -> None:
    """A file can be written in ``folder``, or in its nearest existing parent when the job would have
    to create it (the probe file is removed; nothing is left behind)."""
    from gpumeter.reports.model import ReportError

    existing = folder.absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        if not existing.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(existing))
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".gpumeter-write-check-"):
            pass
    except OSError as exc:
        raise ReportError(f"{variable}: not writable ({exc.strerror}; value {str(folder)!r})") from None


def _listed(setting: str) -> list[str]:
    """A comma-separated setting's items, as both the job and `ReportSchedule.check` read them."""
    return [item.strip() for item in setting.split(",") if item.strip()]


# the ledger's lock row the monthly job holds (`billing serve`'s ingest holds "ingest")
REPORT_LOCK = "report"


@dataclass(frozen=True)
class MonthlyOutcome:
    """What the monthly job did: its one-line message, and the reports that failed with why
    (``chargeback_report``, ``health_report``: contract.BILLING_JOBS)."""

    message: str
    succeeded: tuple[str, ...]
    failed: dict[str, str]
    unwritten: dict[str, tuple[str, ...]] = field(default_factory=dict)  # per failed report: its files


def run_monthly(
    settings: dict, schedule: dict | None = None, now: datetime | None = None, holder: str | None = None
) -> MonthlyOutcome:
    """Render last month (relative to ``now``) for every configured grouping; record each run. Each
    report is attempted whatever happened to the other: a chargeback that fails does not keep the
    fleet-health report from being written, and each failure is logged and returned.

    The ledger's report lock is held throughout (``holder``: this replica), and a report a scheduled
    run already rendered for the month into the same folder is not rendered again: two replicas of
    `billing serve` both run the job, and both used to render and record the month into the one
    shared folder, at once."""
    from gpumeter.billing.ledger import open_ledger
    from gpumeter.billing.ledger.base import LockNotAcquired
    from gpumeter.reports.model import last_month

    cfg = ReportSchedule(**(schedule or {}))
    now = now or datetime.now(UTC)
    period = last_month(now)
    ledger = open_ledger(settings["db"], schema=settings.get("schema"))
    try:
        with ledger.lock(REPORT_LOCK, holder or f"{socket.gethostname()}:{os.getpid()}", now):
            return _render_month(settings, cfg, ledger, period, now)
    except LockNotAcquired:
        message = f"skipped {period.label}: another replica is rendering the monthly reports"
        log.info("monthly report: %s", message)
        return MonthlyOutcome(message, (), {})
    finally:
        ledger.close()


def _rendered(ledger, period, groupings: list[str], out_dir: Path) -> set[str]:
    """The reports of ``period`` a scheduled run rendered into ``out_dir`` and recorded already
    (contract.BILLING_JOBS names): the chargeback once every grouping has one, the health report once
    it has one."""
    folder = str(out_dir.resolve())
    done = {
        run.grouping
        for run in ledger.report_runs(period.start)
        if run.trigger == "schedule"
        and run.status == "ok"
        and run.period_end == period.end
        and run.out_dir == folder
    }
    tasks = {"health_report"} if "health" in done else set()
    if groupings and all(by in done for by in groupings):
        tasks.add("chargeback_report")
    return tasks


def _grouping_names(by: str) -> list[str]:
    """The names the configured groupings' runs are recorded under (none where one does not parse:
    the chargeback then runs, and says why it fails)."""
    from gpumeter.reports.model import Grouping, ReportError

    try:
        return [Grouping.parse(text).name for text in _listed(by)]
    except ReportError:
        return []


def _render_month(settings: dict, cfg: ReportSchedule, ledger, period, now: datetime) -> MonthlyOutcome:
    from gpumeter.billing.config import load_budgets
    from gpumeter.reports.model import Grouping
    from gpumeter.reports.render import RenderOptions
    from gpumeter.reports.run import generate, load_labels

    formats = tuple(_listed(cfg.formats))
    out_dir = Path(cfg.out_dir) / period.label
    kinds = set(_listed(cfg.kinds))
    written, succeeded, failed = 0, [], {}
    unwritten: dict[str, tuple[str, ...]] = {}
    done = _rendered(ledger, period, _grouping_names(cfg.by), out_dir)
    if "chargeback" in kinds and "chargeback_report" in done:
        succeeded.append("chargeback_report")
    elif "chargeback" in kinds:
        try:
            labels = load_labels(cfg.labels) if cfg.labels else {}
            # the billing service's team map file holds the teams' budgets: the report shows them
            budgets = load_budgets(settings["teams_file"]) if settings.get("teams_file") else {}
            for by in _listed(cfg.by):
                result = generate(
                    ledger,
                    period,
                    Grouping.parse(by, labels),
                    formats,
                    out_dir,
                    trigger="schedule",
                    options=RenderOptions(generated_at=now),
                    now=now,
                    budgets=budgets,
                )
                written += len(result.files)
            succeeded.append("chargeback_report")
        except (
            Exception
        ) as exc:  # any failure: logged with its traceback, counted, the health report still tried
            failed["chargeback_report"] = _failure(exc, "chargeback_report", unwritten)
            written += len(getattr(exc, "written", ()))
            _log_failure(exc, "chargeback", period.label)
    if "health" in kinds and "health_report" in done:
        succeeded.append("health_report")
    elif "health" in kinds:
        try:
            written += _health(settings, ledger, period, formats, out_dir, now, cfg.spare_policy)
            succeeded.append("health_report")
        except Exception as exc:
            failed["health_report"] = _failure(exc, "health_report", unwritten)
            written += len(getattr(exc, "written", ()))
            _log_failure(exc, "health", period.label)
    message = f"rendered {written} file(s) for {period.label} into {out_dir}"
    if done:
        message += (
            f" ({', '.join(sorted(t.replace('_', ' ') for t in done))} rendered before: left as they are)"
        )
    message += "".join(f"; {task.replace('_', ' ')} failed: {why}" for task, why in failed.items())
    (log.error if failed else log.info)("monthly report: %s", message)
    return MonthlyOutcome(message, tuple(succeeded), failed, unwritten)


def _failure(exc: Exception, task: str, unwritten: dict[str, tuple[str, ...]]) -> str:
    """Why a report failed, in one line; a file that could not be written names the ones left out."""
    from gpumeter.reports.files import ReportWriteError

    if isinstance(exc, ReportWriteError):
        unwritten[task] = tuple(exc.unwritten)
        return f"{exc}; not written: {', '.join(exc.unwritten)}"
    return f"{type(exc).__name__}: {exc}"


def _log_failure(exc: Exception, kind: str, label: str) -> None:
    from gpumeter.reports.files import ReportWriteError

    if isinstance(exc, ReportWriteError):  # the disk's own words say it all: no traceback
        log.error("monthly %s report for %s failed: %s", kind, label, exc)
    else:
        log.exception("monthly %s report for %s failed", kind, label)


def _health(
    settings: dict, ledger, period, formats: tuple[str, ...], out_dir: Path, now: datetime, policy: str
) -> int:
    """The fleet-health report beside the chargeback (it reads the service's Prometheus)."""
    from gpumeter.billing.prom import open_client
    from gpumeter.reports import health, health_render

    kept = tuple(f for f in formats if f in health_render.FORMATS) or health_render.FORMATS
    with open_client(settings["prometheus"]) as client:
        _, files, _ = health_render.generate(
            client,
            ledger,
            period,
            kept,
            out_dir,
            trigger="schedule",
            now=now,
            spare_policy=health.spare_policy(policy) if policy else None,
        )
    return len(files)
