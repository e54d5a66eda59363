"""The monthly fleet-health report as data: utilization and maturity, incidents, reliability, RMA
candidates and waste, for a period, read from Prometheus (device series) and the ledger (teams, cost).

No rendering here (see `reports.health_render`). Definitions are in docs/reports.md §Fleet health.

Prometheus is read with raw series only: a backfilled history holds no recording-rule results for the
past, so nothing here may depend on `alerts/gpumeter-rules.yaml`. Every query is an instant query at
the period's last millisecond over a window of exactly the period (Prometheus 2 windows include both
ends, so ``[end - 1 ms - length, end - 1 ms]`` holds the samples of ``[start, end)``), or a range query
over the period where a count must be exact.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal

from gpumeter import contract, third_party
from gpumeter.billing.ledger.base import Ledger, LineTotal
from gpumeter.billing.models import LineKind
from gpumeter.billing.pricing.currency import minor_unit
from gpumeter.billing.prom import PrometheusClient, ReplicaSetClient
from gpumeter.reports.model import NO_TEAM, Period, ReportError

# --- definitions ------------------------------------------------------------------------------------

# Seed 003's GPU management maturity model, by utilization: level 1 below 30 %, 2 from 30 %, 3 from
# 50 %, 4 above 80 % (its "costs down 30 %" is not measurable from utilization and is left out),
# 5 above 90 %. The same thresholds as the capacity dashboard's "Maturity level" (dashboards/capacity.py).
MATURITY = ((0.9, 5), (0.8, 4), (0.5, 3), (0.3, 2))
UTILIZATION_GOAL = 0.8  # seed 000: from 40-50 % to about 80 %

# XID classes as the alerts class them (alerts/gpumeter-alerts.yaml, group gpumeter-xid), from NVIDIA's
# Xid catalog (docs/nvml.md §13): critical = needs a GPU reset or node reboot (the contract's list, which
# GpuXidCritical and `doctor --check` share); application = the application's fault, the GPU stays
# healthy; every other code is a hardware or driver XID.
CRITICAL_XIDS = contract.CRITICAL_XIDS
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 69})
XID_CLASSES = ("critical", "hardware", "application")
FALLEN_OFF_THE_BUS = 79
UNCORRECTABLE_ECC_XIDS = frozenset({48, 95})  # double-bit / uncontained ECC error
ROW_REMAP_FAILURE_XID = 64

# RMA thresholds (docs/nvml.md §14.3, §14.4: NVIDIA/DCGM modules/health/DcgmHealthWatch.cpp with
# common/DcgmGPUHardwareLimits.h, and NVIDIA's "RMA Policy Thresholds for Row-Remapping").
ROW_REMAP_UNCORRECTABLE_LIMIT = 512  # DCGM_LIMIT_MAX_ROW_REMAP_UNCORRECTABLE
RETIRED_PAGES_LIMIT = 63  # DCGM_LIMIT_MAX_RETIRED_PAGES: SBE + DBE pages
RETIRED_DBE_SOFT_LIMIT = 15  # more than 15 DBE pages ...
RETIRED_DBE_RECENT = 1  # ... and more than 1 of them retired in the past week
RECENT = timedelta(days=7)

# A tenant line is waste when its hour's mean utilization is below the threshold GpuAllocatedButIdle
# uses (alerts/gpumeter-alerts.yaml, group gpumeter-waste).
IDLE_BELOW = 0.05
SPARE_POLICY = 0.10  # seed 002: keep 10 % of each pool as hot spare (cluster:gpumeter_spare_policy:ratio)
THERMAL_REASONS = ("sw_thermal", "hw_thermal")
MIG_SLICES = {"A30": 4}  # compute slices of a GPU in MIG mode: 4 on an A30, 7 on the others
RANGE_STEP_S = 300  # range queries: every 5 minutes, Prometheus' default lookback, so no sample is skipped
MAX_POINTS = 11_000  # Prometheus refuses range queries of more points per series
RESET_POINTS = 2_000_000  # points fetched at most to follow counters through resets


def spare_policy(text: str) -> float:
    """A spare policy as written (`--spare-policy`, GPUMETER_REPORT_SPARE_POLICY): a share of a pool's
    GPUs, 0 to 1. ValueError otherwise, NaN and infinities included."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 <= value <= 1:
        raise ValueError(f"expected a share from 0 to 1 (value {text!r})")
    return value


def maturity_level(utilization: float | None) -> int | None:
    if utilization is None:
        return None
    return next((level for floor, level in MATURITY if utilization >= floor), 1)


