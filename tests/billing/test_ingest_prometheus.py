"""Ingest against a REAL Prometheus: a hand-written OpenMetrics history (3 hours at 30 s steps),
backfilled with `promtool tsdb create-blocks-from openmetrics`, queried hour by hour. Every total
below was worked out by hand (see the comments), never by the code under test."""

from __future__ import annotations

import subprocess
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import httpx
import pytest

import gpumeter
from gpumeter.billing.ingest import IngestConfig, catch_up, ingest_hour, ingest_hours
from gpumeter.billing.ingest.columns import _at
from gpumeter.billing.models import UNALLOCATED
from gpumeter.billing.pricing import load_price_book
from gpumeter.billing.prom import PrometheusClient, PrometheusError
from tests.billing.conftest import QUERY_BACKENDS
from tests.billing.factories import write_book
from tests.support.servers import PrometheusServer, VictoriaMetricsServer, require_binary

D = Decimal
H0 = datetime(2026, 11, 20, 0, 0, tzinfo=UTC)
STEP = 30
N = 360  # 3 hours of samples, k = 0..359 at H0 + 30 k s
A, H = "GPU-aaaa", "GPU-hhhh"
NODE = {"hostname": "node-1", "job": "gpumeter", "instance": "node-1:9400"}
# H's nvidia_gpu_info labels as an instant answer gives them (the tests that answer by hand)
H_INFO = {"uuid": H, "gpu": "1", "model": "NVIDIA H100 80GB HBM3", "hostname": "n", "mig_mode": "Disabled"}
LAYOUT = [("1", "3g.20gb", 3, 4), ("5", "2g.10gb", 2, 2), ("13", "1g.5gb", 1, 1), ("14", "1g.5gb", 1, 1)]


def _series(name: str, labels: dict, ks, value="1") -> list[str]:
    text = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return [f"{name}{{{text}}} {value} {(H0 + timedelta(seconds=STEP * k)).timestamp():.0f}" for k in ks]


def openmetrics() -> str:
    lines = ["# TYPE nvidia_gpu_info gauge"]
    for uuid, gpu, model, mode in (
        (A, "0", "NVIDIA A100-SXM4-40GB", "Enabled"),
        (H, "1", "NVIDIA H100 80GB HBM3", "Disabled"),
    ):
        info = {**NODE, "gpu": gpu, "uuid": uuid, "model": model, "pci_bus_id": f"0000:0{gpu}:00.0"}
        info |= {"driver_version": "560.35.03", "cuda_version": "12.6", "mig_mode": mode}
        lines += _series("nvidia_gpu_info", info, range(N))
    lines.append("# TYPE nvidia_gpu_mig_info gauge")
    for gi, profile, c, m in LAYOUT:
        labels = {**NODE, "gpu": "0", "uuid": A, "gpu_instance_id": gi, "compute_instance_id": "0"}
        labels |= {"mig_uuid": f"MIG-{gi}", "mig_profile": profile, "compute_slices": c, "memory_slices": m}
        lines += _series("nvidia_gpu_mig_info", labels, range(N))
    lines.append("# TYPE nvidia_gpu_allocation gauge")

    def alloc(ns, pod, uuid, gpu, gi, profile, ks, value="1", resource="nvidia.com/gpu", **extra):
        labels = {**NODE, "namespace": ns, "pod": pod, "container": "main", "resource": resource}
        labels |= {"uuid": uuid, "gpu": gpu, "gpu_instance_id": gi, "mig_profile": profile, **extra}
        return _series("nvidia_gpu_allocation", labels, ks, value)

    lines += alloc("team-a", "a-0", A, "0", "1", "3g.20gb", range(N), resource="nvidia.com/mig-3g.20gb")
    lines += alloc("team-b", "b-0", A, "0", "5", "2g.10gb", range(240), resource="nvidia.com/mig-2g.10gb")
    lines += alloc("team-b", "b-1", A, "0", "13", "1g.5gb", range(60, N), resource="nvidia.com/mig-1g.5gb")
    shared = "nvidia.com/gpu.shared"
    lines += alloc("inference", "p1", H, "1", "", "", [k for k in range(N) if k != 50], "0.25", shared)
    lines += alloc("inference", "p2", H, "1", "", "", range(N), "0.25", shared)
    for replica in ("r1", "r2"):  # an HA pair: counted once (max), not twice
        lines += alloc(
            "inference", "p3", H, "1", "", "", range(60), "0.25", shared, prometheus_replica=replica
        )
    lines.append("# TYPE nvidia_gpu_utilization_ratio gauge")
    lines += _series("nvidia_gpu_utilization_ratio", {**NODE, "gpu": "1", "uuid": H}, range(N), "0.5")
    lines.append("# TYPE nvidia_gpu_mig_sm_utilization_ratio gauge")
    mig1 = {
        **NODE,
        "gpu": "0",
        "uuid": A,
        "gpu_instance_id": "1",
        "compute_instance_id": "0",
        "mig_profile": "3g.20gb",
    }
    lines += _series("nvidia_gpu_mig_sm_utilization_ratio", mig1, range(N), "0.25")
    lines.append("# TYPE kube_namespace_labels gauge")
    ksm = {"job": "kube-state-metrics", "namespace": "team-a", "label_team": "alpha"}
    lines += _series("kube_namespace_labels", ksm, range(0, N, 4))
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


