"""The chargeback report as data: built from the ledger for a period, grouped by one dimension.

No rendering here (see `reports.render`). Money is `Decimal` throughout: every figure is a sum of the
ledger's rounded lines, so nothing is rounded again (docs/billing.md §5). Utilization and the
utilization-tier efficiency are report-only ratios and are carried as floats.
"""

from __future__ import annotations

import functools
import hashlib
import threading
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import TYPE_CHECKING

from gpumeter import contract
from gpumeter.billing.config import Budget
from gpumeter.billing.ledger.base import (
    AuditRecord,
    Ledger,
    LineTotal,
    PriceVersionRecord,
    RefusedGpuHour,
    SharedUse,
)
from gpumeter.billing.models import (
    PLATFORM_KINDS,
    PLATFORM_NAMES,
    LineKind,
    QuantityUnit,
)
from gpumeter.billing.pricing.currency import minor_unit

# the periods and the splits live in their own modules; their names stay importable from here
from gpumeter.reports.period import FIRST_YEAR as FIRST_YEAR
from gpumeter.reports.period import HOUR as HOUR
from gpumeter.reports.period import LAST_YEAR as LAST_YEAR
from gpumeter.reports.period import Period as Period
from gpumeter.reports.period import ReportError as ReportError
from gpumeter.reports.period import last_month as last_month
from gpumeter.reports.period import month_period as month_period
from gpumeter.reports.period import range_period as range_period
from gpumeter.reports.period import utc_text
from gpumeter.reports.splits import PRESENCE_QUANTUM as PRESENCE_QUANTUM
from gpumeter.reports.splits import FactScan, scan_facts
from gpumeter.reports.splits import GpuBucket as GpuBucket
from gpumeter.reports.splits import Holding as Holding
from gpumeter.reports.splits import HoldingKey as HoldingKey
from gpumeter.reports.splits import Holdings as Holdings
from gpumeter.reports.splits import read_splits as read_splits
from gpumeter.reports.sums_worker import SumsWorker, sums_apart

if TYPE_CHECKING:
    import pandas as pd

CLAIM_PREFIX = contract.CLAIM_RESOURCE_PREFIX

DIMENSIONS = ("team", "namespace", "model", "mig_profile", "cluster")
GROUPINGS_EXPECTED = f"expected one of {', '.join(DIMENSIONS)} or label:KEY"  # `Grouping.parse`'s refusal
TENANT_KINDS = (LineKind.TENANT, LineKind.IDLE_SHARE)

NO_TEAM, WHOLE_GPU, NO_LABEL, NO_CLUSTER = "(no team)", "(whole GPU)", "(none)", "(no cluster)"
ZERO = Decimal(0)


# --- grouping -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Grouping:
    """A report dimension: team, namespace, model (GPU model), mig_profile, cluster, or label:KEY."""

    name: str
    labels: dict[str, dict[str, str]] = field(default_factory=dict, compare=False)  # namespace -> labels

    @classmethod
    def parse(cls, text: str, labels: dict[str, dict[str, str]] | None = None) -> Grouping:
        aliases = {
            "gpu_model": "model",
            "gpu-model": "model",
            "mig-profile": "mig_profile",
            "profile": "mig_profile",
        }
        name = aliases.get(text, text)
        if name not in DIMENSIONS and not (name.startswith("label:") and len(name) > 6):
            raise ReportError(f"by: {GROUPINGS_EXPECTED} (value {text!r})")
        return cls(name, labels or {})

    @property
    def title(self) -> str:
        if self.name.startswith("label:"):
            return f"label {self.name[6:]}"
        return {
            "team": "team",
            "namespace": "namespace",
            "model": "GPU model",
            "mig_profile": "MIG profile",
            "cluster": "cluster",
        }[self.name]

    def key(self, line: LineTotal) -> str:
        if self.name == "team":
            return line.team or NO_TEAM
        if self.name == "namespace":
            return line.namespace
        if self.name == "model":
            return line.model
        if self.name == "mig_profile":
            return line.mig_profile or WHOLE_GPU
        if self.name == "cluster":
            return line.cluster or NO_CLUSTER
        label = self.name[6:]
        labels = self.labels.get(line.namespace)
        if labels is None and line.cluster:  # `cluster/namespace` (one cluster's), else the name's
            labels = self.labels.get(line.namespace.removeprefix(f"{line.cluster}/"))
        value = (labels or {}).get(label)
        if value is None and label == "team":
            value = line.team
        return value or NO_LABEL


