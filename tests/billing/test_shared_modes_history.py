"""A backfilled week of shared-modes.yaml (every way the fleet shares a GPU) ingested from a real
Prometheus: every GPU-hour reconciles exactly, every sharing mode is stored with its facts, and the
fractional grants are billed by the slice-weight policy from the fractions the history carries.

The history is what the live exporter serves (tests/test_contract_parity.py covers the fractional node
with the stand-in Kubernetes API). Expected fractions are worked out here from the fleet file: H100
81559 MiB; gpushare's ALIYUN_COM_GPU_MEM_DEV 79 GiB.
"""

from __future__ import annotations

import shutil
import subprocess
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from gpumeter import contract
from gpumeter.billing.ingest import IngestConfig, ingest_hours
from gpumeter.billing.models import LineKind
from gpumeter.billing.pricing import load_price_book
from gpumeter.billing.prom import PrometheusClient
from gpumeter.simulator.fleet import load_fleet
from gpumeter.simulator.history import write_history
from tests.billing.factories import write_book
from tests.support.servers import PrometheusServer, require_binary

START = datetime(2026, 11, 2, tzinfo=UTC)
DAYS = 7
HOURS = [START + timedelta(hours=i) for i in range(24 * DAYS)]
STEP = 300
RATE = Decimal("6.88")
H100_MIB = 81559
# (namespace, pod) → (memory fraction, compute fraction), by hand from the fleet file
GRANTS = {
    ("genai", "llm-serve"): (40960 / H100_MIB, 0.50),
    ("research", "notebook"): (20480 / H100_MIB, 0.30),
    ("data-eng", "batch-embed"): (10240 / H100_MIB, 10240 / H100_MIB),
    ("vision", "ocr"): (16 / 79, 0.25),
    ("nlp", "tagger"): (8 / 79, 8 / 79),
}


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    root = tmp_path_factory.mktemp("shared-modes")
    source = root / "history.om"
    start = START.timestamp()
    with source.open("w") as out:
        write_history([load_fleet("shared-modes")], start, start + DAYS * 86400, STEP, out)
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


def _book(tmp_path, policy: str, split: str = "equal"):
    doc = {
        "currency": "USD",
        "versions": [
            {
                "effective_from": "2026-01-01T00:00:00Z",
                "gpus": {"H100-80GB": {"hourly_rate": str(RATE)}},
                "slice_weight": policy,
                "sharing_efficiency": {"time_slicing": "0.75", "mps": "0.90", "vgpu": "0.85"},
                "sharing_split": split,
            }
        ],
    }
    return load_price_book(write_book(tmp_path, doc, f"{policy}-{split}.yaml"))


@pytest.mark.prometheus
@pytest.mark.parametrize(("policy", "pick"), [("compute", 1), ("memory", 0)])
def test_a_week_of_every_sharing_mode_reconciles_and_grants_pay_their_fraction(
    prometheus, ledger, tmp_path, policy, pick
):
    book = _book(tmp_path, policy)
    fleet = load_fleet("shared-modes")
    vms = {v.vm_id: v.vm for gpu in fleet.node("gpu-shared-vgpu-01").gpus for v in gpu.vgpus}
    teams = {vm_id: f"team-{name}" for vm_id, name in vms.items()}  # the team map's `vms:` section
    with PrometheusClient(prometheus.url) as client:
        result = ingest_hours(client, ledger, book, HOURS, IngestConfig(scrape_interval=STEP, teams=teams))
    assert result.failed == [] and result.ingested == HOURS and result.unpriced_gpu_hours == 0

    gpus = {gpu.uuid for node in fleet.nodes for gpu in node.gpus}
    modes = set()
    for hour in HOURS[:24]:
        for gh in ledger.facts(hour):
            for a in gh.allocations:
                modes.add(a.sharing)
                if a.sharing == contract.SHARING_FRACTIONAL:  # both fractions stored, to 9 places
                    memory, compute = GRANTS[(a.namespace, a.pod)]
                    assert (a.memory_share, a.compute_share) == (
                        Decimal(repr(memory)).quantize(Decimal("1e-9")),
                        Decimal(repr(compute)).quantize(Decimal("1e-9")),
                    )
                else:
                    assert a.memory_share is None and a.compute_share is None
    assert modes == {"exclusive", "mig", "time_slicing", "mps", "fractional", "vgpu"}

    lines = ledger.lines(HOURS[0], HOURS[-1] + timedelta(hours=1))
    per_gpu_hour: dict[tuple, Decimal] = defaultdict(Decimal)
    grants: dict[tuple, list] = defaultdict(list)
    vm_lines: dict[str, list] = defaultdict(list)
    for line in lines:
        per_gpu_hour[(line.hour, line.uuid)] += line.amount
        if line.kind is LineKind.TENANT and line.namespace in vms:
            vm_lines[line.namespace].append(line)
        if line.kind is LineKind.TENANT and (line.namespace, line.pod) in GRANTS:
            grants[(line.namespace, line.pod)].append(line)
    assert len(per_gpu_hour) == len(HOURS) * len(gpus)
    assert set(per_gpu_hour.values()) == {RATE}  # every GPU-hour, exactly its device cost
    for key, (memory, compute) in GRANTS.items():
        share = (memory, compute)[pick]
        assert len(grants[key]) == len(HOURS)
        for line in grants[key]:  # held the whole hour: quantity = the policy's fraction
            assert abs(float(line.quantity) - share) <= 1e-6, key
            assert abs(line.amount - Decimal(repr(share)) * RATE) < Decimal("0.01"), key
    # docs/billing.md §8 (j): each VM's H100XM-20C, 0.25 x 6.88 x 0.85 = 1.462 -> 1.46 every hour (the
    # residue cent goes to the shortfall's larger remainder), under its team from the team map
    assert set(vm_lines) == set(vms)
    for vm_id, vm_hours in vm_lines.items():
        assert len(vm_hours) == len(HOURS)
        assert {(line.amount, line.team) for line in vm_hours} == {(Decimal("1.46"), f"team-{vms[vm_id]}")}
    if policy == "compute":  # by hand: llm-serve's 0.5 x 6.88 = 3.44 has no remainder to round
        assert {line.amount for line in grants[("genai", "llm-serve")]} == {Decimal("3.44")}
    else:  # 16/79 x 6.88 = 1.39342… for ocr's memory
        assert {line.amount for line in grants[("vision", "ocr")]} <= {Decimal("1.39"), Decimal("1.40")}


