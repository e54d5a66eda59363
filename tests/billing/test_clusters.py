"""Many clusters behind one global store: a month of three clusters' simulated histories, each
labelled with its cluster as its Prometheus's `external_labels` would be, in one real store (a
Prometheus backfilled by promtool, and a real VictoriaMetrics), billed by `billing ingest`; each
cluster's history alone (no cluster label) in its own real Prometheus, billed the same way.

The fleets (written here, one whole GPU each, November 2026: 720 hours, a sample every 20 minutes):

| cluster | GPU | holder | held |
|---|---|---|---|
| east | A100-40GB at 3.00, `GPU-7001/gpu-01/0` | ml-training/trainer | 00:00-12:00 daily: 30 x 12 h |
| west | H100-80GB at 6.88, the same UUID as east's | ml-training/trainer | always: 720 h |
| lab | A100-40GB at 3.00 | research/notebook | 08:00-18:00 daily: 30 x 10 h |

west is an HA pair: both replicas' series are in the global store (``prometheus_replica`` a and b,
b scraping 7 s after a), as two Prometheus servers remote-writing would send them.

By hand: east ml-training 360 h x 3.00 = 1,080.00, __unallocated__ 360 h x 3.00 = 1,080.00;
west ml-training 720 h x 6.88 = 4,953.60 (once: the pair de-duplicated); lab research 300 h x 3.00
= 900.00, __unallocated__ 420 h x 3.00 = 1,260.00. Clusters: east 2,160.00, west 4,953.60,
lab 2,160.00; the month 9,273.60. The team map names ml-training per cluster (east: vision, west:
speech) and research in every cluster (science).
"""

from __future__ import annotations

import json
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest

import gpumeter
from gpumeter.billing import queries
from gpumeter.billing.ingest import IngestConfig, ingest_hours
from gpumeter.billing.ledger import MEMORY_URL, open_ledger
from gpumeter.billing.models import UNALLOCATED
from gpumeter.billing.prom import PrometheusClient
from gpumeter.reports.model import build_report, month_period
from gpumeter.simulator.fleet import parse_fleet
from gpumeter.simulator.history import write_history
from tests.billing import factories
from tests.billing.conftest import QUERY_BACKENDS, serve_history
from tests.reports.helpers import html_tables, read_csv

pytestmark = [pytest.mark.prometheus]

D = Decimal
START = datetime(2026, 11, 1, tzinfo=UTC)
HOURS = [START + timedelta(hours=i) for i in range(720)]
END = HOURS[-1] + timedelta(hours=1)
STEP = 1200  # seconds between samples: 3 an hour (a month of a tiny fleet stays small)
NOVEMBER = month_period("2026-11")


def _fleet(seed: int, node: str, model: str, namespace: str, pod: str, **schedule) -> dict:
    return {
        "seed": seed,
        "nodes": [{"name": node, "gpus": [{"model": model, "count": 1}]}],
        "pods": [
            {
                "namespace": namespace,
                "name": pod,
                "container": "main",
                "node": node,
                "devices": [{"gpu": 0}],
                "utilization": 0.5,
                **schedule,
            }
        ],
    }


# east and west share the seed and node name: their GPUs share a UUID
FLEETS = {
    "east": _fleet(
        7001, "gpu-01", "A100-SXM4-40GB", "ml-training", "trainer", start="0h", end="12h", every="24h"
    ),
    "west": _fleet(7001, "gpu-01", "H100-SXM5-80GB", "ml-training", "trainer"),
    "lab": _fleet(
        7002, "lab-01", "A100-SXM4-40GB", "research", "notebook", start="8h", end="18h", every="24h"
    ),
}
TEAMS = "namespaces:\n  east/ml-training: vision\n  west/ml-training: speech\n  research: science\n"
BY_CLUSTER = {"east": D("2160.00"), "west": D("4953.60"), "lab": D("2160.00")}
TENANTS = {("east", "ml-training"): D("1080.00"), ("west", "ml-training"): D("4953.60")}
TENANTS[("lab", "research")] = D("900.00")
PLATFORM = {("east", UNALLOCATED): D("1080.00"), ("lab", UNALLOCATED): D("1260.00")}
TOTAL = D("9273.60")