# --- figures --------------------------------------------------------------------------------------


@dataclass
class Usage:
    """Sums over lines: cost (Decimal), GPU-hours (whole-GPU equivalents), slice-hours, utilization."""

    cost: Decimal = ZERO
    idle_share: Decimal = ZERO  # part of cost spread from idle capacity (idle: spread)
    gpu_hours: Decimal = ZERO
    slice_hours: Decimal = ZERO
    lines: int = 0
    _u_w: float = 0.0
    _u_q: Decimal = ZERO
    _e_w: float = 0.0
    _e_q: Decimal = ZERO

    def add(self, line: LineTotal, slice_hours: Decimal) -> None:
        self.lines += line.lines
        if line.amount is not None:
            self.cost += line.amount
            if line.kind == LineKind.IDLE_SHARE:
                self.idle_share += line.amount
        if line.kind == LineKind.IDLE_SHARE:
            return  # its quantity is idle capacity, not usage
        self.gpu_hours += line.quantity
        self.slice_hours += slice_hours
        self._u_w += line.utilization_weighted
        self._u_q += line.utilization_quantity
        self._e_w += line.efficiency_weighted
        self._e_q += line.efficiency_quantity

    @property
    def utilization(self) -> float | None:
        """Mean utilization, weighted by GPU-hours, over the lines where it is known."""
        return self._u_w / float(self._u_q) if self._u_q else None

    @property
    def efficiency(self) -> float | None:
        """Mean utilization-tier efficiency score (price book's utilizationTiers), weighted by GPU-hours."""
        return self._e_w / float(self._e_q) if self._e_q else None

    @property
    def unit_cost(self) -> Decimal | None:
        return (self.cost / self.gpu_hours) if self.gpu_hours else None


@dataclass
class Change:
    previous: Decimal | None
    delta: Decimal | None
    ratio: float | None  # delta / previous

    @classmethod
    def of(cls, now: Decimal, before: Decimal | None) -> Change:
        if before is None:
            return cls(None, None, None)
        delta = now - before
        return cls(before, delta, float(delta / before) if before else None)


@dataclass
class PodRow:
    namespace: str
    pod: str
    team: str
    models: list[str]
    profiles: list[str]
    usage: Usage
    # its own processes' use on the shared GPUs it held (time-sliced, MPS, fractional), where the
    # exporter's processes collector reported it (docs/billing.md §3.5); None otherwise
    shared: SharedUse | None = None
    sharing: list[str] = field(default_factory=list)  # how it held GPUs (contract.SHARING_MODES)
    claims: list[str] = field(default_factory=list)  # the DRA ResourceClaims it held them through


@dataclass
class SharingRow:
    """One way GPUs were held in the period (``sharing``), and by which pods."""

    sharing: str
    pods: list[tuple[str, str]]  # (namespace, pod), sorted


@dataclass
class ClaimRow:
    """A DRA ResourceClaim pods held GPUs through (docs/pod-attribution.md §8a)."""

    namespace: str
    claim: str
    sharing: list[str]
    pods: list[str]


@dataclass
class GroupRow:
    key: str
    usage: Usage
    change: Change
    namespaces: list[tuple[str, Usage]] = field(default_factory=list)
    models: list[tuple[str, str, Usage]] = field(default_factory=list)  # (model, profile, usage)
    top_pods: list[PodRow] = field(default_factory=list)
    daily: dict[date, Decimal] = field(default_factory=dict)


@dataclass
class PlatformRow:
    kind: str  # a key of PLATFORM_NAMES: unallocated | stranded | sharing_shortfall | utilization_shortfall
    namespace: str
    usage: Usage
    change: Change


@dataclass
class UnpricedRow:
    model: str
    gpu_hours: Decimal
    gpus: int
    cluster: str = ""  # in `Report.unpriced_by_cluster`: the cluster of its lines (empty elsewhere)


