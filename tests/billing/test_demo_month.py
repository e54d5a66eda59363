"""The demo's month, end to end, for issue 41's "Done when": the history `gpumeter demo` backfills (its
two fleets, its incidents, a 300 s step: `deploy/demo.py`) for November 2026 is loaded into a real
Prometheus and ingested once with the shipped book's rates, seed 003's utilization tiers and
`--utilization-tiers price`. Then

* every GPU-hour's lines sum to its device cost, to the cent, with the tiers' discount on
  `__utilization_shortfall__` (docs/billing.md §3.7);
* `gpumeter report --kind allocations` lists every allocation the fleet files schedule in the month,
  with the starts and ends worked out here from the fleets' own schedules (docs/reports.md,
  "Allocation audit");
* every line is as the engine wrote it, and the month's FOCUS files (day and hour grain; 1.3, 1.4,
  1.2) are byte for byte as the report wrote them a dict per row (committed digests).

The month's history is ~2.3 million samples (~630 MB of OpenMetrics, written and backfilled once).
"""

from __future__ import annotations

import csv
import hashlib
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
import yaml

import gpumeter
from gpumeter.billing.ingest import IngestConfig, ingest_hours
from gpumeter.billing.ledger import open_ledger
from gpumeter.billing.models import TIER_SHORTFALL, LineKind, hours_between
from gpumeter.billing.pricing import load_price_book
from gpumeter.billing.pricing.static import DEFAULT_BOOK
from gpumeter.billing.prom import PrometheusClient
from gpumeter.deploy.demo import INCIDENTS, NODES
from gpumeter.reports.model import month_period
from gpumeter.reports.render import RenderOptions
from gpumeter.reports.run import generate
from gpumeter.simulator.fleet import load_fleet
from gpumeter.simulator.history import parse_incident, write_history
from tests.billing.conftest import serve_history

MONTH = datetime(2026, 11, 1, tzinfo=UTC)
END = datetime(2026, 12, 1, tzinfo=UTC)
HOURS = hours_between(MONTH, END)
STEP = 300  # the demo's
SEED_TIERS = [  # seed 003 §6.1's utilizationTiers
    {"range": [0, 0.3], "efficiency": 0.5},
    {"range": [0.3, 0.7], "efficiency": 0.8},
    {"range": [0.7, 1.0], "efficiency": 1.0},
]
# sha256 of every line of the month (`_line_digest`), as the engine wrote them when the columnar engine
# was begun: any engine that bills this month must write these lines, to the last digit
DEMO_MONTH_LINES = "0d5ca4a6fc402dc449b34a78d2af18077168bb059f44dba38a4c008df89fbfa3"
# sha256 of the month's FOCUS file by grain and version (by team), as the report wrote it a dict per
# row before FOCUS was made from the charges' columns (b799b03): any way of making it writes these bytes.
# The day files were pinned again when the SQL ledger began to sum a day's readings exactly (integers of
# 10⁻⁹, billing/ledger/frames.py): five x_GpuUtilizationAvg cells moved by 10⁻⁶, each a day whose true
# mean lies exactly half-way at the seventh place (0.2514875), which the float sums had rounded by the
# order the database met the lines in; every other byte is the same (docs/performance.md, 2026-12-06).
# And again when a bucket's mean was rounded from its exact sum (`focus_origins.mean_text`), half to
# even, no longer from a float: the day files' 24 utilization means that lie exactly half-way at the
# seventh place (0.2503825, 0.8494375, ...) are each now the half-even one, where the float had gone
# either way (docs/performance.md, 2026-12-06, near midnight); the hour file did not change
# The 1.3 and 1.4 files were pinned again when an origin's AllocatedRatio values were split by largest
# remainder so that they sum to exactly 1 (FOCUS's "MUST be equal to 1"), not each rounded on its own:
# 8,640 of the hour file's AllocatedMethodDetails cells and 360 of each day file's moved, each ratio by
# at most 10⁻¹², and no other cell (compared cell by cell, 2026-12-07); the 1.2 file has no ratios
# All four again when SkuPriceId became a digest of the model's price terms (FOCUS: "MUST remain
# consistent over time"): compared cell by cell, only SkuPriceId and its echo in x_OriginCharge moved,
# one to one (a100-40gb:2da10028efd7@2026-01-01T00:00:00Z -> a100-40gb:acae64f6db0e, and the H100's)
DEMO_MONTH_FOCUS = {
    ("day", "1.3"): "e44780209d57b35d3a607e8037e099798fea2f9f138876be854e97809f24266d",
    ("hour", "1.3"): "91a0161fdd04e0ab234e2915252e47781494b72b98a2faab84d9589abf62bd13",
    ("day", "1.4"): "3c3de2c393c2909ca531988cbd6628bb1e85dbb8ee657da0c0b9107bced00448",
    ("day", "1.2"): "41ac41a1ecd44c868b4423833125b2df7e6134a207e2b804fa97c828ede0c1a8",
}
RATES = {"NVIDIA H100 80GB HBM3": Decimal("6.88"), "NVIDIA A100-SXM4-40GB": Decimal("3.00")}


