"""The questions a run of hours asks the store (range queries; instant queries for one hour) and
their answers decoded into `RunAnswers`."""

from __future__ import annotations

import itertools
from datetime import datetime

from gpumeter import contract
from gpumeter.billing.ingest.columns import (
    QUERIES,
    _at,
    _query_columns,
)
from gpumeter.billing.ingest.config import IngestConfig
from gpumeter.billing.ingest.facts import ClusterAnswers, RunAnswers, by_cluster
from gpumeter.billing.ingest.intervals import (
    HourIntervals,
    query_intervals,
)
from gpumeter.billing.models import (
    HOUR,
    GpuHour,
)
from gpumeter.billing.prom import (
    QueryClient,
    RangeAnswer,
    Sample,
)
from gpumeter.billing.refusals import Refused
from gpumeter.process import no_collections


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
            with no_collections():
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


def _fetch_run(client, hours: list[datetime], config) -> tuple[FetchedRun, dict[datetime, HourIntervals]]:
    """The requests of a run of consecutive hours (its answers still to decode) and its scrape intervals."""
    return FetchedRun(client, hours, config.cluster_label), query_intervals(client, hours, config)
