"""docs/billing.md §8: every figure reproduced to the cent. Expected values are worked out by hand
(in the comments and literals here), never computed by the code under test."""

from __future__ import annotations

from collections import defaultdict
from datetime import timedelta
from decimal import Decimal

from gpumeter.billing.allocate import price_gpu_hour
from gpumeter.billing.models import STRANDED, UNALLOCATED, LineKind
from gpumeter.billing.pricing import load_price_book
from tests.billing.factories import A100, H100, HOUR0, alloc, book, gpu_hour, mig, write_book

D = Decimal


def by_namespace(lines) -> dict[str, Decimal]:
    out: dict[str, Decimal] = defaultdict(D)
    for line in lines:
        out[line.namespace] += line.amount
    return dict(out)


def test_a_a100_mixed_layout_two_tenants_one_unallocated_slice(tmp_path):
    prices = book(tmp_path, {"A100-40GB": {"hourly_rate": "3.00"}})
    u = "GPU-a"
    hour = gpu_hour(
        u,
        A100,
        [mig(u, "1", "3g.20gb"), mig(u, "5", "2g.10gb"), mig(u, "13", "1g.5gb"), mig(u, "14", "1g.5gb")],
        [
            alloc(u, "team-a", "a-0", gi="1", profile="3g.20gb"),
            alloc(u, "team-b", "b-0", gi="5", profile="2g.10gb"),
            alloc(u, "team-b", "b-1", gi="13", profile="1g.5gb"),
        ],
    )
    priced = price_gpu_hour(hour, prices)
    amounts = {(line.namespace, line.mig_profile or line.kind.value): line.amount for line in priced.lines}
    # exact: 3/7*3 = 1.2857.., 2/7*3 = 0.8571.., 1/7*3 = 0.4285.. ; floors 1.28+0.85+0.42+0.42 = 2.97,
    # residue 3 cents to remainders .8571, .8571, .7142.
    assert amounts == {
        ("team-a", "3g.20gb"): D("1.28"),
        ("team-b", "2g.10gb"): D("0.86"),
        ("team-b", "1g.5gb"): D("0.43"),
        (UNALLOCATED, "unallocated"): D("0.43"),
    }
    assert by_namespace(priced.lines) == {"team-a": D("1.28"), "team-b": D("1.29"), UNALLOCATED: D("0.43")}
    assert priced.device_cost == D("3.00") == sum(line.amount for line in priced.lines)
    assert not [line for line in priced.lines if line.kind is LineKind.STRANDED]


def test_b_whole_h100_four_time_sliced_pods(tmp_path):
    prices = book(
        tmp_path, {"H100-80GB": {"hourly_rate": "6.88"}}, sharing_efficiency={"time_slicing": "0.75"}
    )
    u = "GPU-h"
    hour = gpu_hour(
        u,
        H100,
        allocations=[
            alloc(u, "ns", "p1", share="0.25"),
            alloc(u, "ns", "p2", share="0.25"),
            alloc(u, "ns", "p3", share="0.25"),
            alloc(u, "ns", "p4", seconds=1800, share="0.25"),
        ],
    )
    priced = price_gpu_hour(hour, prices)
    amounts = {line.pod or line.namespace: line.amount for line in priced.lines}
    # p1-p3: 0.25*6.88*0.75 = 1.29; p4: 0.5*0.25*6.88*0.75 = 0.645 -> 0.64 + the residue cent (tie at .5
    # with the shortfall 1.505; tenant lines first) = 0.65; shortfall 0.875*6.88*0.25 = 1.505 -> 1.50;
    # unallocated 0.125*6.88 = 0.86.
    assert amounts == {
        "p1": D("1.29"),
        "p2": D("1.29"),
        "p3": D("1.29"),
        "p4": D("0.65"),
        "__sharing_shortfall__": D("1.50"),
        UNALLOCATED: D("0.86"),
    }
    assert sum(amounts.values()) == D("6.88") == priced.device_cost


def test_c_price_change_mid_month(tmp_path):
    doc = {
        "currency": "USD",
        "versions": [
            {"effective_from": "2026-01-01T00:00:00Z", "gpus": {"H100-80GB": {"hourly_rate": "6.88"}}},
            {"effective_from": "2026-11-16T00:00:00Z", "gpus": {"H100-80GB": {"hourly_rate": "4.90"}}},
        ],
    }
    prices = load_price_book(write_book(tmp_path, doc))
    totals: dict[str, Decimal] = defaultdict(D)
    device = D(0)
    for i in range(720):  # November 2026
        hour = HOUR0 + timedelta(hours=i)
        held = [alloc("GPU-c", "research", "trainer")] if i < 480 else []
        priced = price_gpu_hour(gpu_hour("GPU-c", H100, allocations=held, hour=hour), prices)
        device += priced.device_cost
        for line in priced.lines:
            totals[line.namespace] += line.amount
    # 360 h * 6.88 = 2476.80; 120 h * 4.90 = 588.00; 240 h * 4.90 = 1176.00 unallocated.
    assert dict(totals) == {"research": D("3064.80"), UNALLOCATED: D("1176.00")}
    assert device == D("4240.80")


