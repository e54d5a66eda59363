"""How the cost of each shared GPU-hour was split among its holders, and each GPU's node and
presence per grain bucket, read from the stored facts (FOCUS 1.3's allocation columns and origin
charges, reports.focus)."""

from __future__ import annotations

import operator
import threading
from collections import defaultdict
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import orjson

from gpumeter import contract
from gpumeter.billing.ledger.base import Ledger, PodHolding
from gpumeter.billing.ledger.layouts import ALLOCATION_LAYOUT, holdings_of, parse_layout, stored_bodies
from gpumeter.billing.models import Allocation, cluster_namespace
from gpumeter.reports.period import HOUR, Period

ZERO = Decimal(0)


@dataclass(frozen=True)
class Holding:
    """How one holder's part of a shared GPU-hour was split (FOCUS 1.3 allocation, reports.focus):
    its sharing mode as pricing read it, and the figures the split took."""

    mode: str  # contract.SHARING_MIG, _TIME_SLICING, _MPS, _FRACTIONAL or _VGPU
    share: Decimal
    memory_share: Decimal | None = None  # a fractional grant's fractions
    compute_share: Decimal | None = None
    compute_slices: int = 0  # of its MIG instance
    replica: str = ""  # a MIG instance shared by replicas: their mode
    process_use: bool = False  # its unit's replicas reported process use (sharing_split: usage applies)


HoldingKey = tuple[str, str, str, str, str]  # (uuid, gpu_instance_id, namespace, pod, container)
Holdings = AbstractSet[Holding]  # a holder's distinct holdings of a bucket (kept once: `_scan_rows`)
PRESENCE_QUANTUM = Decimal("0.000001")  # pricing's quantity quantum (billing.allocate.QUANTITY_QUANTUM)


@dataclass(slots=True)
class GpuBucket:
    """One GPU over one grain bucket, from the stored facts: the node and index that name it, and the
    GPU-hours it was present (each hour's present seconds / 3600 to pricing's quantum, summed): the
    quantity of the FOCUS origin charge (reports.focus)."""

    hostname: str = ""
    index: str = ""
    present: Decimal = ZERO


def _replica_mode(a: Allocation) -> str:
    """The replica mode of a holding, as pricing reads it (billing/allocate.py `_replica_mode`)."""
    if a.sharing in (contract.SHARING_TIME_SLICING, contract.SHARING_MPS, contract.SHARING_VGPU):
        return a.sharing
    if a.sharing:
        return ""
    return contract.SHARING_TIME_SLICING if a.share < 1 or a.resource.endswith(".shared") else ""