def xid_class(code: int) -> str:
    if code in CRITICAL_XIDS:
        return "critical"
    if code in APPLICATION_XIDS:
        return "application"
    return "hardware"


# --- figures ------------------------------------------------------------------------------------------


@dataclass
class GpuHealth:
    """One physical GPU over the period."""

    uuid: str
    model: str
    hostname: str
    hours_up: int = 0  # hourly steps at which nvidia_gpu_up was 1
    utilization: float | None = None  # time-mean; None where not measured (A100 in MIG mode, no DCGM)
    utilization_source: str = ""  # where it comes from: UTILIZATION_SOURCES; "" where not measured
    pool: str = ""  # its node's pool label (docs/capacity.md, "Pools"); "" where the node has none
    xids: dict[int, int] = field(default_factory=dict)  # code -> events in the period
    lost_incidents: int = 0  # times nvidia_gpu_up went to 0
    lost_hours: float = 0.0
    remapped_rows: dict[str, int] = field(default_factory=dict)  # error_type -> rows remapped in the period
    remapped_uncorrected_total: float = 0.0  # at the end of the period
    remap_pending: bool = False  # at any time in the period
    remap_failure: bool = False
    retired_pages: dict[str, int] = field(default_factory=dict)  # error_type -> pages retired in the period
    retired_total: dict[str, float] = field(default_factory=dict)  # at the end of the period
    retired_uncorrected_recent: int = 0  # DBE pages retired in the last 7 days of the period
    retired_pending: bool = False
    thermal_seconds: float = 0.0  # SW + HW thermal slowdown
    cluster: str = ""  # the store's cluster label on its series; "" where the store has none

    @property
    def key(self) -> str:
        """What names the GPU in the report: its UUID, with its cluster where there is one (a UUID
        may be in two clusters)."""
        return gpu_key(self.cluster, self.uuid)

    def xid_events(self, cls: str) -> int:
        return sum(n for code, n in self.xids.items() if xid_class(code) == cls)

    @property
    def failures(self) -> int:
        """Critical XIDs, with a GPU falling off the bus counted once whether XID 79, nvidia_gpu_up
        going to 0, or both showed it."""
        critical = sum(n for code, n in self.xids.items() if code in CRITICAL_XIDS)
        off_bus = self.xids.get(FALLEN_OFF_THE_BUS, 0)
        return critical - off_bus + max(off_bus, self.lost_incidents)

    @property
    def thermal_hours(self) -> float:
        return self.thermal_seconds / 3600

    @property
    def rma_reasons(self) -> list[str]:
        """NVIDIA's criteria that this GPU met in the period (docs/nvml.md §13, §14.3, §14.4)."""
        reasons = []
        if self.remap_failure:
            reasons.append("row-remap failure (remapped_rows_failure=1): unrecoverable memory damage")
        if self.xids.get(ROW_REMAP_FAILURE_XID):
            reasons.append(
                f"XID 64 x{self.xids[ROW_REMAP_FAILURE_XID]}: row-remap or page-retirement failure"
            )
        if self.remapped_uncorrected_total >= ROW_REMAP_UNCORRECTABLE_LIMIT:
            reasons.append(
                f"{self.remapped_uncorrected_total:.0f} rows remapped for uncorrectable errors "
                f"(>= {ROW_REMAP_UNCORRECTABLE_LIMIT})"
            )
        retired = sum(self.retired_total.values())
        if retired >= RETIRED_PAGES_LIMIT:
            reasons.append(f"{retired:.0f} retired pages (SBE + DBE >= {RETIRED_PAGES_LIMIT})")
        dbe = self.retired_total.get("uncorrected", 0.0)
        if dbe > RETIRED_DBE_SOFT_LIMIT and self.retired_uncorrected_recent > RETIRED_DBE_RECENT:
            reasons.append(
                f"{dbe:.0f} DBE retired pages (> {RETIRED_DBE_SOFT_LIMIT}), "
                f"{self.retired_uncorrected_recent} in the last 7 days (> {RETIRED_DBE_RECENT})"
            )
        off_bus = max(self.xids.get(FALLEN_OFF_THE_BUS, 0), self.lost_incidents)
        if off_bus >= 2:
            reasons.append(f"fell off the bus {off_bus} times (XID 79 / GPU lost): RMA if it repeats")
        ecc = sum(self.xids.get(code, 0) for code in UNCORRECTABLE_ECC_XIDS)
        if ecc >= 2:
            reasons.append(f"uncorrectable ECC XID 48/95 x{ecc}: persists across resets")
        return reasons