def _history(
    cluster: str, label: str = "cluster", labelled: bool = True, hours: int = 720, step: int = STEP
) -> str:
    from io import StringIO

    out = StringIO()
    start = START.timestamp()
    fleet = parse_fleet(FLEETS[cluster], source=f"<{cluster}>")
    write_history(
        [fleet],
        start,
        start + hours * 3600,
        step,
        out,
        processes=False,
        cluster=cluster if labelled else "",
        cluster_label=label,
    )
    return out.getvalue()


def _replica(text: str, replica: str, offset: int) -> str:
    """Each sample with ``prometheus_replica`` added and its timestamp ``offset`` seconds later."""
    out = []
    for line in text.splitlines(keepends=True):
        if line.startswith("#"):
            out.append(line)
            continue
        head, _, stamp = line.rstrip("\n").rpartition(" ")
        series, _, value = head.rpartition(" ")
        out.append(f'{series[:-1]},prometheus_replica="{replica}"}} {value} {int(stamp) + offset}\n')
    return "".join(out)


def _one_store(texts: list[str]) -> str:
    """Several histories as one OpenMetrics text: each family's samples together, one EOF."""
    families: dict[str, list[str]] = {}
    current = None
    for text in texts:
        for line in text.splitlines(keepends=True):
            if line.startswith("# TYPE "):
                current = line
                families.setdefault(current, [])
            elif line.startswith("# EOF"):
                continue
            else:
                families[current].append(line)
    return "".join(head + "".join(lines) for head, lines in families.items()) + "# EOF\n"


def _global_text(label: str = "cluster", hours: int = 720, clusters=("east", "west", "lab")) -> str:
    texts = []
    for cluster in clusters:
        text = _history(cluster, label, hours=hours)
        texts += [_replica(text, "a", 0), _replica(text, "b", 7)] if cluster == "west" else [text]
    return _one_store(texts)


def _serve(backend: str, text: str, root: Path):
    root.mkdir(parents=True, exist_ok=True)
    source = root / "history.om"
    source.write_text(text)
    server = serve_history(backend, source, root)
    source.unlink()
    return server


@pytest.fixture(scope="module")
def prices(tmp_path_factory):
    return factories.book(
        tmp_path_factory.mktemp("prices"),
        {"A100-40GB": {"hourly_rate": "3.00"}, "H100-80GB": {"hourly_rate": "6.88"}},
    )


def _ingest(url: str, ledger, prices, config: IngestConfig) -> None:
    with PrometheusClient(url) as client:
        result = ingest_hours(client, ledger, prices, HOURS, config)
    assert result.failed == [] and result.suspect == [] and len(result.ingested) == len(HOURS)


def _lines(ledger) -> list[tuple]:
    """Each line as billed, less its cluster and team: what a cluster's own Prometheus bills too."""
    return sorted(
        (x.hour, x.uuid, x.kind, x.namespace, x.pod, x.container, x.model, x.amount, x.quantity, x.held)
        for x in ledger.lines(START, END)
    )


def _with_clusters(ledger) -> list[tuple]:
    """Each line as billed, its cluster and team too."""
    return sorted(
        (x.cluster, x.team, x.hour, x.uuid, x.kind, x.namespace, x.pod, x.container, x.amount, x.quantity)
        for x in ledger.lines(START, END)
    )


