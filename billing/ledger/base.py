"""The ledger interface, in three parts: what ingest writes (`IngestLedger`), what reports read
(`ReportLedger`) and what the service keeps (`ServiceLedger`); `Ledger` is all three. Implementations:
`billing.ledger.memory` and `billing.ledger.sqlalchemy`."""

from __future__ import annotations

import abc
import contextlib
from collections import defaultdict
from collections.abc import Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

from gpumeter import contract
from gpumeter.billing.models import (
    HOUR,
    GpuHour,
    Line,
    LineKind,
    cluster_namespace,
    hours_between,
    line_billed,
    line_key,
)
from gpumeter.billing.pricing.base import PriceBook

# The kinds of line a team pays: what counts against its budget (docs/billing.md §4.4), as in reports.
BILLED_TO_TEAMS = (LineKind.TENANT, LineKind.IDLE_SHARE)


class LockNotAcquired(RuntimeError):
    """Another replica holds the lock."""


class LedgerError(RuntimeError):
    """The ledger's store refused a write or read, or could not be reached (after retrying what
    was transient). The message is one line naming the store and the cause."""


class DuplicateLine(LedgerError):
    """Two lines of one hour share their natural key (`line_key`): one of them would be a double bill."""


def refuse_duplicate_lines(hour: datetime, lines: Iterable[Line]) -> list[str]:
    """The lines' keys, in order; raises DuplicateLine naming the first key met twice."""
    lines = list(lines)
    keys = list(map(line_key, lines))  # ~3,700 an hour on the 1,000-GPU bench: no loop in Python
    if len(set(keys)) == len(keys):
        return keys
    seen = set()
    for line, key in zip(lines, keys, strict=True):
        if key in seen:
            raise DuplicateLine(
                f"hour {hour.isoformat()}: two {line.kind.value} lines for {line.namespace}/{line.pod}/"
                f"{line.container} on {line.uuid} {line.gpu_instance_id}".rstrip()
            )
        seen.add(key)
    raise AssertionError("unreachable: a key met twice was not found again")


@dataclass(frozen=True)
class Actor:
    """Who changes the ledger (docs/billing.md §6.6): the command, the operator (the OS user), the
    reason given (``--reason``) and the command's run, which names the audit records it writes."""

    command: str = ""
    operator: str = ""
    reason: str = ""
    run: str = ""


@dataclass(frozen=True)
class AuditRecord:
    """What a re-ingest or re-price changed of an already-billed hour: one team's amounts in one
    cluster (``billing_audit``)."""

    id: int
    at: datetime
    run: str
    command: str
    operator: str
    reason: str
    book_digest: str
    hour: datetime
    currency: str
    old_total: Decimal
    new_total: Decimal
    # the cluster whose lines these totals sum: "" where the store has no cluster label; None for a
    # record written before revision 0015, whose totals are the hour's over every cluster
    cluster: str | None = ""
    # and the team they are billed to: "" for lines billed to none (the platform's, a namespace
    # without a team); None for a record written before 0015, whose totals are every team's
    team: str | None = ""


# per (cluster, team) of an hour's lines ("" where the store has no cluster, or the line no team):
# what they bill and its currency; a pair without a priced line is absent, an hour without one empty
BilledTotals = dict[tuple[str, str], tuple[Decimal, str]]


def hour_totals(lines: Iterable[Line]) -> BilledTotals:
    """What the hour's lines bill, per cluster and team (`BilledTotals`). Lines that say what they
    bill (ingest's `PricedLines.billed`) are summed without being made."""
    billed = getattr(lines, "billed", None)
    groups = (
        billed()
        if billed is not None
        else ((line.cluster, [line.team], [line_billed(line)]) for line in lines)
    )
    totals: BilledTotals = {}
    for cluster, teams, pairs in groups:
        for team, (amount, currency) in zip(teams, pairs, strict=True):
            if amount is not None:
                key = (cluster or "", team or "")
                total, first = totals.get(key, (Decimal(0), currency))
                totals[key] = (total + amount, first)
    return totals


