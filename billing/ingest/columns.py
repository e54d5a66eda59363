"""Range answers → columns: each query's series reduced to ``max by`` the labels billing keeps, with
one value per hour of the run, screened against the query's bounds (docs/billing.md §2.2, §6.5)."""

from __future__ import annotations

import itertools
import operator
import sys
from collections.abc import Iterable
from datetime import datetime, timedelta

from gpumeter import contract
from gpumeter.billing import queries
from gpumeter.billing.models import (
    HOUR,
)
from gpumeter.billing.prom import (
    BadAnswer,
    reading,
)
from gpumeter.billing.refusals import Refused, screen_values

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


def _why(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc!s:.200}"


class SeriesLabels(dict):
    """The labels one series of an answer keeps (`_columns`), with room for what billing derives
    from them: a range answer holds each series once for all its steps, so its GPU, pod, profile...
    are parsed once per series rather than once per hour (`derived`: the function and what it gave;
    unset until then)."""

    __slots__ = ("derived",)


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
        try:
            values = _series_values(points, slots, first, count, convert)
        except ValueError:  # a value's text is no number: that reading is refused, not the answer
            values = _series_values(points, slots, first, count, reading)
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


def _series_values(points: list, slots: dict[float, int], first: float, count: int, convert) -> Values:
    """One series' points as its values per hour of the run, each converted by ``convert``."""
    # a series with a point at each step from its first to its last (held all run, or by a pod
    # that started or stopped within it): its values in one slice, not point by point
    start = slots.get(points[0][0]) if points else None
    if start is not None and slots.get(points[-1][0]) == start + len(points) - 1:
        if len(points) == count:
            return list(map(convert, map(_VALUE, points)))
        values: Values = [None] * count
        values[start : start + len(points)] = map(convert, map(_VALUE, points))
        return values
    values = [None] * count
    for t, value in points:
        index = slots.get(t)
        if index is None:  # an engine that wrote the time otherwise: the nearest hour
            index = round((t - first) / 3600)
            if not 0 <= index < count:
                continue
        values[index] = convert(value)
    return values


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