@pytest.fixture(scope="module")
def alone(prices, tmp_path_factory):
    """Each cluster billed alone from its own Prometheus (its history without a cluster label)."""
    root = tmp_path_factory.mktemp("alone")
    out = {}
    for cluster in FLEETS:
        server = _serve("prometheus", _history(cluster, labelled=False), root / cluster)
        ledger = open_ledger(MEMORY_URL)  # the same lines as any ledger (tests/billing/test_ledger.py)
        try:
            _ingest(server.url, ledger, prices, IngestConfig())
            out[cluster] = _lines(ledger)
            assert {x.cluster for x in ledger.lines(START, END)} == {""}
        finally:
            ledger.close()
            server.stop()
    return out


@pytest.fixture(scope="module", params=QUERY_BACKENDS)
def billed(request, prices, tmp_path_factory):
    """The global store's month billed into a SQLite ledger with the team map: (the ledger's path,
    the team map, the store, still serving)."""
    from gpumeter.billing.config import load_team_map

    root = tmp_path_factory.mktemp(f"global-{request.param}")
    teams = root / "teams.yaml"
    teams.write_text(TEAMS)
    server = _serve(request.param, _global_text(), root / "store")
    db = root / "ledger.db"
    try:
        ledger = open_ledger(f"sqlite:///{db}")
        try:
            _ingest(server.url, ledger, prices, IngestConfig(teams=load_team_map(teams)))
        finally:
            ledger.close()
        yield db, teams, server
    finally:
        server.stop()


def test_each_cluster_bills_to_the_cent_as_its_own_prometheus(billed, alone):
    db, _, _ = billed
    ledger = open_ledger(f"sqlite:///{db}")
    try:
        lines = ledger.lines(START, END)
        facts = ledger.facts(START)
    finally:
        ledger.close()
    by_cluster: dict[str, list] = defaultdict(list)
    for x in lines:
        by_cluster[x.cluster].append(x)
    assert set(by_cluster) == set(FLEETS)
    for cluster, own in by_cluster.items():
        mine = sorted(
            (x.hour, x.uuid, x.kind, x.namespace, x.pod, x.container, x.model, x.amount, x.quantity, x.held)
            for x in own
        )
        assert mine == alone[cluster], cluster
    # east and west hold one UUID: two GPU-hours, each its cluster's model
    (shared,) = {f.device.uuid for f in facts if f.device.cluster == "east"}
    assert {(f.device.cluster, f.device.model) for f in facts if f.device.uuid == shared} == {
        ("east", "NVIDIA A100-SXM4-40GB"),
        ("west", "NVIDIA H100 80GB HBM3"),
    }
    # the figures by hand (module docstring), west's HA pair billed once
    money: dict[tuple[str, str], Decimal] = defaultdict(D)
    for x in lines:
        money[(x.cluster, x.namespace)] += x.amount
    assert dict(money) == {**TENANTS, **PLATFORM}
    assert sum(money.values()) == TOTAL
    teams = {(x.cluster, x.namespace): x.team for x in lines if x.kind == "tenant"}
    assert teams == {
        ("east", "ml-training"): "vision",
        ("west", "ml-training"): "speech",
        ("lab", "research"): "science",
    }