@dataclass
class IngestSummary:
    hours_in_period: int
    hours_ingested: int
    missing: list[tuple[datetime, datetime]]  # ranges [start, end) without a successful run
    runs_used: int
    failed_runs: int
    first_run_id: int | None
    last_run_id: int | None
    digest: str  # sha256 over "id:hour" of the runs whose lines the report used
    # GPU-hours a refused reading left unbilled, still outstanding (docs/billing.md §6.5): their hours
    # are billed but for them, so the report names each, as `billing status` does
    refused: list[RefusedGpuHour] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {
            "hours_in_period": self.hours_in_period,
            "hours_ingested": self.hours_ingested,
            "missing_hours": [[utc_text(a), utc_text(b)] for a, b in self.missing],
            "runs_used": self.runs_used,
            "failed_runs": self.failed_runs,
            "first_run_id": self.first_run_id,
            "last_run_id": self.last_run_id,
            "digest": self.digest,
        }

    def refused_dicts(self) -> list[dict]:
        return [
            {"hour": utc_text(r.hour), "cluster": r.cluster or "", "uuid": r.uuid, "reason": r.reason}
            for r in self.refused
        ]


@dataclass(frozen=True)
class BilledChange:
    """One command's changes to hours of the period that were billed before it ran: a re-price or a
    re-ingest, from the ledger's audit (docs/billing.md §6.6). A report read after it differs from one
    read before, and says so: who, when, why, how many hours, the total before and after."""

    at: datetime  # when its first change was written
    command: str
    operator: str
    reason: str
    hours: int
    old_total: Decimal
    new_total: Decimal
    currency: str

    def as_dict(self) -> dict:
        # the totals of rounded hourly lines (docs/billing.md §5): exact in the currency's minor unit
        unit = Decimal(1).scaleb(-minor_unit(self.currency))
        return {
            "at": utc_text(self.at),
            "command": self.command,
            "operator": self.operator,
            "reason": self.reason,
            "hours": self.hours,
            "old_total": str(self.old_total.quantize(unit)),
            "new_total": str(self.new_total.quantize(unit)),
            "currency": self.currency,
        }


def billed_changes(records: list[AuditRecord], clusters: tuple[str, ...] = ()) -> list[BilledChange]:
    """The audit records of a period, one row per run that wrote them (per currency), oldest first.
    With ``clusters`` (a `--cluster` report), their records only, and those written before the audit
    named clusters (revision 0015), whose totals are the hour's over every cluster."""
    runs: dict[tuple[str, str], list[AuditRecord]] = {}
    for record in sorted(records, key=lambda r: r.id):
        if clusters and record.cluster is not None and record.cluster not in clusters:
            continue
        runs.setdefault((record.run, record.currency), []).append(record)
    return [
        BilledChange(
            at=group[0].at if group[0].at.tzinfo else group[0].at.replace(tzinfo=UTC),
            command=group[0].command,
            operator=group[0].operator,
            reason=group[0].reason,
            hours=len({r.hour for r in group}),
            old_total=sum((r.old_total for r in group), ZERO),
            new_total=sum((r.new_total for r in group), ZERO),
            currency=currency,
        )
        for (_run, currency), group in runs.items()
    ]


@dataclass
class BudgetRow:
    """A team's monthly budget against what its lines of the month cost (docs/billing.md §4.4):
    tenant and idle-share lines, whatever the report's grouping."""

    team: str
    budget: Decimal | None  # None: a team billed this month without a budget
    actual: Decimal

    @property
    def remaining(self) -> Decimal | None:
        return None if self.budget is None else self.budget - self.actual

    @property
    def used(self) -> float | None:
        return None if self.budget is None else float(self.actual / self.budget)

    @property
    def over(self) -> bool:
        return self.budget is not None and self.actual > self.budget


