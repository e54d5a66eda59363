"""Hourly ingest: PromQL aggregates of one closed hour → ledger facts → priced lines (docs/billing.md §6).

All queries of an hour run before anything is written; the hour's facts and lines are then replaced
in one transaction, so a Prometheus error or a crash commits no facts or lines.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import gc
import itertools
import logging
import multiprocessing
import operator
import os
import statistics
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import TypeVar

from gpumeter import contract
from gpumeter.billing import queries
from gpumeter.billing.ledger.base import SHARED_MODES, HourRecord, Ledger, LedgerError
from gpumeter.billing.ledger.layouts import LayoutKey, layout_key
from gpumeter.billing.models import (
    HOUR,
    Allocation,
    Device,
    GpuHour,
    MigInstance,
    Readings,
    SteadyGpuHour,
    hour_floor,
    hours_between,
    is_reserved_name,
    team_map_over,
    teams_in_cluster,
    with_fields,
)
from gpumeter.billing.pricer import PricedLines, Pricer
from gpumeter.billing.pricing.base import PriceBook
from gpumeter.billing.prom import (
    BadAnswer,
    PrometheusError,
    PrometheusUnreachable,
    QueryClient,
    RangeAnswer,
    Sample,
    open_client,
)
from gpumeter.billing.refusals import Refused, refusal_text, screen_values

log = logging.getLogger(__name__)
_Fact = TypeVar("_Fact", Device, MigInstance, Allocation)
# Hours that failed or were refused: the service's log keeps them; `billing ingest` states each itself
# in one line on stderr and silences this logger (FAILURES_LOGGER), so none is said twice.
FAILURES_LOGGER = f"{__name__}.failures"
failures = logging.getLogger(FAILURES_LOGGER)

# The PromQL of docs/billing.md §6, built from the metric contract's declarations of the series: each
# sent per series, and reduced to `max by (KEEP[name])` here (`_columns`, §2.2).
QUERIES = {name: query.promql() for name, query in queries.BILLING_QUERIES.items()}
KEEP = {name: query.by for name, query in queries.BILLING_QUERIES.items()}
# the answers whose values repeat hour after hour and series after series (`_columns`)
REPEATED = {
    name
    for name, query in queries.BILLING_QUERIES.items()
    if query.function == "count_over_time"
    or query.series in (contract.ALLOCATION, contract.ALLOCATION_MEMORY, contract.ALLOCATION_COMPUTE)
}
_ALLOC_KEYS = queries.BILLING_QUERIES["alloc_count"].by
ALLOC_LABELS = ",".join(_ALLOC_KEYS)
_MIG_ON = {"enabled", "enable", "1", "true", "yes", "on"}
_RATIO = Decimal("0.000000001")

# What an answer's values may be before they become money (docs/billing.md §6.5); an answer with any
# other value (negative, NaN, infinite, past its range) is refused with its hour, never billed.
# A sample count: at most what an hour holds at the finest scrape interval billing accepts (1 s; the
# [1h] window closed at both ends in Prometheus 2 holds one more).
MAX_SAMPLES_AN_HOUR = 3601.0
# bytes a process can hold on one GPU: far above any GPU's memory (141 GB on an H200), far below 1e308
MAX_BYTES_READING = float(1 << 50)
# Ratios (shares, fractions, utilization) lie in [0, 1]; one off by less than half the ledger's
# resolution (`_RATIO`, 1e-9: an average's rounding) is stored as the bound, any other is refused.
_RATIO_SLACK = 5e-10


def _value_bounds(query: queries.HourQuery) -> tuple[float, float]:
    """The range of ``query``'s values: from its function and its series' unit."""
    if query.function == "count_over_time":
        return (0.0, MAX_SAMPLES_AN_HOUR)
    if query.series.unit == "ratio" or query.series is contract.ALLOCATION:  # a share: 1/replicas
        return (-_RATIO_SLACK, 1.0 + _RATIO_SLACK)
    if query.series.unit == "bytes":
        return (0.0, MAX_BYTES_READING)
    return (-sys.float_info.max, sys.float_info.max)  # any finite number (the teams' info value)


VALUE_BOUNDS = {name: _value_bounds(query) for name, query in queries.BILLING_QUERIES.items()}
# Label values longer than this are refused: Kubernetes names are at most 253 characters, and an
# answer of megabyte labels took ingest to gigabytes of memory and the ledger with it (issue 42).
MAX_LABEL_LENGTH = 1024


# The seconds per sample assumed when the data cannot tell (docs/billing.md §2.1): the interval the
# ServiceMonitor in deploy/ asks for. An hour billed on this assumption is recorded "suspect".
ASSUMED_INTERVAL = 30.0
STEADY_SEARCH_HOURS = 24  # how far from an hour its exporter's interval is looked for
INTERVAL_TOLERANCE = 0.10  # observed vs assumed interval: a larger difference refuses or flags the hour
# sample counts of each exporter's densest nvidia_gpu_info series, per hour (interval detection)
# (aggregated by the engine: ~1,000 series x 73 steps a run against ~125 x 73, for no time saved)
HOST_COUNTS = queries.HourQuery(contract.GPU_INFO, "count_over_time", (contract.HOSTNAME,)).aggregated()
_HOST_SAMPLES = queries.HourQuery(contract.GPU_INFO, "count_over_time", (contract.HOSTNAME,)).promql()


@dataclass
class IngestConfig:
    # seconds per sample (docs/billing.md §2.1); 0 = derived from the data, per exporter and hour.
    # Given explicitly, an hour whose samples show another interval is refused, not billed.
    scrape_interval: float = 0.0
    gap_grace_intervals: int = 2
    catchup_hours: int = 168
    settle: timedelta = timedelta(minutes=2)  # an hour is closed this long after its end
    teams: dict[str, str] = field(default_factory=dict)  # from the team map file; wins over kube
    # hours of the first run of range queries, and the least of any; then series x hours a run's
    # answers may hold: later runs of a smaller fleet are longer (`_run_hours`, docs/billing.md §6)
    chunk_hours: int = 24
    run_points: int = 5_000_000
    workers: int = 1  # processes ingesting runs of hours side by side (docs/billing.md §6)
    # seconds an ingest of a range of hours may take in all (0: no deadline). Past it no query is
    # sent: the hour in flight is recorded failed, and later hours are left to the next run. Well
    # inside the hour: the hourly job starts at :05 and is done by :25 whatever Prometheus does
    deadline: float = 1200.0
    # the label a global store's series name their cluster by (docs/billing.md §2.3); a store whose
    # series carry none is one cluster, billed as before
    cluster_label: str = contract.CLUSTER_LABEL


@dataclass
class IngestResult:
    ingested: list[datetime] = field(default_factory=list)  # written (suspect ones included)
    failed: list[tuple[datetime, str]] = field(default_factory=list)
    unpriced_gpu_hours: int = 0
    suspect: list[tuple[datetime, str]] = field(default_factory=list)  # written, but doubtful
    empty: list[datetime] = field(default_factory=list)  # nothing in Prometheus: not written, retried
    stopped: bool = False  # asked to stop (`stopping`): the hours after the last one written are left
    # hours written without some GPU-hours, or kept as billed before, for a refused reading: (hour, why)
    refused: list[tuple[datetime, str]] = field(default_factory=list)
    halted: bool = False  # Prometheus unreachable or the ledger lost: the hours after `failed` were left


class IntervalMismatch(ValueError):
    """The samples of an hour show another scrape interval than the one given: billing it would
    under- or over-bill every series of the hour."""


@dataclass(frozen=True)
class HourIntervals:
    """Seconds per sample during one hour: per exporter (its hostname), else the fleet's."""

    by_host: dict[str, float]
    fleet: float
    problems: tuple[str, ...] = ()  # what makes the hour doubtful (suspect) or, given an interval, refused

    def of(self, host: str) -> float:
        return self.by_host.get(host, self.fleet)

    def of_cluster(self, cluster: str) -> HourIntervals:
        """One cluster's intervals, from a store's counted per cluster (`query_intervals`, hosts named
        ``cluster/host``): two clusters' nodes of one name are two exporters. Counted per hostname
        alone, the same for every cluster."""
        if not any("/" in host for host in self.by_host):
            return self
        prefix = f"{cluster}/"
        own = {
            host.removeprefix(prefix): seconds
            for host, seconds in self.by_host.items()
            if (host.startswith(prefix) if cluster else "/" not in host)
        }
        return HourIntervals(own, self.fleet, self.problems)


def seconds_from_count(count: float, config: IngestConfig, interval: float | None = None) -> int:
    """Sample count → seconds: count × interval, bridged to 3600 near the full hour, capped at 3600."""
    interval = interval or config.scrape_interval or ASSUMED_INTERVAL
    seconds = count * interval
    if seconds >= 3600 - config.gap_grace_intervals * interval:
        return 3600
    return max(0, min(3600, round(seconds)))