def test_reports_by_cluster_namespace_team_and_one_cluster(billed, tmp_path, capsys):
    db, _, _ = billed
    url = f"sqlite:///{db}"

    def report(out: Path, *args: str) -> dict:
        argv = ["report", "--db", url, "--period", "2026-11", "--format", "json,csv", "--out", str(out)]
        assert gpumeter.main([*argv, "--no-record", *args]) == 0
        (doc,) = [json.loads(p.read_text()) for p in out.glob("gpumeter-2026-11-by-*.json")]
        return doc

    doc = report(tmp_path / "cluster", "--by", "cluster")
    assert {g["group"]: D(g["cost"]) for g in doc["groups"]} == {
        "east": D("1080.00"),
        "west": D("4953.60"),
        "lab": D("900.00"),
    }
    # every line of the month in its cluster: the clusters' costs are the month's total
    assert {c["cluster"]: D(c["cost"]) for c in doc["clusters"]} == BY_CLUSTER
    assert sum(BY_CLUSTER.values()) == D(doc["totals"]["all"]["cost"]) == TOTAL
    rows = read_csv(tmp_path / "cluster" / "gpumeter-2026-11-lines.csv")
    assert {r["cluster"] for r in rows} == set(FLEETS)
    assert sum(D(r["cost"]) for r in rows if r["cluster"] == "lab") == BY_CLUSTER["lab"]

    # the chargeback HTML's cost per cluster
    out = tmp_path / "html"
    argv = [
        "report",
        "--db",
        url,
        "--period",
        "2026-11",
        "--by",
        "cluster",
        "--format",
        "html",
        "--out",
        str(out),
    ]
    assert gpumeter.main([*argv, "--no-record"]) == 0
    table = html_tables((out / "gpumeter-2026-11-by-cluster.html").read_text())["clusters"]
    assert {row[0]: D(row[1].replace(",", "")) for row in table[1:]} == BY_CLUSTER

    doc = report(tmp_path / "namespace", "--by", "namespace")
    assert {g["group"]: D(g["cost"]) for g in doc["groups"]} == {
        "east/ml-training": D("1080.00"),
        "west/ml-training": D("4953.60"),
        "lab/research": D("900.00"),
    }
    doc = report(tmp_path / "team", "--by", "team")
    assert {g["group"]: D(g["cost"]) for g in doc["groups"]} == {
        "vision": D("1080.00"),
        "speech": D("4953.60"),
        "science": D("900.00"),
    }
    doc = report(tmp_path / "two", "--by", "namespace", "--cluster", "east", "--cluster", "lab")
    assert doc["only_clusters"] == ["east", "lab"]
    assert D(doc["totals"]["all"]["cost"]) == BY_CLUSTER["east"] + BY_CLUSTER["lab"] == D("4320.00")
    assert {g["group"] for g in doc["groups"]} == {"east/ml-training", "lab/research"}
    # a cluster the month's lines do not have is refused, naming the ones they have; nothing written
    out = tmp_path / "typo"
    argv = ["report", "--db", url, "--period", "2026-11", "--cluster", "esat", "--out", str(out)]
    assert gpumeter.main(argv) == 2
    assert (
        "cluster: no line of 2026-11 is in cluster 'esat'; the period's clusters: east, lab, west (value 'esat')"
        in (capsys.readouterr().err)
    )
    assert not any(out.glob("*"))

    # the allocations report: grouped by cluster, each holder's cluster first
    out = tmp_path / "allocations"
    argv = ["report", "--kind", "allocations", "--db", url, "--period", "2026-11", "--out", str(out)]
    assert gpumeter.main([*argv, "--format", "csv"]) == 0
    held = read_csv(out / "gpumeter-allocations-2026-11.csv")
    assert [r["cluster"] for r in held] == sorted(r["cluster"] for r in held)
    assert {(r["cluster"], r["namespace"], r["team"]) for r in held} == {
        ("east", "ml-training", "vision"),
        ("west", "ml-training", "speech"),
        ("lab", "research", "science"),
    }


def test_a_re_ingest_changes_nothing_of_any_cluster(billed, prices):
    """A day re-ingested from the same store, then re-priced from the stored facts: every cluster's
    lines (and teams) as they were, nothing audited (docs/billing.md §6.6: an audit row is a changed
    amount)."""
    from gpumeter.billing.config import load_team_map

    db, teams, server = billed
    day = HOURS[:24]
    ledger = open_ledger(f"sqlite:///{db}")
    try:
        before = _with_clusters(ledger)
        with PrometheusClient(server.url) as client:
            result = ingest_hours(client, ledger, prices, day, IngestConfig(teams=load_team_map(teams)))
        assert result.ingested == day
        after = _with_clusters(ledger)
        # re-priced from the stored facts with the same book and map: each cluster's lines, teams too
        from gpumeter.billing.ingest import reprice

        assert reprice(ledger, prices, day[0], day[-1] + timedelta(hours=1), load_team_map(teams)) == 24
        repriced = _with_clusters(ledger)
        audited = ledger.counts()["billing_audit"]
    finally:
        ledger.close()
    assert after == before == repriced and audited == 0