# The time-sliced GPU's three holders, by hand (docs/billing.md §8 (k)): their processes use 5 %, 15 % and
# 2 % of its SM time every hour (utilization 0.2, 0.6, 0.1 over 4 replicas, NVML's whole percent).
# equal: 0.25 × 6.88 × 0.75 = 1.29 each; usage: P = 0.75 GPU-h split 5 : 15 : 2 → 0.88, 2.64, 0.35.
ETL = {
    "equal": {"etl-0": Decimal("1.29"), "etl-1": Decimal("1.29"), "etl-2": Decimal("1.29")},
    "usage": {"etl-0": Decimal("0.88"), "etl-1": Decimal("2.64"), "etl-2": Decimal("0.35")},
}


@pytest.mark.prometheus
@pytest.mark.parametrize("split", ["equal", "usage"])
def test_a_week_reconciles_every_gpu_hour_under_both_sharing_splits(prometheus, ledger, tmp_path, split):
    book = _book(tmp_path, "compute", split)
    with PrometheusClient(prometheus.url) as client:
        result = ingest_hours(client, ledger, book, HOURS, IngestConfig(scrape_interval=STEP))
    assert result.failed == [] and result.ingested == HOURS and result.unpriced_gpu_hours == 0

    fleet = load_fleet("shared-modes")
    gpus = {gpu.uuid for node in fleet.nodes for gpu in node.gpus}
    lines = ledger.lines(HOURS[0], HOURS[-1] + timedelta(hours=1))
    per_gpu_hour: dict[tuple, Decimal] = defaultdict(Decimal)
    etl: dict[str, set] = defaultdict(set)
    for line in lines:
        per_gpu_hour[(line.hour, line.uuid)] += line.amount
        if line.kind is LineKind.TENANT and line.pod.startswith("etl-"):
            etl[line.pod].add(line.amount)
    assert len(per_gpu_hour) == len(HOURS) * len(gpus)
    assert set(per_gpu_hour.values()) == {RATE}  # every GPU-hour, exactly its device cost
    assert {pod: amounts for pod, amounts in etl.items()} == {p: {a} for p, a in ETL[split].items()}
    # the process use is stored with the facts: own SM share on the shared GPU, as the line's utilization
    facts = {a.pod: a for gh in ledger.facts(HOURS[0]) for a in gh.allocations}
    assert (facts["etl-1"].process_sm, facts["etl-1"].utilization) == (Decimal("0.15"), Decimal("0.15"))
    assert facts["etl-1"].process_memory > 0
    assert facts["pretrain"].process_sm == Decimal("0.9")  # exclusive: stored, never re-split
    assert facts["detector"].process_sm is None and facts["detector"].process_memory > 0  # MIG: memory only
