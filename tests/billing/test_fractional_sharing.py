"""docs/billing.md §8 (i): a GPU shared by fractional grants (HAMi, gpushare) is priced by the same
slice_weight policy as MIG slices, picking from each grant's memory and compute fractions. Figures by hand.

One H100 at $6.88/h for one hour, three grants (as the exporter serves them, docs/pod-attribution.md):
  a: memory 0.50, compute 0.30    b: memory 0.25, compute 0.50    c: memory 0.125, compute 0.125
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from decimal import Decimal

import pytest

from gpumeter import contract
from gpumeter.billing import queries
from gpumeter.billing.allocate import price_gpu_hour
from gpumeter.billing.ingest import IngestConfig, build_hour, reprice
from gpumeter.billing.ledger.base import HourRecord
from gpumeter.billing.models import UNALLOCATED
from gpumeter.billing.prom import Sample
from tests.billing.factories import H100, HOUR0, alloc, book, gpu_hour

D = Decimal
RATES = {"H100-80GB": {"hourly_rate": "6.88"}}
GRANTS = {"a": ("0.50", "0.30"), "b": ("0.25", "0.50"), "c": ("0.125", "0.125")}  # (memory, compute)

# compute: a 0.30 x 6.88 = 2.064 -> 2.06 (.4 cent), b 0.50 x 6.88 = 3.44, c 0.125 x 6.88 = 0.86;
# unallocated (1 - 0.925) x 6.88 = 0.516 -> 0.51 (.6 cent). Floors 6.87; the cent left goes to the
# largest remainder, unallocated: 0.52. 2.06 + 3.44 + 0.86 + 0.52 = 6.88.
BY_COMPUTE = {"a": D("2.06"), "b": D("3.44"), "c": D("0.86"), UNALLOCATED: D("0.52")}
# memory: a 3.44, b 1.72, c 0.86, unallocated 0.125 x 6.88 = 0.86; exact, 6.88.
BY_MEMORY = {"a": D("3.44"), "b": D("1.72"), "c": D("0.86"), UNALLOCATED: D("0.86")}
# max: a 0.50, b 0.50, c 0.125 claim 1.125 of the GPU, so each is scaled by 8/9 (as MIG's max is
# normalised): a = b = 4/9 x 6.88 = 3.0577… -> 3.05 (.78 cent), c = 1/9 x 6.88 = 0.7644… -> 0.76
# (.44 cent). Floors 6.86; 2 cents to the two largest remainders, a and b: 3.06 + 3.06 + 0.76 = 6.88.
BY_MAX = {"a": D("3.06"), "b": D("3.06"), "c": D("0.76")}


def _hour():
    u = "GPU-fractional"
    allocations = [
        dataclasses.replace(
            alloc(u, "ml", pod, share=compute),  # the allocation's value is the compute fraction
            sharing=contract.SHARING_FRACTIONAL,
            resource="nvidia.com/gpu",
            memory_share=D(memory),
            compute_share=D(compute),
        )
        for pod, (memory, compute) in GRANTS.items()
    ]
    return gpu_hour(u, H100, allocations=allocations)


def _amounts(priced) -> dict[str, Decimal]:
    return {line.pod or line.namespace: line.amount for line in priced.lines}


@pytest.mark.parametrize(
    ("policy", "expected"), [("compute", BY_COMPUTE), ("memory", BY_MEMORY), ("max", BY_MAX)]
)
def test_the_slice_weight_policy_picks_each_grants_fraction(tmp_path, policy, expected):
    # sharing efficiencies do not touch a grant: its scheduler enforces the fractions (§3.2)
    prices = book(tmp_path, RATES, slice_weight=policy, sharing_efficiency={"time_slicing": "0.5"})
    priced = price_gpu_hour(_hour(), prices)
    assert _amounts(priced) == expected
    assert sum(line.amount for line in priced.lines) == D("6.88") == priced.device_cost


def test_a_grant_without_its_fractions_prices_by_its_value(tmp_path):
    """Samples from before the fraction series: the allocation's value (the compute fraction) counts."""
    prices = book(tmp_path, RATES, slice_weight="memory")
    hour = _hour()
    bare = [dataclasses.replace(a, memory_share=None, compute_share=None) for a in hour.allocations]
    priced = price_gpu_hour(dataclasses.replace(hour, allocations=bare), prices)
    assert _amounts(priced) == BY_COMPUTE


def test_ingest_reads_both_fractions_and_the_ledger_keeps_them_for_a_reprice(ledger, tmp_path):
    labels = {
        contract.HOSTNAME: "node-1",
        contract.NAMESPACE: "ml",
        contract.CONTAINER: "main",
        contract.RESOURCE: "nvidia.com/gpu",
        contract.UUID: "GPU-fractional",
        contract.GPU: "0",
        contract.GPU_INSTANCE_ID: "",
        contract.MIG_PROFILE: "",
        contract.SHARING: contract.SHARING_FRACTIONAL,
    }
    results: dict[str, list[Sample]] = {name: [] for name in queries.BILLING_QUERIES}
    device = {
        contract.UUID: "GPU-fractional",
        contract.GPU: "0",
        contract.MODEL: H100,
        contract.HOSTNAME: "node-1",
    }
    results["gpu_count"] = [Sample({**device, contract.MIG_MODE: "disabled"}, 120.0)]
    for pod, (memory, compute) in GRANTS.items():
        series = {**labels, contract.POD: pod}
        results["alloc_count"].append(Sample(series, 120.0))
        results["alloc_share"].append(Sample(series, float(compute)))
        results["alloc_memory"].append(Sample(series, float(memory)))
        results["alloc_compute"].append(Sample(series, float(compute)))
    (hour,), _ = build_hour(results, HOUR0, IngestConfig(scrape_interval=30.0))
    got = {a.pod: (a.memory_share, a.compute_share, a.sharing) for a in hour.allocations}
    assert got == {pod: (D(m), D(c), "fractional") for pod, (m, c) in GRANTS.items()}

    by_memory = book(tmp_path, RATES, slice_weight="memory")
    ledger.write_hour(HourRecord(HOUR0, [hour], price_gpu_hour(hour, by_memory).lines, by_memory))
    stored = {a.pod: (a.memory_share, a.compute_share) for a in ledger.facts(HOUR0)[0].allocations}
    assert stored == {pod: (D(m), D(c)) for pod, (m, c) in GRANTS.items()}
    # a re-price with another policy reads the stored fractions: the memory bill becomes the compute one
    by_compute = book(tmp_path, RATES, slice_weight="compute")
    assert reprice(ledger, by_compute, HOUR0, HOUR0 + timedelta(hours=1), {}) == 1
    lines = ledger.lines(HOUR0, HOUR0 + timedelta(hours=1))
    assert {line.pod or line.namespace: line.amount for line in lines} == BY_COMPUTE