def read_splits(
    ledger: Ledger,
    period: Period,
    grain: str = "day",
    gpus: dict[tuple[datetime, str, str], GpuBucket] | None = None,
    stop: threading.Event | None = None,
) -> dict[datetime, dict[HoldingKey, set[Holding]]]:
    """Per ``grain`` bucket of ``period`` (an hour or a UTC day), the distinct holdings of every holder
    of a GPU-hour whose cost was split among holders (MIG instances, replicas, fractional grants,
    vGPUs); a GPU held whole by one holder is no split. Read from the stored facts hour by hour; kept
    per bucket, as the report's charges are, so a month by day holds a day's worth of holders. With
    ``gpus``, fills in each GPU's `GpuBucket` (by bucket, cluster and UUID) from the same pass over the
    facts. A holder of a named cluster is keyed `cluster/namespace`, as the report's charges name it."""
    out: dict[datetime, dict[HoldingKey, set[Holding]]] = {}
    hour = period.start
    while hour < period.end:
        if stop is not None and stop.is_set():
            raise ScanStopped
        start = hour if grain == "hour" else hour.replace(hour=0)
        bucket = out.setdefault(start, {})
        for gpu_hour in ledger.facts(hour):
            if gpus is not None:
                device = gpu_hour.device
                gpu = gpus.setdefault((start, device.cluster, device.uuid), GpuBucket())
                gpu.hostname, gpu.index = device.hostname or gpu.hostname, device.gpu or gpu.index
                seconds = max(0, min(device.present_seconds, 3600))
                gpu.present += (Decimal(seconds) / 3600).quantize(PRESENCE_QUANTUM)
            slices = {i.gpu_instance_id: i.compute_slices for i in gpu_hour.instances}
            used: dict[str, bool] = defaultdict(
                bool
            )  # per unit (MIG instance or whole GPU): replicas' process use
            for a in gpu_hour.allocations:
                if _replica_mode(a) and ((a.process_sm or 0) > 0 or (a.process_memory or 0) > 0):
                    used[a.gpu_instance_id] = True
            for a in gpu_hour.allocations:
                replica = _replica_mode(a)
                if a.gpu_instance_id:
                    mode = contract.SHARING_MIG
                elif a.sharing == contract.SHARING_FRACTIONAL:
                    mode = contract.SHARING_FRACTIONAL
                elif replica:
                    mode, replica = replica, ""
                else:
                    continue  # a whole GPU held alone
                namespace = cluster_namespace(gpu_hour.device.cluster, a.namespace)
                key = (a.uuid, a.gpu_instance_id, namespace, a.pod, a.container)
                bucket.setdefault(key, set()).add(
                    Holding(
                        mode,
                        a.share,
                        a.memory_share,
                        a.compute_share,
                        slices.get(a.gpu_instance_id, 0),
                        replica,
                        used[a.gpu_instance_id],
                    )
                )
        hour += HOUR
    return {bucket: held for bucket, held in out.items() if held}


_AT = {name: ALLOCATION_LAYOUT.index(name) for name in ALLOCATION_LAYOUT}


@dataclass
class FactScan:
    """What a report reads of the period's stored facts: the splits and GPUs (`read_splits`; None
    where not asked for) and every pod's holdings (`Ledger.holdings`)."""

    splits: Mapping[datetime, Mapping[HoldingKey, Holdings]] | None
    gpus: dict[tuple[datetime, str, str], GpuBucket] | None
    holdings: list[PodHolding]


class ScanStopped(Exception):
    """The fact scan was asked to stop (`scan_facts`' ``stop``): the report reading it failed."""


def scan_facts(
    ledger: Ledger, period: Period, grain: str, *, splits: bool, stop: threading.Event | None = None
) -> FactScan:
    """The splits, GPUs and holdings of ``period``. A SQL ledger's GPU-hours are summed per bucket
    and GPU by the database, and only those of layouts with replicas read row by row (`_scan_rows`),
    each distinct layout parsed once (a month of 10,000 GPUs is 7.2 million GPU-hours: restoring each
    as objects, hour by hour, took most of a report's time); any other ledger's hour by hour
    (`read_splits`, `Ledger.holdings`). ScanStopped at the next chunk of rows (or hour) once ``stop``
    is set: the scan runs beside the report's other read (`build_report`)."""
    stop = stop or threading.Event()
    engine = getattr(ledger, "engine", None)
    if engine is None:
        gpus: dict[tuple[datetime, str, str], GpuBucket] | None = {} if splits else None
        held = read_splits(ledger, period, grain, gpus, stop) if splits else None
        return FactScan(held, gpus, ledger.holdings(period.start, period.end))
    if not splits:
        return FactScan(None, None, ledger.holdings(period.start, period.end))
    return _scan_rows(engine, period, grain, stop)