# Hand-computed lines per hour (A100-40GB $3.00, H100 $6.88, compute weights, efficiency 1):
# hour 0, A: team-a 3/7*3 = 1.2857 (1.28, rem .5714) ; b-0 2/7*3 = 0.8571 (0.85, .7142) ;
#            b-1 from :30 = 0.5*1/7*3 = 0.2142 (0.21, .4285) ; unallocated gi13 half + gi14 = 0.6428 (0.64, .2857)
#            floors 2.98, residue 2 -> b-0 0.86, team-a 1.29.
#         H: p1 (one missed scrape, bridged) 0.25*6.88 = 1.72 ; p2 1.72 ; p3 30 min (HA pair, max) 0.86 ;
#            unallocated 6.88 - 4.30 = 2.58.
# hour 1, A: team-a 1.28 ; b-0 0.86 ; b-1 0.43 ; unallocated gi14 0.43 (residue 3 to .8571, .8571, .7142)
#         H: p1 1.72 ; p2 1.72 ; unallocated 3.44
# hour 2, A: team-a 1.29 (tie .5714 with unallocated, tenants first) ; b-1 0.43 ; unallocated gi5 + gi14 1.28
#         H: as hour 1.
EXPECTED_BY_HOUR = {
    0: {"team-a": D("1.29"), "team-b": D("1.07"), "inference": D("4.30"), UNALLOCATED: D("3.22")},
    1: {"team-a": D("1.28"), "team-b": D("1.29"), "inference": D("3.44"), UNALLOCATED: D("3.87")},
    2: {"team-a": D("1.29"), "team-b": D("0.43"), "inference": D("3.44"), UNALLOCATED: D("4.72")},
}
EXPECTED_TOTAL = {"team-a": D("3.86"), "team-b": D("2.79"), "inference": D("11.18"), UNALLOCATED: D("11.81")}


@pytest.fixture(scope="module")
def tsdb(tmp_path_factory):
    """The backfilled TSDB, built once; each test copies it (Prometheus writes into its data dir)."""
    root = tmp_path_factory.mktemp("history")
    source = root / "history.om"
    source.write_text(openmetrics())
    data = root / "data"
    subprocess.run(
        [require_binary("promtool"), "tsdb", "create-blocks-from", "openmetrics", str(source), str(data)],
        check=True,
        capture_output=True,
    )
    return data


@pytest.fixture(params=QUERY_BACKENDS)
def prometheus(request, tmp_path):
    """The history on each query backend: a real Prometheus with a copy of the backfilled TSDB, or a
    real VictoriaMetrics with the same OpenMetrics posted to its import API."""
    import shutil

    if request.param == "prometheus":
        data = tmp_path / "prom-data"
        shutil.copytree(request.getfixturevalue("tsdb"), data)
        server = PrometheusServer(tmp_path / "prom", data_dir=data).start()
    else:
        server = VictoriaMetricsServer(tmp_path / "vm").start()
        server.import_openmetrics(openmetrics().splitlines(keepends=True))
    yield server
    server.stop()


@pytest.fixture
def book(tmp_path):
    doc = {
        "currency": "USD",
        "versions": [
            {
                "effective_from": "2026-01-01T00:00:00Z",
                "gpus": {"A100-40GB": {"hourly_rate": "3.00"}, "H100-80GB": {"hourly_rate": "6.88"}},
            }
        ],
    }
    return write_book(tmp_path, doc, "book.yaml")


def _by_namespace(lines) -> dict[str, Decimal]:
    out: dict[str, Decimal] = defaultdict(D)
    for line in lines:
        out[line.namespace] += line.amount
    return dict(out)


def _snapshot(ledger):
    return ledger.counts(), sorted(
        (x.hour, x.uuid, x.kind, x.namespace, x.pod, x.amount, x.quantity)
        for x in ledger.lines(H0, H0 + timedelta(hours=3))
    )