def test_the_cluster_label_is_a_setting(prices, tmp_path, capsys):
    """A store whose series name their cluster ``k8s_cluster``: `billing ingest --cluster-label
    k8s_cluster` bills east and west apart (a day: east 12 x 3.00 = 36.00 + 36.00 idle, west 24 x
    6.88 = 165.12); read with the default label, the two clusters' one UUID is one GPU, as before
    clusters, which is why the label must be named."""
    text = _one_store([_history(c, "k8s_cluster", hours=24) for c in ("east", "west")])
    server = _serve("prometheus", text, tmp_path / "store")
    argv = ["billing", "ingest", "--prometheus", server.url, "--prices", str(prices.path)]
    argv += ["--from", "2026-11-01T00:00:00Z", "--to", "2026-11-02T00:00:00Z"]
    try:
        for label in ("k8s_cluster", "cluster"):
            db = tmp_path / f"{label}.db"
            assert gpumeter.main([*argv, "--db", f"sqlite:///{db}", "--cluster-label", label]) == 0
            ledger = open_ledger(f"sqlite:///{db}")
            try:
                lines, facts = ledger.lines(START, START + timedelta(days=1)), ledger.facts(START)
            finally:
                ledger.close()
            money: dict[str, Decimal] = defaultdict(D)
            for x in lines:
                money[x.cluster] += x.amount
            if label == "k8s_cluster":
                assert dict(money) == {"east": D("72.00"), "west": D("165.12")}
                assert sorted(f.device.cluster for f in facts) == ["east", "west"]
            else:
                assert set(money) == {""} and len(facts) == 1
    finally:
        server.stop()
    with pytest.raises(SystemExit) as refused:  # argparse's refusal: exit status 2, the value named
        gpumeter.main([*argv, "--db", f"sqlite:///{tmp_path / 'x.db'}", "--cluster-label", "k8s-cluster"])
    assert refused.value.code == 2
    assert (
        "--cluster-label: expected a Prometheus label name (value 'k8s-cluster')" in capsys.readouterr().err
    )
    assert not (tmp_path / "x.db").exists()


@pytest.mark.parametrize(
    ("key", "problem"),
    [
        ("east/west/ml", "ambiguous: expected namespace or cluster/namespace"),
        ("/ml", "ambiguous: expected namespace or cluster/namespace"),
        ("east/", "not a Kubernetes namespace name"),
        ("east/ML", "not a Kubernetes namespace name"),
    ],
)
def test_a_team_map_key_that_is_not_namespace_or_cluster_namespace_is_refused(tmp_path, capsys, key, problem):
    from gpumeter.billing.config import ConfigError, load_team_map

    teams = tmp_path / "teams.yaml"
    teams.write_text(f"namespaces:\n  {key!r}: vision\n")
    with pytest.raises(ConfigError) as refused:
        load_team_map(teams)
    assert str(refused.value).startswith(f"{teams}: namespaces.{key}: {problem}")
    assert str(refused.value).endswith(f"(value {key!r})")
    db = tmp_path / "ledger.db"
    argv = [
        "billing",
        "ingest",
        "--db",
        f"sqlite:///{db}",
        "--teams",
        str(teams),
        "--prometheus",
        "http://127.0.0.1:1",
    ]
    assert gpumeter.main(argv) == 2
    assert f"namespaces.{key}: {problem}" in capsys.readouterr().err
    assert not db.exists()


