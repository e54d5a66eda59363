"""Facts → priced record: an hour's GPU-hours priced under the teams' map (`Pricer`), and the
re-pricing of stored facts (`reprice`)."""

from __future__ import annotations

import logging
import operator
from datetime import datetime

from gpumeter.billing.ingest.facts import RunAnswers
from gpumeter.billing.ingest.intervals import (
    HourIntervals,
    IntervalMismatch,
)
from gpumeter.billing.ledger.base import HourRecord, Ledger
from gpumeter.billing.models import (
    GpuHour,
    hour_floor,
    team_map_over,
    teams_in_cluster,
)
from gpumeter.billing.pricer import PricedLines, Pricer
from gpumeter.billing.pricing.base import PriceBook
from gpumeter.process import no_collections

log = logging.getLogger(__name__)


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


def reprice(ledger: Ledger, book: PriceBook, start: datetime, end: datetime, teams: dict[str, str]) -> int:
    """Re-price stored facts (e.g. after a price-book change); returns the number of hours re-priced.

    A re-price changes prices, not who pays: each hour's namespaces keep the teams their lines were
    billed to (the ingest's team map and labels of that hour), under ``teams`` where it names them;
    a namespace billed to no team takes the kept labels' (docs/billing.md §6.1)."""
    count = 0
    start = hour_floor(start)  # the hour it is in: the hours `facts_between` reads, and their teams
    labels = ledger.namespace_teams()
    billed = ledger.billed_teams(start, end)
    merged: dict[str, str] = {}
    merged_from: dict[str, str] | None = None
    pricer = Pricer(book)
    with no_collections():
        for hour, facts in ledger.facts_between(start, end):
            kept = billed.get(hour, {})
            if kept != merged_from:  # hours on end bill alike: one map for all of them
                merged, merged_from = team_map_over({**labels, **kept}, teams), kept
            # priced as ingest prices an hour: each cluster's team map worked out once, and the lines
            # handed over with their groups, so the ledger names again what it stored of a GPU's lines
            # an hour before instead of making and looking up every line
            record, _ = priced_record(pricer, hour, facts, merged)
            ledger.replace_lines(hour, record.lines, book, record.line_groups)
            count += 1
    return count
