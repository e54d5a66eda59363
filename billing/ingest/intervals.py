"""Seconds per sample, per exporter and hour, read from the samples themselves (docs/billing.md §2.1):
what turns a sample count into seconds held."""

from __future__ import annotations

import bisect
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from gpumeter import contract
from gpumeter.billing import queries
from gpumeter.billing.ingest.columns import (
    MAX_SAMPLES_AN_HOUR,
    _at,
    _why,
)
from gpumeter.billing.ingest.config import IngestConfig
from gpumeter.billing.models import (
    HOUR,
    hour_floor,
)
from gpumeter.billing.prom import (
    BadAnswer,
    QueryClient,
)

# The seconds per sample assumed when the data cannot tell (docs/billing.md §2.1): the interval the
# ServiceMonitor in deploy/ asks for. An hour billed on this assumption is recorded "suspect".
ASSUMED_INTERVAL = 30.0
STEADY_SEARCH_HOURS = 24  # how far from an hour its exporter's interval is looked for
INTERVAL_TOLERANCE = 0.10  # observed vs assumed interval: a larger difference refuses or flags the hour
# sample counts of each exporter's densest nvidia_gpu_info series, per hour (interval detection)
# (aggregated by the engine: ~1,000 series x 73 steps a run against ~125 x 73, for no time saved)
HOST_COUNTS = queries.HourQuery(contract.GPU_INFO, "count_over_time", (contract.HOSTNAME,)).aggregated()
_HOST_SAMPLES = queries.HourQuery(contract.GPU_INFO, "count_over_time", (contract.HOSTNAME,)).promql()


class IntervalMismatch(ValueError):
    """The samples of an hour show another scrape interval than the one given: billing it would
    under- or over-bill every series of the hour."""


@dataclass(frozen=True)
class HourIntervals:
    """Seconds per sample during one hour: per exporter (its hostname), else the fleet's."""

    by_host: dict[str, float]
    fleet: float
    problems: tuple[str, ...] = ()  # what makes the hour doubtful (suspect) or, given an interval, refused
    # given an interval: the exporters whose samples show another, and why; their GPU-hours are refused
    # (`RunAnswers.build`), the rest of the hour billed
    mismatched: dict[str, str] = field(default_factory=dict)

    def of(self, host: str) -> float:
        return self.by_host.get(host, self.fleet)

    def of_cluster(self, cluster: str) -> HourIntervals:
        """One cluster's intervals, from a store's counted per cluster (`query_intervals`, hosts named
        ``cluster/host``): two clusters' nodes of one name are two exporters. Counted per hostname
        alone, the same for every cluster."""
        if not any("/" in host for host in (*self.by_host, *self.mismatched)):
            return self
        prefix = f"{cluster}/"

        def own(by_host: dict) -> dict:
            return {
                host.removeprefix(prefix): value
                for host, value in by_host.items()
                if (host.startswith(prefix) if cluster else "/" not in host)
            }

        return HourIntervals(own(self.by_host), self.fleet, self.problems, own(self.mismatched))


def mismatch_text(mismatched: dict[str, str], shown: int = 3) -> str:
    """Why a cluster's GPU-hours are refused where its exporters disagree with the interval given."""
    texts = [mismatched[host] for host in sorted(mismatched)]
    more = f"; and {len(texts) - shown} more" if len(texts) > shown else ""
    return "samples disagree with the scrape interval given: " + "; ".join(texts[:shown]) + more


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
        if config.scrape_interval > 0:  # each exporter that disagrees costs its own GPU-hours only
            given = config.scrape_interval
            mismatched = {
                host: f"{host or '(no hostname)'}: samples every {interval:g} s, but --scrape-interval is {given:g} s"
                for host, interval in detected.items()
                if not _near(interval, given)
            }
            out[hour] = HourIntervals({}, given, (), mismatched)
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
