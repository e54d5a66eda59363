"""FOCUS's rules between rows (tests/reports/focus_rules.py, written from the spec's text) on two days
of the demo's fleets of every sharing mode — `h100-mig`, `a100-mixed`, `shared-modes` (time-slicing,
MPS, fractional grants, vGPU) and `dra` — backfilled into a real Prometheus and ingested twice: with
the shipped price book, and with sharing efficiencies below 1 and utilization tiers that price. Every
FOCUS version at hour and day grain; the origin charges are worked out from the ledger, not the file.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
import yaml

from gpumeter.billing.ingest import IngestConfig, ingest_hours
from gpumeter.billing.ledger import open_ledger
from gpumeter.billing.models import hours_between
from gpumeter.billing.pricing import load_price_book
from gpumeter.billing.pricing.static import DEFAULT_BOOK
from gpumeter.billing.prom import PrometheusClient
from gpumeter.reports import focus
from gpumeter.reports.model import Period, build_report
from gpumeter.reports.render import RenderOptions, render
from gpumeter.simulator.fleet import load_fleet
from gpumeter.simulator.history import write_history
from tests.billing.conftest import serve_history
from tests.reports.focus_checks import KNOWN_VALIDATOR_FAILURES, rows_of, schema_problems, validate_12
from tests.reports.focus_rules import origins_from_ledger, rule_problems
from tests.support.servers import VictoriaMetricsServer

START = datetime(2026, 11, 2, tzinfo=UTC)
END = START + timedelta(days=2)
PERIOD = Period(START, END, "2026-11-02_2026-11-04")
STEP = 300
FLEETS = ("h100-mig", "a100-mixed", "shared-modes", "dra")
TIERS = [
    {"range": [0, 0.3], "efficiency": 0.5},
    {"range": [0.3, 0.7], "efficiency": 0.8},
    {"range": [0.7, 1.0], "efficiency": 1.0},
]
BOOKS = ("default", "efficiencies-and-tiers")
VERSIONS = ("1.2", "1.3", "1.4")


def _book(root, name: str):
    doc = yaml.safe_load(DEFAULT_BOOK.read_text())
    if name == "default":
        return load_price_book(DEFAULT_BOOK)
    for version in doc["versions"]:
        version["sharing_efficiency"] = {"mig": "0.95", "time_slicing": "0.75", "mps": "0.9", "vgpu": "0.85"}
        version["utilization_tiers"] = TIERS
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return load_price_book(path).with_utilization_tiers("price")


@pytest.fixture(scope="module")
def demo_ledgers(tmp_path_factory):
    """Two days of the four fleets, ingested once per price book into its own SQLite ledger."""
    root = tmp_path_factory.mktemp("focus-rules")
    source = root / "history.om"
    fleets = [load_fleet(name) for name in FLEETS]
    with source.open("w") as out:
        write_history(fleets, START.timestamp(), END.timestamp(), STEP, out)
    server = serve_history("prometheus", source, root)
    source.unlink()
    ledgers = {}
    try:
        for name in BOOKS:
            ledger = open_ledger(f"sqlite:///{root / f'{name}.sqlite'}")
            with PrometheusClient(server.url) as client:
                result = ingest_hours(
                    client,
                    ledger,
                    _book(root, name),
                    hours_between(START, END),
                    IngestConfig(scrape_interval=STEP, workers=1),
                )
            assert result.failed == [] and result.unpriced_gpu_hours == 0, name
            ledgers[name] = ledger
    finally:
        server.stop()
    yield ledgers
    for ledger in ledgers.values():
        ledger.close()


def _file(ledger, tmp_path, grain: str, version: str, by: str = "team"):
    report = build_report(ledger, PERIOD, by, grain=grain, compare=False)
    render(report, tmp_path, ("focus",), RenderOptions(focus_version=version))
    return report, tmp_path / f"gpumeter-{PERIOD.label}-focus-{version}.csv"


def _export(ledger, tmp_path, grain: str, version: str):
    _report, path = _file(ledger, tmp_path, grain, version)
    # the column texts hold too: the project's own check, and for 1.3 and 1.4 the schema test
    assert focus.check_file(path) == []
    if version != "1.2":
        assert schema_problems(path, version) == []
    return rows_of(path)


@pytest.mark.prometheus
@pytest.mark.slow
@pytest.mark.parametrize("book", BOOKS)
@pytest.mark.parametrize("grain", ["hour", "day"])
@pytest.mark.parametrize("version", VERSIONS)
def test_every_origin_charge_can_be_rebuilt_from_its_rows(demo_ledgers, tmp_path, book, grain, version):
    ledger = demo_ledgers[book]
    origins = origins_from_ledger(ledger, START, END, grain)
    header, rows = _export(ledger, tmp_path, grain, version)
    # not vacuous: every GPU of the fleets for two days or 48 hours, origins split into several rows,
    # every sharing mode's split and, with efficiencies and tiers, both shortfall lines
    gpus = sum(len(node.gpus) for name in FLEETS for node in load_fleet(name).nodes)
    assert len(origins) == gpus * (2 if grain == "day" else 48) and len(rows) > 2 * len(origins)
    if version != "1.2":
        kinds = ("mig-slice-weight", "time-slicing-share", "mps-share", "fractional-grant", "vgpu-share")
        assert {f"gpumeter.{kind}" for kind in kinds} <= {r["AllocatedMethodId"] for r in rows}
    if book != "default":
        assert {"sharing_shortfall", "utilization_shortfall"} <= {r["x_LineKind"] for r in rows}
    found = rule_problems(header, rows, grain, origins)
    summary = {rule: (len(p), p[:2]) for rule, p in found.items() if p}
    columns = sorted({p.split(": ")[1].split(" takes")[0] for p in found["dimension"]})
    print(f"\n{version} {grain} {book}: {len(origins)} origins, {len(rows)} rows; {columns} {summary}")
    assert summary == {}


@pytest.mark.prometheus
@pytest.mark.slow
@pytest.mark.focus_validator
def test_focus_validator_passes_the_12_file_of_every_sharing_mode(demo_ledgers, tmp_path):
    _report, path = _file(demo_ledgers["efficiencies-and-tiers"], tmp_path, "day", "1.2")
    outcome = validate_12(path, tmp_path / "validator")
    assert outcome.rules > 100 and outcome.failed == KNOWN_VALIDATOR_FAILURES, str(outcome)


@pytest.mark.prometheus
@pytest.mark.slow
@pytest.mark.parametrize("version", VERSIONS)
def test_the_focus_file_reconciles_with_the_chargeback_per_namespace_and_pool(
    demo_ledgers, tmp_path, version
):
    """The chargeback by namespace and the FOCUS file agree to the cent per namespace and in total;
    a FinOps reader filtering one pool (SubAccountId) and one namespace (x_Namespace) gets what the
    ledger's own lines of that GPU model and namespace add up to."""
    ledger = demo_ledgers["efficiencies-and-tiers"]
    report, path = _file(ledger, tmp_path, "day", version, by="namespace")
    _header, rows = rows_of(path)
    per_namespace: dict[str, Decimal] = defaultdict(Decimal)
    for row in rows:
        per_namespace[row["x_Namespace"]] += Decimal(row["BilledCost"])
    chargeback = {g.key: g.usage.cost for g in report.groups}
    platform = {p.namespace: p.usage.cost for p in report.platform}
    assert {ns: per_namespace[ns] for ns in chargeback} == chargeback
    assert {ns: per_namespace[ns] for ns in platform} == platform
    assert (
        sum(per_namespace.values()) == report.total.cost == sum(chargeback.values()) + sum(platform.values())
    )

    lines = ledger.lines(START, END)
    by_pool_ns: dict[tuple[str, str], Decimal] = defaultdict(Decimal)
    for line in lines:
        by_pool_ns[(line.model, line.namespace)] += line.amount or 0
    picked = 0
    for (model, namespace), want in sorted(by_pool_ns.items()):
        got = [r for r in rows if r["SubAccountId"] == f"pool/{model}" and r["x_Namespace"] == namespace]
        assert sum(Decimal(r["BilledCost"]) for r in got) == want, (model, namespace)
        picked += bool(got)
    # not vacuous: several pools, each with several namespaces
    assert len({model for model, _ in by_pool_ns}) >= 2 and picked > 10