def audited_changes(
    actor: Actor,
    book: PriceBook | None,
    hour: datetime,
    old: BilledTotals,
    new: BilledTotals,
    at: datetime,
) -> list[AuditRecord]:
    """The audit records of replacing an hour billed ``old`` by lines billing ``new`` (each
    `hour_totals`): one per cluster and team whose total changed, one absent from either side at
    0, so money moved between teams or clusters is seen even where the hour's total stays. An hour
    billed for the first time needs none, nor one billed again to the same totals."""
    if not old:
        return []
    digest = (book.digest if book is not None else "") or "inline"
    records = []
    for cluster, team in sorted(old.keys() | new.keys()):
        before, after = old.get((cluster, team)), new.get((cluster, team))
        if before == after:
            continue
        currency = (before or after)[1]  # type: ignore[index]  # one of them is there
        records.append(
            AuditRecord(
                0,
                at,
                actor.run,
                actor.command,
                actor.operator,
                actor.reason,
                digest,
                hour,
                currency,
                before[0] if before is not None else Decimal(0),
                after[0] if after is not None else Decimal(0),
                cluster,
                team,
            )
        )
    return records


# per GPU-hour of an hour's lines, in their order: (uuid, its `PricedHour.terms`, how many lines it has)
LineGroups = tuple[tuple[str, Hashable | None, int], ...]


@dataclass(frozen=True)
class HourRecord:
    """What one ingest wrote for one hour: facts, priced lines and the book that priced them."""

    hour: datetime
    gpu_hours: list[GpuHour]
    lines: Sequence[Line]  # a list, or ingest's `PricedLines`: made when first read
    book: PriceBook | None
    # what made the ingest doubt the hour (docs/billing.md §2.1): the run is recorded "suspect"
    warnings: tuple[str, ...] = ()
    # per GPU-hour, in the order of ``lines``: (uuid, its `PricedHour.terms`, how many lines it
    # has). A ledger may name the terms and keys it stored for that GPU's lines again where the
    # terms are equal (docs/billing.md §6.3), and then, where ``lines`` are ingest's `PricedLines`,
    # read what it stores of them from their priced hour without making them; empty: every line is
    # looked at
    line_groups: LineGroups = field(default=(), compare=False, repr=False)
    # GPU-hours left out because a reading of theirs was refused, (cluster, uuid, why): the run is recorded
    # "partial", they are stored (`Ledger.refused_gpu_hours`), and catch-up retries the hour
    refused: tuple[tuple[str, str, str], ...] = ()
    # clusters with no series this hour though the run has them in an hour before and one after (a
    # store that answered without them): the run is recorded "partial", and catch-up retries the hour
    missing_clusters: tuple[str, ...] = ()


@dataclass(frozen=True)
class LedgerSummary:
    """Aggregates for /metrics."""

    cost: list[tuple[dict[str, str], Decimal]]
    gpu_hours: list[tuple[dict[str, str], Decimal]]
    unpriced: list[tuple[dict[str, str], Decimal]]
    last_success: datetime | None  # end of the newest hour ingested successfully
    runs: dict[str, int]


def summarise(
    lines: Iterable[tuple[str, str, str, str, str, str, Decimal, Decimal | None, str | None]],
    last_hour: datetime | None,
    runs: dict[str, int],
) -> LedgerSummary:
    """The /metrics aggregates from (namespace, team, model, mig_profile, kind, currency, quantity,
    amount, cluster) per line, the newest successful hour and the run counts: every ledger sums the
    same way, in Python over Decimals (SQLite stores exact decimals as text)."""
    cost: dict[tuple[str, ...], Decimal] = defaultdict(Decimal)
    hours: dict[tuple[str, ...], Decimal] = defaultdict(Decimal)
    unpriced: dict[tuple[str, str], Decimal] = defaultdict(Decimal)
    for ns, team, model, profile, kind, currency, quantity, amount, cluster in lines:
        cluster = cluster or ""  # NULL: a line of a store without a cluster label
        if amount is None:
            unpriced[(model, cluster)] += quantity
            continue
        cost[(ns, team, model, profile, kind, currency, cluster)] += amount
        if kind == LineKind.TENANT:
            hours[(ns, team, model, profile, cluster)] += quantity
    cost_keys = ("namespace", "team", "model", "mig_profile", "kind", "currency", "cluster")
    hour_keys = ("namespace", "team", "model", "mig_profile", "cluster")
    return LedgerSummary(
        cost=[(dict(zip(cost_keys, k, strict=True)), v) for k, v in sorted(cost.items())],
        gpu_hours=[(dict(zip(hour_keys, k, strict=True)), v) for k, v in sorted(hours.items())],
        unpriced=[({"model": m, "cluster": c}, v) for (m, c), v in sorted(unpriced.items())],
        last_success=None if last_hour is None else last_hour + HOUR,
        runs=dict(runs),
    )