@dataclass
class Report:
    period: Period
    previous_period: Period
    grouping: Grouping
    currency: str
    grain: str
    groups: list[GroupRow]
    platform: list[PlatformRow]
    unpriced: list[UnpricedRow]
    total: Usage  # every priced line
    tenants: Usage  # tenant + idle_share lines
    total_change: Change
    tenants_change: Change
    top_pods: list[PodRow]
    daily: list[tuple[date, dict[str, Decimal]]]  # day -> {group key or platform namespace: cost}
    price_versions: list[PriceVersionRecord]
    ingest: IngestSummary
    # the ledger lines summed per grain bucket, sorted (bucket first): FOCUS and detail CSV. Made as
    # they are read (reports.grouped.Charges): a month of 10,000 GPUs is ~1 million of them
    charges: Sequence[LineTotal]
    # per pod billed in the period, its own use on the shared GPUs it held (not the devices'), by cost
    shared_use: list[PodRow] = field(default_factory=list)
    # how GPUs were held (every sharing mode met in the period) and the DRA claims they were held through
    sharing_modes: list[SharingRow] = field(default_factory=list)
    claims: list[ClaimRow] = field(default_factory=list)
    # budget against actual per team; empty unless budgets were given and the period is a month
    budgets: list[BudgetRow] = field(default_factory=list)
    # per charge bucket, the holdings of the GPU-hours whose cost was split (read_splits); None: not read
    splits: Mapping[datetime, Mapping[HoldingKey, Holdings]] | None = None
    # changes to the period's billed hours after they were first billed (re-prices, re-ingests)
    billed_changes: list[BilledChange] = field(default_factory=list)
    # per (charge bucket, cluster, GPU uuid), the GPU's node, index and presence (read with splits);
    # None: not read
    gpus: dict[tuple[datetime, str, str], GpuBucket] | None = None
    # per cluster, what its lines cost (tenants and platform): empty where the store has no cluster
    # label, and then no report shows a cluster anywhere (their bytes are as before clusters)
    # (a cluster whose GPUs are all unpriced too, costing nothing: its GPU-hours are in
    # `unpriced_by_cluster`)
    clusters: list[tuple[str, Usage]] = field(default_factory=list)
    only_clusters: tuple[str, ...] = ()  # --cluster: the clusters the report was limited to
    # the unpriced GPU-hours per (model, cluster), where the lines name clusters (else empty)
    unpriced_by_cluster: list[UnpricedRow] = field(default_factory=list)

    @property
    def has_clusters(self) -> bool:
        return bool(self.clusters)

    @property
    def cluster_unpriced(self) -> dict[str, Decimal]:
        """Per cluster, its unpriced GPU-hours (none: not in it)."""
        out: dict[str, Decimal] = defaultdict(Decimal)
        for row in self.unpriced_by_cluster:
            out[row.cluster] += row.gpu_hours
        return dict(out)

    @property
    def exponent(self) -> int:
        return minor_unit(self.currency)

    def money(self, value: Decimal | None) -> str:
        return money_text(value, self.exponent)

    def version_label(self, version_id: int | None) -> str:
        for v in self.price_versions:
            if v.id == version_id:
                return version_label(v)
        return ""

    def rate(self, line: LineTotal) -> Decimal | None:
        for v in self.price_versions:
            if v.id == line.price_version_id:
                rate = v.body.get("rates", {}).get(line.model)
                return Decimal(rate) if rate is not None else None
        return None

    @staticmethod
    def slices(line: LineTotal) -> Decimal:
        """The slice-hours a tenant's charge held, as its lines state them (docs/billing.md §4): read,
        never recomputed."""
        if line.kind in TENANT_KINDS and line.held_unit == QuantityUnit.SLICE_HOUR:
            return line.held
        return ZERO

    @property
    def group_keys(self) -> list[str]:
        return [g.key for g in self.groups]


def money_text(value: Decimal | None, exponent: int) -> str:
    """An amount as the report's files write it: to the currency's minor unit; empty for none."""
    if value is None:
        return ""
    return str(value.quantize(Decimal(1).scaleb(-exponent)))


def version_label(version: PriceVersionRecord) -> str:
    """``<digest[:12]>@<effective_from>``: names a price-book version in every format."""
    return f"{version.digest[:12]}@{version.effective_from.strftime('%Y-%m-%dT%H:%M:%SZ')}"


# --- building -------------------------------------------------------------------------------------


def _missing_ranges(period: Period, have: set[datetime]) -> list[tuple[datetime, datetime]]:
    out: list[tuple[datetime, datetime]] = []
    hour = period.start
    while hour < period.end:
        if hour not in have:
            if out and out[-1][1] == hour:
                out[-1] = (out[-1][0], hour + HOUR)
            else:
                out.append((hour, hour + HOUR))
        hour += HOUR
    return out