@pytest.fixture(scope="module")
def fleets():
    # the demo's MIG nodes, whose figures this file works out (the shared-modes nodes are priced by
    # tests/billing/test_shared_modes_history.py)
    return [
        load_fleet(fleet) for fleet in dict.fromkeys(n.fleet for n in NODES if not n.shared and n.kubelet)
    ]


@pytest.fixture(scope="module")
def demo_month(fleets, tmp_path_factory):
    """The demo's November, ingested under utilization_tiers: price into a SQLite ledger."""
    root = tmp_path_factory.mktemp("demo-month")
    source = root / "history.om"
    incidents = tuple(
        parse_incident(f"{what}@{(MONTH + timedelta(hours=h)).isoformat()}") for what, h in INCIDENTS
    )
    with source.open("w") as out:
        write_history(fleets, MONTH.timestamp(), END.timestamp(), STEP, out, incidents=incidents)
    server = serve_history("prometheus", source, root)
    source.unlink()
    doc = yaml.safe_load(DEFAULT_BOOK.read_text())
    doc["versions"][0]["utilization_tiers"] = SEED_TIERS
    (root / "prices.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    book = load_price_book(root / "prices.yaml").with_utilization_tiers("price")
    url = f"sqlite:///{root / 'ledger.sqlite'}"
    ledger = open_ledger(url)
    try:
        with PrometheusClient(server.url) as client:
            result = ingest_hours(client, ledger, book, HOURS, IngestConfig(scrape_interval=STEP, workers=1))
    finally:
        server.stop()
    assert result.failed == [] and result.ingested == HOURS and result.unpriced_gpu_hours == 0
    yield url, ledger
    ledger.close()


@pytest.mark.prometheus
@pytest.mark.slow
def test_the_demo_month_priced_by_its_tiers_reconciles_every_gpu_hour(demo_month, fleets):
    _, ledger = demo_month
    gpus = {gpu.uuid: gpu for fleet in fleets for node in fleet.nodes for gpu in node.gpus}
    per_gpu_hour: dict[tuple, Decimal] = defaultdict(Decimal)
    discount = Decimal(0)
    discounted = 0
    for line in ledger.lines(MONTH, END):
        per_gpu_hour[(line.hour, line.uuid)] += line.amount
        if line.kind is LineKind.UTILIZATION_SHORTFALL:
            assert line.namespace == TIER_SHORTFALL
            discount += line.amount
        elif line.kind is LineKind.TENANT and line.efficiency is not None and line.efficiency < 1:
            discounted += 1
    # every GPU of both fleets, every hour of the month, present the whole hour (a lost GPU's info
    # series stays), each GPU-hour summing exactly to its rate
    assert len(per_gpu_hour) == len(HOURS) * len(gpus)
    for (_, uuid), total in per_gpu_hour.items():
        assert total == RATES[gpus[uuid].model.nvml_name], uuid
    month = sum(RATES[g.model.nvml_name] for g in gpus.values()) * len(HOURS)
    assert sum(per_gpu_hour.values()) == month  # (8 x 6.88 + 6 x 3.00) x 720 = 52,588.80
    print(
        f"\ndemo month under price: {len(per_gpu_hour)} GPU-hours, {month} USD, {discounted} tenant lines "
        f"below tier 1.0, utilization shortfall {discount} USD"
    )  # pytest -s shows it
    # not vacuous: the tiers priced lines (pods below 70 % utilization) and the platform carried it
    assert discounted > 1000 and discount > 100


@pytest.mark.prometheus
@pytest.mark.slow
def test_the_allocations_report_lists_the_demo_months_allocations(demo_month, fleets, tmp_path):
    url, _ = demo_month
    out = tmp_path / "out"
    argv = ["report", "--kind", "allocations", "--db", url, "--period", "2026-11", "--out", str(out)]
    assert gpumeter.main([*argv, "--format", "csv", "--no-record"]) == 0
    with (out / "gpumeter-allocations-2026-11.csv").open() as f:
        got = sorted(
            (r["namespace"], r["pod"], r["node"], r["gpu"], r["gpu_instance_id"], r["start"], r["end"])
            for r in csv.DictReader(f)
        )
    # By hand from the fleet files: each pod holds its device over [start_s, end_s) of every period
    # every_s (or for good), on whole hours, so each run is one allocation from its start to its end,
    # cut at the month's edges.
    month_s = (END - MONTH).total_seconds()
    want = []
    for fleet in fleets:
        for pod in fleet.pods:
            runs = []
            if pod.every_s is None:
                runs.append((pod.start_s, month_s if pod.end_s is None else pod.end_s))
            else:
                at = pod.start_s
                while at < month_s:
                    runs.append((at, min(month_s, at + pod.end_s - pod.start_s)))
                    at += pod.every_s
            for device in pod.devices:
                gi = "" if device.gpu_instance_id is None else str(device.gpu_instance_id)
                for begin, finish in runs:
                    start, end = (MONTH + timedelta(seconds=s) for s in (begin, finish))
                    stamps = tuple(moment.strftime("%Y-%m-%dT%H:%M:%SZ") for moment in (start, end))
                    want.append((pod.namespace, pod.name, pod.node, str(device.gpu), gi, *stamps))
    print(f"\ndemo month: {len(got)} allocations")  # pytest -s shows it
    assert got == sorted(want)
    assert len(got) > 1500  # notebooks daily, fine-tunes every 8 h: 14 x 30 + 14 x 90 + ...


def _line_digest(lines) -> tuple[int, str]:
    """How many lines and the sha256 of them all, each as its holder (cluster, GPU, MIG instance,
    namespace, pod, container, team), kind, model, MIG profile, quantities, amount, currency,
    efficiency and utilization, in one order whatever order the ledger read them in."""
    rows = sorted(
        "|".join(
            map(
                str,
                (
                    line.hour.isoformat(), line.cluster, line.uuid, line.gpu_instance_id, line.namespace,
                    line.pod, line.container, line.team, line.kind.value, line.model, line.mig_profile,
                    line.quantity, line.held, line.held_unit, line.amount, line.currency, line.efficiency,
                    line.utilization,
                ),
            )
        )
        for line in lines
    )  # fmt: skip
    digest = hashlib.sha256()
    for row in rows:
        digest.update(row.encode() + b"\n")
    return len(rows), digest.hexdigest()


@pytest.mark.prometheus
@pytest.mark.slow
def test_every_line_of_the_demo_month_is_as_the_engine_wrote_it(demo_month):
    """The month's lines, every field a bill shows, against the digest committed above: a change of
    engine (columns for objects, another rounding order) that moves one cent of one line fails here."""
    _, ledger = demo_month
    count, digest = _line_digest(ledger.lines(MONTH, END))
    print(f"\ndemo month: {count} lines, sha256 {digest}")  # pytest -s shows it
    assert count > 10_000
    assert digest == DEMO_MONTH_LINES


@pytest.mark.prometheus
@pytest.mark.slow
def test_the_demo_months_focus_files_are_as_they_were_written(demo_month, tmp_path):
    """FOCUS at day and hour grain, 1.3, 1.4 and 1.2, byte for byte (origins, their integer splits,
    the allocation columns' JSON) as the report wrote them before its columns were made in bulk."""
    _, ledger = demo_month
    now = datetime(2026, 12, 6, tzinfo=UTC)  # FOCUS names no generation time; the manifest does
    written = {}
    for grain, version in DEMO_MONTH_FOCUS:
        out = tmp_path / f"{grain}-{version}"
        options = RenderOptions(generated_at=now, focus_version=version)
        run = generate(
            ledger,
            month_period("2026-11"),
            "team",
            ("focus",),
            out,
            grain=grain,
            record=False,
            now=now,
            options=options,
        )
        (digest,) = run.files.values()
        written[(grain, version)] = digest
    assert written == DEMO_MONTH_FOCUS
