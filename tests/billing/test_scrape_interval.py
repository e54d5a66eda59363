"""The scrape interval comes from the data (docs/billing.md §2.1), not from a flag that defaults to 30 s.

Billing counts samples; seconds are samples × the interval. With the interval fixed at 30 s, data
scraped every 60 s billed half of every GPU and every 300 s a tenth, all reconciled, exit 0. Here
the same five hours of a two-node fleet are backfilled into a real Prometheus at 30, 60 and 300 s
steps and ingested with no --scrape-interval: each bills the hand-computed figures to the cent.
"""

from __future__ import annotations

import contextlib
import itertools
import subprocess
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest

import gpumeter
from gpumeter.billing.ingest import IngestConfig, detect_intervals, missing_hours
from gpumeter.billing.ingest.intervals import STEADY_SEARCH_HOURS, steady_intervals
from gpumeter.billing.ledger import open_ledger
from gpumeter.billing.metrics import BillingCollector
from gpumeter.billing.models import UNALLOCATED
from tests.billing.conftest import QUERY_BACKENDS
from tests.billing.factories import write_book
from tests.support.hypothesis_profiles import examples
from tests.support.servers import PrometheusServer, VictoriaMetricsServer, require_binary

D = Decimal
H0 = datetime(2026, 11, 20, 0, 0, tzinfo=UTC)
HOURS = 5
MODEL = "NVIDIA H100 80GB HBM3"  # H100-80GB, $6.88 an hour

# (series labels, minutes present [from, to)) — every edge on a 5-minute boundary, so 30, 60 and
# 300 s scrapes all see the same presence.
NODE1 = {"hostname": "node-1", "job": "gpumeter", "instance": "node-1:9400"}
NODE2 = {"hostname": "node-2", "job": "gpumeter", "instance": "node-2:9400"}


def _gpu(node: dict, gpu: str, uuid: str) -> dict:
    return {**node, "gpu": gpu, "uuid": uuid, "model": MODEL, "mig_mode": "Disabled"}


def _pod(node: dict, gpu: str, uuid: str, namespace: str, pod: str) -> dict:
    labels = {**node, "namespace": namespace, "pod": pod, "container": "main", "resource": "nvidia.com/gpu"}
    return {**labels, "uuid": uuid, "gpu": gpu, "gpu_instance_id": "", "mig_profile": ""}


INFO = [
    (_gpu(NODE1, "0", "GPU-a"), (0, 300)),
    (_gpu(NODE1, "1", "GPU-b"), (0, 300)),
    (_gpu(NODE2, "0", "GPU-c"), (135, 300)),  # a node that joined at 2:15: its first hour is not steady
]
ALLOCATIONS = [
    (_pod(NODE1, "0", "GPU-a", "research", "r-0"), (0, 300)),
    (_pod(NODE1, "1", "GPU-b", "web", "w-0"), (90, 180)),
    (_pod(NODE2, "0", "GPU-c", "batch", "b-0"), (135, 300)),
]

# By hand, H100 at $6.88 an hour, whole GPUs:
# hour 0: research 6.88 (GPU-a) ; GPU-b unallocated 6.88
# hour 1: research 6.88 ; web from :30, 0.5 x 6.88 = 3.44 ; GPU-b unallocated 3.44
# hour 2: research 6.88 ; web 6.88 ; GPU-c present from :15, 2700 s = 0.75 x 6.88 = 5.16, all batch's
# hour 3: research 6.88 ; web gone at 3:00, GPU-b unallocated 6.88 ; batch 6.88
# hour 4: research 6.88 ; GPU-b unallocated 6.88 ; batch 6.88
EXPECTED = {
    "research": D("34.40"),  # 5 x 6.88
    "web": D("10.32"),  # 3.44 + 6.88
    "batch": D("18.92"),  # 5.16 + 6.88 + 6.88
    UNALLOCATED: D("24.08"),  # 6.88 + 3.44 + 0 + 6.88 + 6.88
}
assert sum(EXPECTED.values()) == D("87.72")  # GPU-a 34.40 + GPU-b 34.40 + GPU-c 18.92