def test_ingest_matches_hand_computed_totals_and_is_idempotent(prometheus, ledger, book):
    prices = load_price_book(book)
    config = IngestConfig(scrape_interval=30)
    with PrometheusClient(prometheus.url) as client:
        result = ingest_hours(client, ledger, prices, [H0 + timedelta(hours=i) for i in range(3)], config)
        assert result.failed == [] and len(result.ingested) == 3
        for i, expected in EXPECTED_BY_HOUR.items():
            hour = H0 + timedelta(hours=i)
            lines = ledger.lines(hour, hour + timedelta(hours=1))
            assert _by_namespace(lines) == expected, i
            assert sum(x.amount for x in lines) == D("9.88")  # 3.00 + 6.88 every hour
        assert _by_namespace(ledger.lines(H0, H0 + timedelta(hours=3))) == EXPECTED_TOTAL

        facts = {(a.pod, a.gpu_instance_id): a for gh in ledger.facts(H0) for a in gh.allocations}
        assert facts[("p1", "")].allocated_seconds == 3600  # one missed scrape, bridged
        assert facts[("p3", "")].allocated_seconds == 1800  # HA pair de-duplicated by max
        assert facts[("p3", "")].share == D("0.25")
        assert facts[("b-1", "13")].allocated_seconds == 1800
        assert facts[("a-0", "1")].utilization == D("0.25")
        assert facts[("p2", "")].utilization == D("0.5")
        devices = {gh.device.uuid: gh for gh in ledger.facts(H0)}
        assert devices[A].device.mig_mode and len(devices[A].instances) == 4
        assert {x.team for x in ledger.lines(H0, H0 + timedelta(hours=1)) if x.namespace == "team-a"} == {
            "alpha"
        }

        before = _snapshot(ledger)
        ingest_hour(client, ledger, prices, H0 + timedelta(hours=1), config)  # re-ingest: same result
        counts, lines = _snapshot(ledger)
        assert lines == before[1]
        assert {k: v for k, v in counts.items() if k != "ingest_runs"} == {
            k: v for k, v in before[0].items() if k != "ingest_runs"
        }


def test_prometheus_down_commits_nothing_and_the_next_run_catches_up(tsdb, tmp_path, sql_ledger, book):
    ledger = sql_ledger  # the CLI opens the database by URL
    import shutil

    data = tmp_path / "prom-data"
    shutil.copytree(tsdb, data)
    url, schema = ledger.engine.url.render_as_string(hide_password=False), None
    if ledger.engine.dialect.name == "postgresql":
        schema = ledger.engine.dialect.default_schema_name
    server = PrometheusServer(tmp_path / "prom", data_dir=data).start()
    argv = [
        "billing",
        "ingest",
        "--db",
        url,
        "--prices",
        str(book),
        "--prometheus",
        server.url,
        "--no-progress",
    ]
    argv += ["--db-schema", schema] if schema else []
    try:  # hours 0 and 1 through the CLI
        assert (
            gpumeter.main([*argv, "--from", H0.isoformat(), "--to", (H0 + timedelta(hours=2)).isoformat()])
            == 0
        )
    finally:
        server.stop()
    before = ledger.counts()
    prices = load_price_book(book)
    config = IngestConfig(scrape_interval=30, catchup_hours=3)
    now = H0 + timedelta(hours=3, minutes=5)
    with PrometheusClient(server.url, timeout=5) as client:  # stopped: connection refused
        result = catch_up(client, ledger, prices, now, config)
    assert [h for h, _ in result.failed] == [H0 + timedelta(hours=2)] and result.ingested == []
    after = ledger.counts()
    assert after["ingest_runs"] == before["ingest_runs"] + 1  # the failed run is logged ...
    assert {k: v for k, v in after.items() if k != "ingest_runs"} == {
        k: v for k, v in before.items() if k != "ingest_runs"
    }  # ... and nothing else is written
    assert ledger.lines(H0 + timedelta(hours=2), H0 + timedelta(hours=3)) == []

    server = PrometheusServer(tmp_path / "prom2", data_dir=data).start()
    try:
        with PrometheusClient(server.url) as client:
            result = catch_up(client, ledger, prices, now, config)
    finally:
        server.stop()
    assert result.ingested == [H0 + timedelta(hours=2)] and result.failed == []
    assert _by_namespace(ledger.lines(H0, H0 + timedelta(hours=3))) == EXPECTED_TOTAL


def test_an_error_mid_hour_commits_nothing(ledger, book):
    """The 4th query of the hour fails: the earlier answers are discarded, nothing is written."""
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        if len(calls) == 4:
            return httpx.Response(
                503, json={"status": "error", "errorType": "unavailable", "error": "overloaded"}
            )
        return httpx.Response(200, json={"status": "success", "data": {"resultType": "vector", "result": []}})

    before = ledger.counts()
    transport = httpx.MockTransport(handler)
    with (
        PrometheusClient("http://prometheus.test", transport=transport) as client,
        pytest.raises(PrometheusError, match="overloaded"),
    ):
        ingest_hour(client, ledger, load_price_book(book), H0, IngestConfig())
    after = ledger.counts()
    assert after["ingest_runs"] == before["ingest_runs"] + 1
    assert after["gpu_hours"] == after["cost_lines"] == after["gpu_layouts"] == 0