@dataclass(frozen=True)
class NodeOutages:
    """A node's downtime in the period (seed 002 §4.1 counts "node downtime" beside GPU drop-offs):
    runs of 5-minute points at which none of its GPUs' ``nvidia_gpu_info`` was there, after its first
    one in the period. The node, or its exporter, did not answer (they look alike from Prometheus)."""

    hostname: str
    outages: int
    down_hours: float
    cluster: str = ""


@dataclass
class Incidents:
    """Incidents summed over GPUs (a model, a node, the fleet)."""

    gpus: int = 0
    xids: dict[str, int] = field(default_factory=lambda: dict.fromkeys(XID_CLASSES, 0))
    lost_gpus: int = 0
    lost_incidents: int = 0
    lost_hours: float = 0.0
    remapped_rows: int = 0
    retired_pages: int = 0
    pending: int = 0  # GPUs with a remap or page retirement pending at some time
    thermal_hours: float = 0.0
    hours_up: int = 0
    failures: int = 0
    utilization_sum: float = 0.0
    measured: int = 0  # GPUs whose utilization is known
    node_outages: int = 0  # times a node of the group went down (NodeOutages)
    node_down_hours: float = 0.0
    sources: dict[str, int] = field(default_factory=dict)  # utilization source -> GPUs measured by it

    def add_node(self, node: NodeOutages) -> None:
        """A node outage is a failure of the group, once per outage however many GPUs the node has:
        its GPUs were out of service together (their hours in service stop with their series)."""
        self.node_outages += node.outages
        self.node_down_hours += node.down_hours
        self.failures += node.outages

    def add(self, gpu: GpuHealth) -> None:
        self.gpus += 1
        for cls in XID_CLASSES:
            self.xids[cls] += gpu.xid_events(cls)
        self.lost_gpus += bool(gpu.lost_incidents)
        self.lost_incidents += gpu.lost_incidents
        self.lost_hours += gpu.lost_hours
        self.remapped_rows += sum(gpu.remapped_rows.values())
        self.retired_pages += sum(gpu.retired_pages.values())
        self.pending += gpu.remap_pending or gpu.retired_pending
        self.thermal_hours += gpu.thermal_hours
        self.hours_up += gpu.hours_up
        self.failures += gpu.failures
        if gpu.utilization is not None:
            self.utilization_sum += gpu.utilization
            self.measured += 1
            self.sources[gpu.utilization_source] = self.sources.get(gpu.utilization_source, 0) + 1

    @property
    def sources_text(self) -> str:
        """E.g. "nvml 2, dcgm 2": how many GPUs' figures come from each source."""
        return ", ".join(
            f"{name} {self.sources[name]}" for name in UTILIZATION_SOURCES if name in self.sources
        )

    @property
    def utilization(self) -> float | None:
        """Mean over the GPUs whose utilization is measured of each GPU's time-mean."""
        return self.utilization_sum / self.measured if self.measured else None

    @property
    def maturity(self) -> int | None:
        return maturity_level(self.utilization)

    @property
    def mtbf_hours(self) -> float | None:
        """GPU-hours in service per failure (None: no failure in the period)."""
        return self.hours_up / self.failures if self.failures else None

    @property
    def failures_per_1000_gpu_hours(self) -> float | None:
        return 1000 * self.failures / self.hours_up if self.hours_up else None

    @property
    def annualized_failure_rate(self) -> float | None:
        """Failures per GPU-year in service (8,760 h)."""
        return 8760 * self.failures / self.hours_up if self.hours_up else None


@dataclass
class PoolCapacity:
    """A pool's capacity over the period, from the ledger's hourly lines (docs/reports.md, "Pool
    capacity"): every GPU-hour billing priced is a GPU in service that hour; its tenant lines' GPU-hours
    (whole-GPU equivalents: a 3g slice of a 7-slice GPU is 3/7) are what was held. A GPU is spare in an
    hour when nothing on it was held: a GPU holding one MIG instance is not, so fragmented MIG capacity
    never counts as spare; its free slices count in the headroom."""

    policy: float  # the spare share the pool should keep
    gpu_hours: int = 0  # GPU-hours billed
    held: Decimal = Decimal(0)  # GPU-hours held by tenants
    hours: int = 0  # hours with any of the pool's GPUs billed
    spare_gpu_hours: int = 0  # over those hours, GPUs nothing was held on
    min_spare: int | None = None  # the fewest spare GPUs in any of those hours
    hours_below_policy: int = 0  # hours whose spare GPUs were under policy x the GPUs billed

    def add_hour(self, billed: int, spare: int) -> None:
        self.hours += 1
        self.spare_gpu_hours += spare
        self.min_spare = spare if self.min_spare is None else min(self.min_spare, spare)
        self.hours_below_policy += spare < self.policy * billed

    @property
    def headroom(self) -> float | None:
        """The share of the billed GPU-hours not held (fragmented MIG slices included)."""
        return 1 - float(self.held) / self.gpu_hours if self.gpu_hours else None

    @property
    def mean_spare(self) -> float | None:
        return self.spare_gpu_hours / self.hours if self.hours else None


