"""A cluster missing from a global store's answers costs only that cluster's GPU-hours, never what
was billed, and never silently (docs/billing.md §2.3). A REAL Prometheus holds one day of two
clusters (test_clusters' fleets, a sample every 20 minutes), served as the store answered it.

By hand: east's A100 at 3.00 is held by ml-training 00:00-12:00 and idle after (unallocated), 3.00
an hour either way: 72.00 a day. west's H100 at 6.88 is held all day: 165.12.

* **A gap.** west's series are missing 12:00-17:00 (a remote write behind, one store of a federation
  down): the day is billed with east's 72.00 and west's other 19 hours, 130.72, and hours 12-16 are
  recorded "partial" naming west, so catch-up retries them; once the store has them, the retry bills
  west's 5 x 6.88 = 34.40 more: 165.12, audited as west's 0 -> 6.88 in each of the five (a report
  sent before lacked them). Before, the five hours were "ok" without west and never retried.
* **A re-ingest without a cluster.** The day billed from both, then re-ingested from a store holding
  east only (west's retention ended): before, each hour was replaced, west's 165.12 deleted, and the
  command exited 0. Now each hour is kept as billed and recorded failed naming west, exit 1; with
  `--drop-missing-clusters` the hours are replaced, and the audit records west's 6.88 -> 0 each hour."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from io import StringIO

import pytest

import gpumeter
from gpumeter.billing.ingest import IngestConfig, ingest_hours
from gpumeter.billing.ingest.runs import cluster_gaps, missing_hours
from gpumeter.billing.ledger import open_ledger
from gpumeter.billing.prom import PrometheusClient
from gpumeter.simulator.fleet import parse_fleet
from gpumeter.simulator.history import write_history
from tests.billing import factories
from tests.billing.test_clusters import FLEETS, START, STEP, _one_store, _serve

pytestmark = [pytest.mark.prometheus]

D = Decimal
DAY = [START + timedelta(hours=i) for i in range(24)]
GAP = DAY[12:17]


@pytest.fixture(scope="module")
def prices(tmp_path_factory):
    return factories.book(
        tmp_path_factory.mktemp("prices"),
        {"A100-40GB": {"hourly_rate": "3.00"}, "H100-80GB": {"hourly_rate": "6.88"}},
    )


def _history(cluster: str, spans: list[tuple[int, int]], step: int = STEP) -> str:
    """``cluster``'s history over the hour spans given, labelled with its cluster."""
    out = StringIO()
    fleet = parse_fleet(FLEETS[cluster], source=f"<{cluster}>")
    start = START.timestamp()
    for first, end in spans:
        write_history(
            [fleet], start + first * 3600, start + end * 3600, step, out, processes=False, cluster=cluster
        )
    return out.getvalue().replace("# EOF\n", "") + "# EOF\n"


def _store(root, name: str, west: list[tuple[int, int]]):
    texts = [_history("east", [(0, 24)])] + ([_history("west", west)] if west else [])
    return _serve("prometheus", _one_store(texts), root / name)


def _billed(ledger) -> dict[str, Decimal]:
    totals: dict[str, Decimal] = {}
    for line in ledger.lines(DAY[0], DAY[-1] + timedelta(hours=1)):
        totals[line.cluster] = totals.get(line.cluster, D(0)) + (line.amount or 0)
    return totals


def _ingest(server, ledger, prices, hours, **config):
    with PrometheusClient(server.url) as client:
        return ingest_hours(client, ledger, prices, hours, IngestConfig(**config))


def test_cluster_gaps_are_hours_between_two_with_the_cluster():
    present = [{"east", "west"}, {"east"}, {"east"}, {"east", "west"}, {"east"}, set(), {"lab"}]
    # west is missing at 1 and 2 (before and after it: a gap), not at 4-6 (gone as far as the run
    # knows); east not at 5 (nothing after it); lab came at 6
    assert cluster_gaps(present) == [(), ("west",), ("west",), (), (), (), ()]
    assert cluster_gaps([]) == [] and cluster_gaps([{"a"}]) == [()]