@dataclass(frozen=True)
class LineTotal:
    """Priced lines summed over a bucket of hours (an hour, a UTC day, or the whole range), for reports.

    Lines are grouped by everything that identifies a charge (kind, namespace, team, pod, container,
    GPU, MIG instance, model, currency, price-book version). Sums are exact: ``amount`` is the sum of
    the rounded line amounts (None when every line of the group is unpriced); utilization and
    efficiency are quantity-weighted sums over the lines where they are known (report only).
    """

    bucket: datetime
    first_hour: datetime
    last_hour: datetime
    kind: str
    namespace: str
    team: str
    pod: str
    container: str
    uuid: str
    gpu_instance_id: str
    mig_profile: str
    model: str
    currency: str
    price_version_id: int | None
    lines: int
    quantity: Decimal
    amount: Decimal | None
    utilization_weighted: float = 0.0  # sum of utilization x quantity
    utilization_quantity: Decimal = Decimal(0)  # sum of quantity where utilization is known
    efficiency_weighted: float = 0.0
    efficiency_quantity: Decimal = Decimal(0)
    held: Decimal = Decimal(0)  # sum of the lines' held quantity, in held_unit (a grouping key)
    held_unit: str = "gpu_hour"
    cluster: str = ""  # the lines' cluster ("": a store without a cluster label; a grouping key)


@dataclass(frozen=True)
class SharedUse:
    """What a pod's own processes used on the shared GPUs it held (time-sliced, MPS, fractional), over
    the hours of a range that have process data (docs/billing.md §3.5): per hour its containers' memory
    and SM shares summed, then the mean over those hours. ``sm`` is None where NVML gave no process
    utilization (a MIG instance shared by replicas)."""

    namespace: str
    pod: str
    hours: int
    memory_bytes: Decimal
    sm: Decimal | None


SHARED_MODES = (contract.SHARING_TIME_SLICING, contract.SHARING_MPS, contract.SHARING_FRACTIONAL)


@dataclass(frozen=True, order=True)
class PodHolding:
    """How a pod held GPUs in a range: one per (sharing mode, resource) it held them as, the resource
    being the device plugin's (``nvidia.com/gpu``), a vGPU type, or a DRA claim
    (``resourceclaim/<name>``, docs/pod-attribution.md §8a). For reports."""

    namespace: str
    pod: str
    sharing: str
    resource: str


def shared_use_of(rows: Iterable[Any]) -> list[SharedUse]:
    """Rows of (namespace, pod, hour, process memory, process SM) → one SharedUse per pod."""
    per_hour: dict[tuple[str, str, datetime], list[Any]] = {}
    for namespace, pod, hour, memory, sm in rows:
        entry = per_hour.setdefault((namespace, pod, hour), [Decimal(0), None])
        entry[0] += Decimal(memory)
        if sm is not None:
            entry[1] = (entry[1] or Decimal(0)) + Decimal(sm)
    pods: dict[tuple[str, str], list[Any]] = {}
    for (namespace, pod, _hour), (memory, sm) in per_hour.items():
        entry = pods.setdefault((namespace, pod), [0, Decimal(0), Decimal(0), 0])
        entry[0] += 1
        entry[1] += memory
        if sm is not None:
            entry[2] += sm
            entry[3] += 1
    return [
        SharedUse(ns, pod, hours, memory / hours, (sm / sm_hours) if sm_hours else None)
        for (ns, pod), (hours, memory, sm, sm_hours) in sorted(pods.items())
    ]