class _Layout:
    """A stored layout as splits read it: its holders' figures, and which replicas' readings say
    whether their unit reported process use."""

    def __init__(self, body: str) -> None:
        parsed = parse_layout(body)
        self.held = holdings_of(parsed)
        slices = {values[0]: values[2] for values in parsed["instances"]}
        self.holders: list[tuple[Any, ...]] = []
        self.replicas: list[tuple[int, str]] = []  # (position in readings, unit)
        for position, values in enumerate(parsed["allocations"]):
            a = dict(zip(ALLOCATION_LAYOUT, values, strict=True))
            share = Decimal(a["share"])
            probe = Allocation(
                uuid="",
                namespace="",
                pod="",
                container="",
                allocated_seconds=0,
                share=share,
                sharing=a["sharing"],
                resource=a["resource"],
            )
            replica = _replica_mode(probe)
            if replica:
                self.replicas.append((position, a["gpu_instance_id"]))
            if a["gpu_instance_id"]:
                mode = contract.SHARING_MIG
            elif a["sharing"] == contract.SHARING_FRACTIONAL:
                mode = contract.SHARING_FRACTIONAL
            elif replica:
                mode, replica = replica, ""
            else:
                continue  # a whole GPU held alone
            self.holders.append(
                (
                    a["gpu_instance_id"],
                    a["namespace"],
                    a["pod"],
                    a["container"],
                    mode,
                    share,
                    None if a["memory_share"] is None else Decimal(a["memory_share"]),
                    None if a["compute_share"] is None else Decimal(a["compute_share"]),
                    slices.get(a["gpu_instance_id"], 0),
                    replica,
                )
            )

    def used(self, readings: str | None) -> frozenset[str]:
        """The units (MIG instance, or "" for the GPU) whose replicas reported process use."""
        if not self.replicas or not readings:
            return frozenset()
        measured = orjson.loads(readings)[1]
        return frozenset(
            unit
            for position, unit in self.replicas
            if any(v is not None and Decimal(v) > 0 for v in measured[position][1:3])
        )


LAYOUTS_KEPT = 20_000  # parsed layouts of a generation (`_scan_rows`)


def _scan_rows(engine: Any, period: Period, grain: str, stop: threading.Event) -> FactScan:
    """`scan_facts` of a SQL ledger, in two reads. The database sums each GPU's bucket (its node, its
    presence, the layouts it held: `frames.gpu_bucket_rows`), from which every holder of a layout
    without replicas is known; only the GPU-hours of layouts with replicas are read one by one, since
    whether a replica's unit reported process use is in each hour's readings (`_Layout.used`)."""
    from gpumeter.billing.ledger import frames  # the ledger's bulk readers

    out: dict[datetime, dict[HoldingKey, frozenset[Holding]]] = {}
    gpus: dict[tuple[datetime, str, str], GpuBucket] = {}
    layouts = _Layouts(engine)
    with_replicas: set[int] = set()  # layouts whose holders' holdings depend on each hour's readings
    held: set[tuple[str, int]] = set()
    pods: set[PodHolding] = set()
    buckets: dict[int, datetime] = {}
    step = 3600 if grain == "hour" else 86400
    holders = _Holders()

    def bucket_of(start: int) -> datetime:
        bucket = buckets.get(start)
        if bucket is None:
            bucket = buckets[start] = datetime.fromtimestamp(start, UTC)
            out[bucket] = {}
        return bucket

    for part in frames.gpu_bucket_rows(engine, period.start, period.end, step):
        if stop.is_set():
            raise ScanStopped
        held_ids = [[int(i) for i in ids.split(",")] if ids else [] for *_, ids in part]
        layouts.load(i for ids in held_ids for i in ids)
        for (start, cluster, uuid, hostname, index, present, _), ids in zip(part, held_ids, strict=True):
            bucket = bucket_of(start)
            gpus[(bucket, cluster, uuid)] = GpuBucket(hostname, index, present * PRESENCE_QUANTUM)
            for layout_id in ids:
                layout = layouts[layout_id]
                if (cluster, layout_id) not in held:
                    held.add((cluster, layout_id))
                    pods.update(
                        PodHolding(cluster_namespace(cluster, namespace), pod, sharing, resource)
                        for namespace, pod, sharing, resource in layout.held
                    )
                if layout.replicas:
                    with_replicas.add(layout_id)
                elif layout.holders:
                    holders.add(out[bucket], cluster, uuid, layout, frozenset())
        layouts.turn()
    if with_replicas:
        seen: set[tuple[Any, ...]] = set()  # of the bucket being read
        last = None
        for part in frames.gpu_hour_rows(engine, period.start, period.end, with_replicas):
            if stop.is_set():
                raise ScanStopped
            layouts.load(row[6] for row in part)
            for epoch, cluster, uuid, _, _, _, layout_id, readings in part:
                start = epoch - epoch % step
                if start != last:
                    seen.clear()  # a new bucket: the ones before it are done
                    last = start
                layout = layouts[layout_id]
                used = layout.used(readings)
                if (start, cluster, uuid, layout_id, used) in seen:
                    continue  # this GPU's holders of this bucket are already in
                seen.add((start, cluster, uuid, layout_id, used))
                holders.add(out[bucket_of(start)], cluster, uuid, layout, used)
            layouts.turn()
    # in PodHolding's order (its fields in turn), compared as tuples, not through the dataclass's __lt__
    ordered = sorted(pods, key=operator.attrgetter("namespace", "pod", "sharing", "resource"))
    return FactScan({b: h for b, h in out.items() if h}, gpus, ordered)