def _openmetrics(step: int, hours: int = HOURS) -> str:
    end_minute = 60 * hours
    lines = []
    for name, series in (("nvidia_gpu_info", INFO), ("nvidia_gpu_allocation", ALLOCATIONS)):
        lines.append(f"# TYPE {name} gauge")
        for labels, (start, end) in series:
            text = ",".join(f'{k}="{v}"' for k, v in labels.items())
            for second in range(start * 60, min(end, end_minute) * 60, step):
                lines.append(f"{name}{{{text}}} 1 {(H0 + timedelta(seconds=second)).timestamp():.0f}")
    return "\n".join([*lines, "# EOF"]) + "\n"


def _backfill(root, step: int, hours: int = HOURS):
    source = root / f"history-{step}.om"
    source.write_text(_openmetrics(step, hours))
    data = root / f"data-{step}-{hours}"
    subprocess.run(
        [require_binary("promtool"), "tsdb", "create-blocks-from", "openmetrics", str(source), str(data)],
        check=True,
        capture_output=True,
    )
    return data


@contextlib.contextmanager
def _served(backend: str, root, step: int, hours: int = HOURS):
    """The history at ``step`` on a real query backend: Prometheus (backfilled) or VictoriaMetrics
    (imported)."""
    if backend == "prometheus":
        with PrometheusServer(root / "prom", data_dir=_backfill(root, step, hours)) as server:
            yield server
        return
    with VictoriaMetricsServer(root / "vm") as server:
        server.import_openmetrics(_openmetrics(step, hours).splitlines(keepends=True))
        yield server


@pytest.fixture
def book(tmp_path):
    doc = {"currency": "USD", "versions": [{"effective_from": "2026-01-01", "gpus": {"H100-80GB": "6.88"}}]}
    return write_book(tmp_path, doc, "book.yaml")


def _ingest(tmp_path, prometheus: PrometheusServer | VictoriaMetricsServer, book, *extra: str) -> int:
    argv = ["billing", "ingest", "--db", f"sqlite:///{tmp_path / 'ledger.db'}", "--prices", str(book)]
    argv += ["--prometheus", prometheus.url, "--no-progress", "--workers", "1"]
    argv += ["--from", H0.isoformat(), "--to", (H0 + timedelta(hours=HOURS)).isoformat(), *extra]
    return gpumeter.main(argv)


def _totals(tmp_path) -> dict[str, Decimal]:
    ledger = open_ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    try:
        lines = ledger.lines(H0, H0 + timedelta(hours=HOURS))
    finally:
        ledger.close()
    out: dict[str, Decimal] = defaultdict(D)
    for line in lines:
        out[line.namespace] += line.amount
    return dict(out)


@pytest.mark.prometheus
@pytest.mark.parametrize("backend", QUERY_BACKENDS)
@pytest.mark.parametrize("step", [30, 60, 300])
def test_every_scrape_interval_bills_the_same_without_the_flag(tmp_path, book, capsys, step, backend):
    """The interval is derived from count_over_time per exporter and hour, on either engine."""
    with _served(backend, tmp_path, step) as prometheus:
        assert _ingest(tmp_path, prometheus, book) == 0
    err = capsys.readouterr().err
    assert "suspect" not in err, err
    assert _totals(tmp_path) == EXPECTED


