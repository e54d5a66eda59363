"""`utilization_tiers: price` (docs/billing.md §3.7): seed 003's ConfigMap, as written, prices each
tenant line by its utilization tier, the platform carries the difference on `__utilization_shortfall__`,
and every GPU-hour still sums to its device cost. Worked example (m) is reproduced to the cent from
figures worked out by hand; `report`, the default, leaves the amounts as they were."""

from __future__ import annotations

import dataclasses
import json
from decimal import Decimal
from pathlib import Path

import pytest

import gpumeter
from gpumeter.billing.allocate import price_gpu_hour
from gpumeter.billing.models import TIER_SHORTFALL, Allocation, LineKind
from gpumeter.billing.pricer import Pricer
from gpumeter.billing.pricing import PriceBookError, load_price_book
from gpumeter.billing.pricing.static import DEFAULT_BOOK
from tests.billing.factories import A100, HOUR0, alloc, gpu_hour, mig

D = Decimal
SEED_CONFIGMAP = Path(__file__).parents[1] / "data" / "seed-003" / "gpu-cost-model.yaml"
UUID = "GPU-seed-a100"
SHORTFALL = "__sharing_shortfall__"


def _held(namespace: str, gi: str, profile: str, utilization: str | None) -> Allocation:
    held = alloc(UUID, namespace, f"{namespace}-0", gi=gi, profile=profile)
    return dataclasses.replace(held, utilization=None if utilization is None else D(utilization))


def example_m(team_c_utilization: str | None = "0.10", hour=HOUR0):
    """§8 (m): one A100-40GB, 4g.20gb + 2g.10gb + 1g.5gb, held at 0.85, 0.45 and team-c's."""
    instances = [mig(UUID, "1", "4g.20gb"), mig(UUID, "2", "2g.10gb"), mig(UUID, "3", "1g.5gb")]
    held = [
        _held("team-a", "1", "4g.20gb", "0.85"),
        _held("team-b", "2", "2g.10gb", "0.45"),
        _held("team-c", "3", "1g.5gb", team_c_utilization),
    ]
    return gpu_hour(UUID, A100, instances, held, hour=hour)


def amounts(priced) -> dict[str, Decimal]:
    return {line.namespace: line.amount for line in priced.lines}


@pytest.fixture
def seed_book():
    return load_price_book(SEED_CONFIGMAP)


def test_worked_example_m_to_the_cent(seed_book):
    priced = price_gpu_hour(example_m(), seed_book.with_utilization_tiers("price"))
    # by hand: gross 4/7, 2/7, 1/7 x 3.50 = 2.00, 1.00, 0.50; x mig 0.9 = 1.80, 0.90, 0.45; x tier 1.0,
    # 0.8, 0.5 = 1.80, 0.72, 0.225; sharing shortfall 3.50 x 0.1 = 0.35; utilization shortfall 0.90 x 0.2
    # + 0.45 x 0.5 = 0.405. Floors 3.49; the residue cent is a tie at half a cent between team-c and the
    # utilization shortfall, and tenants come first.
    assert amounts(priced) == {
        "team-a": D("1.80"),
        "team-b": D("0.72"),
        "team-c": D("0.23"),
        SHORTFALL: D("0.35"),
        TIER_SHORTFALL: D("0.40"),
    }
    assert priced.device_cost == D("3.50") == sum(amounts(priced).values())
    by_namespace = {line.namespace: line for line in priced.lines}
    assert by_namespace[TIER_SHORTFALL].kind is LineKind.UTILIZATION_SHORTFALL
    # the shortfall's quantity: weighted GPU-hours it stands for, 2/7 x 0.9 x 0.2 + 1/7 x 0.9 x 0.5
    assert by_namespace[TIER_SHORTFALL].quantity == D("0.115714")
    assert [by_namespace[t].efficiency for t in ("team-a", "team-b", "team-c")] == [
        D("1.0"),
        D("0.8"),
        D("0.5"),
    ]


def test_report_the_default_leaves_the_amounts_alone(seed_book):
    priced = price_gpu_hour(example_m(), seed_book)
    assert amounts(priced) == {
        "team-a": D("1.80"),
        "team-b": D("0.90"),
        "team-c": D("0.45"),
        SHORTFALL: D("0.35"),
    }
    # the tiers still score the lines
    assert [line.efficiency for line in priced.lines if line.kind is LineKind.TENANT] == [
        D("1.0"),
        D("0.8"),
        D("0.5"),
    ]


def test_a_line_without_a_reading_pays_as_under_report(seed_book):
    priced = price_gpu_hour(example_m(team_c_utilization=None), seed_book.with_utilization_tiers("price"))
    # team-c's instance has no reading either: 0.45, no tier; shortfall 0.90 x 0.2 = 0.18
    assert amounts(priced) == {
        "team-a": D("1.80"),
        "team-b": D("0.72"),
        "team-c": D("0.45"),
        SHORTFALL: D("0.35"),
        TIER_SHORTFALL: D("0.18"),
    }
    assert next(line for line in priced.lines if line.namespace == "team-c").efficiency is None


def test_the_pricer_reuses_an_hour_only_within_the_same_tiers(seed_book):
    book = seed_book.with_utilization_tiers("price")
    pricer = Pricer(book)
    hours = [HOUR0.replace(hour=h) for h in range(4)]
    # team-c at 0.10, 0.20 (same tier), 0.50 (another), 0.05 (the first's again)
    readings = ["0.10", "0.20", "0.50", "0.05"]
    for hour, utilization in zip(hours, readings, strict=True):
        gh = example_m(utilization, hour)
        assert pricer.price(gh) == price_gpu_hour(gh, book), utilization
    assert (pricer.misses, pricer.hits) == (2, 2)
    # team-c at 0.50 is in the 0.8 tier: 0.45 x 0.8 = 0.36, shortfall 0.18 + 0.09 = 0.27
    third = amounts(pricer.price(example_m("0.50", hours[2])))
    assert (third["team-c"], third[TIER_SHORTFALL]) == (D("0.36"), D("0.27"))


def test_a_book_priced_by_its_tiers_is_registered_as_another_book(seed_book):
    priced = seed_book.with_utilization_tiers("price")
    assert priced.digest != seed_book.digest
    assert seed_book.with_utilization_tiers("report") is seed_book
    (version,) = priced.versions
    body = json.loads(priced.version_body(version))
    assert body["utilization_tiers"] == [["0", "0.3", "0.5"], ["0.3", "0.7", "0.8"], ["0.7", "1.0", "1.0"]]
    assert "utilization_tiers" not in json.loads(seed_book.version_body(seed_book.versions[0]))


def test_price_with_a_book_without_tiers_is_refused(tmp_path, capsys):
    with pytest.raises(PriceBookError, match="no utilization tiers"):
        load_price_book(DEFAULT_BOOK).with_utilization_tiers("price")
    db = tmp_path / "ledger.sqlite"
    argv = ["billing", "price", "--db", f"sqlite:///{db}", "--from", "2026-11-01", "--to", "2026-11-02"]
    assert gpumeter.main([*argv, "--utilization-tiers", "price"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"error: {DEFAULT_BOOK}: utilization_tiers: the price book has no utilization tiers to price by "
        "(value 'price')"
    )
    assert not db.exists()  # refused before any ledger is opened