def steady_intervals(counts: dict[datetime, float]) -> dict[datetime, float]:
    """Seconds per sample at each steady hour of one exporter: an hour whose sample count and both
    neighbours' agree within one sample. A series present the three hours through was there all of
    the middle one, so the count is the hour's and 3600 / count the interval; an exporter that came,
    went or restarted inside the hour shows in the counts and is not steady."""
    out = {}
    for hour, count in counts.items():
        trio = (counts.get(hour - HOUR, 0.0), count, counts.get(hour + HOUR, 0.0))
        if min(trio) >= 1 and max(trio) - min(trio) <= 1:
            out[hour] = 3600 / statistics.median(trio)
    return out


def _near(a: float, b: float) -> bool:
    return abs(a - b) <= INTERVAL_TOLERANCE * min(a, b)


def detect_intervals(
    host_counts: dict[str, dict[datetime, float]], hours: list[datetime], config: IngestConfig
) -> dict[datetime, HourIntervals]:
    """Each hour's intervals from the exporters' sample counts (docs/billing.md §2.1).

    An exporter's interval in hour h is the one of its steady hour nearest to h (within
    STEADY_SEARCH_HOURS, the earlier one on a tie); one without a steady hour gets the fleet's (the
    most common of the hour, the shorter one on a tie). With no steady hour in the fleet, the
    densest hour near h sets it (else ASSUMED_INTERVAL), and the hour is doubtful: a problem. With an explicit ``config.scrape_interval`` every series uses it, and each exporter
    whose samples say otherwise is a problem (the hour is then refused).
    """
    steady = {host: steady_intervals(counts) for host, counts in host_counts.items()}
    # each exporter's steady hours in order: the nearest on either side found by bisection (a scan
    # of every steady hour for every hour took 2.6 % of the 1,000-GPU bench's ingest)
    in_order = [(host, found, sorted(found)) for host, found in sorted(steady.items())]
    reach = timedelta(hours=STEADY_SEARCH_HOURS)
    out = {}
    for hour in hours:
        detected: dict[str, float] = {}
        changes: list[str] = []  # doubtful with a derived interval; a given one is checked below
        earliest, latest = hour - reach, hour + reach
        for host, found, times in in_order:
            at = bisect.bisect_right(times, hour)  # times[:at] <= hour < times[at:]
            before = times[at - 1] if at and times[at - 1] >= earliest else None
            after = times[at] if at < len(times) and times[at] <= latest else None
            if before is None and after is None:
                continue
            nearest = (
                before if after is None or (before is not None and hour - before <= after - hour) else after
            )
            detected[host] = found[nearest]
            changed = before is not None and after is not None and not _near(found[before], found[after])
            if changed and before != hour:  # the interval changed between two steady hours around h
                changes.append(
                    f"{host or '(no hostname)'}: scrape interval changed from {found[before]:g} s "
                    f"to {found[after]:g} s around this hour; {detected[host]:g} s used"
                )
        if config.scrape_interval > 0:
            given = config.scrape_interval
            mismatches = tuple(
                f"{host or '(no hostname)'}: samples every {interval:g} s, but --scrape-interval is {given:g} s"
                for host, interval in detected.items()
                if not _near(interval, given)
            )
            out[hour] = HourIntervals({}, given, mismatches)
            continue
        problems = changes
        if detected:
            common = Counter(round(v, 3) for v in detected.values()).most_common()
            fleet = min(v for v, n in common if n == common[0][1])
        else:  # a young or flapping fleet: the densest hour near h, else the assumption
            densest = max(
                (c for counts in host_counts.values() for t, c in counts.items() if abs(t - hour) <= reach),
                default=0.0,
            )
            fleet = 3600 / densest if densest >= 1 else ASSUMED_INTERVAL
            how = "the densest hour's" if densest >= 1 else "assumed"
            problems.append(
                f"no exporter had three steady hours within {STEADY_SEARCH_HOURS} h; {fleet:g} s per sample "
                f"({how})"
            )
        out[hour] = HourIntervals(detected, fleet, tuple(problems))
    return out


def query_intervals(
    client: QueryClient, hours: list[datetime], config: IngestConfig, clustered: bool = False
) -> dict[datetime, HourIntervals]:
    """The intervals of ``hours`` (consecutive) from one range query of every exporter's sample
    counts, over the hours and STEADY_SEARCH_HOURS (+1 for the neighbours) either side.
    ``clustered``: counted per (cluster, hostname), for a store whose answers name clusters
    (`HourIntervals.of_cluster`)."""
    margin = timedelta(hours=STEADY_SEARCH_HOURS + 1)
    counts: dict[str, dict[datetime, float]] = defaultdict(dict)
    label = config.cluster_label
    promql = f"max by ({label}, {contract.HOSTNAME}) ({_HOST_SAMPLES})" if clustered else HOST_COUNTS
    answer = client.query_range(promql, _at(hours[0] - margin), _at(hours[-1] + margin), 3600)
    try:
        for labels, points in answer:
            host = labels.get(contract.HOSTNAME, "")
            if clustered and labels.get(label):
                host = f"{labels[label]}/{host}"
            for t, value in points:
                count = float(value)
                if not 0 <= count <= MAX_SAMPLES_AN_HOUR:
                    raise BadAnswer(
                        f"sample counts ({promql!r}): {host!r}: value {value!r} is not a count "
                        f"in [0, {MAX_SAMPLES_AN_HOUR:g}]"
                    )
                counts[host][hour_floor(datetime.fromtimestamp(float(t), UTC))] = count
    except (TypeError, ValueError, KeyError, IndexError, AttributeError, OverflowError) as exc:
        raise BadAnswer(f"sample counts ({promql!r}): an answer of the wrong shape: {_why(exc)}") from None
    return detect_intervals(counts, hours, config)


def _why(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc!s:.200}"


@functools.lru_cache(maxsize=65536)
def _ratio(value: float) -> Decimal:
    return Decimal(repr(value)).quantize(_RATIO)


class SeriesLabels(dict):
    """The labels one series of an answer keeps (`_columns`), with room for what billing derives
    from them: a range answer holds each series once for all its steps, so its GPU, pod, profile...
    are parsed once per series rather than once per hour (`derived`: the function and what it gave;
    unset until then)."""

    __slots__ = ("derived",)


def _derived(labels: dict[str, str], derive: Callable[[dict[str, str]], tuple]) -> tuple:
    """``derive(labels)``, computed once per series of an answer (kept on its `SeriesLabels`, which
    every hour of the run shares, with the function that derived it); each time for a plain dict."""
    kept = getattr(labels, "derived", None)
    if kept is not None and kept[0] is derive:
        return kept[1]
    value = derive(labels)
    if isinstance(labels, SeriesLabels):
        labels.derived = (derive, value)
    return value


def _fact(cls: type[_Fact], **fields: object) -> _Fact:
    """A frozen fact (Device, MigInstance, Allocation) built without its generated ``__init__``,
    which sets each field through ``object.__setattr__``: 0.6 µs against 2.5 µs for an Allocation.
    Every field must be given (checked: a missing one would otherwise surface as an AttributeError
    far from here)."""
    if len(fields) != len(cls.__dataclass_fields__):  # type: ignore[attr-defined]
        raise TypeError(f"{cls.__name__} needs all of its fields")
    return with_fields(cls, fields)


def _template(cls: type, **constants: object) -> dict[str, object]:
    """The fields of a fact of one series, in the dataclass's order: those fixed by the series'
    labels set, the ones each hour sets (`_VARYING`) still None. `RunAnswers.build` gives a copy of it
    to a new fact as its ``__dict__`` (`with_fields`) and sets the hour's values: cheaper than `_fact`
    with keywords (~6,500 facts an hour on the 1,000-GPU bench)."""
    fields: dict[str, object] = dict.fromkeys(cls.__dataclass_fields__)  # type: ignore[attr-defined]
    if set(constants) | _VARYING[cls] != set(fields) or set(constants) & _VARYING[cls]:
        raise TypeError(f"{cls.__name__}: a template sets every field but the hour's")
    fields.update(constants)
    return fields


# the fields of a fact that `RunAnswers.build` sets every hour (the others come from `_template`)
_VARYING: dict[type, frozenset[str]] = {
    MigInstance: frozenset(("present_seconds", "utilization")),
    Allocation: frozenset(
        (
            "allocated_seconds",
            "share",
            "utilization",
            "memory_share",
            "compute_share",
            "process_sm",
            "process_memory",
        )
    ),
}


def _alloc_key_labels(labels: dict[str, str]) -> tuple:
    return tuple(map(labels.get, _ALLOC_KEYS))


def _device_labels(labels: dict[str, str]) -> tuple:
    get = labels.get
    return (
        get(contract.UUID, ""),
        get(contract.MODEL, ""),
        get(contract.HOSTNAME, ""),
        get(contract.GPU, ""),
        get(contract.MIG_MODE, "").lower() in _MIG_ON,
    )