@dataclass(frozen=True)
class PriceVersionRecord:
    """A stored price-book version (``price_book_versions``): what priced some lines."""

    id: int
    digest: str
    path: str
    currency: str
    effective_from: datetime
    effective_to: datetime | None
    source: str
    body: dict[str, Any]  # rates, slice_weight, idle, sharing_efficiency, aliases


@dataclass(frozen=True)
class IngestRunRecord:
    id: int
    hour: datetime
    started_at: datetime
    finished_at: datetime | None
    status: str
    source: str


@dataclass(frozen=True)
class RefusedGpuHour:
    """A GPU-hour ingest left unbilled because a reading of it was refused (docs/billing.md §6.5)."""

    hour: datetime
    cluster: str | None  # None where the store has no cluster label
    uuid: str
    reason: str
    refused_at: datetime


def run_status(record: HourRecord) -> tuple[str, str | None]:
    """The ingest run's status and error text for a written hour."""
    if record.refused or record.missing_clusters:
        texts = []
        if record.missing_clusters:
            texts.append(missing_clusters_text(record.missing_clusters))
        if record.refused:
            shown = "; ".join(f"{f'{c}/' if c else ''}{uuid}: {why}" for c, uuid, why in record.refused)
            texts.append(f"{len(record.refused)} GPU-hour(s) refused, not billed: {shown}")
        return contract.INGEST_PARTIAL, "; ".join((*texts, *record.warnings))[:4000]
    if record.warnings:
        return contract.INGEST_SUSPECT, "; ".join(record.warnings)[:4000]
    return contract.INGEST_OK, None


def missing_clusters_text(clusters: Sequence[str]) -> str:
    """Why an hour written without some clusters is partial (`HourRecord.missing_clusters`)."""
    return (
        f"cluster(s) {', '.join(clusters)}: no GPU or allocation series this hour, though the store has "
        "them in the hours before and after it; not billed for them yet"
    )


@dataclass(frozen=True)
class ReportRunRecord:
    id: int
    period_start: datetime
    period_end: datetime
    created_at: datetime
    trigger: str
    grouping: str
    out_dir: str
    price_book_versions: list[dict[str, Any]]  # JSON documents, as the report's manifest has them
    ingest_runs: dict[str, Any]
    files: dict[str, str]
    status: str
    error: str | None


class LedgerStore(abc.ABC):
    """What every part of a ledger has: the store it reaches, which the service checks and every
    command closes."""

    @abc.abstractmethod
    def ping(self) -> None:
        """Raise when the store cannot be reached (the service's /healthz)."""

    @abc.abstractmethod
    def close(self) -> None: ...


class IngestLedger(LedgerStore):
    """What ingest writes: an hour's facts and lines, a re-price's lines, the runs of both, and
    which hours are done (so catch-up knows what is left to write)."""

    actor: Actor = Actor()  # who writes, named in the audit records; the commands set theirs

    @abc.abstractmethod
    def write_hour(self, record: HourRecord, *, source: str = "", started_at: datetime | None = None) -> None:
        """Replace everything of ``record.hour`` (facts, lines) and record a successful run, atomically."""

    @abc.abstractmethod
    def replace_lines(
        self, hour: datetime, lines: Sequence[Line], book: PriceBook, line_groups: LineGroups = ()
    ) -> None:
        """Re-price: replace the hour's lines only, in one transaction. ``line_groups``: as
        `HourRecord.line_groups`, where the lines are a re-price's `PricedLines`."""

    @abc.abstractmethod
    def record_run(
        self,
        hour: datetime,
        status: str,
        reason: str,
        *,
        source: str = "",
        started_at: datetime | None = None,
    ) -> None:
        """Record an ingest run that wrote nothing (its own transaction; no facts or lines):
        ``status`` is contract.INGEST_FAILED or INGEST_EMPTY, ``reason`` says why."""

    def record_failure(
        self, hour: datetime, error: str, *, source: str = "", started_at: datetime | None = None
    ) -> None:
        """Record a failed ingest run (its own transaction; no facts or lines)."""
        self.record_run(hour, contract.INGEST_FAILED, error, source=source, started_at=started_at)

    @abc.abstractmethod
    def ingested_hours(self, start: datetime, end: datetime) -> set[datetime]:
        """Hours in [start, end) with a successful ingest run (status in contract.INGEST_DONE)."""

    @abc.abstractmethod
    def billed_clusters(self, start: datetime, end: datetime) -> dict[datetime, set[str]]:
        """Per hour of [start, end) with stored GPU-hours, the clusters they are in ("" where the store
        had no cluster label): what a re-ingest must not drop unnoticed (docs/billing.md §2.3)."""

    @contextlib.contextmanager
    def serialised(self, *, shared: bool) -> Iterator[bool]:
        """Ingests (``shared``) run side by side; a re-price (not shared) runs alone, so the two never
        interleave hours priced by two books (docs/billing.md §6.6). Yields whether it had to wait.
        In one process (this default) nothing runs side by side to wait for."""
        yield False