def test_a_namespace_named_in_one_cluster_wins_there_over_the_same_name_in_every_cluster(tmp_path):
    from gpumeter.billing.config import load_team_map
    from gpumeter.billing.models import teams_in_cluster

    teams = tmp_path / "teams.yaml"
    teams.write_text(
        "namespaces:\n  ml-training: platform\n  east/ml-training: vision\n  research: science\n"
    )
    mapped = load_team_map(teams)
    assert teams_in_cluster(mapped, "east") == {"ml-training": "vision", "research": "science"}
    assert teams_in_cluster(mapped, "west") == {"ml-training": "platform", "research": "science"}
    assert teams_in_cluster(mapped, "") == {"ml-training": "platform", "research": "science"}
    plain = {"ml-training": "platform"}
    assert teams_in_cluster(plain, "east") is plain  # no key names a cluster: the map itself


def test_an_unpriced_gpus_warning_names_its_cluster(tmp_path):
    """A GPU is (cluster, uuid): the warning for an unpriced GPU-hour names the cluster where the
    store has one, and reads as before where it has none."""
    from gpumeter.billing.allocate import price_gpu_hour
    from gpumeter.billing.models import Device, GpuHour

    prices = factories.book(tmp_path, {"A100-40GB": "3.00"})
    warnings = {
        cluster: price_gpu_hour(
            GpuHour(START, Device("GPU-VR", "NVIDIA VR200", 3600, "vr-1", "0", cluster=cluster), [], []),
            prices,
        ).warnings
        for cluster in ("east", "")
    }
    assert warnings == {
        "east": [
            "unpriced GPU model 'NVIDIA VR200' (cluster east, uuid GPU-VR, hour 2026-11-01T00:00:00+00:00): "
            "model missing from the price book"
        ],
        "": [
            "unpriced GPU model 'NVIDIA VR200' (uuid GPU-VR, hour 2026-11-01T00:00:00+00:00): "
            "model missing from the price book"
        ],
    }


def test_billings_own_series_carry_the_cluster_under_the_stores_label(billed):
    """/metrics of the clustered ledger: each cost series names its cluster, under the label name the
    store uses; the clusters' costs are the month's, by hand."""
    from gpumeter.service import build_app
    from tests.billing.test_service import _metrics

    db, _, _ = billed
    ledger = open_ledger(f"sqlite:///{db}")
    try:
        for label in ("cluster", "k8s_cluster"):
            families = _metrics(build_app(ledger, clock=lambda: END, cluster_label=label))
            cost: dict[str, Decimal] = defaultdict(D)
            for s in families["gpumeter_billing_cost"]:
                cost[s.labels[label]] += D(str(s.value))
            assert dict(cost) == BY_CLUSTER
            idle = {s.labels[label]: s.value for s in families["gpumeter_billing_unallocated_cost"]}
            assert idle == {"east": 1080.0, "lab": 1260.0}
            hours = {s.labels[label]: s.value for s in families["gpumeter_billing_gpu_hours"]}
            assert hours == {"east": 360.0, "west": 720.0, "lab": 300.0}
    finally:
        ledger.close()


def test_the_fleet_health_report_keeps_each_clusters_gpus_apart(prices, tmp_path):
    """A day of east and west (one UUID, two GPUs) in one store, read by the fleet-health report: two
    GPUs, each with its cluster's model and its 24 hours in service (merged, the UUID would be one
    GPU of one model), the incidents grouped by cluster first, a cluster column on each GPU row."""
    from gpumeter.reports import health_render
    from gpumeter.reports.model import range_period

    text = _one_store([_history(c, hours=24) for c in ("east", "west")])
    server = _serve("prometheus", text, tmp_path / "store")
    ledger = open_ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    try:
        with PrometheusClient(server.url) as client:
            assert ingest_hours(client, ledger, prices, HOURS[:24], IngestConfig()).failed == []
            report, _, _ = health_render.generate(
                client,
                ledger,
                range_period(START, START + timedelta(days=1)),
                ("json", "csv"),
                tmp_path / "out",
            )
    finally:
        ledger.close()
        server.stop()
    assert [(g.cluster, g.model, g.hours_up) for g in report.gpus] == [
        ("east", "NVIDIA A100-SXM4-40GB", 24),
        ("west", "NVIDIA H100 80GB HBM3", 24),
    ]
    assert len({g.uuid for g in report.gpus}) == 1
    assert [(name, i.gpus, i.hours_up) for name, i in report.clusters] == [("east", 1, 24), ("west", 1, 24)]
    doc = json.loads(next((tmp_path / "out").glob("*.json")).read_text())
    assert [c["cluster"] for c in doc["clusters"]] == ["east", "west"]
    rows = read_csv(next((tmp_path / "out").glob("*-gpus.csv")))
    assert [(r["cluster"], r["model"]) for r in rows] == [
        ("east", "NVIDIA A100-SXM4-40GB"),
        ("west", "NVIDIA H100 80GB HBM3"),
    ]


