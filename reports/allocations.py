"""The allocation audit (seed 002 §5: record every GPU allocation and release): who held which GPU,
MIG instance or share, from when to when, read from the ledger's hourly facts (docs/reports.md,
"Allocation audit").

The ledger keeps, per GPU-hour, the seconds each holder held its device (docs/billing.md §2), not
the moments it came and went. A holding is a run of consecutive hours in which the same holder
(namespace, pod, container) held the same device (GPU, MIG instance). Its ends are placed against the
hour boundaries it crosses: a run that goes on into the next hour held the *last* seconds of its first
hour, and one that came from the hour before held the *first* seconds of its last; so those ends are
exact to the scrape interval (seconds are sample counts × interval, §2.1). What stays unknown is said
per end: a holding that began and ended inside one hour lies somewhere in it ("hour"), and one held at
the period's edge may have begun before it or go on after it ("period").
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path

from gpumeter.billing.ledger.base import Ledger
from gpumeter.billing.models import HOUR, LineKind, hours_between
from gpumeter.reports.files import write_files
from gpumeter.reports.model import Period
from gpumeter.reports.period import utc_text
from gpumeter.reports.render import _environment, csv_text

FORMATS = ("csv", "html")
# How well an end of a holding is known (`Holding.start_known`, `end_known`)
EXACT, IN_HOUR, AT_PERIOD_EDGE = "exact", "hour", "period"
RESOLUTION = (
    "Built from the ledger's hourly facts (seconds held per GPU-hour). An end marked 'exact' is exact "
    "to the scrape interval (the holding crossed an hour boundary there, so its seconds in that hour "
    "place it); 'hour': the holding began and ended inside one hour, which is all the facts say of "
    "when; 'period': held at the period's edge, it may have begun before or may go on after. Scrape "
    "gaps bridged by the grace rule (docs/billing.md §2.1) are not seen; an hour without the holder "
    "ends a holding."
)
HEADER = [
    "namespace",
    "pod",
    "container",
    "team",
    "node",
    "gpu",
    "gpu_uuid",
    "gpu_model",
    "gpu_instance_id",
    "mig_profile",
    "sharing",
    "share",
    "start",
    "end",
    "start_known",
    "end_known",
    "hours",
    "held_seconds",
]


@dataclass
class Holding:
    """One holder's run of consecutive hours on one device."""

    namespace: str
    pod: str
    container: str
    uuid: str
    gpu_instance_id: str
    mig_profile: str
    cluster: str = ""  # its GPU's cluster; "" where the store has no cluster label
    node: str = ""
    gpu: str = ""
    model: str = ""
    sharing: str = ""
    share: Decimal = Decimal(1)
    team: str = ""
    first_hour: datetime | None = None
    last_hour: datetime | None = None
    first_seconds: int = 0
    last_seconds: int = 0
    held_seconds: int = 0
    hours: int = 0
    start: datetime = field(init=False)
    end: datetime = field(init=False)
    start_known: str = field(init=False)
    end_known: str = field(init=False)

    @property
    def key(self) -> tuple[str, ...]:
        return (
            self.namespace,
            self.pod,
            self.container,
            self.uuid,
            self.gpu_instance_id,
            self.mig_profile,
            self.cluster,
        )

    def place(self, period: Period) -> None:
        """Its start and end from the seconds of its first and last hours (the module's rule)."""
        first, last = self.first_hour, self.last_hour
        assert first is not None and last is not None
        if self.hours > 1 or self.first_seconds >= 3600:
            self.start = first + HOUR - timedelta(seconds=self.first_seconds)
            self.start_known = AT_PERIOD_EDGE if self.start == period.start else EXACT
        else:
            self.start, self.start_known = first, IN_HOUR
        if self.hours > 1 or self.last_seconds >= 3600:
            self.end = last + timedelta(seconds=self.last_seconds)
            self.end_known = AT_PERIOD_EDGE if self.end == period.end else EXACT
        else:
            self.end, self.end_known = last + HOUR, IN_HOUR


@dataclass
class AllocationReport:
    period: Period
    holdings: list[Holding]
    hours_read: int  # hours of the period the ledger holds facts for
    resolution: str = RESOLUTION