@pytest.fixture(scope="module")
def clustered_ledger(tmp_path_factory):
    """A day of two clusters in one VictoriaMetrics, as a global store holds them: `east` runs the
    h100-mig fleet, `west` the same fleet (the same GPU UUIDs: a cloned image) and shared-modes."""
    root = tmp_path_factory.mktemp("focus-clusters")
    end = START + timedelta(days=1)
    server = VictoriaMetricsServer(root / "vm").start()
    try:
        for cluster, names in (("east", ("h100-mig",)), ("west", ("h100-mig", "shared-modes"))):
            source = root / f"{cluster}.om"
            with source.open("w") as out:
                fleets = [load_fleet(name) for name in names]
                write_history(fleets, START.timestamp(), end.timestamp(), STEP, out, cluster=cluster)
            with source.open() as lines:
                server.import_openmetrics(lines)
            source.unlink()
        ledger = open_ledger(f"sqlite:///{root / 'clusters.sqlite'}")
        with PrometheusClient(server.url) as client:
            result = ingest_hours(
                client,
                ledger,
                _book(root, "efficiencies-and-tiers"),
                hours_between(START, end),
                IngestConfig(scrape_interval=STEP, workers=1),
            )
        assert result.failed == [] and result.unpriced_gpu_hours == 0
    finally:
        server.stop()
    yield ledger, Period(START, end, "2026-11-02")
    ledger.close()


