"""HA pairs (issue 17): two real Prometheus servers holding the same history under different
``replica`` external labels, one of them missing an hour, as a replica restarted for an hour would.

Billing pointed at both (``--prometheus URL1,URL2``, billing/prom.py ReplicaSetClient) must write the
ledger one complete Prometheus gives, the hand-computed one of tests/billing/test_ingest_prometheus.py;
the hour one replica lacks is filled from the other. The same pair de-duplicated by VictoriaMetrics
itself (both replicas' samples in one VictoriaMetrics with -dedup.minScrapeInterval) gives it too.
"""

from __future__ import annotations

import subprocess
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from gpumeter.billing.ingest import IngestConfig, ingest_hours
from gpumeter.billing.ledger import MEMORY_URL, open_ledger
from gpumeter.billing.prom import PrometheusClient, ReplicaSetClient, open_client
from tests.billing import factories
from tests.billing.test_ingest_prometheus import (
    EXPECTED_BY_HOUR,
    EXPECTED_TOTAL,
    H0,
    _by_namespace,
    _snapshot,
    openmetrics,
)
from tests.support.servers import PrometheusServer, VictoriaMetricsServer, free_port, require_binary

HOURS = [H0 + timedelta(hours=i) for i in range(3)]
GAP = HOURS[1]  # the hour replica r2 lost
CONFIG = IngestConfig(scrape_interval=30)


def _without_hour(text: str, hour: datetime) -> str:
    """The history less the samples of ``hour`` (timestamps in [hour, hour + 1 h))."""
    start, end = hour.timestamp(), (hour + timedelta(hours=1)).timestamp()

    def kept(line: str) -> bool:
        return line.startswith("#") or not start <= float(line.rpartition(" ")[2]) < end

    return "".join(line for line in text.splitlines(keepends=True) if kept(line))


def _backfilled(root: Path, text: str, replica: str) -> PrometheusServer:
    source = root / f"{replica}.om"
    source.write_text(text)
    data = root / f"{replica}-data"
    subprocess.run(
        [require_binary("promtool"), "tsdb", "create-blocks-from", "openmetrics", str(source), str(data)],
        check=True,
        capture_output=True,
    )
    return PrometheusServer(root / replica, data_dir=data, external_labels={"replica": replica})


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """Replica r1 with the whole history, r2 without hour 1; both started, read-only here."""
    root = tmp_path_factory.mktemp("ha")
    history = openmetrics()
    r1 = _backfilled(root, history, "r1").start()
    r2 = _backfilled(root, _without_hour(history, GAP), "r2")
    try:
        r2.start()
        yield r1, r2
    finally:
        r2.stop()
        r1.stop()


@pytest.fixture
def book(tmp_path):
    return factories.book(
        tmp_path, {"A100-40GB": {"hourly_rate": "3.00"}, "H100-80GB": {"hourly_rate": "6.88"}}
    )


def _ingest(client, book):
    ledger = open_ledger(MEMORY_URL)
    result = ingest_hours(client, ledger, book, HOURS, CONFIG)
    return ledger, result


def _state(ledger):
    counts, lines = _snapshot(ledger)
    return {k: v for k, v in counts.items() if k != "ingest_runs"}, lines


def test_the_pair_bills_what_one_prometheus_bills_and_fills_a_replicas_gap(pair, book):
    r1, r2 = pair
    with PrometheusClient(r1.url) as client:
        single, result = _ingest(client, book)
    assert result.ingested == HOURS
    assert _by_namespace(single.lines(H0, H0 + timedelta(hours=3))) == EXPECTED_TOTAL

    with PrometheusClient(r2.url) as client:  # the gap is real: r2 alone cannot bill hour 1
        alone, result = _ingest(client, book)
    assert result.empty == [GAP] and alone.lines(GAP, GAP + timedelta(hours=1)) == []

    for urls in (f"{r1.url},{r2.url}", f"{r2.url},{r1.url}"):  # whichever replica is listed first
        with open_client(urls) as client:
            assert isinstance(client, ReplicaSetClient)
            merged, result = _ingest(client, book)
        assert result.ingested == HOURS and result.failed == []
        assert _state(merged) == _state(single)
        gap_lines = merged.lines(GAP, GAP + timedelta(hours=1))
        assert _by_namespace(gap_lines) == EXPECTED_BY_HOUR[1]


def test_a_replica_that_does_not_answer_fails_the_hour_and_writes_nothing(pair, book):
    r1, _ = pair
    with open_client(f"{r1.url},http://127.0.0.1:{free_port()}") as client:
        ledger, result = _ingest(client, book)
    assert result.ingested == [] and [hour for hour, _ in result.failed] == [HOURS[0]]
    assert "127.0.0.1" in result.failed[0][1]
    assert ledger.lines(H0, H0 + timedelta(hours=3)) == []


@pytest.mark.victoriametrics
def test_victoriametrics_deduplicates_the_pair_itself(tmp_path, book):
    """Both replicas' samples land in one VictoriaMetrics (as their remote writes would: the
    ``replica`` external label on every sample, r2 scraping 7 s before r1 and missing hour 1).
    VictoriaMetrics drops the label (-relabelConfig) and keeps the last sample of each 30 s
    (-dedup.minScrapeInterval): one series per pair, the hand-computed ledger from one URL. Without
    the de-duplication every hour holds twice the samples 30 s allow, and billing refuses it. (A
    replica scraping *after* the other can see a pod that ended in between once more: 30 s more,
    which no de-duplication can tell from a real sample; docs/billing.md §6.2.)"""
    relabel = tmp_path / "relabel.yml"
    relabel.write_text("- action: labeldrop\n  regex: replica\n")
    history = openmetrics()
    with VictoriaMetricsServer(
        tmp_path / "vm", extra_args=["-dedup.minScrapeInterval=30s", f"-relabelConfig={relabel}"]
    ) as vm:
        for replica, text, offset in (("r1", history, 0), ("r2", _without_hour(history, GAP), -7)):
            vm.import_openmetrics(_labelled(text, replica, offset).splitlines(keepends=True))
        with PrometheusClient(vm.url) as client:
            ledger, result = _ingest(client, book)
    assert result.ingested == HOURS and result.failed == []
    for i, expected in EXPECTED_BY_HOUR.items():
        hour = H0 + timedelta(hours=i)
        assert _by_namespace(ledger.lines(hour, hour + timedelta(hours=1))) == expected, i


def _labelled(text: str, replica: str, offset: int) -> str:
    """Each sample with ``replica="<replica>"`` added and its timestamp ``offset`` seconds later."""
    out = []
    for line in text.splitlines(keepends=True):
        if line.startswith("#"):
            continue
        head, _, stamp = line.rstrip("\n").rpartition(" ")
        series, _, value = head.rpartition(" ")
        series = series[:-1] + f',replica="{replica}"}}'
        out.append(f"{series} {value} {float(stamp) + offset:.0f}\n")
    return "".join(out)