def test_a_run_whose_range_answers_are_errors_is_ingested_hour_by_hour(sql_ledger, book):
    """Prometheus answers a run's range queries with an error (HTTP 503, as an overloaded one does)
    while its instant queries answer: the error, met when the run's answers are decoded (in the
    thread that builds the hours, `FetchedRun`), sends the run hour by hour: the first hour is billed.
    The second hour's instant queries fail too: it is recorded as failed and nothing after it runs."""
    hours = [H0 + timedelta(hours=n) for n in range(3)]
    asked: list[tuple[str, str]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        form = dict(httpx.QueryParams(request.content.decode()))
        kind = "range" if request.url.path.endswith("/query_range") else "instant"
        asked.append((kind, form.get("time", "")))
        if kind == "range" and not form["query"].startswith("max by (hostname)"):  # billing's own
            return httpx.Response(
                503, json={"status": "error", "errorType": "unavailable", "error": "overloaded"}
            )
        if kind == "range":  # the scrape-interval counts: none, 30 s given
            return httpx.Response(
                200, json={"status": "success", "data": {"resultType": "matrix", "result": []}}
            )
        if float(form["time"]) == _at(hours[1]).timestamp():
            return httpx.Response(503, json={"status": "error", "errorType": "unavailable", "error": "down"})
        result = [{"metric": H_INFO, "value": [0, "120"]}] if "nvidia_gpu_info" in form["query"] else []
        return httpx.Response(
            200, json={"status": "success", "data": {"resultType": "vector", "result": result}}
        )

    prices = load_price_book(book)
    with PrometheusClient("http://prometheus.test", transport=httpx.MockTransport(handler)) as client:
        result = ingest_hours(client, sql_ledger, prices, hours, IngestConfig(scrape_interval=30, workers=1))
    assert ("range", "") in asked, "the run was asked for with range queries first"
    assert result.ingested == hours[:1]
    assert [hour for hour, _ in result.failed] == [hours[1]] and "down" in result.failed[0][1]
    assert sql_ledger.ingested_hours(hours[0], hours[-1] + timedelta(hours=1)) == {hours[0]}
    assert not any(kind == "instant" and float(at) == _at(hours[2]).timestamp() for kind, at in asked)


def test_a_database_failure_mid_write_keeps_the_previous_hour(sql_ledger, book, monkeypatch):
    ledger = sql_ledger  # a crash inside the SQL ledger's transaction
    """Re-ingesting an hour deletes then inserts in one transaction: a crash in between rolls back."""
    from gpumeter.billing.ledger.sqlalchemy import SqlLedger

    sample = {"metric": H_INFO, "value": [0, "120"]}

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/query_range"):  # the scrape-interval counts: none, 30 s given
            return httpx.Response(
                200, json={"status": "success", "data": {"resultType": "matrix", "result": []}}
            )
        query = dict(httpx.QueryParams(request.content.decode()))["query"]
        result = [sample] if "nvidia_gpu_info" in query else []
        return httpx.Response(
            200, json={"status": "success", "data": {"resultType": "vector", "result": result}}
        )

    prices = load_price_book(book)
    with PrometheusClient("http://prometheus.test", transport=httpx.MockTransport(handler)) as client:
        ingest_hour(client, ledger, prices, H0, IngestConfig(scrape_interval=30))
        before = _snapshot(ledger)
        assert before[1][0][3] == UNALLOCATED and before[1][0][5] == D("6.88")

        def crash(*args, **kwargs):
            raise RuntimeError("crash between delete and insert")

        monkeypatch.setattr(SqlLedger, "_group_rows", staticmethod(crash))
        with pytest.raises(RuntimeError):
            ingest_hour(client, ledger, prices, H0, IngestConfig(scrape_interval=30))
    assert _snapshot(ledger) == before


def test_billing_reads_the_same_hour_window_on_every_backend(prometheus):
    """docs/billing.md §6.1: Prometheus 2.42's `[1h]` window is closed at both ends, MetricsQL's is
    open at the start. Evaluated exactly on the hour, a sample on the hour's first second counts on
    Prometheus and not on VictoriaMetrics (121 vs 120 of H's 30 s samples); billing evaluates 1 ms
    before the hour's end, where both windows hold the same 120 samples."""
    promql = f'count_over_time(nvidia_gpu_info{{uuid="{H}"}}[1h])'
    (billing_window,) = prometheus.query(promql, time=_at(H0).timestamp())
    assert billing_window["value"][1] == "120"
    (on_the_hour,) = prometheus.query(promql, time=(H0 + timedelta(hours=1)).timestamp())
    closed_at_both_ends = isinstance(prometheus, PrometheusServer)
    assert on_the_hour["value"][1] == ("121" if closed_at_both_ends else "120")