def test_simulate_history_labels_every_series_with_its_cluster(tmp_path, capsys):
    """`gpumeter simulate history --cluster east` (and `--cluster-label k8s_cluster`): every sample
    names the cluster, as a remote-writing Prometheus's external label would; a name billing could not
    tell from a team map's `cluster/namespace`, or a label that is no label name, is refused."""
    base = [
        "simulate",
        "history",
        "--fleet",
        "workstation",
        "--from",
        "2026-11-01",
        "--to",
        "2026-11-01T00:10",
    ]
    base += ["--step", "300"]
    for args, label in (
        (["--cluster", "east"], "cluster"),
        (["--cluster", "east", "--cluster-label", "k8s_cluster"], "k8s_cluster"),
    ):
        out = tmp_path / f"{label}.om"
        assert gpumeter.main([*base, "--out", str(out), *args]) == 0
        samples = [line for line in out.read_text().splitlines() if not line.startswith("#")]
        assert samples and all(f'{label}="east"}}' in line for line in samples)
    for args, message in (
        (["--cluster", "east/west"], "--cluster: letters, digits and _.:- only (value 'east/west')"),
        (
            ["--cluster", "east", "--cluster-label", "k8s-cluster"],
            "--cluster-label: not a Prometheus label name",
        ),
    ):
        out = tmp_path / "refused.om"
        assert gpumeter.main([*base, "--out", str(out), *args]) == 2
        assert message in capsys.readouterr().err
        assert not out.exists()


def test_kube_namespace_teams_are_read_per_cluster_and_the_team_map_wins(prices):
    """One hour's answers from a global store: ml-training's `team` namespace label is vision in east
    and speech in west (kube-state-metrics of each cluster). Read per cluster, kept as
    `cluster/namespace`. The team map wins over them (docs/billing.md §4.3): `ml-training` in every
    cluster over both labels, `west/ml-training` over the map's every-cluster name for west alone,
    `east/ml-training` over east's label and not west's."""
    from gpumeter.billing.ingest import build_hour, priced_record
    from gpumeter.billing.models import team_map_over
    from gpumeter.billing.pricer import Pricer
    from gpumeter.billing.prom import Sample

    results: dict[str, list[Sample]] = {name: [] for name in queries.BILLING_QUERIES}
    for cluster, team in (("east", "vision"), ("west", "speech")):
        device = {
            "uuid": "GPU-1",
            "gpu": "0",
            "model": "NVIDIA A100-SXM4-40GB",
            "hostname": "n1",
            "cluster": cluster,
        }
        results["gpu_count"].append(Sample({**device, "mig_mode": "disabled"}, 120.0))
        held = {
            **device,
            "namespace": "ml-training",
            "pod": "p",
            "container": "main",
            "resource": "nvidia.com/gpu",
        }
        held |= {"gpu_instance_id": "", "mig_profile": "", "sharing": "exclusive"}
        del held["model"]
        results["alloc_count"].append(Sample(held, 120.0))
        results["teams"].append(
            Sample({"namespace": "ml-training", "label_team": team, "cluster": cluster}, 1.0)
        )
    gpu_hours, kube = build_hour(results, START, IngestConfig(scrape_interval=30.0))
    assert kube == {"east/ml-training": "vision", "west/ml-training": "speech"}
    assert [(gh.device.cluster, gh.device.uuid) for gh in gpu_hours] == [("east", "GPU-1"), ("west", "GPU-1")]

    def teams(mapped: dict[str, str]) -> list[tuple[str, str, Decimal]]:
        record, _ = priced_record(Pricer(prices), START, gpu_hours, team_map_over(kube, mapped))
        return [(x.cluster, x.team, x.amount) for x in record.lines]

    assert teams({}) == [("east", "vision", D("3.00")), ("west", "speech", D("3.00"))]
    assert teams({"ml-training": "platform"}) == [
        ("east", "platform", D("3.00")),
        ("west", "platform", D("3.00")),
    ]
    assert teams({"ml-training": "platform", "west/ml-training": "inference"}) == [
        ("east", "platform", D("3.00")),
        ("west", "inference", D("3.00")),
    ]
    assert teams({"east/ml-training": "research"}) == [
        ("east", "research", D("3.00")),
        ("west", "speech", D("3.00")),
    ]