@dataclass
class TeamHealth:
    team: str
    currency: str
    gpu_hours: Decimal = Decimal(0)
    cost: Decimal = Decimal(0)
    measured_hours: Decimal = Decimal(0)  # GPU-hours whose utilization is known
    utilization_weighted: float = 0.0
    idle_hours: Decimal = Decimal(0)  # allocated GPU-hours below IDLE_BELOW
    idle_cost: Decimal = Decimal(0)

    @property
    def utilization(self) -> float | None:
        return self.utilization_weighted / float(self.measured_hours) if self.measured_hours else None

    @property
    def maturity(self) -> int | None:
        return maturity_level(self.utilization)

    @property
    def unmeasured_hours(self) -> Decimal:
        return self.gpu_hours - self.measured_hours


@dataclass
class HealthReport:
    period: Period
    source: str  # the Prometheus URL read
    currency: str
    gpus: list[GpuHealth]
    teams: list[TeamHealth]
    node_outages: list[NodeOutages] = field(default_factory=list)
    # `pool_key` -> its capacity (the ledger's)
    capacity: dict[str, PoolCapacity] = field(default_factory=dict)
    spare_policy: float = SPARE_POLICY

    def by(self, key) -> list[tuple[str, Incidents]]:
        groups: dict[str, Incidents] = defaultdict(Incidents)
        for gpu in self.gpus:
            groups[key(gpu)].add(gpu)
        for node in self.node_outages:  # once in each group the node's GPUs are in
            on_node = (g for g in self.gpus if (g.cluster, g.hostname) == (node.cluster, node.hostname))
            for name in sorted({key(gpu) for gpu in on_node}):
                groups[name].add_node(node)
        return sorted(groups.items())

    @property
    def pools(self) -> list[tuple[str, Incidents]]:
        """A pool is what the pool rules make it (docs/capacity.md, "Pools"): the node's pool label,
        GPU feature discovery's product by default, and without it the GPU model (what the price book,
        the scheduler's node pools and MIG profiles are defined by); one cluster's, as the rules keep
        pools per (cluster, pool): two clusters' nodes of one label are two pools (`pool_key`)."""
        return self.by(lambda g: pool_key(g.cluster, g.pool or g.model))

    @property
    def nodes(self) -> list[tuple[str, Incidents]]:
        return self.by(lambda g: gpu_key(g.cluster, g.hostname))

    @property
    def clusters(self) -> list[tuple[str, Incidents]]:
        """Per cluster, where the store labels clusters; none otherwise (the report then has no cluster)."""
        return self.by(lambda g: g.cluster) if any(g.cluster for g in self.gpus) else []

    @property
    def fleet(self) -> Incidents:
        total = Incidents()
        for gpu in self.gpus:
            total.add(gpu)
        for node in self.node_outages:
            total.add_node(node)
        return total

    @property
    def rma(self) -> list[GpuHealth]:
        return [g for g in self.gpus if g.rma_reasons]

    @property
    def waste(self) -> tuple[Decimal, Decimal]:
        return sum((t.idle_hours for t in self.teams), Decimal(0)), sum(
            (t.idle_cost for t in self.teams), Decimal(0)
        )

    def money(self, value: Decimal) -> str:
        return str(value.quantize(Decimal(1).scaleb(-minor_unit(self.currency))))


# --- reading Prometheus -------------------------------------------------------------------------------


