"""The billing issue's "Done when": the simulator's history of real fleets, loaded into a real
Prometheus and, the same suite again, a real VictoriaMetrics, ingested by billing, gives exactly the GPU-hours the fleet file says were allocated.

Three days of `h100-mig` (8×H100, 56 MIG 1g.10gb instances on schedules) and `a100-mixed` (MIG, whole
and time-sliced A100s) at a 60 s step are written by `gpumeter.simulator.history`, backfilled with
`promtool tsdb create-blocks-from openmetrics`, and ingested hour by hour. The expected figures are
computed here from the fleet's own `PodSpec.running(offset)` schedule and time-slicing replicas,
never from billing's code: per pod and per hour, the seconds observed (one step per sample,
docs/billing.md §2.1), times the share (1/replicas when time-sliced), times the slice weight
(compute slices / 7) and the rate. That this history is what a live exporter serves (same series
names, label sets and values) is checked by tests/test_contract_parity.py.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from fractions import Fraction

import pytest

from gpumeter.billing.ingest import QUERIES, IngestConfig, ingest_hour, ingest_hours
from gpumeter.billing.models import LineKind
from gpumeter.billing.pricer import Pricer
from gpumeter.billing.prom import PrometheusClient
from gpumeter.simulator.fleet import load_fleet
from gpumeter.simulator.history import write_history
from tests.billing import factories
from tests.billing.conftest import QUERY_BACKENDS, serve_history

START = datetime(2026, 11, 2, tzinfo=UTC)
DAYS = 3
HOURS = [START + timedelta(hours=i) for i in range(24 * DAYS)]
STEP = 60  # seconds between samples
FLEETS = ("h100-mig", "a100-mixed")
RATES = {"NVIDIA H100 80GB HBM3": Fraction(688, 100), "NVIDIA A100-SXM4-40GB": Fraction(3)}
COMPUTE_SLICES_TOTAL = 7  # H100-80GB and A100-40GB


@pytest.fixture(scope="module")
def fleets():
    return [load_fleet(name) for name in FLEETS]


@pytest.fixture(scope="module", params=QUERY_BACKENDS)
def prometheus(request, fleets, tmp_path_factory):
    """Three days of simulated history, loaded once into a real Prometheus (backfilled by promtool)
    or a real VictoriaMetrics (its import API), read-only here: every test runs on both engines."""
    root = tmp_path_factory.mktemp(f"simulated-{request.param}")
    source = root / "history.om"
    start = START.timestamp()
    with source.open("w") as out:
        write_history(fleets, start, start + DAYS * 86400, STEP, out)
    server = serve_history(request.param, source, root)
    source.unlink()
    yield server
    server.stop()


@pytest.fixture
def book(tmp_path):
    return factories.book(
        tmp_path, {"A100-40GB": {"hourly_rate": "3.00"}, "H100-80GB": {"hourly_rate": "6.88"}}
    )


def _observed_seconds(pod, hour_index: int) -> int:
    """Seconds one pod held its devices in one hour, by the fleet's schedule and §2.1's sample rule."""
    first = hour_index * 3600
    samples = sum(1 for t in range(first, first + 3600, STEP) if pod.running(t))
    seconds = samples * STEP
    return 3600 if seconds >= 3600 - 2 * STEP else seconds


def expected_allocations(fleets) -> dict[tuple[str, str], dict[str, Fraction]]:
    """(namespace, pod) → {"held": GPU-hours × share, "weighted": × slice weight, "cost": × rate}."""
    out: dict[tuple[str, str], dict[str, Fraction]] = defaultdict(lambda: defaultdict(Fraction))
    for fleet in fleets:
        for pod in fleet.pods:
            node = fleet.node(pod.node)
            for device in pod.devices:
                gpu = node.gpus[device.gpu]
                share = Fraction(1, gpu.time_slicing) if device.replica is not None else Fraction(1)
                weight = Fraction(1)
                if device.gpu_instance_id is not None:
                    (instance,) = [m for m in gpu.mig if m.gpu_instance_id == device.gpu_instance_id]
                    weight = Fraction(instance.profile.compute_slices, COMPUTE_SLICES_TOTAL)
                for i in range(len(HOURS)):
                    held = Fraction(_observed_seconds(pod, i), 3600) * share
                    totals = out[(pod.namespace, pod.name)]
                    totals["held"] += held
                    totals["weighted"] += held * weight
                    totals["cost"] += held * weight * RATES[gpu.model.nvml_name]
    return out


def _ledger_state(ledger):
    facts = {h: ledger.facts(h) for h in HOURS}
    lines = sorted(
        (x.hour, x.uuid, x.kind, x.namespace, x.pod, x.gpu_instance_id, x.amount, x.quantity)
        for x in ledger.lines(HOURS[0], HOURS[-1] + timedelta(hours=1))
    )
    counts = {k: v for k, v in ledger.counts().items() if k != "ingest_runs"}
    return facts, lines, counts


def test_simulated_fleets_bill_exactly_what_the_fleet_file_allocated(prometheus, ledger, book, fleets):
    config = IngestConfig(scrape_interval=STEP)
    with PrometheusClient(prometheus.url) as client:
        result = ingest_hours(client, ledger, book, HOURS, config)
    assert result.failed == [] and result.ingested == HOURS and result.unpriced_gpu_hours == 0

    # Facts: allocated GPU-hours × share per pod, exactly as the fleet file scheduled them.
    expected = expected_allocations(fleets)
    held: dict[tuple[str, str], Fraction] = defaultdict(Fraction)
    gpus = {gpu.uuid: gpu for fleet in fleets for node in fleet.nodes for gpu in node.gpus}
    for hour in HOURS:
        facts = ledger.facts(hour)
        assert sorted(gh.device.uuid for gh in facts) == sorted(gpus)  # every GPU, every hour
        for gh in facts:
            assert gh.device.present_seconds == 3600
            assert gh.device.mig_mode == gpus[gh.device.uuid].mig_enabled
            assert len(gh.instances) == len(gpus[gh.device.uuid].mig)
            for a in gh.allocations:
                held[(a.namespace, a.pod)] += Fraction(a.allocated_seconds, 3600) * Fraction(a.share)
    assert dict(held) == {k: v["held"] for k, v in expected.items() if v["held"]}
    assert sum(held.values()) > 2000  # not vacuous: ~3 days × ~40 GPUs' worth of slices

    # Lines: each GPU-hour's lines sum exactly to its device cost (every GPU present the whole hour).
    lines = ledger.lines(HOURS[0], HOURS[-1] + timedelta(hours=1))
    per_gpu_hour: dict[tuple, Decimal] = defaultdict(Decimal)
    tenant: dict[tuple[str, str], list] = defaultdict(list)
    for line in lines:
        per_gpu_hour[(line.hour, line.uuid)] += line.amount
        if line.kind is LineKind.TENANT:
            tenant[(line.namespace, line.pod)].append(line)
    assert len(per_gpu_hour) == len(HOURS) * len(gpus)
    for (_, uuid), total in per_gpu_hour.items():
        assert total == Decimal(RATES[gpus[uuid].model.nvml_name].numerator) / Decimal(
            RATES[gpus[uuid].model.nvml_name].denominator
        )

    # Tenant lines: weighted quantity and cost per pod, within each line's rounding (6 dp, 1 cent).
    for key, want in expected.items():
        got = tenant.get(key, [])
        if not want["held"]:
            assert sum(x.amount for x in got) == 0, key
            continue
        quantity = sum(Fraction(x.quantity) for x in got)
        amount = sum(Fraction(x.amount) for x in got)
        assert abs(quantity - want["weighted"]) <= Fraction(len(got), 2 * 10**6), key
        assert abs(amount - want["cost"]) < Fraction(len(got), 100), key

    # Per namespace: tenant money plus the platform lines is the whole fleet's device cost.
    device_cost = sum(RATES[g.model.nvml_name] for g in gpus.values()) * len(HOURS)
    assert sum(Fraction(x.amount) for x in lines) == device_cost


def test_reingesting_the_simulated_history_changes_nothing(prometheus, ledger, book):
    """Re-ingesting replaces each hour with the same facts and lines; and ingesting in worker
    processes (range queries per 12 h run) writes exactly what one process writes."""
    with PrometheusClient(prometheus.url) as client:
        parallel = IngestConfig(scrape_interval=STEP, chunk_hours=12, workers=2)
        assert sorted(ingest_hours(client, ledger, book, HOURS, parallel).ingested) == HOURS
        before = _ledger_state(ledger)
        serial = IngestConfig(scrape_interval=STEP)
        assert ingest_hours(client, ledger, book, HOURS, serial).ingested == HOURS
        assert _ledger_state(ledger) == before
        # a pricer given prices every GPU-hour in this process: no worker is started to ignore it
        pricer = Pricer(book)
        assert ingest_hours(client, ledger, book, HOURS, parallel, pricer=pricer).ingested == HOURS
        assert pricer.hits + pricer.misses == ledger.counts()["gpu_hours"] > 0
        assert _ledger_state(ledger) == before
        for hour in HOURS[:2]:  # and hour by hour with instant queries, as the hourly service does
            ingest_hour(client, ledger, book, hour, serial)
    assert _ledger_state(ledger) == before
    assert ledger.counts()["ingest_runs"] == 3 * len(HOURS) + 2


class _RunsRecorded(PrometheusClient):
    """A Prometheus client that notes the hours of each run of range queries billing asks for."""

    def __init__(self, url: str):
        super().__init__(url)
        self.runs: list[int] = []

    def fetch_range(self, promql, start, end, step_seconds):
        if promql == QUERIES["gpu_count"]:  # one of each run's queries
            self.runs.append(round((end - start).total_seconds() / step_seconds) + 1)
        return super().fetch_range(promql, start, end, step_seconds)


def test_runs_grow_across_a_gap_and_bill_what_fixed_runs_bill(prometheus, ledger, book):
    """Runs of range queries start at chunk_hours, grow threefold once a run's series are known, are
    cut short by a gap in the hours, and bound by run_points; every hour is ingested once, in order,
    and the ledger is the one runs of 24 hours give (docs/billing.md §6)."""
    hours = HOURS[:25] + HOURS[26:]  # hour 25 is not asked for
    with PrometheusClient(prometheus.url) as client:
        assert ingest_hours(client, ledger, book, hours, IngestConfig(scrape_interval=STEP)).ingested == hours
    fixed = _ledger_state(ledger)
    with _RunsRecorded(prometheus.url) as client:
        grown = IngestConfig(scrape_interval=STEP, chunk_hours=2)
        assert ingest_hours(client, ledger, book, hours, grown).ingested == hours
        # 2; 6; 18 asked, 17 before the gap; 54 asked, the 46 left
        assert client.runs == [2, 6, 17, 46]
        assert _ledger_state(ledger) == fixed
        client.runs.clear()
        bounded = IngestConfig(scrape_interval=STEP, chunk_hours=2, run_points=1)  # never past chunk_hours
        assert ingest_hours(client, ledger, book, hours, bounded).ingested == hours
        assert client.runs == [2] * 12 + [2] * 23  # hour 24 alone: instant queries, no range
    assert _ledger_state(ledger) == fixed


def test_the_share_answer_leaves_out_exclusive_holdings(prometheus):
    """The engine sends no share of 1 (`HourQuery.left_out`): exclusive holdings are absent from the
    share answer, present in the count answer, and billed whole (the test above, to the cent)."""
    first, last = HOURS[0] + timedelta(hours=1), HOURS[23] + timedelta(hours=1)
    with PrometheusClient(prometheus.url) as client:
        shares = client.query_range(QUERIES["alloc_share"], first, last, 3600)
        counts = client.query_range(QUERIES["alloc_count"], first, last, 3600)
    values = {float(value) for _, points in shares for _, value in points}
    assert values and 1.0 not in values  # the time-sliced A100s' 1/replicas remain
    assert 0 < len(shares) < len(counts)