def build_allocations(ledger: Ledger, period: Period) -> AllocationReport:
    """Every holding of the period, from the ledger's facts, ordered by start, device and holder."""
    open_runs: dict[tuple[str, ...], Holding] = {}
    done: list[Holding] = []
    hours_read = 0
    for hour in hours_between(period.start, period.end):
        facts = ledger.facts(hour)
        hours_read += bool(facts)
        seen: set[tuple[str, ...]] = set()
        for gpu_hour in facts:
            device = gpu_hour.device
            for allocation in gpu_hour.allocations:
                seconds = min(int(allocation.allocated_seconds), 3600)
                if seconds <= 0:
                    continue
                key = (
                    allocation.namespace,
                    allocation.pod,
                    allocation.container,
                    device.uuid,
                    allocation.gpu_instance_id,
                    allocation.mig_profile,
                    device.cluster,
                )
                holding = open_runs.get(key)
                if holding is not None and key in seen:  # twice in one GPU-hour (two resources): one
                    holding.held_seconds += seconds
                    holding.last_seconds = min(3600, holding.last_seconds + seconds)
                    if holding.hours == 1:
                        holding.first_seconds = holding.last_seconds
                    continue
                if holding is None:
                    holding = open_runs[key] = Holding(
                        *key,
                        node=allocation.hostname or device.hostname,
                        gpu=device.gpu,
                        model=device.model,
                        sharing=allocation.sharing,
                        share=allocation.share,
                        first_hour=hour,
                        first_seconds=seconds,
                    )
                holding.last_hour, holding.last_seconds = hour, seconds
                holding.held_seconds += seconds
                holding.hours += 1
                seen.add(key)
        for released in [k for k in open_runs if k not in seen]:  # held last hour, not this one
            done.append(open_runs.pop(released))
    done.extend(open_runs.values())
    teams = _teams(ledger, period)
    for holding in done:
        holding.place(period)
        holding.team = teams.get(holding.key, "")
    # grouped by cluster (one group, "", where the store has no cluster label)
    done.sort(
        key=lambda h: (h.cluster, h.start, h.node, h.gpu, h.gpu_instance_id, h.namespace, h.pod, h.container)
    )
    return AllocationReport(period, done, hours_read)


def _teams(ledger: Ledger, period: Period) -> dict[tuple[str, ...], str]:
    """Each holder's team as its tenant lines name it (the team map or kube-state-metrics at ingest),
    the latest hour's where it changed."""
    teams: dict[tuple[str, ...], str] = {}
    for line in sorted(ledger.lines(period.start, period.end), key=lambda x: x.hour):
        if line.kind is LineKind.TENANT:
            key = (
                line.namespace,
                line.pod,
                line.container,
                line.uuid,
                line.gpu_instance_id,
                line.mig_profile,
                line.cluster,
            )
            teams[key] = line.team
    return teams


def clustered(report: AllocationReport) -> bool:
    """Whether any holding names a cluster: then every row does, in a first column (`header`)."""
    return any(h.cluster for h in report.holdings)


def header(report: AllocationReport) -> list[str]:
    return ["cluster", *HEADER] if clustered(report) else HEADER


def rows(report: AllocationReport) -> Iterable[list[str]]:
    """The holdings as text, in `header`'s order."""
    first = [lambda h: h.cluster] if clustered(report) else []
    for h in report.holdings:
        yield [
            *(f(h) for f in first),
            h.namespace,
            h.pod,
            h.container,
            h.team,
            h.node,
            h.gpu,
            h.uuid,
            h.model,
            h.gpu_instance_id,
            h.mig_profile,
            h.sharing,
            str(h.share),
            utc_text(h.start),
            utc_text(h.end),
            h.start_known,
            h.end_known,
            str(h.hours),
            str(h.held_seconds),
        ]


def file_names(report: AllocationReport, formats: tuple[str, ...]) -> dict[str, str]:
    return {f: f"gpumeter-allocations-{report.period.label}.{f}" for f in formats}


def html_text(report: AllocationReport, generated_at: datetime | None = None) -> str:
    template = _environment().get_template("allocations.html.j2")
    return template.render(
        r=report,
        header=header(report),
        rows=list(rows(report)),
        ts=utc_text,
        generated_at=generated_at and utc_text(generated_at),
    )


def render(
    report: AllocationReport, out_dir: str | Path, formats: tuple[str, ...] = FORMATS, generated_at=None
) -> dict[str, str]:
    """Write the report's files into ``out_dir``; returns {file name: sha256 hex}."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    texts = {
        # csv_text defuses formula-leading cells itself (reports.csvfile)
        name: csv_text(header(report), rows(report)) if fmt == "csv" else html_text(report, generated_at)
        for fmt, name in file_names(report, formats).items()
    }
    return write_files(out, texts)