class ReportLedger(LedgerStore):
    """What reports read (and the commands and /metrics that show what was billed): facts, lines and
    their sums, the price versions and runs behind them, audit records and refused GPU-hours."""

    @abc.abstractmethod
    def facts(self, hour: datetime) -> list[GpuHour]:
        """The stored facts of one hour, as domain objects."""

    def facts_between(self, start: datetime, end: datetime) -> Iterator[tuple[datetime, list[GpuHour]]]:
        """(hour, its facts) of each hour in [start, end) with facts, in order: what a re-price reads."""
        for hour in hours_between(start, end):
            facts = self.facts(hour)
            if facts:
                yield hour, facts

    @abc.abstractmethod
    def lines(self, start: datetime, end: datetime) -> list[Line]:
        """Priced lines of the hours in [start, end)."""

    @abc.abstractmethod
    def refused_gpu_hours(
        self, start: datetime | None = None, end: datetime | None = None
    ) -> list[RefusedGpuHour]:
        """The GPU-hours refused by the latest write of their hour, by hour and uuid."""

    @abc.abstractmethod
    def summary(self) -> LedgerSummary: ...

    @abc.abstractmethod
    def counts(self) -> dict[str, int]:
        """Stored records per kind, named as the SQL ledger's tables (proof that nothing was written)."""

    @abc.abstractmethod
    def line_totals(self, start: datetime, end: datetime, grain: str = "day") -> list[LineTotal]:
        """Lines of [start, end) summed per ``grain`` bucket: "hour", "day" (UTC) or "range"."""

    def team_costs(self, start: datetime, end: datetime) -> dict[tuple[str, str], Decimal]:
        """What the lines of [start, end) bill to teams, per (team, currency): tenant and idle-share
        amounts, exact sums of the rounded lines; lines without a team or amount left out (budgets,
        docs/billing.md §4.4). The SQL ledger sums in the database."""
        totals: dict[tuple[str, str], Decimal] = defaultdict(Decimal)
        for line in self.lines(start, end):
            if line.team and line.amount is not None and line.kind in BILLED_TO_TEAMS:
                totals[(line.team, line.currency)] += line.amount
        return dict(totals)

    def billed_teams(self, start: datetime, end: datetime) -> dict[datetime, dict[str, str]]:
        """Per hour of [start, end), the team each namespace's lines were billed to, keyed as a team
        map is (`cluster/namespace`, or the namespace where the GPU has no cluster): what a re-price
        keeps unless its team map says otherwise (docs/billing.md §6.1). Lines without a team are
        left out; were one namespace's lines of an hour billed to two teams, the first by name. An
        hour may also name namespaces it did not bill (the SQL ledger names in every hour each one
        only ever billed to one team): a re-price looks up only those its facts hold."""
        teams: dict[datetime, dict[str, str]] = defaultdict(dict)
        for line in sorted(self.lines(start, end), key=lambda line: line.team):
            if line.team:
                teams[line.hour].setdefault(cluster_namespace(line.cluster, line.namespace), line.team)
        return dict(teams)

    @abc.abstractmethod
    def price_versions(self, ids: set[int]) -> dict[int, PriceVersionRecord]:
        """Stored price-book versions by id."""

    @abc.abstractmethod
    def ingest_runs(self, start: datetime, end: datetime) -> list[IngestRunRecord]:
        """Ingest runs of the hours in [start, end), oldest first (successful and failed)."""

    @abc.abstractmethod
    def audit_records(self, start: datetime | None = None, end: datetime | None = None) -> list[AuditRecord]:
        """Audit records of the hours in [start, end) (every one when not given), oldest first."""

    def currencies(self, start: datetime, end: datetime) -> set[str]:
        """The currencies the lines of [start, end) are billed in."""
        return {line.currency for line in self.lines(start, end) if line.amount is not None}

    def shared_use(self, start: datetime, end: datetime) -> list[SharedUse]:
        """Per pod, its own process use on shared GPUs over [start, end) (reports). This default reads
        the facts hour by hour; a ledger with a query language answers it in one query."""
        rows = []
        hour = start
        while hour < end:
            for gpu_hour in self.facts(hour):
                for a in gpu_hour.allocations:
                    if a.sharing in SHARED_MODES and a.process_memory is not None:
                        namespace = cluster_namespace(gpu_hour.device.cluster, a.namespace)
                        rows.append((namespace, a.pod, hour, a.process_memory, a.process_sm))
            hour += HOUR
        return shared_use_of(rows)

    def holdings(self, start: datetime, end: datetime) -> list[PodHolding]:
        """Every (pod, sharing, resource) held over [start, end), sorted (reports). This default reads
        the facts hour by hour; the SQL ledger reads the range's distinct layouts."""
        found: set[PodHolding] = set()
        hour = start
        while hour < end:
            for gpu_hour in self.facts(hour):
                cluster = gpu_hour.device.cluster
                found.update(
                    PodHolding(cluster_namespace(cluster, a.namespace), a.pod, a.sharing, a.resource)
                    for a in gpu_hour.allocations
                )
            hour += HOUR
        return sorted(found)