class _Layouts:
    """The stored layouts parsed, in two generations: rows come in time order, and a layout a GPU held
    on one day is seldom held again weeks later (a month of 10,000 GPUs has ~300,000 layouts, ~0.9 GiB
    parsed at once); one not met for a generation is read again if it comes back."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.now: dict[int, _Layout] = {}
        self.older: dict[int, _Layout] = {}

    def load(self, ids: Iterable[int]) -> None:
        """Have every layout of ``ids`` at hand: kept from the generation before, or read."""
        missing = {i for i in ids if i not in self.now}
        for layout_id in missing & self.older.keys():
            self.now[layout_id] = self.older[layout_id]
        with self.engine.connect() as connection:
            bodies = stored_bodies(connection, missing - self.older.keys())
        for layout_id, body in bodies.items():
            self.now[layout_id] = _Layout(body)

    def __getitem__(self, layout_id: int) -> _Layout:
        return self.now[layout_id]

    def turn(self) -> None:
        """After a chunk of rows: a full generation becomes the older one."""
        if len(self.now) > LAYOUTS_KEPT:
            self.older, self.now = self.now, {}


class _Holders:
    """Adds a GPU's holders of a layout to a bucket's. A month of 10,000 GPUs has ~1 million holders'
    keys over few distinct holdings: each set of holdings (a holding alone, or one joined to a set)
    and cluster's namespace is kept once and named by every key that has it."""

    def __init__(self) -> None:
        self.alone: dict[Holding, frozenset[Holding]] = {}
        self.joined: dict[tuple[frozenset[Holding], Holding], frozenset[Holding]] = {}
        self.names: dict[tuple[str, str], str] = {}

    def add(
        self,
        into: dict[HoldingKey, frozenset[Holding]],
        cluster: str,
        uuid: str,
        layout: _Layout,
        used: frozenset[str],
    ) -> None:
        alone, joined, names = self.alone, self.joined, self.names
        for gi, namespace, pod, container, mode, share, memory, compute, slices, replica in layout.holders:
            named = names.get((cluster, namespace))
            if named is None:
                named = names[(cluster, namespace)] = cluster_namespace(cluster, namespace)
            key = (uuid, gi, named, pod, container)
            holding = Holding(mode, share, memory, compute, slices, replica, gi in used)
            had = into.get(key)
            if had is None:
                single = alone.get(holding)
                if single is None:
                    single = alone[holding] = frozenset((holding,))
                into[key] = single
            elif holding not in had:
                both = joined.get((had, holding))
                if both is None:
                    both = joined[(had, holding)] = had | {holding}
                into[key] = both