def test_a_gap_in_one_cluster_is_partial_and_retried(prices, tmp_path):
    ledger = open_ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    gapped = _store(tmp_path, "gapped", [(0, 12), (17, 24)])
    try:
        result = _ingest(gapped, ledger, prices, DAY)
    finally:
        gapped.stop()
    try:
        assert result.ingested == DAY and result.failed == []
        assert [hour for hour, _ in result.refused] == GAP
        assert all(
            "cluster(s) west: no GPU or allocation series this hour" in why for _, why in result.refused
        )
        assert _billed(ledger) == {"east": D("72.00"), "west": D("130.72")}  # 19 x 6.88
        runs = {run.hour: run.status for run in ledger.ingest_runs(DAY[0], DAY[-1] + timedelta(hours=1))}
        assert [hour for hour in DAY if runs[hour] == "partial"] == GAP
        now = DAY[-1] + timedelta(hours=1, minutes=10)
        assert missing_hours(ledger, now, IngestConfig(catchup_hours=24)) == GAP

        whole = _store(tmp_path, "whole", [(0, 24)])
        try:
            retried = _ingest(
                whole, ledger, prices, missing_hours(ledger, now, IngestConfig(catchup_hours=24))
            )
        finally:
            whole.stop()
        assert retried.ingested == GAP and retried.refused == [] and retried.failed == []
        assert _billed(ledger) == {"east": D("72.00"), "west": D("165.12")}
        # the hours were billed (east's): west's 34.40 since is a change a report sent before lacks
        assert [(r.hour, r.cluster, r.old_total, r.new_total) for r in ledger.audit_records()] == [
            (hour, "west", D("0"), D("6.88")) for hour in GAP
        ]
    finally:
        ledger.close()


def test_a_re_ingest_never_drops_a_billed_cluster_unless_told(prices, tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    ledger = open_ledger(url)
    whole = _store(tmp_path, "whole", [(0, 24)])
    try:
        assert _ingest(whole, ledger, prices, DAY).ingested == DAY
    finally:
        whole.stop()
    assert _billed(ledger) == {"east": D("72.00"), "west": D("165.12")}
    east_only = _store(tmp_path, "east-only", [])
    try:
        result = _ingest(east_only, ledger, prices, DAY)
        assert result.ingested == [] and [hour for hour, _ in result.refused] == DAY
        assert "cluster(s) west: billed in this hour before, but the store has no" in result.refused[0][1]
        assert _billed(ledger) == {"east": D("72.00"), "west": D("165.12")}  # kept as billed
        assert ledger.audit_records() == []

        # the command says so and fails; the hours stay "ok" (billed), with the failed attempt beside
        argv = ["billing", "ingest", "--db", url, "--prometheus", east_only.url, "--prices", str(prices.path)]
        argv += ["--from", DAY[0].isoformat(), "--to", DAY[3].isoformat(), "--no-progress", "--workers", "1"]
        assert gpumeter.main(argv) == 1
        assert "west: billed in this hour before" in capsys.readouterr().err
        assert _billed(ledger) == {"east": D("72.00"), "west": D("165.12")}

        dropped = _ingest(east_only, ledger, prices, DAY, drop_missing_clusters=True)
        assert dropped.ingested == DAY and dropped.refused == []
        assert _billed(ledger) == {"east": D("72.00")}
        assert {(r.cluster, r.old_total, r.new_total) for r in ledger.audit_records()} == {
            ("west", D("6.88"), D("0"))
        }
        assert len(ledger.audit_records()) == 24
    finally:
        east_only.stop()
        ledger.close()


def test_a_scrape_interval_one_cluster_contradicts_costs_that_clusters_gpu_hours(prices, tmp_path):
    """--scrape-interval 1200 where west's exporter was scraped every 600 s: west's GPU-hours are
    refused, each hour recorded partial naming west's node, and east is billed its 72.00. Before, every
    hour of both clusters was refused."""
    ledger = open_ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    texts = [_history("east", [(0, 24)]), _history("west", [(0, 24)], step=600)]
    store = _serve("prometheus", _one_store(texts), tmp_path / "store")
    try:
        result = _ingest(store, ledger, prices, DAY, scrape_interval=1200)
        assert result.ingested == DAY and result.failed == [] and [h for h, _ in result.refused] == DAY
        assert _billed(ledger) == {"east": D("72.00")}
        refused = ledger.refused_gpu_hours(DAY[0], DAY[-1] + timedelta(hours=1))
        assert {(r.cluster, r.hour) for r in refused} == {("west", hour) for hour in DAY}
        assert {r.reason for r in refused} == {
            "samples disagree with the scrape interval given: west/gpu-01: samples every 600 s, but "
            "--scrape-interval is 1200 s"
        }
    finally:
        store.stop()
        ledger.close()