@pytest.mark.prometheus
def test_a_given_interval_the_samples_contradict_is_refused(tmp_path, book, capsys):
    """--scrape-interval 30 over data scraped every 60 s would bill half of every GPU: every GPU-hour
    of the cluster is refused, each hour on its own (one hour's refusal never stops the next,
    docs/billing.md), recorded partial with the reason, and nothing is billed. node-2, which joined at
    2:15, is never steady enough to show its interval, and is refused with its cluster: billed at 30 s
    it would have been billed half. (A global store's other clusters are billed:
    tests/billing/test_cluster_gaps.py.)"""
    with PrometheusServer(tmp_path / "prom", data_dir=_backfill(tmp_path, 60)) as prometheus:
        assert _ingest(tmp_path, prometheus, book, "--scrape-interval", "30") == 1
    err = capsys.readouterr().err
    assert "node-1: samples every 60 s, but --scrape-interval is 30 s" in err, err
    ledger = open_ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    try:
        runs = ledger.ingest_runs(H0, H0 + timedelta(hours=HOURS))
        assert ledger.counts()["cost_lines"] == 0
        refused = ledger.refused_gpu_hours(H0, H0 + timedelta(hours=HOURS))
    finally:
        ledger.close()
    assert [(run.hour, run.status) for run in runs] == [
        (H0 + timedelta(hours=h), "partial") for h in range(HOURS)
    ]
    # GPU-a and GPU-b every hour, GPU-c from 2:15: 2 + 2 + 3 + 3 + 3
    assert sorted((r.hour.hour, r.uuid) for r in refused) == sorted(
        [(h, u) for h in range(HOURS) for u in ("GPU-a", "GPU-b")] + [(h, "GPU-c") for h in (2, 3, 4)]
    )
    assert {r.reason for r in refused} == {
        "samples disagree with the scrape interval given: node-1: samples every 60 s, but "
        "--scrape-interval is 30 s"
    }


@pytest.mark.prometheus
def test_a_given_interval_the_samples_agree_with_bills_as_derived(tmp_path, book):
    with PrometheusServer(tmp_path / "prom", data_dir=_backfill(tmp_path, 300)) as prometheus:
        assert _ingest(tmp_path, prometheus, book, "--scrape-interval", "300") == 0
    assert _totals(tmp_path) == EXPECTED


@pytest.mark.prometheus
@pytest.mark.parametrize("backend", QUERY_BACKENDS)
def test_too_little_history_to_tell_is_billed_but_marked_suspect(tmp_path, book, capsys, backend):
    """Two hours of 60 s data hold no steady hour (three alike in a row): the densest hour's interval
    is used, and the run says so: status "suspect", a warning, and the runs metric."""
    with _served(backend, tmp_path, 60, hours=2) as prometheus:
        argv = ["--to", (H0 + timedelta(hours=2)).isoformat()]
        assert _ingest(tmp_path, prometheus, book, *argv) == 0
    err = capsys.readouterr().err
    assert (
        "warning: hour 2026-11-20T00:00:00+00:00 ingested but suspect: no exporter had three steady hours"
        in err
    )
    ledger = open_ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    try:
        statuses = [run.status for run in ledger.ingest_runs(H0, H0 + timedelta(hours=2))]
        registry = CollectorRegistry()
        registry.register(BillingCollector(ledger))
        exposition = generate_latest(registry).decode()
        missing = missing_hours(ledger, H0 + timedelta(hours=2, minutes=5), IngestConfig(catchup_hours=2))
    finally:
        ledger.close()
    assert statuses == ["suspect", "suspect"]
    assert 'gpumeter_billing_ingest_runs_total{status="suspect"} 2.0' in exposition
    assert missing == []  # written: catch-up does not redo them
    # both hours billed at 60 s: research 2 x 6.88 ; web 3.44 ; GPU-b unallocated 6.88 + 3.44
    assert _totals(tmp_path) == {"research": D("13.76"), "web": D("3.44"), UNALLOCATED: D("10.32")}


@pytest.mark.prometheus
def test_an_hour_prometheus_had_nothing_for_is_retried_once_data_arrives(tmp_path, book, capsys):
    """An empty answer is recorded "empty", not done: the hour stays missing for catch-up, and once
    the samples are there (here: backfilled late) it is billed."""
    data = tmp_path / "late"
    with PrometheusServer(tmp_path / "prom", data_dir=data) as prometheus:
        assert _ingest(tmp_path, prometheus, book) == 0
    assert "had no series in Prometheus" in capsys.readouterr().err
    ledger = open_ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    config = IngestConfig(catchup_hours=HOURS)
    now = H0 + timedelta(hours=HOURS, minutes=5)
    try:
        assert {run.status for run in ledger.ingest_runs(H0, now)} == {"empty"}
        assert len(missing_hours(ledger, now, config)) == HOURS
    finally:
        ledger.close()
    import shutil

    shutil.rmtree(data)
    shutil.copytree(_backfill(tmp_path, 60), data)
    with PrometheusServer(tmp_path / "prom2", data_dir=data) as prometheus:
        assert _ingest(tmp_path, prometheus, book) == 0
    assert _totals(tmp_path) == EXPECTED


