"""Hourly ingest: PromQL aggregates of one closed hour → ledger facts → priced lines (docs/billing.md §6).

All queries of an hour run before anything is written; the hour's facts and lines are then replaced
in one transaction, so a Prometheus error or a crash commits no facts or lines.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from billing.allocate import price_gpu_hour
from billing.ledger.base import HourRecord, Ledger
from billing.models import HOUR, Allocation, Device, GpuHour, MigInstance, hour_floor, hours_between
from billing.pricing.base import PriceBook
from billing.prom import PrometheusClient, PrometheusError

log = logging.getLogger(__name__)

ALLOC_LABELS = "hostname,namespace,pod,container,resource,uuid,gpu,gpu_instance_id,mig_profile"
# `max by (kept labels)` drops prometheus_replica/replica/instance/job: HA replicas de-duplicated by max.
QUERIES = {
    "alloc_count": f"max by ({ALLOC_LABELS}) (count_over_time(nvidia_gpu_allocation[1h]))",
    "alloc_share": f"max by ({ALLOC_LABELS}) (avg_over_time(nvidia_gpu_allocation[1h]))",
    "gpu_count": "max by (uuid,gpu,model,hostname,mig_mode) (count_over_time(nvidia_gpu_info[1h]))",
    "mig_count": "max by (uuid,gpu_instance_id,mig_profile,compute_slices,memory_slices) "
    "(count_over_time(nvidia_gpu_mig_info[1h]))",
    "gpu_util": "max by (uuid) (avg_over_time(nvidia_gpu_utilization_ratio[1h]))",
    "mig_util": "max by (uuid,gpu_instance_id) (avg_over_time(nvidia_gpu_mig_sm_utilization_ratio[1h]))",
    "teams": "max by (namespace,label_team) (last_over_time(kube_namespace_labels[1h]))",
}
_MIG_ON = {"enabled", "enable", "1", "true", "yes", "on"}
_RATIO = Decimal("0.000000001")
DEFAULT_INTERVAL = 30


@dataclass
class IngestConfig:
    scrape_interval: float = 30.0  # seconds per sample (docs/billing.md §2.1); 0 = detect per hour
    gap_grace_intervals: int = 2
    catchup_hours: int = 168
    settle: timedelta = timedelta(minutes=2)  # an hour is closed this long after its end
    teams: dict[str, str] = field(default_factory=dict)  # from the team map file; wins over kube


@dataclass
class IngestResult:
    ingested: list[datetime] = field(default_factory=list)
    failed: list[tuple[datetime, str]] = field(default_factory=list)
    unpriced_gpu_hours: int = 0


def seconds_from_count(count: float, config: IngestConfig) -> int:
    """Sample count → seconds: count × interval, bridged to 3600 near the full hour, capped at 3600."""
    seconds = count * config.scrape_interval
    if seconds >= 3600 - config.gap_grace_intervals * config.scrape_interval:
        return 3600
    return max(0, min(3600, round(seconds)))


def _ratio(value: float) -> Decimal:
    return Decimal(repr(value)).quantize(_RATIO)


def collect_hour(
    client: PrometheusClient, hour: datetime, config: IngestConfig
) -> tuple[list[GpuHour], dict[str, str]]:
    """Query Prometheus for one hour; returns the GPU-hours and the kube namespace→team labels."""
    at = hour + HOUR - timedelta(milliseconds=1)  # [1h] then covers exactly [hour, hour+1h)
    results = {name: client.query(promql, at) for name, promql in QUERIES.items()}

    if config.scrape_interval <= 0:  # "auto": the densest GPU series of the hour had one sample per interval
        densest = max((s.value for s in results["gpu_count"]), default=0.0)
        interval = max(1, round(3600 / densest)) if densest else DEFAULT_INTERVAL
        config = replace(config, scrape_interval=float(interval))
        log.debug("hour %s: detected scrape interval %ss", hour.isoformat(), interval)

    devices: dict[str, dict] = {}
    for sample in results["gpu_count"]:
        labels = sample.labels
        entry = devices.setdefault(labels.get("uuid", ""), {"count": 0.0, "best": (-1.0, labels)})
        entry["count"] += sample.value  # label changes inside the hour split one GPU over series
        if sample.value > entry["best"][0]:
            entry["best"] = (sample.value, labels)
    gpu_util = {s.labels.get("uuid", ""): _ratio(s.value) for s in results["gpu_util"]}
    mig_util = {
        (s.labels.get("uuid", ""), s.labels.get("gpu_instance_id", "")): _ratio(s.value)
        for s in results["mig_util"]
    }

    hours: dict[str, GpuHour] = {}
    for uuid, entry in devices.items():
        labels = entry["best"][1]
        device = Device(
            uuid=uuid,
            model=labels.get("model", ""),
            present_seconds=seconds_from_count(entry["count"], config),
            hostname=labels.get("hostname", ""),
            gpu=labels.get("gpu", ""),
            mig_mode=labels.get("mig_mode", "").lower() in _MIG_ON,
            utilization=gpu_util.get(uuid),
        )
        hours[uuid] = GpuHour(hour, device)

    for sample in results["mig_count"]:
        labels = sample.labels
        uuid, gi = labels.get("uuid", ""), labels.get("gpu_instance_id", "")
        if uuid not in hours:
            continue  # a layout without its device: nothing to price it against
        try:
            compute, memory = int(labels.get("compute_slices", "")), int(labels.get("memory_slices", ""))
        except ValueError:
            log.warning("MIG instance %s/%s without slice counts; skipped", uuid, gi)
            continue
        hours[uuid].instances.append(
            MigInstance(
                uuid,
                gi,
                labels.get("mig_profile", ""),
                compute,
                memory,
                seconds_from_count(sample.value, config),
                mig_util.get((uuid, gi)),
            )
        )

    shares = {tuple(sorted(s.labels.items())): s.value for s in results["alloc_share"]}
    for sample in results["alloc_count"]:
        labels = sample.labels
        uuid, gi = labels.get("uuid", ""), labels.get("gpu_instance_id", "")
        seconds = seconds_from_count(sample.value, config)
        if uuid not in hours:  # allocated but the device was never seen: priced as an unknown model
            hours[uuid] = GpuHour(
                hour, Device(uuid, "", seconds, labels.get("hostname", ""), labels.get("gpu", ""))
            )
        share = shares.get(tuple(sorted(labels.items())), 1.0)
        hours[uuid].allocations.append(
            Allocation(
                uuid=uuid,
                namespace=labels.get("namespace", ""),
                pod=labels.get("pod", ""),
                container=labels.get("container", ""),
                allocated_seconds=seconds,
                share=_ratio(share),
                gpu_instance_id=gi,
                mig_profile=labels.get("mig_profile", ""),
                resource=labels.get("resource", ""),
                hostname=labels.get("hostname", ""),
                utilization=mig_util.get((uuid, gi)) if gi else gpu_util.get(uuid),
            )
        )
    teams = {
        s.labels["namespace"]: s.labels["label_team"]
        for s in results["teams"]
        if s.labels.get("namespace") and s.labels.get("label_team")
    }
    return [hours[u] for u in sorted(hours)], teams


def ingest_hour(
    client: PrometheusClient,
    ledger: Ledger,
    book: PriceBook,
    hour: datetime,
    config: IngestConfig,
) -> int:
    """Ingest and price one closed hour; returns the number of unpriced GPU-hours. Raises PrometheusError."""
    hour = hour_floor(hour)
    started = datetime.now(UTC)
    try:
        gpu_hours, kube_teams = collect_hour(client, hour, config)
    except PrometheusError as exc:
        log.error("ingest of %s failed: %s", hour.isoformat(), exc)
        ledger.record_failure(hour, str(exc), source=client.base_url, started_at=started)
        raise
    teams = {**ledger.namespace_teams(), **kube_teams, **config.teams}
    priced = [price_gpu_hour(gh, book, teams) for gh in gpu_hours]
    lines = [line for p in priced for line in p.lines]
    ledger.write_hour(HourRecord(hour, gpu_hours, lines, book), source=client.base_url, started_at=started)
    ledger.set_namespace_teams(kube_teams, "kube", started)
    return sum(1 for p in priced if p.device_cost is None)


def ingest_hours(
    client: PrometheusClient,
    ledger: Ledger,
    book: PriceBook,
    hours: Iterable[datetime],
    config: IngestConfig,
    progress: Callable[[Iterable], Iterable] | None = None,
) -> IngestResult:
    """Ingest hours in order; stops at the first Prometheus error (later hours would fail too)."""
    result = IngestResult()
    hours = list(hours)
    for hour in progress(hours) if progress else hours:
        try:
            result.unpriced_gpu_hours += ingest_hour(client, ledger, book, hour, config)
        except PrometheusError as exc:
            result.failed.append((hour, str(exc)))
            break
        result.ingested.append(hour)
    return result


def missing_hours(ledger: Ledger, now: datetime, config: IngestConfig) -> list[datetime]:
    """Closed hours of the catch-up window without a successful ingest, oldest first."""
    end = hour_floor(now - config.settle)
    start = end - timedelta(hours=config.catchup_hours)
    done = ledger.ingested_hours(start, end)
    return [h for h in hours_between(start, end) if h not in done]


def catch_up(client, ledger, book, now: datetime, config: IngestConfig, progress=None) -> IngestResult:
    return ingest_hours(client, ledger, book, missing_hours(ledger, now, config), config, progress)


def reprice(ledger: Ledger, book: PriceBook, start: datetime, end: datetime, teams: dict[str, str]) -> int:
    """Re-price stored facts (e.g. after a price-book change); returns the number of hours re-priced."""
    count = 0
    merged = {**ledger.namespace_teams(), **teams}
    for hour in hours_between(start, end):
        facts = ledger.facts(hour)
        if facts:
            ledger.replace_lines(
                hour, [line for gh in facts for line in price_gpu_hour(gh, book, merged).lines], book
            )
            count += 1
    return count
