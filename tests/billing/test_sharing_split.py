"""docs/billing.md §3.5 and worked examples (k), (l): ``sharing_split: usage`` splits what a
time-sliced or MPS GPU's holders hold together by their processes' SM time (memory as the
tie-breaker), and falls back to equal shares for an hour without process data; the lines still sum
exactly to the device cost. Every figure is worked out by hand in the doc and repeated here."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from decimal import Decimal

import pytest

from gpumeter.billing.allocate import price_gpu_hour
from gpumeter.billing.ingest import reprice
from gpumeter.billing.ledger.base import HourRecord
from gpumeter.billing.models import UNALLOCATED
from gpumeter.billing.pricer import Pricer
from gpumeter.billing.pricing import load_price_book
from gpumeter.billing.pricing.base import PriceBookError
from tests.billing.factories import H100, HOUR0, alloc, book, gpu_hour, write_book

D = Decimal
SHORTFALL = "__sharing_shortfall__"
RATES = {"H100-80GB": {"hourly_rate": "6.88"}}
GIB = 1024**3


def _replicas(u: str, usage: dict[str, tuple[str | None, int | None]], sharing: str = "time_slicing"):
    """One H100 with a replica (share 0.25) per pod, held the whole hour; usage: pod → (SM, bytes)."""
    return gpu_hour(
        u,
        H100,
        allocations=[
            dataclasses.replace(
                alloc(u, "data-eng", pod, share="0.25"),
                sharing=sharing,
                process_sm=None if sm is None else D(sm),
                process_memory=None if memory is None else D(memory),
            )
            for pod, (sm, memory) in usage.items()
        ],
    )


def _amounts(priced) -> dict[str, Decimal]:
    return {line.pod or line.namespace: line.amount for line in priced.lines}


# (k): SM 5 %, 15 %, 2 %. P = 3 × 0.25 = 0.75 GPU-h. etl-0: 0.75 × 5/22 × 6.88 × 0.75 = 0.879545…,
# etl-1: 0.75 × 15/22 × 6.88 × 0.75 = 2.638636…, etl-2: 0.75 × 2/22 × 6.88 × 0.75 = 0.351818…;
# shortfall 0.75 × 6.88 × 0.25 = 1.29; unallocated 0.25 × 6.88 = 1.72. Floors 0.87 + 2.63 + 0.35 +
# 1.29 + 1.72 = 6.86: the 2 residue cents go to the largest remainders, etl-0 (0.954) and etl-1 (0.864).
ETL = {"etl-0": ("0.05", 30 * GIB), "etl-1": ("0.15", 20 * GIB), "etl-2": ("0.02", 5 * GIB)}
BY_USE = {
    "etl-0": D("0.88"),
    "etl-1": D("2.64"),
    "etl-2": D("0.35"),
    SHORTFALL: D("1.29"),
    UNALLOCATED: D("1.72"),
}
# equal: each 0.25 × 6.88 × 0.75 = 1.29
EQUAL = {
    "etl-0": D("1.29"),
    "etl-1": D("1.29"),
    "etl-2": D("1.29"),
    SHORTFALL: D("1.29"),
    UNALLOCATED: D("1.72"),
}


def _book(tmp_path, split: str):
    return book(tmp_path, RATES, sharing_efficiency={"time_slicing": "0.75"}, sharing_split=split)


def test_worked_example_k_usage_splits_by_sm_time_to_the_cent(tmp_path):
    priced = price_gpu_hour(_replicas("GPU-j", ETL), _book(tmp_path, "usage"))
    assert _amounts(priced) == BY_USE
    assert sum(BY_USE.values()) == D("6.88") == priced.device_cost
    # the same hour under equal: the process data changes nothing there
    assert _amounts(price_gpu_hour(_replicas("GPU-j", ETL), _book(tmp_path, "equal"))) == EQUAL


def test_an_hour_without_process_data_is_split_equally_under_usage(tmp_path):
    no_data = {pod: (None, None) for pod in ETL}
    assert _amounts(price_gpu_hour(_replicas("GPU-n", no_data), _book(tmp_path, "usage"))) == EQUAL


def test_worked_example_l_memory_breaks_the_tie_of_idle_holders(tmp_path):
    # P = 0.5 GPU-h split 20 : 12 GiB: p1 0.5 × 20/32 × 6.88 × 0.75 = 1.6125 → 1.61, p2 0.9675 → 0.96
    # + 1 residue cent (remainder 0.75 against 0.25) = 0.97; shortfall 0.86; unallocated 3.44
    idle = {"p1": ("0", 20 * GIB), "p2": ("0", 12 * GIB)}
    expected = {"p1": D("1.61"), "p2": D("0.97"), SHORTFALL: D("0.86"), UNALLOCATED: D("3.44")}
    priced = price_gpu_hour(_replicas("GPU-k", idle), _book(tmp_path, "usage"))
    assert _amounts(priced) == expected
    assert sum(expected.values()) == D("6.88")


def test_a_holder_that_ran_nothing_pays_nothing_and_the_others_carry_its_replica(tmp_path):
    # P = 0.5: all of it on p1 (the only SM time): 0.5 × 6.88 × 0.75 = 2.58; p2 0
    usage = {"p1": ("0.10", GIB), "p2": ("0", 0)}
    amounts = _amounts(price_gpu_hour(_replicas("GPU-z", usage), _book(tmp_path, "usage")))
    assert amounts == {"p1": D("2.58"), "p2": D("0.00"), SHORTFALL: D("0.86"), UNALLOCATED: D("3.44")}


def test_mps_replicas_are_split_by_use_and_exclusive_holdings_never(tmp_path):
    prices = _book(tmp_path, "usage")
    mps = _replicas("GPU-m", ETL, sharing="mps")  # mps takes time-slicing's 0.75: the same figures
    assert _amounts(price_gpu_hour(mps, prices)) == BY_USE
    whole = gpu_hour(
        "GPU-x",
        H100,
        allocations=[
            dataclasses.replace(alloc("GPU-x", "train", "t"), sharing="exclusive", process_sm=D("0.01"))
        ],
    )
    assert _amounts(price_gpu_hour(whole, prices)) == {"t": D("6.88")}


def test_the_pricer_re_uses_no_result_across_different_use(tmp_path):
    prices = _book(tmp_path, "usage")
    pricer = Pricer(prices)
    first = pricer.price(_replicas("GPU-p", ETL))
    swapped = {"etl-0": ETL["etl-1"], "etl-1": ETL["etl-0"], "etl-2": ETL["etl-2"]}
    second = pricer.price(_replicas("GPU-p", swapped))
    assert _amounts(first)["etl-1"] == D("2.64") and _amounts(second)["etl-0"] == D("2.64")
    assert _amounts(second) == _amounts(price_gpu_hour(_replicas("GPU-p", swapped), prices))


def test_the_price_book_names_a_bad_split_and_the_seed_layout_takes_one(tmp_path):
    doc = {
        "currency": "USD",
        "versions": [{"effective_from": "2026-01-01T00:00:00Z", "gpus": RATES, "sharing_split": "by-use"}],
    }
    with pytest.raises(PriceBookError, match=r"versions\[0\]\.sharing_split.*'by-use'"):
        load_price_book(write_book(tmp_path, doc))
    seed = "gpuTypes:\n  - {name: h100-80gb, hourlyCost: 6.88}\nsharingSplit: usage\n"
    assert load_price_book(write_book(tmp_path, seed, "seed.yaml")).versions[0].sharing_split == "usage"
    equal = load_price_book(
        write_book(
            tmp_path, {**doc, "versions": [{**doc["versions"][0], "sharing_split": "equal"}]}, "e.yaml"
        )
    )
    assert "sharing_split" not in equal.version_body(equal.versions[0])  # bodies stored before it stay equal


def test_the_ledger_keeps_the_process_use_so_a_reprice_under_usage_splits_by_it(ledger, tmp_path):
    """Ingested under equal, re-priced under usage from the stored facts (migration 0007): the
    lines of worked example (k), on every ledger backend; and back to equal again."""
    (tmp_path / "usage").mkdir()
    equal, usage = _book(tmp_path, "equal"), _book(tmp_path / "usage", "usage")
    gh = _replicas("GPU-r", ETL)
    ledger.write_hour(HourRecord(HOUR0, [gh], price_gpu_hour(gh, equal).lines, equal))
    stored = {a.pod: (a.process_sm, a.process_memory) for a in ledger.facts(HOUR0)[0].allocations}
    assert stored == {pod: (D(sm), D(memory)) for pod, (sm, memory) in ETL.items()}
    hour_end = HOUR0 + timedelta(hours=1)
    assert reprice(ledger, usage, HOUR0, hour_end, {}) == 1
    assert {line.pod or line.namespace: line.amount for line in ledger.lines(HOUR0, hour_end)} == BY_USE
    assert reprice(ledger, equal, HOUR0, hour_end, {}) == 1
    assert {line.pod or line.namespace: line.amount for line in ledger.lines(HOUR0, hour_end)} == EQUAL
