"""A day of dra.yaml (GPUs handed out by Dynamic Resource Allocation) backfilled into a real Prometheus,
ingested and priced: every GPU-hour reconciles exactly, every pod holding a DRA claim is billed every
hour, the claims are stored with the allocations (resource ``resourceclaim/<name>``), and docs/billing.md
§8 (n) comes out to the cent. The history is what the live exporter serves (tests/test_contract_parity.py
covers both dra nodes); the chargeback report names each claim and how it was shared.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from gpumeter.billing.ingest import IngestConfig, ingest_hours
from gpumeter.billing.models import LineKind
from gpumeter.billing.pricing import load_price_book
from gpumeter.billing.prom import PrometheusClient
from gpumeter.reports.model import Period, build_report
from gpumeter.reports.render import render
from gpumeter.simulator.fleet import load_fleet
from gpumeter.simulator.history import write_history
from tests.billing.factories import write_book
from tests.support.servers import PrometheusServer, require_binary

START = datetime(2026, 11, 2, tzinfo=UTC)
HOURS = [START + timedelta(hours=i) for i in range(24)]
STEP = 300
H100, A100 = Decimal("6.88"), Decimal("3.00")
FLEET = load_fleet("dra")
DRA_01 = FLEET.node("gpu-dra-01").gpus


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    root = tmp_path_factory.mktemp("dra-history")
    source = root / "history.om"
    start = START.timestamp()
    with source.open("w") as out:
        write_history([FLEET], start, start + 86400, STEP, out)
    data = root / "data"
    subprocess.run(
        [
            require_binary("promtool"),
            *("tsdb", "create-blocks-from", "openmetrics", "--max-block-duration=768h"),
            *(str(source), str(data)),
        ],
        check=True,
        capture_output=True,
    )
    server = PrometheusServer(root / "prom", data_dir=data).start()
    yield server
    server.stop()
    shutil.rmtree(data, ignore_errors=True)


def _book(tmp_path):
    doc = {
        "currency": "USD",
        "versions": [
            {
                "effective_from": "2026-01-01T00:00:00Z",
                "gpus": {"H100-80GB": {"hourly_rate": str(H100)}, "A100-40GB": {"hourly_rate": str(A100)}},
                "slice_weight": "compute",
                "sharing_efficiency": {"time_slicing": "0.75", "mps": "0.90"},
            }
        ],
    }
    return load_price_book(write_book(tmp_path, doc))


@pytest.mark.prometheus
def test_a_day_of_dra_claims_is_billed_and_the_worked_example_holds_to_the_cent(prometheus, ledger, tmp_path):
    with PrometheusClient(prometheus.url) as client:
        result = ingest_hours(client, ledger, _book(tmp_path), HOURS, IngestConfig(scrape_interval=STEP))
    assert result.failed == [] and result.ingested == HOURS and result.unpriced_gpu_hours == 0

    lines = ledger.lines(HOURS[0], HOURS[-1] + timedelta(hours=1))
    rates = {
        gpu.uuid: (H100 if gpu.model.key.startswith("H100") else A100) for n in FLEET.nodes for gpu in n.gpus
    }
    per_gpu_hour: dict[tuple, Decimal] = defaultdict(Decimal)
    billed: dict[tuple[str, str], int] = defaultdict(int)
    for line in lines:
        per_gpu_hour[(line.hour, line.uuid)] += line.amount
        if line.kind is LineKind.TENANT:
            billed[(line.namespace, line.pod)] += 1
    assert len(per_gpu_hour) == len(HOURS) * len(rates)
    assert all(amount == rates[uuid] for (_, uuid), amount in per_gpu_hour.items())
    # every pod of the fleet (DRA claims and the mixed node's device-plugin pods) billed every hour
    assert billed == {(p.namespace, p.name): len(HOURS) for p in FLEET.pods}

    # the claims are stored with the allocations, with the sharing their config asked for
    facts = {(a.namespace, a.pod): a for gh in ledger.facts(HOURS[0]) for a in gh.allocations}
    assert facts[("inference", "ranker-0")].resource == "resourceclaim/shared-ts"
    assert (facts[("inference", "ranker-0")].sharing, facts[("inference", "ranker-0")].share) == (
        "time_slicing",
        Decimal("0.5"),
    )
    assert facts[("inference", "llm-1")].sharing == "mps"
    assert (facts[("vision", "detector")].sharing, facts[("vision", "detector")].mig_profile) == (
        "mig",
        "3g.40gb",
    )
    assert facts[("search-inference", "retriever")].resource == "nvidia.com/gpu"  # the device plugin's

    # docs/billing.md §8 (n), by hand, every hour: GPU 1's 3g.40gb (vision/detector) and one 1g.10gb
    # (nlp/embedder) claimed, a 2g.20gb and a 1g.10gb free; GPU 2's claim shared by two pods, time-sliced
    def amounts(uuid: str) -> dict[tuple, set[Decimal]]:
        out: dict[tuple, Decimal] = defaultdict(Decimal)
        for line in lines:
            if line.uuid == uuid and line.hour == HOURS[5]:
                out[(line.kind.value, line.namespace, line.pod)] += line.amount
        return {k: v for k, v in out.items()}

    assert amounts(DRA_01[1].uuid) == {
        ("tenant", "vision", "detector"): Decimal("2.95"),  # 3/7 x 6.88 = 2.9486 -> 2.94 + residue cent
        ("tenant", "nlp", "embedder"): Decimal("0.98"),  # 1/7 x 6.88 = 0.9829 -> 0.98
        ("unallocated", "__unallocated__", ""): Decimal("2.95"),  # 2g 1.9657 -> 1.97, 1g 0.98
    }
    assert amounts(DRA_01[2].uuid) == {
        ("tenant", "inference", "ranker-0"): Decimal("2.58"),  # 0.5 x 6.88 x 0.75
        ("tenant", "inference", "ranker-1"): Decimal("2.58"),
        ("sharing_shortfall", "__sharing_shortfall__", ""): Decimal("1.72"),  # 1.0 x 6.88 x 0.25
    }

    # the report names each claim, how it was shared and who held it
    report = build_report(ledger, Period(START, START + timedelta(days=1), "2026-11-02"), "namespace")
    render(report, tmp_path / "out", ("json",))
    (document,) = (tmp_path / "out").glob("*.json")
    doc = json.loads(document.read_text())
    claims = {(c["namespace"], c["claim"]): (c["sharing"], c["pods"]) for c in doc["resource_claims"]}
    assert claims == {
        (c.namespace, c.name): (
            [
                {"TimeSlicing": "time_slicing", "MPS": "mps"}.get(
                    c.sharing, "exclusive" if c.devices[0].gpu_instance_id is None else "mig"
                )
            ],
            sorted(
                p.name
                for p in FLEET.pods
                if p.namespace == c.namespace and any(d.claim == c.name for d in p.devices)
            ),
        )
        for c in FLEET.claims
        if c.devices  # a ComputeDomain's channel claim holds no GPU: nothing billed through it
    }
    assert {m["sharing"] for m in doc["sharing_modes"]} == {"exclusive", "mig", "time_slicing", "mps"}