def test_a_teams_budget_counts_its_namespaces_in_every_cluster(billed, prices, tmp_path):
    """One team owning ml-training in east and west (the map re-priced over a copy of the month):
    its budget against actual is both clusters' lines, 1,080.00 + 4,953.60 = 6,033.60, over a
    6,000.00 budget by 33.60; research's team, in lab alone, 900.00 of 1,000.00."""
    import shutil

    from gpumeter.billing.config import load_budgets, load_team_map
    from gpumeter.billing.ingest import reprice

    db, _, _ = billed
    copy = tmp_path / "ledger.db"
    shutil.copyfile(db, copy)
    teams = tmp_path / "teams.yaml"
    teams.write_text(
        "namespaces:\n  east/ml-training: ml\n  west/ml-training: ml\n  research: science\n"
        "budgets:\n  ml: {amount: '6000', currency: USD}\n  science: {amount: '1000', currency: USD}\n"
    )
    ledger = open_ledger(f"sqlite:///{copy}")
    try:
        assert reprice(ledger, prices, START, END, load_team_map(teams)) == len(HOURS)
        report = build_report(ledger, NOVEMBER, "team", budgets=load_budgets(teams), splits=False)
    finally:
        ledger.close()
    assert [(b.team, b.budget, b.actual, b.remaining) for b in report.budgets] == [
        ("ml", D("6000"), D("6033.60"), D("-33.60")),
        ("science", D("1000"), D("900.00"), D("100.00")),
    ]
    assert {name: usage.cost for name, usage in report.clusters} == BY_CLUSTER


def test_each_clusters_scrape_interval_is_its_own_even_on_nodes_of_one_name(prices, tmp_path):
    """east's node gpu-01 is scraped every 10 minutes, west's node of the same name every 20: each
    cluster's seconds per sample are its own (6 samples an hour are 3,600 s in east, 3 in west), so a
    day bills east 12 h x 3.00 + 12 h idle x 3.00 = 72.00 and west 24 h x 6.88 = 165.12, as each alone."""
    text = _one_store([_history("east", hours=24, step=600), _history("west", hours=24, step=1200)])
    server = _serve("prometheus", text, tmp_path / "store")
    try:
        for hours in (HOURS[:24], HOURS[:1]):  # a run of range queries, and one hour's instant queries
            ledger = open_ledger(MEMORY_URL)
            with PrometheusClient(server.url) as client:
                result = ingest_hours(client, ledger, prices, hours, IngestConfig())
            assert result.ingested == hours and result.suspect == []
            money: dict[str, Decimal] = defaultdict(D)
            for x in ledger.lines(START, END):
                money[x.cluster] += x.amount
            assert dict(money) == {"east": D("3.00") * len(hours), "west": D("6.88") * len(hours)}
    finally:
        server.stop()