class _Window:
    """Instant queries over exactly the period, evaluated at its last millisecond."""

    def __init__(
        self,
        client: PrometheusClient | ReplicaSetClient,
        start: datetime,
        end: datetime,
        cluster_label: str = contract.CLUSTER_LABEL,
    ):
        self.client, self.start, self.end = client, start, end
        self.cluster = cluster_label  # kept in every aggregation: two clusters' GPUs never merge
        self.at = end - timedelta(milliseconds=1)
        self.seconds = int((end - start).total_seconds())
        self.range = f"[{self.seconds}s]"
        self.step = max(RANGE_STEP_S, -(-self.seconds // MAX_POINTS))  # range queries' step, seconds

    def query(self, promql: str) -> list[tuple[dict[str, str], float]]:
        return [
            (s.labels, s.value)
            for s in self.client.query(
                promql.replace("[W]", self.range).replace("[W:", f"[{self.seconds}s:"), self.at
            )
        ]

    def points(
        self, promql: str, step: int | None = None
    ) -> list[tuple[dict[str, str], list[tuple[float, float]]]]:
        step = step or self.step
        last = self.start + timedelta(seconds=((self.seconds - 1) // step) * step)
        return [
            (labels, [(float(t), float(v)) for t, v in values])
            for labels, values in self.client.query_range(promql, self.start, last, step)
        ]

    def increases(self, metric: str, matchers: str, by: tuple[str, ...]) -> dict[tuple, int | float]:
        """How much each counter grew in the period, exactly: the last value minus the value before the
        period (its last sample in the hour before; 0 for a series that starts in the period, e.g. an
        XID counter at its first event, or whose first value in the period is below it, an exporter
        restart at the boundary), and for series that reset in the period the sum of every rise over
        5-minute points (coarser when very many series reset). ``increase()`` would extrapolate to the
        window's edges and miss the first event of a new series."""
        selector = f"{metric}{{{matchers}}}"
        grouped = f"max by ({', '.join(by)})"

        def by_key(promql: str) -> dict[tuple, float]:
            return {tuple(labels.get(k, "") for k in by): value for labels, value in self.query(promql)}

        last = by_key(f"{grouped} (last_over_time({selector}[W]))")
        lowest = by_key(f"min by ({', '.join(by)}) (min_over_time({selector}[W]))")
        before = by_key(f"{grouped} (last_over_time({selector}[1h] offset {self.seconds}s))")
        out: dict[tuple, int | float] = {}
        for key, value in last.items():
            baseline = before.get(key, 0.0)
            out[key] = value - (baseline if lowest.get(key, value) >= baseline else 0.0)
        reset = [
            tuple(labels.get(k, "") for k in by)
            for labels, n in self.query(f"{grouped} (resets({selector}[W]))")
            if n > 0
        ]
        if reset:
            uuids = "|".join(sorted({key[by.index("uuid")] for key in reset}))
            narrowed = f'{metric}{{{matchers}{"," if matchers else ""}uuid=~"{uuids}"}}'
            # an exporter restart resets every counter of its node: on a large fleet keep the answer
            # under RESET_POINTS points by a coarser step (a rise within one step before a reset is lost)
            step = max(
                self.step, -(-self.seconds * len(reset) // (RESET_POINTS * RANGE_STEP_S)) * RANGE_STEP_S
            )
            for labels, points in self.points(f"{grouped} ({narrowed})", step):
                key = tuple(labels.get(k, "") for k in by)
                if key not in reset:
                    continue
                previous, total = before.get(key, 0.0), 0.0
                for _, value in points:
                    total += value - previous if value >= previous else value
                    previous = value
                out[key] = total
        return out


def gpu_key(cluster: str, name: str) -> str:
    """A GPU's (or node's) name in the report: ``cluster/name`` for one of a named cluster."""
    return f"{cluster}/{name}" if cluster else name


def pool_key(cluster: str, pool: str) -> str:
    """A pool's name in the report: ``cluster/pool`` for one of a named cluster. A pool is one
    cluster's, as the rules compute it (``pool:… by (cluster, pool)``): a spare GPU of west is no spare
    for east's workloads, so two clusters' pools of one name never merge."""
    return gpu_key(cluster, pool)


def _key(window: _Window, labels: dict[str, str], uuid: str = "uuid") -> str:
    return gpu_key(labels.get(window.cluster, ""), labels.get(uuid, ""))


def _gpus(window: _Window) -> dict[str, GpuHealth]:
    """The period's GPUs by `GpuHealth.key`."""
    gpus: dict[str, GpuHealth] = {}
    for labels, _ in window.query(f"last_over_time({contract.GPU_INFO.name}[W])"):
        uuid, key = labels.get(contract.UUID, ""), _key(window, labels)
        if uuid and key not in gpus:
            gpus[key] = GpuHealth(
                uuid,
                labels.get(contract.MODEL, ""),
                labels.get(contract.HOSTNAME, ""),
                cluster=labels.get(window.cluster, ""),
            )
    return gpus


# Where a GPU's utilization comes from: NVML's whole-GPU utilization, its MIG instances' SM utilization
# from NVML GPM (Hopper and later), or their graphics-engine activity from a dcgm-exporter beside gpumeter
# (DCGM's profiling module: the one source for A100 and A30 in MIG mode; docs/dcgm-mode.md).
UTILIZATION_SOURCES = ("nvml", "gpm", "dcgm")


def _utilization(window: _Window, gpus: dict[str, GpuHealth]) -> None:
    """Each GPU's time-mean utilization: whole GPUs from nvidia_gpu_utilization_ratio; GPUs in MIG mode
    from their instances' SM utilization (GPM, Hopper and later), else from dcgm-exporter's
    DCGM_FI_PROF_GR_ENGINE_ACTIVE of their instances where it was scraped, weighted by compute slices over
    the GPU's (slices no instance covers count as idle). With neither: not measured."""
    c = window.cluster
    for labels, value in window.query(f"max by ({c}, uuid) (avg_over_time({contract.UTILIZATION.name}[W]))"):
        gpu = gpus.get(_key(window, labels))
        if gpu is not None:
            gpu.utilization = value
            gpu.utilization_source = "nvml"
    slices = {
        (_key(window, labels), labels.get("gpu_instance_id", "")): int(
            labels.get(contract.COMPUTE_SLICES, "0") or 0
        )
        for labels, _ in window.query(f"last_over_time({contract.MIG_INFO.name}[W])")
    }
    dcgm = third_party.DCGM_UTILIZATION.name
    for source, promql in (
        (
            "gpm",
            f"max by ({c}, uuid, gpu_instance_id) (avg_over_time({contract.MIG_SM_UTILIZATION.name}[W]))",
        ),
        # dcgm-exporter's UUID and GPU_I_ID are gpumeter's uuid and gpu_instance_id
        ("dcgm", f'max by ({c}, UUID, GPU_I_ID) (avg_over_time({dcgm}{{GPU_I_ID!=""}}[W]))'),
    ):
        mig: dict[str, float] = defaultdict(float)
        for labels, value in window.query(promql):
            key = (
                _key(window, labels, "uuid" if "uuid" in labels else "UUID"),
                labels.get("gpu_instance_id", labels.get("GPU_I_ID", "")),
            )
            mig[key[0]] += value * slices.get(key, 0)
        for uuid, weighted in mig.items():
            gpu = gpus.get(uuid)
            if gpu is not None and gpu.utilization is None:
                capacity = next((n for name, n in MIG_SLICES.items() if name in gpu.model), 7)
                gpu.utilization = weighted / capacity
                gpu.utilization_source = source


def _pools(window: _Window, gpus: dict[str, GpuHealth]) -> None:
    """Each GPU's pool: the pool node label its node last had in the period, as kube-state-metrics
    exports it (kube_node_labels, the label uuid:gpumeter_pool:info reads)."""
    label = third_party.KUBE_NODE_LABELS.labels[1]
    by_node = {
        (labels.get(window.cluster, ""), labels.get("node", "")): labels[label]
        for labels, _ in window.query(
            f'last_over_time({third_party.KUBE_NODE_LABELS.name}{{{label}!=""}}[W])'
        )
        if labels.get(label)
    }
    for gpu in gpus.values():
        gpu.pool = by_node.get((gpu.cluster, gpu.hostname), "")
    # Before the label: a GPU of an NVLink domain that spans nodes (an NVL72 rack) pools with its domain,
    # "nvlink-<cluster UUID>", as uuid:gpumeter_pool:info does (docs/capacity.md, "Pools"). A domain is
    # one cluster's: the same domain UUID in two clusters is two pools.
    c = window.cluster
    domain_of = {
        _key(window, labels): (labels.get(c, ""), labels[contract.NVLINK_DOMAIN])
        for labels, _ in window.query(
            f"group by ({c}, uuid, {contract.NVLINK_DOMAIN}) (last_over_time({contract.FABRIC_INFO.name}[W]))"
        )
        if labels.get(contract.NVLINK_DOMAIN) and _key(window, labels) in gpus
    }
    hosts: dict[tuple[str, str], set[str]] = {}
    for key, domain in domain_of.items():
        hosts.setdefault(domain, set()).add(gpus[key].hostname)
    for key, domain in domain_of.items():
        if len(hosts[domain]) > 1:
            gpus[key].pool = f"nvlink-{domain[1]}"


def _lost(window: _Window, gpus: dict[str, GpuHealth]) -> None:
    """Runs of 5-minute points at which nvidia_gpu_up was 0: one run, one incident."""
    for labels, points in window.points(f"max by ({window.cluster}, uuid) ({contract.GPU_UP.name}) == 0"):
        gpu = gpus.get(_key(window, labels))
        if gpu is None or not points:
            continue
        runs = 1 + sum(1 for a, b in itertools.pairwise(points) if b[0] - a[0] > window.step)
        gpu.lost_incidents += runs
        gpu.lost_hours += len(points) * window.step / 3600


def read_node_outages(
    client: PrometheusClient | ReplicaSetClient, period: Period, cluster_label: str = contract.CLUSTER_LABEL
) -> list[NodeOutages]:
    """Each node's runs of 5-minute points without any of its GPUs' ``nvidia_gpu_info``, from its first
    point in the period to the period's last (a node that joined later was not down before it; one
    that stops answering and does not come back is down to the end). Lost hours = points x 5 min."""
    window = _Window(client, period.start, period.end, cluster_label)
    last = (window.start + timedelta(seconds=((window.seconds - 1) // window.step) * window.step)).timestamp()
    outages = []
    for labels, points in window.points(
        f"count by ({cluster_label}, {contract.HOSTNAME}) ({contract.GPU_INFO.name})"
    ):
        hostname = labels.get(contract.HOSTNAME, "")
        if not hostname or not points:
            continue
        times = [t for t, _ in points]
        gaps = [round((b - a) / window.step) - 1 for a, b in itertools.pairwise([*times, last + window.step])]
        down = [n for n in gaps if n > 0]
        if down:
            cluster = labels.get(cluster_label, "")
            outages.append(NodeOutages(hostname, len(down), sum(down) * window.step / 3600, cluster))
    return sorted(outages, key=lambda n: (n.cluster, n.hostname))


def _flags(window: _Window, metric: str) -> set[str]:
    return {
        _key(window, labels)
        for labels, v in window.query(f"max by ({window.cluster}, uuid) (max_over_time({metric}[W]))")
        if v >= 1
    }


def read_devices(
    client: PrometheusClient | ReplicaSetClient, period: Period, cluster_label: str = contract.CLUSTER_LABEL
) -> list[GpuHealth]:
    """Every GPU of the period with its figures; in a store labelling clusters, a GPU per (cluster,
    uuid): every aggregation keeps the cluster, so two clusters' GPUs never merge."""
    window = _Window(client, period.start, period.end, cluster_label)
    c = cluster_label
    gpus = _gpus(window)

    def increases(metric: str, matchers: str, label: str, of: _Window = window):
        """`_Window.increases` per (GPU key, ``label``)."""
        for (cluster, uuid, value), n in of.increases(metric, matchers, (c, "uuid", label)).items():
            gpu = gpus.get(gpu_key(cluster, uuid))
            if gpu is not None:
                yield gpu, value, n

    for labels, hours in window.query(
        f"count_over_time((max by ({c}, uuid) ({contract.GPU_UP.name}) == 1)[W:1h])"
    ):
        if (gpu := gpus.get(_key(window, labels))) is not None:
            gpu.hours_up = int(hours)
    _utilization(window, gpus)
    _pools(window, gpus)
    _lost(window, gpus)
    for gpu, xid, n in increases(contract.XID_ERRORS.name, "", "xid"):
        if n > 0:
            gpu.xids[int(xid)] = gpu.xids.get(int(xid), 0) + round(n)
    for gpu, error_type, n in increases(contract.REMAPPED_ROWS.name, "", "error_type"):
        if n > 0:
            gpu.remapped_rows[error_type] = round(n)
    for gpu, error_type, n in increases(contract.RETIRED_PAGES.name, "", "error_type"):
        if n > 0:
            gpu.retired_pages[error_type] = round(n)
    recent = _Window(client, max(period.start, period.end - RECENT), period.end, cluster_label)
    for gpu, _error_type, n in increases(
        contract.RETIRED_PAGES.name, 'error_type="uncorrected"', "error_type", recent
    ):
        gpu.retired_uncorrected_recent = round(n)
    for labels, value in window.query(
        f"max by ({c}, uuid, error_type) (last_over_time({contract.RETIRED_PAGES.name}[W]))"
    ):
        if (gpu := gpus.get(_key(window, labels))) is not None:
            gpu.retired_total[labels.get("error_type", "")] = value
    for labels, value in window.query(
        f'max by ({c}, uuid) (last_over_time({contract.REMAPPED_ROWS.name}{{error_type="uncorrected"}}[W]))'
    ):
        if (gpu := gpus.get(_key(window, labels))) is not None:
            gpu.remapped_uncorrected_total = value
    for key in _flags(window, contract.REMAPPED_ROWS_PENDING.name) & gpus.keys():
        gpus[key].remap_pending = True
    for key in _flags(window, contract.REMAPPED_ROWS_FAILURE.name) & gpus.keys():
        gpus[key].remap_failure = True
    for key in _flags(window, contract.RETIRED_PAGES_PENDING.name) & gpus.keys():
        gpus[key].retired_pending = True
    reasons = "|".join(THERMAL_REASONS)
    for gpu, _reason, seconds in increases(
        contract.CLOCKS_EVENT_SECONDS.name, f'reason=~"{reasons}"', "reason"
    ):
        gpu.thermal_seconds += seconds
    return sorted(gpus.values(), key=lambda g: (g.cluster, g.model, g.hostname, g.uuid))


# --- reading the ledger -------------------------------------------------------------------------------


def read_ledger(
    ledger: Ledger, period: Period, pool_of: dict[str, str] | None = None, policy: float = SPARE_POLICY
) -> tuple[str, list[TeamHealth], dict[str, PoolCapacity]]:
    """One pass over the period's hourly lines. Per team, from its tenant lines: GPU-hours and cost
    held, utilization where it is known, and the waste: GPU-hours of lines whose hour's utilization was
    below IDLE_BELOW, and what they cost. Per pool (``pool_of``: GPU UUID -> pool, for the GPUs
    Prometheus saw; a GPU it did not see pools by the price book's model name its lines carry), its
    capacity (PoolCapacity), keyed by `pool_key`: a pool is one cluster's. A GPU is named by its
    `gpu_key` (its cluster too, where lines have one)."""
    pool_of = pool_of or {}
    teams: dict[str, TeamHealth] = {}
    capacity: dict[str, PoolCapacity] = {}
    currencies: set[str] = set()
    for day in _days(ledger, period):
        held: dict[tuple[datetime, str], Decimal] = {}  # (hour, GPU) -> GPU-hours held; billed if here
        pools: dict[str, str] = {}  # GPU -> `pool_key`
        for line in day:
            gpu = gpu_key(line.cluster, line.uuid)
            key = (line.bucket, gpu)
            held.setdefault(key, Decimal(0))
            pools.setdefault(gpu, pool_key(line.cluster, pool_of.get(gpu) or line.model))
            if line.kind != LineKind.TENANT or line.amount is None:
                continue
            held[key] += line.quantity
            currencies.add(line.currency)
            team = teams.setdefault(line.team or NO_TEAM, TeamHealth(line.team or NO_TEAM, ""))
            team.gpu_hours += line.quantity
            team.cost += line.amount
            if line.utilization_quantity:
                team.measured_hours += line.utilization_quantity
                team.utilization_weighted += line.utilization_weighted
                if line.utilization_weighted / float(line.utilization_quantity) < IDLE_BELOW:
                    team.idle_hours += line.quantity
                    team.idle_cost += line.amount
        by_hour: dict[tuple[datetime, str], list[int]] = defaultdict(lambda: [0, 0])  # billed, spare
        for (hour, gpu), quantity in held.items():
            pool = pools[gpu]
            pool_capacity = capacity.setdefault(pool, PoolCapacity(policy))
            pool_capacity.gpu_hours += 1
            pool_capacity.held += quantity
            counts = by_hour[(hour, pool)]
            counts[0] += 1
            counts[1] += quantity == 0
        for (_hour, pool), (billed, spare) in sorted(by_hour.items()):
            capacity[pool].add_hour(billed, spare)
    if len(currencies) > 1:
        raise ReportError(f"ledger: lines in several currencies in one period (value {sorted(currencies)!r})")
    currency = currencies.pop() if currencies else "USD"
    for team in teams.values():
        team.currency = currency
    return currency, sorted(teams.values(), key=lambda t: (-t.idle_cost, t.team)), capacity


def _days(ledger: Ledger, period: Period) -> Iterator[list[LineTotal]]:
    """The period's hourly lines, a day at a time: a month of a large fleet is millions of lines, and
    only their sums are kept."""
    day = period.start
    while day < period.end:
        until = min(day + timedelta(days=1), period.end)
        yield ledger.line_totals(day, until, "hour")
        day = until


def build_health(
    client: PrometheusClient | ReplicaSetClient,
    ledger: Ledger,
    period: Period,
    spare_policy: float = SPARE_POLICY,
    cluster_label: str = contract.CLUSTER_LABEL,
) -> HealthReport:
    devices = read_devices(client, period, cluster_label)
    outages = read_node_outages(client, period, cluster_label)
    pool_of = {g.key: g.pool or g.model for g in devices}
    currency, teams, capacity = read_ledger(ledger, period, pool_of, spare_policy)
    return HealthReport(period, client.base_url, currency, devices, teams, outages, capacity, spare_policy)
