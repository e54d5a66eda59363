"""docs/billing.md §8 (h): how a GPU is shared picks its sharing efficiency. MPS and time-sliced
replicas look the same to the device plugin; the exporter's `sharing` label tells them apart, and
pricing applies `sharing_efficiency.mps` (time-slicing's when the book gives none). Figures by hand."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from decimal import Decimal

import pytest

from gpumeter.billing.allocate import price_gpu_hour
from gpumeter.billing.ingest import reprice
from gpumeter.billing.ledger.base import HourRecord
from gpumeter.billing.models import UNALLOCATED
from gpumeter.billing.pricing import load_price_book
from tests.billing.factories import H100, HOUR0, alloc, book, gpu_hour, write_book

D = Decimal
SHORTFALL = "__sharing_shortfall__"
RATES = {"H100-80GB": {"hourly_rate": "6.88"}}


def _hour(sharing: str):
    """One H100 shared four ways; three replicas held the whole hour, the fourth by nobody."""
    u = "GPU-shared"
    allocations = [
        dataclasses.replace(alloc(u, "inf", f"p{i}", share="0.25"), sharing=sharing) for i in (1, 2, 3)
    ]
    return gpu_hour(u, H100, allocations=allocations)


def _amounts(priced) -> dict[str, Decimal]:
    return {line.pod or line.namespace: line.amount for line in priced.lines}


# MPS at 0.90: each pod 0.25 x 6.88 x 0.90 = 1.548 -> 1.54 (remainder 0.8 cent); shortfall
# 0.75 x 6.88 x 0.10 = 0.516 -> 0.51 (0.6 cent); unallocated 0.25 x 6.88 = 1.72. Floors sum to 6.85:
# the 3 cents left go to the three largest remainders, the pods: 1.55 each. 4.65 + 0.51 + 1.72 = 6.88.
MPS_AT_090 = {"p1": D("1.55"), "p2": D("1.55"), "p3": D("1.55"), SHORTFALL: D("0.51"), UNALLOCATED: D("1.72")}
# Time-slicing at 0.75: each pod 0.25 x 6.88 x 0.75 = 1.29; shortfall 0.75 x 6.88 x 0.25 = 1.29;
# unallocated 1.72. 3.87 + 1.29 + 1.72 = 6.88.
TIME_SLICED_AT_075 = {
    "p1": D("1.29"),
    "p2": D("1.29"),
    "p3": D("1.29"),
    SHORTFALL: D("1.29"),
    UNALLOCATED: D("1.72"),
}


@pytest.mark.parametrize(
    ("sharing", "expected"),
    [
        ("mps", MPS_AT_090),
        ("time_slicing", TIME_SLICED_AT_075),
        ("", TIME_SLICED_AT_075),  # samples from before the label: a share below 1 is time-slicing
    ],
)
def test_each_replica_mode_is_priced_with_its_own_efficiency(tmp_path, sharing, expected):
    prices = book(tmp_path, RATES, sharing_efficiency={"time_slicing": "0.75", "mps": "0.90"})
    priced = price_gpu_hour(_hour(sharing), prices)
    assert _amounts(priced) == expected
    assert sum(expected.values()) == D("6.88") == priced.device_cost


def test_mps_takes_time_slicings_efficiency_when_the_book_gives_none(tmp_path):
    prices = book(tmp_path, RATES, sharing_efficiency={"time_slicing": "0.75"})
    assert _amounts(price_gpu_hour(_hour("mps"), prices)) == TIME_SLICED_AT_075


def test_an_exclusive_or_mig_holding_pays_no_replica_efficiency(tmp_path):
    prices = book(tmp_path, RATES, sharing_efficiency={"time_slicing": "0.5", "mps": "0.5"})
    u = "GPU-whole"
    whole = dataclasses.replace(alloc(u, "train", "t"), sharing="exclusive")
    assert _amounts(price_gpu_hour(gpu_hour(u, H100, allocations=[whole]), prices)) == {"t": D("6.88")}


def test_the_seed_layout_names_mps_too(tmp_path):
    doc = {
        "gpuTypes": [{"name": "h100-80gb", "hourlyCost": 6.88}],
        "sharingEfficiency": {"timeSharing": 0.75, "mps": 0.9},
    }
    path = write_book(tmp_path, doc, "seed.yaml")
    version = load_price_book(path).versions[0]
    assert (version.efficiency("time_slicing"), version.efficiency("mps")) == (D("0.75"), D("0.9"))


def test_the_ledger_keeps_the_mode_so_a_reprice_keeps_mps(ledger, tmp_path):
    """Re-pricing reads the facts back: without the stored mode an MPS GPU would be re-priced as
    time-sliced (1.29 a pod instead of 1.55)."""
    prices = book(tmp_path, RATES, sharing_efficiency={"time_slicing": "0.75", "mps": "0.90"})
    gh = _hour("mps")
    ledger.write_hour(HourRecord(HOUR0, [gh], price_gpu_hour(gh, prices).lines, prices))
    assert {a.sharing for a in ledger.facts(HOUR0)[0].allocations} == {"mps"}
    assert reprice(ledger, prices, HOUR0, HOUR0 + timedelta(hours=1), {}) == 1
    lines = ledger.lines(HOUR0, HOUR0 + timedelta(hours=1))
    assert {line.pod or line.namespace: line.amount for line in lines} == MPS_AT_090