def _instance_labels(labels: dict[str, str]) -> tuple:
    """(uuid, gpu instance id, profile, compute slices, memory slices); slices None when missing."""
    get = labels.get
    try:
        slices: tuple[int | None, int | None] = (
            int(get(contract.COMPUTE_SLICES, "")),
            int(get(contract.MEMORY_SLICES, "")),
        )
    except ValueError:
        slices = (None, None)
    return (get(contract.UUID, ""), get(contract.GPU_INSTANCE_ID, ""), get(contract.MIG_PROFILE, ""), *slices)


def _uuid_gi(labels: dict[str, str]) -> tuple:
    return (labels.get(contract.UUID, ""), labels.get(contract.GPU_INSTANCE_ID, ""))


def _allocation_labels(labels: dict[str, str]) -> tuple:
    get = labels.get
    return (
        get(contract.UUID, ""),
        get(contract.GPU_INSTANCE_ID, ""),
        get(contract.HOSTNAME, ""),
        get(contract.GPU, ""),
        get(contract.NAMESPACE, ""),
        get(contract.POD, ""),
        get(contract.CONTAINER, ""),
        get(contract.MIG_PROFILE, ""),
        get(contract.RESOURCE, ""),
        get(contract.SHARING, ""),
        _alloc_key_labels(labels),  # what the share and fraction answers are matched on
    )


def _instance_template(found: tuple) -> dict[str, object]:
    uuid, gi, profile, compute, memory = found
    return _template(
        MigInstance,
        uuid=uuid,
        gpu_instance_id=gi,
        mig_profile=profile,
        compute_slices=compute,
        memory_slices=memory,
    )


def _allocation_template(found: tuple) -> dict[str, object]:
    uuid, gi, hostname, _, namespace, pod, container, profile, resource, sharing, _ = found
    return _template(
        Allocation,
        uuid=uuid,
        namespace=namespace,
        pod=pod,
        container=container,
        gpu_instance_id=gi,
        mig_profile=profile,
        resource=resource,
        hostname=hostname,
        sharing=sharing,
    )


def _at(hour: datetime) -> datetime:
    return hour + HOUR - timedelta(milliseconds=1)  # [1h] then covers exactly [hour, hour+1h)


Values = list[float | None]  # one series' values, one per hour of a run (None: no sample that hour)
_VALUE = operator.itemgetter(1)  # of a point, [unix seconds, "value"]


class _Repeated(dict):
    """Values' text -> float, each text converted once per answer, for answers whose values repeat:
    sample counts (a few integers: samples an hour at each exporter's interval) and granted shares.
    A dict look-up of the text takes a quarter of ``float`` of it (~70 against ~275 ns; ~260,000
    such values a day on the 1,000-GPU bench). Readings (utilization, process use) seldom repeat and
    are converted as they come."""

    def __missing__(self, text: str) -> float:
        value = self[text] = float(text)
        return value


def _columns(
    answer: Iterable[tuple[dict[str, str], list]],
    first: float,
    count: int,
    keep: tuple[str, ...],
    repeated: bool = False,
) -> list[tuple[SeriesLabels, Values]]:
    """A range answer's series reduced to ``max by (keep)``, with their values per hour of the run:
    [labels, [value or None, ...]], in the order each kept label set first came (see `_in_order`).
    ``repeated``: the answer's values repeat (`_Repeated`).

    Series whose kept labels agree (HA replicas, an exporter that changed its instance label) merge
    hour by hour to the largest value; a NaN gives way to any number, as in PromQL's ``max``."""
    out: dict[tuple, tuple[SeriesLabels, Values]] = {}
    slots = {first + 3600 * i: i for i in range(count)}  # a step's time -> its hour, as Prometheus writes it
    convert = _Repeated().__getitem__ if repeated else float
    for labels, points in answer:
        # a series with a point at each step from its first to its last (held all run, or by a pod
        # that started or stopped within it): its values in one slice, not point by point
        start = slots.get(points[0][0]) if points else None
        if start is not None and slots.get(points[-1][0]) == start + len(points) - 1:
            if len(points) == count:
                values: Values = list(map(convert, map(_VALUE, points)))
            else:
                values = [None] * count
                values[start : start + len(points)] = map(convert, map(_VALUE, points))
        else:
            values = [None] * count
            for t, value in points:
                index = slots.get(t)
                if index is None:  # an engine that wrote the time otherwise: the nearest hour
                    index = round((t - first) / 3600)
                    if not 0 <= index < count:
                        continue
                values[index] = convert(value)
        key = tuple(map(labels.get, keep, itertools.repeat("")))  # absent and empty are one to PromQL
        kept = out.get(key)
        if kept is None:  # neither is kept
            for value in key:  # checked once per kept label set
                if value.__class__ is not str or len(value) > MAX_LABEL_LENGTH:
                    raise BadAnswer(
                        f"a label value that is not text of at most {MAX_LABEL_LENGTH} characters "
                        f"(value {str(value)[:60]!r}, {len(str(value))} characters)"
                    )
            out[key] = (SeriesLabels({k: v for k, v in zip(keep, key, strict=True) if v}), values)
        else:
            kept[1][:] = map(_larger, kept[1], values)
    return list(out.values())