class ServiceLedger(LedgerStore):
    """What the service keeps beside the bills: the lock one replica holds to ingest, the report
    runs it rendered, and the namespace → team map ingest learns from Kubernetes."""

    @abc.abstractmethod
    def set_namespace_teams(self, teams: dict[str, str], source: str, now: datetime) -> None: ...

    @abc.abstractmethod
    def namespace_teams(self) -> dict[str, str]: ...

    @abc.abstractmethod
    def record_report_run(self, run: ReportRunRecord) -> int:
        """Store a rendered report (the ``id`` of ``run`` is ignored); returns its id."""

    @abc.abstractmethod
    def report_runs(self, start: datetime | None = None) -> list[ReportRunRecord]:
        """Recorded report runs (of periods starting at ``start`` when given), oldest first."""

    @abc.abstractmethod
    def acquire_lock(self, name: str, holder: str, now: datetime, ttl_seconds: int) -> bool: ...

    @abc.abstractmethod
    def release_lock(self, name: str, holder: str) -> None: ...

    @contextlib.contextmanager
    def lock(self, name: str, holder: str, now: datetime, ttl_seconds: int = 1800) -> Iterator[None]:
        """Hold the lock row for the block (LockNotAcquired: another holder has it). Freeing it is
        best effort: with the database lost, the failed release is logged in one line and the block's
        own error (or none) goes on; the row expires on its own after ``ttl_seconds``."""
        if not self.acquire_lock(name, holder, now, ttl_seconds):
            raise LockNotAcquired(name)
        try:
            yield
        finally:
            try:
                self.release_lock(name, holder)
            except LedgerError as exc:
                import logging  # here: this method is the module's only logger

                logging.getLogger(__name__).warning("%s lock left to expire: %s", name, exc)


class Ledger(IngestLedger, ReportLedger, ServiceLedger):
    """The whole ledger: each backend implements all three parts over one store. A caller that
    needs one side only may be typed with that part."""