@pytest.mark.victoriametrics
@pytest.mark.slow
@pytest.mark.parametrize("grain", ["hour", "day"])
@pytest.mark.parametrize("version", VERSIONS)
def test_two_clusters_are_two_sub_accounts_and_keep_the_rules(clustered_ledger, tmp_path, grain, version):
    ledger, period = clustered_ledger
    report = build_report(ledger, period, "namespace", grain=grain, compare=False)
    render(report, tmp_path, ("focus",), RenderOptions(focus_version=version))
    path = tmp_path / f"gpumeter-{period.label}-focus-{version}.csv"
    assert focus.check_file(path) == []
    header, rows = rows_of(path)
    origins = origins_from_ledger(ledger, period.start, period.end, grain)
    # not vacuous: h100-mig's GPUs once in east and again in west, and west's shared-modes GPUs
    east = {uuid for cluster, uuid, _ in origins if cluster == "east"}
    west = {uuid for cluster, uuid, _ in origins if cluster == "west"}
    assert east and east < west
    found = rule_problems(header, rows, grain, origins)
    assert {rule: p[:2] for rule, p in found.items() if p} == {}
    assert {(r["SubAccountId"], r["SubAccountType"], r["x_Cluster"]) for r in rows} == {
        ("east", "Cluster", "east"),
        ("west", "Cluster", "west"),
    }
    # the chargeback names a cluster's namespace `cluster/namespace`; the file the cluster and the
    # namespace apart: filtering one cluster and one namespace gives that chargeback group, to the cent
    per_pair: dict[str, Decimal] = defaultdict(Decimal)
    for row in rows:
        per_pair[f"{row['x_Cluster']}/{row['x_Namespace']}"] += Decimal(row["BilledCost"])
    groups = {g.key: g.usage.cost for g in report.groups if "/" in g.key}
    assert len(groups) > 4 and {key: per_pair[key] for key in groups} == groups
    assert sum(per_pair.values()) == report.total.cost