def _query_columns(
    name: str, answer, first: float, count: int, refused: Refused, cluster_label: str = contract.CLUSTER_LABEL
) -> list[tuple[SeriesLabels, Values]]:
    """`_columns` of the answer to ``QUERIES[name]``: reduced by its kept labels, its values
    converted once per text where they repeat, and screened (`screen_values`: a value out of its
    range is dropped and its GPU-hour refused in ``refused``). BadAnswer, naming the query, for an
    answer of the wrong shape."""
    try:
        # the cluster kept too: HA replicas of one cluster merge, two clusters' series never do
        series = _columns(answer, first, count, (*KEEP[name], cluster_label), name in REPEATED)
    except BadAnswer as exc:
        raise BadAnswer(f"{name} ({QUERIES[name]!r}): {exc}") from None
    except (TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:
        raise BadAnswer(f"{name} ({QUERIES[name]!r}): an answer of the wrong shape: {_why(exc)}") from None
    screen_values(name, QUERIES[name], series, VALUE_BOUNDS[name], refused, cluster_label)
    return series


def _larger(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    if b is None:
        return a
    return b if a < b or a != a else a  # a != a: NaN


def _in_order(series: list[tuple[SeriesLabels, Values]]) -> list[tuple[SeriesLabels, Values]]:
    """Series in Prometheus' order of label sets (names, then values), as the engine's own ``max by``
    range answer lists them: where `RunAnswers` keeps the first or the last of several series (one
    GPU's labels changed inside an hour, one namespace's team), this order decides, whatever order the
    engine listed the raw series in. The other answers need none (sorting them all was ~3 ms an hour)."""
    return sorted(series, key=lambda s: sorted(s[0].items()))


def _keyed(
    series: list[tuple[dict, Values]], derive: Callable[[dict[str, str]], tuple]
) -> dict[tuple, Values]:
    """Values per derived key. Each key is one series': `_columns` has already merged the series
    whose kept labels agree, and every ``derive`` here reads only the labels its query keeps."""
    return {_derived(labels, derive): values for labels, values in series}


class RunAnswers:
    """The answers of every query of §6 for a run of consecutive hours, column-wise.

    A range answer holds each series once with a value per hour, so what joins the series to each
    other (an allocation's share, its instance's utilization, its container's process use) is worked
    out once per series for the whole run, and `build` then makes each hour's facts from the values
    at that hour: the same facts as an instant query per hour would give (tests check it)."""

    @classmethod
    def of(
        cls,
        answers: dict[str, list[tuple[dict[str, str], list]]],
        hours: list[datetime],
        cluster_label: str = contract.CLUSTER_LABEL,
    ) -> RunAnswers | ClusterAnswers:
        """From the answers as Prometheus gives them: (labels, [[unix seconds, value], ...]) per series."""
        first = _at(hours[0]).timestamp()
        refused: Refused = [{} for _ in hours]
        columns = {
            name: _query_columns(name, answers.get(name, ()), first, len(hours), refused, cluster_label)
            for name in QUERIES
        }
        return by_cluster(columns, hours, cluster_label, refused)

    def __init__(
        self,
        col: dict[str, list[tuple[dict, Values]]],
        hours: list[datetime],
        cluster: str = "",
        refused: list[dict[str, str]] | None = None,
    ):
        """``col``: per query name, its series with their values per hour (`_columns`), all of
        ``cluster`` (`by_cluster`); ``refused``: per hour, the uuids of the GPU-hours a refused
        reading leaves out, with why (`screen_values`)."""
        self.hours = hours
        self.cluster = cluster
        self.refused: list[dict[str, str]] = refused if refused is not None else [{} for _ in hours]
        self.series = sum(map(len, col.values()))  # what sizes the next run (`_run_hours`)
        self.devices = [
            (_derived(labels, _device_labels), values) for labels, values in _in_order(col["gpu_count"])
        ]
        self.gpu_util = {key[0]: values for key, values in _keyed(col["gpu_util"], _uuid_gi).items()}
        mig_util = _keyed(col["mig_util"], _uuid_gi)
        self.instances = [
            (found, values, mig_util.get(_derived(labels, _uuid_gi)), _instance_template(found))
            for labels, values in col["mig_count"]
            for found in (_derived(labels, _instance_labels),)
        ]
        # the allocation queries keep exactly the ALLOC_LABELS: match their answers on those values
        shares = _keyed(col["alloc_share"], _alloc_key_labels)
        # fractional grants only (an hour of Prometheus from before them has no such answers)
        memory_shares = _keyed(col["alloc_memory"], _alloc_key_labels)
        compute_shares = _keyed(col["alloc_compute"], _alloc_key_labels)
        process_sm = _keyed(col["proc_sm"], _process_key)
        process_memory = _keyed(col["proc_memory"], _process_key)
        # per hour: the GPUs with any process data, and with SM data (docs/billing.md §3.5)
        self.with_data: list[set[str]] = [set() for _ in hours]
        self.with_sm: list[set[str]] = [set() for _ in hours]
        for processes, into in (
            (process_sm, (self.with_data, self.with_sm)),
            (process_memory, (self.with_data,)),
        ):
            for key, values in processes.items():
                for i, value in enumerate(values):
                    if value is not None:
                        for sets in into:
                            sets[i].add(key[0])
        allocations = []
        for labels, values in col["alloc_count"]:
            found = _derived(labels, _allocation_labels)
            uuid, gi, _, _, namespace, pod, container, *_, key = found
            process_key = (uuid, gi, namespace, pod, container)
            allocations.append(
                (
                    found,
                    values,
                    shares.get(key),
                    memory_shares.get(key),
                    compute_shares.get(key),
                    mig_util.get((uuid, gi)) if gi else self.gpu_util.get(uuid),
                    process_sm.get(process_key),
                    process_memory.get(process_key),
                    _allocation_template(found),
                )
            )
        # each GPU's instances and holders then come out of `build` in the canonical order of its
        # layout (billing/ledger/layouts.py): by (instance, profile) and (instance, namespace, pod,
        # container, resource); sorted once per run, not per GPU-hour
        self.instances.sort(key=lambda s: (s[0][1], s[0][2]))
        allocations.sort(key=lambda s: (s[0][1], s[0][4], s[0][5], s[0][6], s[0][8]))
        # what `build` reads of each, per hour and per series: (values, uuid, hostname, gpu, namespace,
        # pod, whether its GPU is shared, share, memory and compute fractions, utilization, process SM
        # and memory, the fact's template)
        self.allocations = [
            (values, found[0], found[2], found[3], found[4], found[5], found[9] in SHARED_MODES, *rest)
            for found, values, *rest in allocations
        ]
        self.teams: list[dict[str, str]] = [{} for _ in hours]
        # each GPU's layout key of the last hour built, carried to the next (`build`)
        self.layouts = CarriedLayouts()
        # per hour of the run, the GPUs any of whose layout's inputs (device, instance and holder
        # counts, shares, fractions) differ from the hour before: the others keep the key built then
        self.moved: list[set[str]] = _moved(
            len(hours),
            ((found[0], (values,)) for found, values in self.devices),
            ((found[0], (values,)) for found, values, *_ in self.instances),
            ((a[1], (a[0], a[7], a[8], a[9])) for a in self.allocations),
        )
        self._built: tuple | None = None  # (index, config, intervals) of the hour built last
        # per GPU, the hour it was last built in full, which the next hour may be built steady on
        self._templates: dict[str, GpuHour] = {}
        for labels, values in _in_order(col["teams"]):
            namespace, team = labels.get(contract.NAMESPACE), labels.get(contract.LABEL_TEAM)
            if team and is_reserved_name(team):  # it would merge with the reports' own rows
                log.warning("namespace %r: team label %r is a reserved name; ignored", namespace, team)
                continue
            if namespace and team:
                for i, value in enumerate(values):
                    if value is not None:
                        self.teams[i][namespace] = team

    def refused_at(self, index: int) -> list[tuple[str, str, str]]:
        """The run's ``index``-th hour's refused GPU-hours: (their cluster, uuid, why)."""
        return [(self.cluster, uuid, why) for uuid, why in self.refused[index].items()]

    def build(
        self,
        index: int,
        config: IngestConfig,
        intervals: HourIntervals | None = None,
        problems: list[str] | None = None,
    ) -> tuple[list[GpuHour], dict[str, str]]:
        """The GPU-hours of the run's ``index``-th hour and its kube namespace→team labels (§2).

        ``intervals`` gives each exporter's seconds per sample (default: ``config``'s, else the
        assumed one); ``problems`` collects the series with more samples than the hour holds at
        their interval.
        """
        hour, i = self.hours[index], index
        if intervals is None:
            intervals = HourIntervals({}, config.scrape_interval or ASSUMED_INTERVAL)
        if problems is not None:
            problems.extend(intervals.problems)

        by_host, fleet = intervals.by_host, intervals.fleet
        # (count, host) -> (seconds, the interval when the count is more than an hour holds at it,
        # else None): counts repeat, hour after hour and series after series
        counted: dict[tuple[float, str], tuple[int, float | None]] = {}

        troubled: set[str] = set()  # GPUs with a series of more samples than the hour holds

        def seconds(count: float, host: str, uuid: str, what: str, *names: str) -> int:
            held = counted.get((count, host))
            if held is None:
                interval = by_host.get(host, fleet)  # intervals.of(host)
                held = counted[(count, host)] = (
                    seconds_from_count(count, config, interval),
                    interval if count > 3600 / interval + 1 else None,  # one sample of slack at the edges
                )
            if held[1] is not None:
                troubled.add(uuid)
                if problems is not None:
                    problems.append(
                        f"{what % names}: {count:g} samples, more than an hour holds at {held[1]:g} s"
                    )
            return held[0]

        # the hour after the one built last, with the same seconds per sample: a GPU none of whose
        # layout's inputs moved (`_moved`) has the layout of that hour, whose key `kept` holds, and
        # one built in full then or since (its template) is built steady: its readings only
        before = self._built
        moved = (
            self.moved[index]
            if before is not None
            and before[0] == index - 1
            and before[1] is config
            and before[2] == (by_host, fleet)
            else None
        )
        self._built = (index, config, (by_host, fleet))
        kept, one = self.layouts.last, self.layouts.one
        templates = self._templates if moved is not None else {}
        steady: dict[str, Readings] = {}  # the readings of this hour's steady GPUs, as they are read

        devices: dict[str, list] = {}  # uuid -> [samples, best series' samples, its derived labels]
        for found, values in self.devices:
            value = values[i]
            if value is None:
                continue
            entry = devices.get(found[0])
            if entry is None:
                devices[found[0]] = [value, value, found]
                continue
            entry[0] += value  # label changes inside the hour split one GPU over series
            if value > entry[1]:
                entry[1], entry[2] = value, found

        hours: dict[str, GpuHour] = {}
        gpu_util = self.gpu_util
        for uuid, (count, _, (_, model, host, gpu, mig_mode)) in devices.items():
            template = templates.get(uuid)
            if (
                template is not None
                and moved is not None
                and uuid not in moved
                and (key := kept.get(uuid)) is not None
            ):
                # its device series' counts did not move either: the template's device (labels and
                # seconds), with this hour's utilization
                fields = template.device.__dict__.copy()
                fields["utilization"] = _at_hour(gpu_util.get(uuid), i)
                readings = steady[uuid] = ([], [])
                hours[uuid] = SteadyGpuHour(hour, with_fields(Device, fields), template, readings, key)
                continue
            device = _fact(
                Device,
                uuid=uuid,
                model=model,
                present_seconds=seconds(count, host, uuid, "%s", uuid),
                hostname=host,
                gpu=gpu,
                mig_mode=mig_mode,
                utilization=_at_hour(gpu_util.get(uuid), i),
                cluster=self.cluster,
            )
            hours[uuid] = GpuHour(hour, device)

        for (uuid, gi, _, compute, memory), values, utilizations, template in self.instances:
            value = values[i]
            if value is None or uuid not in hours:
                continue  # a layout without its device: nothing to price it against
            if compute is None or memory is None:
                log.warning("MIG instance %s/%s without slice counts; skipped", uuid, gi)
                continue
            utilization = None if utilizations is None else utilizations[i]
            if utilization is not None:
                utilization = _ratio(utilization)
            readings = steady.get(uuid)
            if readings is not None:
                readings[0].append(utilization)
                continue
            owner = hours[uuid]
            fields = template.copy()
            instance = with_fields(MigInstance, fields)
            fields["present_seconds"] = seconds(
                value, owner.device.hostname, uuid, "%s instance %s", uuid, gi
            )
            fields["utilization"] = utilization
            owner.instances.append(instance)

        with_data, with_sm = self.with_data[i], self.with_sm[i]
        for (
            values,
            uuid,
            hostname,
            gpu,
            namespace,
            pod,
            shared,
            shares,
            memory_shares,
            compute_shares,
            utils,
            sm,
            used,
            template,
        ) in self.allocations:
            value = values[i]
            if value is None:
                continue
            utilization = None if utils is None else utils[i]
            if utilization is not None:
                utilization = _ratio(utilization)
            own_sm = own_memory = None
            if uuid in with_data:  # its container's own use: 0 where it ran no process on the GPU (§3.5)
                if uuid in with_sm:
                    reading = None if sm is None else sm[i]
                    own_sm = _ratio(0.0 if reading is None else reading)
                    if shared:  # a shared GPU's holder: its own SM share
                        utilization = own_sm
                reading = None if used is None else used[i]
                own_memory = _whole(0.0 if reading is None else reading)
            readings = steady.get(uuid)
            if readings is not None:
                readings[1].append((utilization, own_sm, own_memory))
                continue
            owner = hours.get(uuid)
            host = hostname or (owner.device.hostname if owner is not None else "")
            held = seconds(value, host, uuid, "%s/%s", namespace, pod)
            if owner is None:  # allocated but the device was never seen: priced as an unknown model
                owner = hours[uuid] = GpuHour(
                    hour, Device(uuid, "", held, hostname, gpu, cluster=self.cluster)
                )
            share = None if shares is None else shares[i]
            memory = None if memory_shares is None else memory_shares[i]
            compute = None if compute_shares is None else compute_shares[i]
            fields = template.copy()
            allocation = with_fields(Allocation, fields)
            fields["allocated_seconds"] = held
            fields["share"] = _ratio(1.0 if share is None else share)
            fields["utilization"] = utilization
            fields["memory_share"] = None if memory is None else _ratio(memory)
            fields["compute_share"] = None if compute is None else _ratio(compute)
            fields["process_sm"] = own_sm
            fields["process_memory"] = own_memory
            owner.allocations.append(allocation)
        refused = self.refused[i]
        built = [hours[u] for u in sorted(hours) if u not in refused]
        carried = {}  # each GPU's template for the next hour: this hour, or the one it was steady on
        for gpu_hour in built:  # in canonical order already: its layout's key, for pricing and the ledger
            uuid = gpu_hour.device.uuid
            if uuid in steady:
                carried[uuid] = templates[uuid]
                continue
            if uuid not in troubled:  # a GPU whose counts made problems is built in full each hour
                carried[uuid] = gpu_hour
            if moved is not None and uuid not in moved and uuid in kept:
                gpu_hour.layout = kept[uuid]
                continue
            key = layout_key(gpu_hour.instances, gpu_hour.allocations)
            if key is not None:  # the key object of the first hour with this layout (`CarriedLayouts`)
                key = one.setdefault(key, key)
            kept[uuid] = gpu_hour.layout = key
        self._templates = carried
        if len(one) > LAYOUTS_KEPT:  # equal keys then compare value by value again, until met anew
            one.clear()
        return built, dict(self.teams[i])


def by_cluster(
    columns: dict[str, list[tuple[SeriesLabels, Values]]],
    hours: list[datetime],
    cluster_label: str,
    refused: Refused | None = None,
) -> RunAnswers | ClusterAnswers:
    """The run's answers of each cluster apart (`ClusterAnswers`), where the store labels series
    with their cluster; else (one cluster's own Prometheus) the answers as one `RunAnswers`, as before
    clusters. A series without the label in a store with it is the cluster "" (its own)."""
    refused = refused if refused is not None else [{} for _ in hours]
    if not any(cluster_label in labels for series in columns.values() for labels, _ in series):
        return RunAnswers(columns, hours, "", _of_cluster(refused, ""))
    parts: dict[str, dict[str, list]] = {}
    for name, series in columns.items():
        for labels, values in series:
            cluster = labels.get(cluster_label, "")
            kept = SeriesLabels({k: v for k, v in labels.items() if k != cluster_label})
            parts.setdefault(cluster, {n: [] for n in columns})[name].append((kept, values))
    return ClusterAnswers(
        {c: RunAnswers(parts[c], hours, c, _of_cluster(refused, c)) for c in sorted(parts)}, hours
    )


def _of_cluster(refused: Refused, cluster: str) -> list[dict[str, str]]:
    """Per hour, the refused GPU-hours of one cluster: uuid -> why."""
    return [{uuid: why for (c, uuid), why in hour.items() if c == cluster} for hour in refused]


class ClusterAnswers:
    """A run's answers from a store holding several clusters' series: one `RunAnswers` per cluster,
    each built as that cluster's own Prometheus would be (so a cluster bills to the cent as it would
    alone), the GPU-hours of all of them together in (cluster, uuid) order."""

    def __init__(self, parts: dict[str, RunAnswers], hours: list[datetime]):
        self.parts, self.hours = parts, hours
        self.series = sum(part.series for part in parts.values())
        self._layouts = CarriedLayouts()

    @property
    def layouts(self) -> CarriedLayouts:
        return self._layouts

    @layouts.setter
    def layouts(self, layouts: CarriedLayouts) -> None:
        """Each cluster's layout keys carried apart (a UUID may be in two clusters)."""
        self._layouts = layouts
        for cluster, part in self.parts.items():
            part.layouts = layouts.of_cluster(cluster)

    def build(
        self,
        index: int,
        config: IngestConfig,
        intervals: HourIntervals | None = None,
        problems: list[str] | None = None,
    ) -> tuple[list[GpuHour], dict[str, str]]:
        """`RunAnswers.build` of each cluster; the kube namespace→team labels named with their
        cluster (``cluster/namespace``, as a team map names them)."""
        built: list[GpuHour] = []
        teams: dict[str, str] = {}
        for cluster, part in self.parts.items():
            own = None if intervals is None else intervals.of_cluster(cluster)
            gpu_hours, kube_teams = part.build(index, config, own, problems)
            built += gpu_hours
            teams.update((f"{cluster}/{ns}" if cluster else ns, team) for ns, team in kube_teams.items())
        return built, teams

    def refused_at(self, index: int) -> list[tuple[str, str, str]]:
        """The run's ``index``-th hour's refused GPU-hours of every cluster: (cluster, uuid, why)."""
        return [r for part in self.parts.values() for r in part.refused_at(index)]


class CarriedLayouts:
    """What `RunAnswers.build` carries from hour to hour and run to run of an ingest: each GPU's
    layout key of the last hour built (``last``), and one key object per layout seen (``one``).

    A GPU whose layout comes back (a pod on a schedule, an idle MIG GPU like its neighbours) then
    names the object it named before, which the pricer's memo and the ledger's layout ids hold: their
    look-ups compare it by identity, not value by value (~130 values, the labels' strings made anew
    by each run's answers: ~5 µs a look-up). In the first 72 hours of the 1,000-GPU bench, 42,352 of
    66,600 GPU-hours with a layout had such an equal key made anew."""

    __slots__ = ("clusters", "last", "one")

    def __init__(self) -> None:
        self.last: dict[str, LayoutKey | None] = {}
        self.one: dict[LayoutKey, LayoutKey] = {}
        self.clusters: dict[str, CarriedLayouts] = {}

    def of_cluster(self, cluster: str) -> CarriedLayouts:
        """The keys carried for one cluster's GPUs (its own: a UUID may be in two clusters)."""
        if not cluster:
            return self
        kept = self.clusters.get(cluster)
        if kept is None:
            kept = self.clusters[cluster] = CarriedLayouts()
        return kept


LAYOUTS_KEPT = 50_000  # layout key objects kept (~1,400 layouts a month on 1,000 GPUs)


def _moved(hours: int, *series: Iterable[tuple[str, tuple[Values | None, ...]]]) -> list[set[str]]:
    """Per hour of a run, the GPUs with a series whose value in any of its columns differs from the
    hour before's (an appearing or vanishing series included; every GPU at the first hour).

    A GPU-hour's layout (its instances and holders with their seconds and shares, `layout_key`) is a
    function of these values, the labels and the seconds per sample alone, so a GPU absent here kept
    the layout of the hour before: `RunAnswers.build` then carries that hour's key instead of building
    and comparing the ~130 values of a new one (a quarter of building an hour on the 1,000-GPU bench)."""
    moved: list[set[str]] = [set() for _ in range(hours)]
    everything = set()
    for of_gpu in series:
        for uuid, columns in of_gpu:
            everything.add(uuid)
            for values in columns:
                if values is None:
                    continue
                first = values[0]
                if first == first and values.count(first) == hours:  # the same all run (most are)
                    continue  # (a NaN, which differs from itself, is compared hour by hour)
                for i, (last, value) in enumerate(itertools.pairwise(values), 1):
                    if value != last:  # a NaN differs from itself: a moved hour, never a wrong key
                        moved[i].add(uuid)
    if hours:
        moved[0] = everything
    return moved


def _at_hour(values: Values | None, index: int) -> Decimal | None:
    """A ratio series' value at the run's ``index``-th hour, if it has one."""
    if values is None:
        return None
    value = values[index]
    return None if value is None else _ratio(value)


def query_run(
    client: QueryClient, hours: list[datetime], cluster_label: str = contract.CLUSTER_LABEL
) -> RunAnswers | ClusterAnswers:
    """Every query of §6 for consecutive ``hours``.

    One hour: instant queries at its end. Several: one range query per query name with a 1 h step,
    whose steps are the same instants (each step's ``[1h]`` window is that hour), so the answers
    are identical to the hour-by-hour instant queries, in 7 requests instead of 7 per hour.
    """
    return FetchedRun(client, hours, cluster_label).answers()


class FetchedRun:
    """`query_run` in two halves: the requests, made when it is created (by ingest's query thread,
    which then mostly waits on Prometheus with the GIL free), and the answers' decoding into
    `RunAnswers` (`answers`, in the thread that builds the hours).

    So one thread runs Python at a time: with the answers decoded in the query thread and the hours
    written in a third, the same work took 11-20 % more CPU on the 1,000-GPU bench, and two runs'
    decoded answers were held at once (docs/performance.md, issue 17, thirteenth session)."""

    def __init__(
        self, client: QueryClient, hours: list[datetime], cluster_label: str = contract.CLUSTER_LABEL
    ):
        if any(b - a != HOUR for a, b in itertools.pairwise(hours)):
            raise ValueError("query_run needs consecutive hours")
        self.hours, self.cluster_label = hours, cluster_label
        self._answers: RunAnswers | ClusterAnswers | None = None
        self._fetched: dict[str, RangeAnswer] = {}
        if len(hours) == 1:  # instant queries: one hour's answers are small, decoded here
            at = _at(hours[0])
            self._answers = _one_hour(
                {name: client.query(promql, at) for name, promql in QUERIES.items()}, hours[0], cluster_label
            )
            return
        first, last = _at(hours[0]), _at(hours[-1])
        self._fetched = {
            name: client.fetch_range(promql, first, last, 3600) for name, promql in QUERIES.items()
        }

    def answers(self) -> RunAnswers | ClusterAnswers:
        """The run's answers, decoded once. Each raw answer is let go as it is made columns: only one
        is held decoded at a time (at 10,000 GPUs one is ~40,000 series x 24 steps of JSON lists)."""
        if self._answers is None:
            at, count = _at(self.hours[0]).timestamp(), len(self.hours)
            columns = {}
            refused: Refused = [{} for _ in self.hours]
            with _no_collections():
                for name in QUERIES:
                    columns[name] = _query_columns(
                        name, self._fetched.pop(name)(), at, count, refused, self.cluster_label
                    )
            self._answers = by_cluster(columns, self.hours, self.cluster_label, refused)
        return self._answers


def collect_hour(
    client: QueryClient, hour: datetime, config: IngestConfig, problems: list[str] | None = None
) -> tuple[list[GpuHour], dict[str, str]]:
    """Query Prometheus for one hour; returns the GPU-hours and the kube namespace→team labels."""
    answers = query_run(client, [hour], config.cluster_label)
    intervals = query_intervals(client, [hour], config, isinstance(answers, ClusterAnswers))[hour]
    return answers.build(0, config, intervals, problems)


def build_hour(
    results: dict[str, list[Sample]],
    hour: datetime,
    config: IngestConfig,
    intervals: HourIntervals | None = None,
    problems: list[str] | None = None,
) -> tuple[list[GpuHour], dict[str, str]]:
    """The GPU-hours of one hour from its query answers, as samples (docs/billing.md §2)."""
    return _one_hour(results, hour, config.cluster_label).build(0, config, intervals, problems)


def _one_hour(
    results: dict[str, list[Sample]], hour: datetime, cluster_label: str = contract.CLUSTER_LABEL
) -> RunAnswers | ClusterAnswers:
    """One hour's instant answers as a run of that one hour (each sample a series with one point)."""
    at = _at(hour).timestamp()
    return RunAnswers.of(
        {name: [(labels, [(at, value)]) for labels, value in samples] for name, samples in results.items()},
        [hour],
        cluster_label,
    )


_PROCESS_KEY = queries.BILLING_QUERIES["proc_sm"].by  # uuid, gpu_instance_id, namespace, pod, container


def _process_key(labels: dict[str, str]) -> tuple:
    get = labels.get
    return tuple(get(label, "") for label in _PROCESS_KEY)


@functools.lru_cache(maxsize=65536)
def _whole(value: float) -> Decimal:
    return Decimal(round(value))


def ingest_hour(
    client: QueryClient,
    ledger: Ledger,
    book: PriceBook,
    hour: datetime,
    config: IngestConfig,
) -> int:
    """Ingest and price one closed hour; returns the number of unpriced GPU-hours.

    Raises PrometheusError, or IntervalMismatch (recorded as a failed run, nothing written). An hour
    Prometheus has no series for is recorded "empty" and written nowhere, so catch-up retries it.
    """
    result = IngestResult()
    _ingest_one(client, ledger, Pricer(book), hour_floor(hour), config, result)
    if result.failed:
        raise IntervalMismatch(result.failed[0][1])
    return result.unpriced_gpu_hours


def _ingest_one(client, ledger: Ledger, pricer: Pricer, hour: datetime, config, result: IngestResult) -> None:
    """One hour with instant queries, start to finish; the outcome lands in ``result``. Raises
    PrometheusError after recording it (later hours would fail too)."""
    started = datetime.now(UTC)
    try:
        answers = query_run(client, [hour], config.cluster_label)
        intervals = query_intervals(client, [hour], config, isinstance(answers, ClusterAnswers))[hour]
    except PrometheusError as exc:
        failures.error("ingest of %s failed: %s", hour.isoformat(), exc)
        ledger.record_failure(hour, str(exc), source=client.base_url, started_at=started)
        raise
    try:
        record, kube_teams, unpriced = _price_hour(
            pricer, answers, 0, intervals, config, ledger.namespace_teams()
        )
    except IntervalMismatch as exc:
        _refuse(ledger, hour, str(exc), client.base_url, started, result)
        return
    if record is None:
        _record_empty(ledger, hour, client.base_url, started, result)
        return
    try:
        _write_priced(ledger, record, kube_teams, client.base_url, started, unpriced, result)
    except LedgerError as exc:
        _write_failed(ledger, hour, exc, client.base_url, started, result)


def _price_hour(
    pricer: Pricer,
    answers: RunAnswers,
    index: int,
    intervals: HourIntervals,
    config,
    known_teams: dict[str, str],
):
    """(the hour's record, its kube teams, its unpriced GPU-hours): everything but the write.

    The record is None when Prometheus had no GPU or allocation series for the hour: nothing to
    bill yet, and nothing to replace what an earlier ingest stored. Raises IntervalMismatch when an
    explicit scrape interval disagrees with the samples; with a derived one the disagreement makes
    the record's warnings (a "suspect" run).
    """
    problems: list[str] = []
    hour = answers.hours[index]
    gpu_hours, kube_teams = answers.build(index, config, intervals, problems)
    refused = tuple(sorted(answers.refused_at(index)))
    if not gpu_hours and not refused:
        return None, kube_teams, 0
    if problems:
        problems = list(dict.fromkeys(problems))  # in order, once each
        shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
        if config.scrape_interval > 0:
            raise IntervalMismatch(f"samples disagree with the scrape interval given: {shown}")
        log.warning("hour %s is suspect: %s", hour.isoformat(), shown)
        problems = [shown]
    teams = team_map_over({**known_teams, **kube_teams}, config.teams)
    record, unpriced = priced_record(pricer, hour, gpu_hours, teams, tuple(problems), refused)
    return record, kube_teams, unpriced


def priced_record(
    pricer: Pricer, hour: datetime, gpu_hours: list[GpuHour], teams: dict[str, str], warnings=(), refused=()
) -> tuple[HourRecord, int]:
    """(the hour's record, its unpriced GPU-hours): the GPU-hours priced, with what fixes each one's
    lines' terms (`HourRecord.line_groups`) for the ledger."""
    if any("/" in key for key in teams):  # teams named per cluster: each GPU's cluster's map
        of_cluster: dict[str, dict[str, str]] = {}
        priced = []
        for gh in gpu_hours:
            cluster = gh.device.cluster
            mapped = of_cluster.get(cluster)
            if mapped is None:
                mapped = of_cluster[cluster] = teams_in_cluster(teams, cluster)
            priced.append(pricer.price(gh, mapped))
    else:
        priced = [pricer.price(gh, teams) for gh in gpu_hours]
    unpriced = sum(1 for p in priced if p.device_cost is None)
    # one zip of maps, no loop in Python: ~1,000 GPU-hours an hour on the 1,000-GPU bench. The lines
    # are made when read (`PricedLines`): the SQL ledger reads their priced hours instead
    groups = tuple(zip(map(_UUID, gpu_hours), map(_TERMS, priced), map(_SIZE, priced), strict=True))
    return HourRecord(hour, gpu_hours, PricedLines(priced), pricer.book, warnings, groups, refused), unpriced


_UUID, _TERMS, _SIZE = (
    operator.attrgetter("device.uuid"),
    operator.attrgetter("terms"),
    operator.attrgetter("size"),
)


def _write_hour(ledger: Ledger, record: HourRecord, kube_teams, source: str, started: datetime) -> None:
    ledger.write_hour(record, source=source, started_at=started)
    ledger.set_namespace_teams(kube_teams, "kube", started)


def _write_priced(
    ledger: Ledger, record: HourRecord, kube_teams, source: str, started: datetime, unpriced: int, result
) -> None:
    """Write the hour, unless a reading of it was refused and the ledger holds it billed already: a
    refused reading never takes away what an earlier ingest billed (the attempt is recorded failed)."""
    if record.refused and ledger.ingested_hours(record.hour, record.hour + HOUR):
        reason = refusal_text(record.refused) + "; the hour as billed before is kept"
        failures.error("ingest of %s: %s", record.hour.isoformat(), reason)
        ledger.record_failure(record.hour, reason, source=source, started_at=started)
        result.refused.append((record.hour, reason))
        return
    _write_hour(ledger, record, kube_teams, source, started)
    _count_written(record, unpriced, result)


def _count_written(record: HourRecord, unpriced: int, result: IngestResult) -> None:
    if record.refused:
        reason = refusal_text(record.refused) + "; the rest of the hour is billed and catch-up retries it"
        failures.error("ingest of %s: %s", record.hour.isoformat(), reason)
        result.refused.append((record.hour, reason))
    result.ingested.append(record.hour)
    result.unpriced_gpu_hours += unpriced
    if record.warnings:
        result.suspect.append((record.hour, "; ".join(record.warnings)))


def _record_empty(
    ledger: Ledger, hour: datetime, source: str, started: datetime, result: IngestResult
) -> None:
    reason = "Prometheus had no GPU or allocation series for this hour; it will be retried"
    ledger.record_run(hour, contract.INGEST_EMPTY, reason, source=source, started_at=started)
    result.empty.append(hour)


def _write_failed(
    ledger: Ledger, hour: datetime, exc: LedgerError, source: str, started: datetime, result
) -> None:
    """The ledger refused the hour (or lost its database past the retries): nothing of it was
    committed. Recorded as a failed run when the ledger still answers; the range stops here."""
    failures.error("ingest of %s failed: %s", hour.isoformat(), exc)
    try:
        ledger.record_failure(hour, str(exc), source=source, started_at=started)
    except LedgerError as again:
        log.error("the failed run of %s could not be recorded either: %s", hour.isoformat(), again)
    result.failed.append((hour, str(exc)))
    result.halted = True


def _refuse(ledger: Ledger, hour: datetime, reason: str, source: str, started: datetime, result) -> None:
    failures.error("ingest of %s refused: %s", hour.isoformat(), reason)
    ledger.record_failure(hour, reason, source=source, started_at=started)
    result.failed.append((hour, reason))


MAX_RUN_HOURS = 744  # a 31-day month; Prometheus answers at most 11,000 steps a series


def _run_hours(config: IngestConfig, last: int, series: int | None) -> int:
    """Hours of the next run of range queries, after one of ``last`` hours.

    ``config.chunk_hours`` for the first run (no answers known), then as many as ``config.run_points``
    allows for the ``series`` the run before answered, never fewer than ``chunk_hours``. Each run
    decodes and joins every series' labels again, ~20 µs a series whatever its hours (docs/performance.md,
    issue 17, tenth pass), so fewer, longer runs cost less; the points bound the memory a run's
    answers take. A run is at most three times the one before: its requests are answered while that
    one's hours are built (~3 times what Prometheus takes per hour), so the build never waits long."""
    least = max(1, config.chunk_hours)
    if not series:
        return least
    return max(least, min(3 * last, config.run_points // series, MAX_RUN_HOURS))


def _take_run(hours: list[datetime], at: int, size: int) -> list[datetime]:
    """The consecutive hours from ``hours[at]`` on, at most ``size`` of them."""
    run = hours[at : at + 1]
    for hour in hours[at + 1 : at + size]:
        if hour - run[-1] != HOUR:
            break
        run.append(hour)
    return run


def _runs(hours: list[datetime], size: int) -> list[list[datetime]]:
    """Split hours into runs of at most ``size`` consecutive hours, keeping their order."""
    runs: list[list[datetime]] = []
    taken = 0
    while taken < len(hours):
        runs.append(_take_run(hours, taken, size))
        taken += len(runs[-1])
    return runs


def ingest_hours(
    client: QueryClient,
    ledger: Ledger,
    book: PriceBook,
    hours: Iterable[datetime],
    config: IngestConfig,
    progress: Callable[[Iterable], Iterable] | None = None,
    stopping: Callable[[], bool] | None = None,
    pricer: Pricer | None = None,
) -> IngestResult:
    """Ingest hours in order; stops at the first hour Prometheus cannot answer or the ledger cannot
    store (later hours would fail too: ``halted``), or at the next hour boundary once ``stopping()`` is true (`billing serve` on SIGTERM:
    the hour being written is finished, nothing after it is started).

    ``pricer`` prices every hour (default: a new `Pricer` of ``book``); given one, the hours are
    ingested in this process whatever ``config.workers`` says, since a worker cannot share it.

    Consecutive hours are queried a run of ``config.chunk_hours`` at a time with range queries
    (`query_run`, `query_intervals`): the next run's requests wait on Prometheus in a thread while
    this one decodes the run's answers, then builds, prices and writes its hours in order, each its
    own transaction (docs/billing.md §6; `FetchedRun` says why one thread does all of that). A run
    whose range queries fail is retried hour by hour with instant queries, so the failure is
    recorded against the first hour that fails, and nothing after it is written.
    """
    hours = [hour_floor(h) for h in hours]
    if config.deadline > 0 and getattr(client, "deadline", False) is None:
        client.deadline = time.monotonic() + config.deadline
        try:
            if hours and (down := _unreachable(client)) is not None:  # before any worker is started
                return _halted(ledger, hours[0], down, client.base_url)
            return ingest_hours(client, ledger, book, hours, config, progress, stopping, pricer)
        finally:
            client.deadline = None
    if (
        pricer is None
        and config.workers > 1
        and len(hours) > 2 * config.chunk_hours
        and getattr(client, "reopenable", False)
        and getattr(ledger, "engine", None) is not None
    ):
        return _ingest_in_workers(client, ledger, book, hours, config, progress, stopping)
    with _no_collections():
        return _ingest_serially(client, ledger, pricer or Pricer(book), hours, config, progress, stopping)


def _unreachable(client) -> str | None:
    """Why Prometheus cannot be reached, or None: one cheap query, so that a stopped or hung
    Prometheus ends an ingest after one request's wait, before worker processes are started (each
    of which would wait on it again: a stopped Prometheus took 8.4 s to report, a hung one 12 min).
    Any answer, even an error, means it is there: the hour's own queries then say what is wrong."""
    try:
        client.query("vector(1)", datetime.now(UTC))
    except PrometheusUnreachable as exc:
        return str(exc)
    except PrometheusError:
        pass
    return None


def _halted(ledger: Ledger, hour: datetime, reason: str, source: str) -> IngestResult:
    failures.error("ingest of %s failed: %s", hour.isoformat(), reason)
    ledger.record_failure(hour, reason, source=source, started_at=datetime.now(UTC))
    return IngestResult(failed=[(hour, reason)], halted=True)


@contextlib.contextmanager
def _no_collections():
    """The cyclic collector paused, restored after: around an ingest (`ingest_hours`, `reprice`),
    and around a run's decoding wherever that happens (`FetchedRun.answers`).

    An ingest makes millions of objects that reference counting frees (samples, facts, priced hours,
    rows) and almost no cycles. The collector's young collections, every 200,000 allocations, found
    the hours in flight alive and scanned and promoted them again and again: decoding alone (a list
    per point, held until its answer is made columns) cost 2.0 s of the 1,000-GPU month, and building,
    pricing and writing 10,000 GPUs' hours cost 7.3 s of the 10,000-GPU bench's 62.7 s of CPU. The
    few cycles an ingest makes (an HTTP exchange's objects, a caught exception's frames) wait for the
    collection `_ingest_serially` makes between runs, or for the end. (The pause is the process's:
    `billing serve`'s other threads go without collections while an ingest runs, and theirs too wait.)
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _fetch_run(client, hours: list[datetime], config) -> tuple[FetchedRun, dict[datetime, HourIntervals]]:
    """The requests of a run of consecutive hours (its answers still to decode) and its scrape intervals."""
    return FetchedRun(client, hours, config.cluster_label), query_intervals(client, hours, config)


def _ingest_serially(client, ledger, pricer: Pricer, hours, config, progress, stopping=None) -> IngestResult:
    result = IngestResult()
    ticks = _ticks(progress, hours)
    known_teams = ledger.namespace_teams()
    layouts = CarriedLayouts()

    def tick() -> None:
        if ticks is not None:
            next(ticks, None)

    def stop_here() -> bool:
        """Asked to stop: the hour before is written; start no other."""
        if stopping is None or not stopping():
            return False
        result.stopped = True
        return True

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="billing-query") as queries:
        # hours taken into runs, the hours the last run was given, the series the last run answered:
        # what sizes the next run (a gap in the hours may cut one short)
        taken, asked, series = 0, 0, None

        def submit(size: int):
            nonlocal taken, asked
            run = _take_run(hours, taken, size)
            taken, asked = taken + len(run), size
            return (run, queries.submit(_fetch_run, client, run, config)) if run else None

        pending = submit(_run_hours(config, asked, series))
        try:
            while pending is not None:
                if stop_here():
                    return result
                (run, future), pending = pending, None
                answers = None  # the run before's answers let go before this run's are decoded
                # the cycles the run before made, and what survived one run and died in the next:
                # the collector is paused (`_no_collections`), so they are collected here, once a run
                gc.collect(1)
                try:
                    fetched, intervals = future.result()
                    answers = fetched.answers()
                    if isinstance(answers, ClusterAnswers):  # each cluster's exporters apart
                        intervals = query_intervals(client, run, config, clustered=True)
                    answers.layouts = layouts  # each GPU's layout key, carried from run to run
                    series = answers.series
                except PrometheusUnreachable as exc:  # stopped or hung: hour by hour would wait again
                    result.failed.append((run[0], str(exc)))
                    result.halted = True
                    failures.error("ingest of %s failed: %s", run[0].isoformat(), exc)
                    ledger.record_failure(
                        run[0], str(exc), source=client.base_url, started_at=datetime.now(UTC)
                    )
                    return result
                except PrometheusError as exc:
                    failures.warning("range queries for %s.. failed (%s); retrying hour by hour", run[0], exc)
                    answers = intervals = None
                # the next run's requests, sized by this run's series, answered while its hours are built
                pending = submit(_run_hours(config, asked, series))
                for index, hour in enumerate(run):
                    if stop_here():
                        return result
                    if answers is None or intervals is None:  # hour by hour, instant queries
                        try:
                            _ingest_one(client, ledger, pricer, hour, config, result)
                        except BadAnswer as exc:  # this hour's answer: the next hour's may be sound
                            result.failed.append((hour, str(exc)))
                        except PrometheusError as exc:  # unreachable: later hours would fail too
                            result.failed.append((hour, str(exc)))
                            result.halted = True
                            return result
                        if result.halted:
                            return result
                        tick()
                        continue
                    started = datetime.now(UTC)
                    try:
                        record, kube_teams, unpriced = _price_hour(
                            pricer, answers, index, intervals[hour], config, known_teams
                        )
                    except IntervalMismatch as exc:  # this hour refused; catch-up retries it
                        _refuse(ledger, hour, str(exc), client.base_url, started, result)
                        tick()
                        continue
                    if record is None:
                        _record_empty(ledger, hour, client.base_url, started, result)
                        tick()
                        continue
                    known_teams.update(kube_teams)
                    try:
                        _write_priced(ledger, record, kube_teams, client.base_url, started, unpriced, result)
                    except LedgerError as exc:  # recorded as failed: the range stops here
                        _write_failed(ledger, hour, exc, client.base_url, started, result)
                        return result
                    tick()
        finally:
            if pending is not None:
                pending[1].cancel()
            _close(ticks)
    return result


def worker_pool(workers: int) -> ProcessPoolExecutor:
    """Worker processes that die with the ingest that started them.

    Spawned, not forked (the parent holds threads and sockets). Each asks the kernel for SIGKILL
    when its parent dies (prctl PR_SET_PDEATHSIG, Linux): a killed `billing ingest` must not leave
    workers writing hours for a minute after it.
    """
    return ProcessPoolExecutor(
        max_workers=workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_die_with_parent,
        initargs=(os.getpid(),),
    )


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _die_with_parent(parent: int) -> None:
    import ctypes
    import signal
    import sys

    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        log.warning(
            "worker %s will not die with its parent: prctl failed (errno %s)", os.getpid(), ctypes.get_errno()
        )
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def _ingest_in_workers(client, ledger, book, hours, config, progress, stopping=None) -> IngestResult:
    """`ingest_hours` split over ``config.workers`` processes, a few days of hours per task.

    Every hour is still one transaction, so the ledger ends up the same as with one process. The
    tasks run side by side, so when one stops at a Prometheus error, tasks of later hours may
    already have been written; they are reported as ingested, and the failed hour (and the rest of
    its task) is caught up by the next run like any missing hour.
    """
    engine = ledger.engine
    schema = engine.dialect.default_schema_name if engine.dialect.name == "postgresql" else None
    target = (engine.url.render_as_string(hide_password=False), schema, ledger.actor)
    # the URL as given (a password in it included) and the other options: the worker's own client
    source = (
        client.url,
        {
            "timeout": client.timeout,
            "headers": client.headers,
            "auth": client.auth,
            "max_answer_bytes": client.max_answer_bytes,
            "deadline": client.deadline,  # CLOCK_MONOTONIC: one clock for every process of the host
        },
    )
    serial = replace(config, workers=1)
    task_hours = max(config.chunk_hours, -(-len(hours) // (4 * config.workers)))  # ~4 tasks a worker
    tasks = _runs(hours, task_hours)
    result = IngestResult()
    ticks = _ticks(progress, hours)
    with worker_pool(config.workers) as pool:
        futures = [pool.submit(_ingest_task, target, source, book, task, serial) for task in tasks]

        def merge(part: IngestResult) -> None:
            result.ingested.extend(part.ingested)
            result.failed.extend(part.failed)
            result.suspect.extend(part.suspect)
            result.empty.extend(part.empty)
            result.refused.extend(part.refused)
            result.halted |= part.halted
            result.unpriced_gpu_hours += part.unpriced_gpu_hours
            for _ in [*part.ingested, *part.empty] if ticks is not None else ():
                next(ticks, None)

        try:
            for i, future in enumerate(futures):
                if stopping is not None and stopping():  # tasks not started are dropped; running ones end
                    result.stopped = True
                    for later in futures[i:]:
                        later.cancel()
                if future.cancelled():
                    continue
                merge(future.result())
                if result.halted:
                    for later in futures[i + 1 :]:
                        later.cancel()
                    for later in futures[i + 1 :]:  # already running: they write anyway
                        if not later.cancelled():
                            with contextlib.suppress(Exception):
                                merge(later.result())
                    break
        finally:
            for future in futures:
                future.cancel()
            _close(ticks)
    return result


def _ingest_task(target, source, book, hours, config) -> IngestResult:
    """One worker's task: its own ledger connection and Prometheus client, hours in order."""
    from gpumeter.billing.ledger import open_ledger

    (url, schema, actor), (prometheus_url, options) = target, source
    ledger = open_ledger(url, schema=schema, migrate=False)
    ledger.actor = actor  # the audit records name the command that started the worker
    try:
        with open_client(prometheus_url, **options) as client:
            return ingest_hours(client, ledger, book, hours, config)
    finally:
        ledger.close()


def _ticks(progress, hours):
    """An iterator over ``progress(hours)`` advanced once per ingested hour (None without progress)."""
    if progress is None:
        return None
    ticks = iter(progress(hours))
    next(ticks, None)  # a progress generator (tqdm) counts an item when asked for the next one
    return ticks


def _close(ticks) -> None:
    close = getattr(ticks, "close", None)
    if close is not None:
        close()


def missing_hours(ledger: Ledger, now: datetime, config: IngestConfig) -> list[datetime]:
    """Closed hours of the catch-up window without a successful ingest, oldest first."""
    end = hour_floor(now - config.settle)
    start = end - timedelta(hours=config.catchup_hours)
    done = ledger.ingested_hours(start, end)
    return [h for h in hours_between(start, end) if h not in done]


def catch_up(
    client, ledger, book, now: datetime, config: IngestConfig, progress=None, stopping=None
) -> IngestResult:
    return ingest_hours(client, ledger, book, missing_hours(ledger, now, config), config, progress, stopping)


def reprice(ledger: Ledger, book: PriceBook, start: datetime, end: datetime, teams: dict[str, str]) -> int:
    """Re-price stored facts (e.g. after a price-book change); returns the number of hours re-priced."""
    count = 0
    merged = team_map_over(ledger.namespace_teams(), teams)
    pricer = Pricer(book)
    with _no_collections():
        for hour in hours_between(start, end):
            facts = ledger.facts(hour)
            if facts:
                lines = [
                    line
                    for gh in facts
                    for line in pricer.price(gh, teams_in_cluster(merged, gh.device.cluster)).lines
                ]
                ledger.replace_lines(hour, lines, book)
                count += 1
    return count
