"""Smaller rules of docs/billing.md: the gap policy, A30 slice totals, odd data, aliases, team maps."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest

from gpumeter.billing.allocate import price_gpu_hour
from gpumeter.billing.config import ConfigError, load_team_map
from gpumeter.billing.ingest import IngestConfig, seconds_from_count
from gpumeter.billing.models import UNALLOCATED
from gpumeter.billing.pricing.aliases import resolve_model
from tests.billing.factories import A100, H100, HOUR0, alloc, book, gpu_hour, mig

D = Decimal


@pytest.mark.parametrize(
    ("count", "expected"),
    [
        (120, 3600),  # every 30 s sample of the hour
        (121, 3600),  # a boundary duplicate never bills more than the hour
        (240, 3600),  # an HA pair summed by mistake is still capped
        (118, 3600),  # two missed scrapes: bridged (grace 2 intervals)
        (117, 3510),  # three missed: billed as observed
        (60, 1800),  # started at :30
        (0, 0),
    ],
)
def test_gap_policy(count, expected):
    assert seconds_from_count(count, IngestConfig(scrape_interval=30, gap_grace_intervals=2)) == expected


def test_a30_slices_are_quarters(tmp_path):
    prices = book(tmp_path, {"A30-24GB": {"hourly_rate": "1.00"}})
    u = "GPU-30"
    slices = {"2g.12gb": (2, 2), "1g.6gb": (1, 1)}
    layout = [mig(u, "1", "2g.12gb", slices=slices), mig(u, "2", "1g.6gb", slices=slices)]
    priced = price_gpu_hour(
        gpu_hour(u, "NVIDIA A30", layout, [alloc(u, "ns", "p", gi="1", profile="2g.12gb")]), prices
    )
    # 2/4 of 1.00 to ns; 1g.6gb (1/4) unallocated; the 4th quarter no instance covers is stranded
    assert {x.namespace: x.amount for x in priced.lines} == {
        "ns": D("0.50"),
        UNALLOCATED: D("0.25"),
        "__stranded__": D("0.25"),
    }


def test_over_allocated_instance_is_scaled_never_negative(tmp_path):
    prices = book(tmp_path, {"H100-80GB": {"hourly_rate": "6.88"}})
    u = "GPU-o"
    held = [alloc(u, "ns", f"p{i}", share="0.5") for i in range(3)]  # 1.5 GPUs of one GPU
    # scaled to 1/3 each: 2.2933.. -> 2.29 each and the residue cent to one of them, in turns by the
    # hour: over three hours each pod gets it once
    per_pod = {f"p{i}": D(0) for i in range(3)}
    for h in range(3):
        priced = price_gpu_hour(gpu_hour(u, H100, allocations=held, hour=HOUR0 + timedelta(hours=h)), prices)
        assert sorted(x.amount for x in priced.lines) == [D("2.29"), D("2.29"), D("2.30")]
        assert any("over-allocated" in w for w in priced.warnings)
        for line in priced.lines:
            per_pod[line.pod] += line.amount
    assert per_pod == {"p0": D("6.88"), "p1": D("6.88"), "p2": D("6.88")}


def test_whole_gpu_allocation_on_a_mig_gpu_is_dropped_with_a_warning(tmp_path):
    prices = book(tmp_path, {"A100-40GB": {"hourly_rate": "3.00"}})
    u = "GPU-w"
    priced = price_gpu_hour(gpu_hour(u, A100, [mig(u, "0", "7g.40gb")], [alloc(u, "ns", "p")]), prices)
    assert {x.namespace: x.amount for x in priced.lines} == {UNALLOCATED: D("3.00")}
    assert priced.warnings


def test_instance_missing_from_layout_is_taken_from_the_allocation(tmp_path):
    prices = book(tmp_path, {"A100-40GB": {"hourly_rate": "3.50"}})
    u = "GPU-n"
    hour = gpu_hour(u, A100, [], [alloc(u, "ns", "p", gi="9", profile="1g.5gb")], mig_mode=True)
    # 1/7 x 3.50 = 0.50 to ns; the 6/7 no known instance covers is stranded
    assert {x.namespace: x.amount for x in price_gpu_hour(hour, prices).lines} == {
        "ns": D("0.50"),
        "__stranded__": D("3.00"),
    }


def test_partial_presence_bills_only_the_seen_part(tmp_path):
    prices = book(tmp_path, {"H100-80GB": {"hourly_rate": "6.88"}})
    priced = price_gpu_hour(gpu_hour("GPU-p", H100, seconds=900), prices)  # a quarter of the hour
    assert priced.device_cost == D("1.72") and [x.amount for x in priced.lines] == [D("1.72")]


def test_aliases():
    known = {"A100-40GB", "H100-80GB", "MyCard"}
    assert resolve_model("NVIDIA A100-SXM4-40GB", known) == "A100-40GB"
    assert resolve_model("nvidia h100 80gb hbm3", known) == "H100-80GB"
    assert resolve_model("a100-40gb", known) == "A100-40GB"
    assert resolve_model("Vendor Card X", known, {"Vendor Card X": "MyCard"}) == "MyCard"
    assert resolve_model("NVIDIA B200", known) is None


def test_team_map_file(tmp_path):
    good = tmp_path / "teams.yaml"
    good.write_text("namespaces:\n  ml-train: research\n  web: product\n")
    assert load_team_map(good) == {"ml-train": "research", "web": "product"}
    bad = tmp_path / "bad.yaml"
    bad.write_text("namespaces:\n  web: 7\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: namespaces.web: expected a team name \(value 7\)"):
        load_team_map(bad)