# --- the rule itself, on sample counts ---------------------------------------------------------


def _hours(n: int) -> list[datetime]:
    return [H0 + timedelta(hours=i) for i in range(n)]


def test_an_interval_change_is_followed_within_an_hour_and_flagged_where_it_happened():
    """node-1 goes from 30 s to 60 s at 10:30: 120 samples an hour, then 90, then 60."""
    counts = {h: 120.0 if i < 10 else 90.0 if i == 10 else 60.0 for i, h in enumerate(_hours(20))}
    intervals = detect_intervals({"node-1": counts}, _hours(20), IngestConfig())
    used = [intervals[h].of("node-1") for h in _hours(20)]
    assert used[:10] == [30.0] * 10 and used[11:] == [60.0] * 9
    doubtful = [i for i, h in enumerate(_hours(20)) if intervals[h].problems]
    assert doubtful == [9, 10, 11], (
        doubtful
    )  # between the last steady 30 s hour (8) and the first 60 s one (12)


def test_a_node_without_a_steady_hour_takes_the_fleets_interval():
    steady = {h: 60.0 for h in _hours(6)}
    young = {_hours(6)[4]: 30.0, _hours(6)[5]: 60.0}  # joined at 4:30, at 60 s like the rest
    intervals = detect_intervals({"old": steady, "young": young}, _hours(6), IngestConfig())
    assert intervals[_hours(6)[4]].of("young") == 60.0 and not intervals[_hours(6)[4]].problems


_STRETCHES = st.lists(  # an exporter's history: stretches of hours at one count (0: absent, a gap)
    st.tuples(st.integers(1, 30), st.sampled_from([0.0, 59.0, 60.0, 61.0, 120.0, 240.0])), max_size=8
)


@settings(max_examples=examples(300), deadline=None)
@given(st.dictionaries(st.sampled_from(["node-a", "node-b", "node-c"]), _STRETCHES), st.integers(-20, 80))
def test_each_exporter_takes_the_interval_of_its_nearest_steady_hour(stretches_by_host, first):
    """docs/billing.md §2.1 as written: an exporter's interval in hour h is that of its steady hour
    nearest to h within STEADY_SEARCH_HOURS, the earlier one on a tie; none within reach, none of
    its own. Checked against that definition, steady hour by steady hour, for histories of gaps,
    restarts and changes on either side of the hours asked about (from 30 hours before them)."""
    host_counts = {}
    for host, stretches in stretches_by_host.items():
        counts = itertools.chain.from_iterable(itertools.repeat(n, length) for length, n in stretches)
        host_counts[host] = {H0 + timedelta(hours=k): n for k, n in enumerate(counts, -30) if n}
    hours = [H0 + timedelta(hours=first + i) for i in range(24)]
    intervals = detect_intervals(host_counts, hours, IngestConfig())
    reach = timedelta(hours=STEADY_SEARCH_HOURS)
    steady_by_host = {host: steady_intervals(counts) for host, counts in host_counts.items()}
    for hour in hours:
        for host, steady in steady_by_host.items():
            within = [t for t in steady if abs(t - hour) <= reach]
            nearest = min(within, key=lambda t: (abs(t - hour), t), default=None)
            own = intervals[hour].by_host.get(host)
            assert own == (None if nearest is None else steady[nearest]), (host, hour)


def test_exporters_at_different_intervals_keep_their_own():
    counts = {"fast": {h: 240.0 for h in _hours(5)}, "slow": {h: 12.0 for h in _hours(5)}}
    intervals = detect_intervals(counts, _hours(5), IngestConfig())[_hours(5)[2]]
    assert (intervals.of("fast"), intervals.of("slow")) == (15.0, 300.0)