def _ingest_summary(ledger: Ledger, period: Period, clusters: tuple[str, ...] = ()) -> IngestSummary:
    """The runs the report's lines come from; ``clusters``: --cluster, whose refused GPU-hours alone
    are named (a run is the whole store's hour)."""
    runs = ledger.ingest_runs(period.start, period.end)
    latest_ok: dict[datetime, int] = {}
    failed = 0
    for run in runs:
        if run.status in contract.INGEST_DONE:
            latest_ok[run.hour] = max(run.id, latest_ok.get(run.hour, 0))
        elif run.status == contract.INGEST_FAILED:  # an "empty" run is a retry to come, not a failure
            failed += 1
    used = sorted((run_id, hour) for hour, run_id in latest_ok.items())
    digest = hashlib.sha256("\n".join(f"{i}:{utc_text(h)}" for i, h in used).encode()).hexdigest()
    return IngestSummary(
        hours_in_period=period.hours,
        hours_ingested=len(latest_ok),
        missing=_missing_ranges(period, set(latest_ok)),
        runs_used=len(used),
        failed_runs=failed,
        first_run_id=used[0][0] if used else None,
        last_run_id=used[-1][0] if used else None,
        digest=digest,
        refused=[
            r
            for r in ledger.refused_gpu_hours(period.start, period.end)
            if not clusters or (r.cluster or "") in clusters
        ],
    )


def build_report(
    ledger: Ledger,
    period: Period,
    grouping: Grouping | str = "team",
    *,
    grain: str = "day",
    top: int = 10,
    compare: bool = True,
    budgets: Mapping[str, Budget] | None = None,
    splits: bool = True,
    clusters: tuple[str, ...] = (),
    sums_process: bool | None = None,
    sums: SumsWorker | None = None,
) -> Report:
    """Read the ledger for ``period`` (and the previous period for the change) into a Report;
    with ``budgets`` (team → monthly budget) and a month, budget against actual per team; with
    ``splits``, how the cost of each shared GPU-hour was split (FOCUS 1.3 reads it); with
    ``clusters``, the lines of those clusters alone. ``sums_process``: whether the lines are summed
    by a process of their own (default: where the ledger and the period make it worth it); ``sums``:
    that process, started by the caller for this period, grain and comparison (`sums_apart`), which
    then closes it (`reports.run.generate` has it write the lines CSV too)."""
    if isinstance(grouping, str):
        grouping = Grouping.parse(grouping)
    if grain not in ("hour", "day"):
        raise ReportError(f"grain: expected hour or day (value {grain!r})")
    # The reads of the period side by side: the fact scan, then the shared GPUs' use, in a thread
    # beside the line sums, so on two cores the report waits for the longer of the two. The sums are
    # the database's, but the scan is mostly Python, and SQLite's work is done in this process: on a
    # SQLite file and a large period the sums are made by a process of their own
    # (`reports.sums_worker`) while this one scans. A report that fails stops the scan at its next
    # chunk and kills the sums' process, rather than waiting either out.
    from gpumeter.billing.ledger import frames  # pandas: paid for by a report, not by the CLI's start

    previous = period.previous() if compare else None
    apart = sums_apart(ledger, period, grain, previous, sums_process) if sums is None else nullcontext(sums)
    with apart as worker:
        read_lines: Callable[[], pd.DataFrame]
        read_previous: Callable[[], pd.DataFrame] | None
        if worker is not None:
            read_lines = worker.lines
            read_previous = None if previous is None else worker.previous_lines
        else:
            read_lines = functools.partial(frames.line_frame, ledger, period.start, period.end, grain)
            read_previous = (
                None
                if previous is None
                else functools.partial(frames.line_frame, ledger, previous.start, previous.end, "range")
            )
        stop = threading.Event()
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="report-facts") as pool:
            scan = pool.submit(scan_facts, ledger, period, grain, splits=splits, stop=stop)
            shared = pool.submit(ledger.shared_use, period.start, period.end)
            try:
                return _build_report(
                    ledger,
                    period,
                    grouping,
                    grain,
                    top,
                    budgets,
                    clusters,
                    read_lines,
                    read_previous,
                    scan.result,
                    shared.result,
                )
            finally:
                stop.set()
                shared.cancel()