def test_d_stranded_seventh_slice_and_tie_break(tmp_path):
    prices = book(tmp_path, {"A100-40GB": {"hourly_rate": "3.00"}})
    u = "GPU-d"

    def priced_at(hour):
        return price_gpu_hour(
            gpu_hour(
                u,
                A100,
                [mig(u, "1", "3g.20gb"), mig(u, "2", "3g.20gb")],
                [
                    alloc(u, "ns-b", "b", gi="2", profile="3g.20gb"),
                    alloc(u, "ns-a", "a", gi="1", profile="3g.20gb"),
                ],
                hour=hour,
            ),
            prices,
        )

    # 1.2857.. x2 (rem .5714 each), stranded 0.4285.. (rem .8571); residue 2: stranded, then the tie
    # at .5714 between ns-a and ns-b, in turns by the hour: one of them this hour, the other the next.
    first, second = (by_namespace(priced_at(HOUR0 + timedelta(hours=h)).lines) for h in (0, 1))
    for figures in (first, second):
        assert figures[STRANDED] == D("0.43")
        assert sorted((figures["ns-a"], figures["ns-b"])) == [D("1.28"), D("1.29")]
    assert first["ns-a"] + second["ns-a"] == first["ns-b"] + second["ns-b"] == D("2.57")


def test_idle_spread_policy_moves_unallocated_to_tenants(tmp_path):
    prices = book(tmp_path, {"A100-40GB": {"hourly_rate": "3.00"}}, idle="spread")
    u = "GPU-e"
    hour = gpu_hour(
        u,
        A100,
        [mig(u, "1", "3g.20gb"), mig(u, "2", "3g.20gb")],
        [alloc(u, "ns-a", "a", gi="1", profile="3g.20gb")],
    )
    priced = price_gpu_hour(hour, prices)
    # ns-a holds 3/7 of 3.00; the rest (4/7 * 3 = 1.7142..) is spread to ns-a as idle_share: all 3.00.
    assert by_namespace(priced.lines) == {"ns-a": D("3.00")}
    assert {line.kind for line in priced.lines} == {LineKind.TENANT, LineKind.IDLE_SHARE}


def test_memory_and_max_policies(tmp_path):
    u = "GPU-f"
    layout = [mig(u, "1", "4g.20gb"), mig(u, "2", "3g.20gb")]
    allocations = [
        alloc(u, "x", "x", gi="1", profile="4g.20gb"),
        alloc(u, "y", "y", gi="2", profile="3g.20gb"),
    ]
    memory = book(tmp_path, {"H100-80GB": {"hourly_rate": "6.88"}}, slice_weight="memory")
    priced = price_gpu_hour(gpu_hour(u, H100, layout, allocations), memory)
    assert by_namespace(priced.lines) == {"x": D("3.44"), "y": D("3.44")}  # 4/8 each
    maxed = book(tmp_path, {"H100-80GB": {"hourly_rate": "6.88"}}, slice_weight="max")
    priced = price_gpu_hour(gpu_hour(u, H100, layout, allocations), maxed)
    # max weights 4/7 and 4/8 sum to 15/14 > 1, normalised by 14/15: 8/15 and 7/15 of 6.88
    # = 3.66933.. and 3.21066.. -> 3.66 (+1 cent, rem .933) = 3.67 and 3.21.
    assert by_namespace(priced.lines) == {"x": D("3.67"), "y": D("3.21")}


def test_unpriced_model_gives_a_quantity_without_cost(tmp_path, caplog):
    prices = book(tmp_path, {"H100-80GB": {"hourly_rate": "6.88"}})
    priced = price_gpu_hour(gpu_hour("GPU-u", "NVIDIA B200", allocations=[alloc("GPU-u", "ns", "p")]), prices)
    assert [(line.namespace, line.amount, line.quantity) for line in priced.lines] == [
        ("__unpriced__", None, D("1.000000"))
    ]
    assert priced.device_cost is None
    assert "unpriced GPU model 'NVIDIA B200'" in caplog.text


def test_seed_sharing_efficiency_on_mig_gives_shortfall(tmp_path):
    prices = book(tmp_path, {"A100-40GB": {"hourly_rate": "3.50"}}, sharing_efficiency={"mig": "0.9"})
    u = "GPU-g"
    hour = gpu_hour(u, A100, [mig(u, "0", "7g.40gb")], [alloc(u, "ns", "p", gi="0", profile="7g.40gb")])
    # 3.50 * 0.9 = 3.15 to the tenant, 0.35 shortfall.
    assert by_namespace(price_gpu_hour(hour, prices).lines) == {
        "ns": D("3.15"),
        "__sharing_shortfall__": D("0.35"),
    }