def _build_report(
    ledger: Ledger,
    period: Period,
    grouping: Grouping,
    grain: str,
    top: int,
    budgets: Mapping[str, Budget] | None,
    clusters: tuple[str, ...],
    read_lines: Callable[[], pd.DataFrame],
    read_previous: Callable[[], pd.DataFrame] | None,
    read_facts: Callable[[], FactScan],
    read_shared: Callable[[], list[SharedUse]],
) -> Report:
    """`build_report`'s work: the period's line frame read by ``read_lines``, the previous period's
    totals by ``read_previous`` (None: no comparison), its facts by ``read_facts`` and the shared
    GPUs' use by ``read_shared``, each where it is needed."""
    from gpumeter.billing.ledger import frames  # pandas: paid for by a report, not by the CLI's start
    from gpumeter.reports import grouped

    compare = read_previous is not None
    lines = read_lines()
    if clusters:  # a misspelt cluster would report $0: name the ones the period's lines have
        known = sorted(set(lines["cluster"].astype(object).unique()) - {""})
        unknown = [c for c in clusters if c not in known]
        if unknown:
            raise ReportError(
                f"cluster: no line of {period.label} is in cluster {unknown[0]!r}; the period's clusters: "
                f"{', '.join(known) or 'none (the store had no cluster label)'} (value {unknown[0]!r})"
            )
    frame = grouped.charges(grouped.name_clusters(lines, clusters))
    del lines
    charges = grouped.Charges(frame)
    charged_versions = {int(v) for v in frame["price_version_id"].dropna().unique()}
    charged_currencies = set(frame.loc[frame["amount"].notna(), "currency"])
    # the columns the tables below group by and sum, alone: each filter below copies what it keeps
    # (~1 million charges for 10,000 GPUs), and the charges keep their own columns (`Charges`)
    frame = frame[list(grouped.SUMMED)]

    priced = frame[frame["priced_line"]]
    tenant = priced[priced["tenant"]].copy()
    platform_lines = priced[~priced["tenant"]]
    tenant["group"] = grouped.group_keys(tenant, grouping.key)
    total = grouped.usage_all(priced, Usage)
    tenants = grouped.usage_all(tenant, Usage)
    by_cluster = grouped.usage_by(priced[priced["cluster"] != ""], ["cluster"], Usage)
    groups = grouped.usage_by(tenant, ["group"], Usage)
    group_ns: dict[str, dict[str, Usage]] = defaultdict(dict)
    for (key, namespace), usage in grouped.usage_by(tenant, ["group", "namespace"], Usage).items():
        group_ns[key][namespace] = usage
    group_models: dict[str, dict[tuple[str, str], Usage]] = defaultdict(dict)
    for (key, model, profile), usage in grouped.usage_by(
        tenant, ["group", "model", "profile"], Usage
    ).items():
        group_models[key][(model, profile)] = usage
    group_daily: dict[str, dict[date, Decimal]] = defaultdict(dict)
    daily: dict[date, dict[str, Decimal]] = defaultdict(dict)
    for (key, day), cost in grouped.money_by(tenant, ["group", "day"]).items():
        group_daily[key][day] = cost
        daily[day][key] = cost
    platform_daily = platform_lines.assign(
        name=[
            PLATFORM_NAMES.get(k, ns)
            for k, ns in zip(platform_lines["kind"], platform_lines["namespace"], strict=True)
        ]
    )
    for (day, name), cost in grouped.money_by(platform_daily, ["day", "name"]).items():
        daily[day][name] = daily[day].get(name, ZERO) + cost
    shared = {(u.namespace, u.pod): u for u in read_shared()}
    by_group = grouping.name in ("team", "namespace") or grouping.name.startswith("label:")
    pods = grouped.pods(tenant, top=top, shared=set(shared), group_key=grouping.key if by_group else None)
    platform: dict[str, Usage] = defaultdict(Usage, grouped.usage_by(platform_lines, ["kind"], Usage))
    unpriced: dict[str, tuple[Decimal, int]] = {}
    unpriced_by_cluster: list[UnpricedRow] = []
    missing = frame[~frame["priced_line"]]
    if not missing.empty:
        hours = missing.groupby("model", sort=True)["quantity"].sum()
        # a GPU is (cluster, uuid): two clusters' GPUs of one UUID are two GPUs (docs/billing.md §2.3)
        gpus = missing[["model", "cluster", "uuid"]].drop_duplicates().groupby("model").size()
        for model in hours.index:
            unpriced[model] = (Decimal(int(hours[model])) * frames.QUANTITY_UNIT, int(gpus[model]))
        if (missing["cluster"] != "").any():  # lines naming clusters: each cluster's unpriced GPUs
            keys = ["model", "cluster"]
            in_cluster = missing.groupby(keys, sort=True, observed=True)["quantity"].sum()
            gpus_in = (
                missing[["model", "cluster", "uuid"]].drop_duplicates().groupby(keys, observed=True).size()
            )
            unpriced_by_cluster = [
                UnpricedRow(
                    str(model),
                    Decimal(int(quantity)) * frames.QUANTITY_UNIT,
                    int(gpus_in[(model, cluster)]),
                    str(cluster),
                )
                for (model, cluster), quantity in in_cluster.items()
            ]
    team_actual = grouped.money_by(tenant[tenant["team"] != ""], ["team"])
    del frame, priced, tenant, platform_lines, platform_daily, missing

    # the previous period, read last: the sums' worker makes it after this period's lines
    # (`reports.sums_worker`). In columns too, a row a term: its totals are all the comparison reads
    previous_period = period.previous()
    previous = grouped.before(
        grouped.name_clusters(
            read_previous() if read_previous is not None else frames.from_totals([]),
            clusters,
        ),
        grouping.key,
    )
    versions = ledger.price_versions(charged_versions | previous.version_ids)
    currencies = sorted(charged_currencies) or sorted({v.currency for v in versions.values()})
    if len(currencies) > 1:
        raise ReportError(f"ledger: lines in several currencies in one period (value {currencies!r})")
    currency = currencies[0] if currencies else "USD"
    before_groups: dict[str, Decimal] = defaultdict(Decimal, previous.groups)
    before_platform: dict[str, Decimal] = defaultdict(Decimal, previous.platform)
    before_total, before_tenants = previous.total, previous.tenants
    has_previous = compare and previous.had_lines

    def change(now: Decimal, before: Decimal) -> Change:
        return Change.of(now, before if has_previous else None)

    facts = read_facts()
    holdings = facts.holdings
    if clusters:  # the named clusters' holders (the ledger names them `cluster/namespace`)
        prefixes = tuple(f"{c}/" for c in clusters)
        holdings = [h for h in holdings if h.namespace.startswith(prefixes)]
    held_as: dict[tuple[str, str], set[str]] = defaultdict(set)
    held_through: dict[tuple[str, str], set[str]] = defaultdict(set)
    by_mode: dict[str, set[tuple[str, str]]] = defaultdict(set)
    by_claim: dict[tuple[str, str], tuple[set[str], set[str]]] = {}
    shown = pods.figures.keys()  # the pods whose rows say how they held their GPUs
    for h in holdings:
        pod = (h.namespace, h.pod)
        if pod in shown:
            held_as[pod].add(h.sharing)
        by_mode[h.sharing].add(pod)
        if h.resource.startswith(CLAIM_PREFIX):
            claim = h.resource.removeprefix(CLAIM_PREFIX)
            if pod in shown:
                held_through[pod].add(claim)
            modes, holders = by_claim.setdefault((h.namespace, claim), (set(), set()))
            modes.add(h.sharing)
            holders.add(h.pod)

    def pod_row(pod: tuple[str, str]) -> PodRow:
        return PodRow(
            pod[0],
            pod[1],
            pods.teams[pod],
            sorted(pods.models[pod]),
            sorted(pods.profiles[pod]),
            grouped.usage_of(pods.figures[pod], Usage),
            shared.get(pod),
            sorted(held_as.get(pod, ())),
            sorted(held_through.get(pod, ())),
        )

    per_group_pods = {key: [pod_row(p) for p in listed] for key, listed in pods.per_group.items()}
    rows = []
    for key in sorted(groups, key=lambda k: (-groups[k].cost, k)):
        usage = groups[key]
        rows.append(
            GroupRow(
                key=key,
                usage=usage,
                change=change(usage.cost, before_groups.get(key, ZERO)),
                namespaces=sorted(group_ns[key].items(), key=lambda kv: (-kv[1].cost, kv[0])),
                models=[
                    (m, p, u)
                    for (m, p), u in sorted(group_models[key].items(), key=lambda kv: (-kv[1].cost, kv[0]))
                ],
                top_pods=per_group_pods.get(key, []),
                daily=dict(sorted(group_daily[key].items())),
            )
        )
    # groups that existed before but not now still show their drop
    for key in sorted(set(before_groups) - set(groups)):
        rows.append(GroupRow(key=key, usage=Usage(), change=change(ZERO, before_groups[key])))

    platform_rows = [
        PlatformRow(
            kind, PLATFORM_NAMES[kind], platform[kind], change(platform[kind].cost, before_platform[kind])
        )
        for kind in PLATFORM_KINDS
        if kind in platform or before_platform.get(kind)
    ]
    return Report(
        period=period,
        previous_period=previous_period,
        grouping=grouping,
        currency=currency,
        grain=grain,
        groups=rows,
        platform=platform_rows,
        unpriced=[UnpricedRow(m, h, n) for m, (h, n) in sorted(unpriced.items())],
        total=total,
        tenants=tenants,
        total_change=change(total.cost, before_total),
        tenants_change=change(tenants.cost, before_tenants),
        top_pods=[pod_row(p) for p in pods.top],
        daily=[(day, dict(sorted(daily.get(day, {}).items()))) for day in period.days()],
        price_versions=[versions[i] for i in sorted(versions) if i in charged_versions],
        ingest=_ingest_summary(ledger, period, clusters),
        charges=charges,
        shared_use=[pod_row(p) for p in pods.shared],
        sharing_modes=[
            SharingRow(mode, sorted(by_mode[mode]))
            for mode in (*contract.SHARING_MODES, *sorted(set(by_mode) - set(contract.SHARING_MODES)))
            if mode in by_mode
        ],
        claims=[
            ClaimRow(namespace, claim, sorted(modes), sorted(holders))
            for (namespace, claim), (modes, holders) in sorted(by_claim.items())
        ],
        budgets=budget_rows(charges, budgets or {}, currency, team_actual) if period.is_month else [],
        billed_changes=billed_changes(ledger.audit_records(period.start, period.end), tuple(clusters)),
        splits=facts.splits,
        gpus=facts.gpus,
        # a cluster whose GPUs are all unpriced is one too, costing nothing
        clusters=sorted(
            {**{u.cluster: Usage() for u in unpriced_by_cluster if u.cluster}, **by_cluster}.items(),
            key=lambda kv: (-kv[1].cost, kv[0]),
        ),
        only_clusters=tuple(clusters),
        unpriced_by_cluster=unpriced_by_cluster,
    )


def budget_rows(
    charges: list[LineTotal],
    budgets: Mapping[str, Budget],
    currency: str,
    actual: Mapping[str, Decimal] | None = None,
) -> list[BudgetRow]:
    """Every team with a budget, and every team billed without one, by team name; nothing when no
    team has a budget. Lines without a team count for none (they appear as "(no team)" elsewhere).
    ``actual``: what the charges bill each team, where the caller has summed it already."""
    if not budgets:
        return []
    for team, budget in sorted(budgets.items()):
        if budget.currency != currency:  # never compare amounts of two currencies
            raise ReportError(
                f"budgets.{team}.currency: the ledger's lines of the period are in {currency} (value {budget.currency!r})"
            )
    if actual is None:
        summed: dict[str, Decimal] = defaultdict(Decimal)
        for c in charges:
            if c.kind in TENANT_KINDS and c.team and c.amount is not None:
                summed[c.team] += c.amount
        actual = summed
    return [
        BudgetRow(team, budgets[team].amount if team in budgets else None, actual.get(team, ZERO))
        for team in sorted(set(budgets) | set(actual))
    ]
