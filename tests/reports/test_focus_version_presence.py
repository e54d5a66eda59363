"""At day grain, a GPU-day that two price-book versions split is two origin charges (test_focus13's
mid-day change): each origin's PricingQuantity is the GPU's presence in the hours its version priced,
so that ListCost = ListUnitPrice x PricingQuantity reconciles as on every other day."""

from __future__ import annotations

from decimal import Decimal

from gpumeter.billing.allocate import price_gpu_hour
from gpumeter.billing.ledger.base import HourRecord
from gpumeter.billing.pricing import load_price_book
from gpumeter.reports import focus
from gpumeter.reports.model import HOUR, build_report, month_period
from gpumeter.reports.render import render
from tests.billing.factories import A100, HOUR0, alloc, gpu_hour, mig, write_book
from tests.reports.focus_checks import rows_of, schema_problems
from tests.reports.test_focus13 import MID_DAY_CHANGE

NOVEMBER = month_period("2026-11")
DAY = "2026-11-01T00:00:00Z"
AT_14 = "2026-11-01T14:00:00Z"
NEXT_DAY = "2026-11-02T00:00:00Z"


def test_a_price_change_inside_a_day_prices_each_origin_at_the_gpus_hours(ledger, tmp_path):
    """An A100 in MIG mode, its 7 compute slices held all day by 7 pods, a 1g.5gb instance each; a
    second version (4.00 after 3.00) takes effect at 13:30, so it prices the hours from 14:00 on: the
    GPU-day is two origins, [00:00, 14:00) and [14:00, 24:00). By hand:

    * each hour a 1g.5gb instance is 1/7 of the GPU: its line states 0.142857 GPU-hours (1/7 to 6
      places), so the 7 lines of an hour state 0.999999, and the origins' capacity lines state
      14 x 0.999999 = 13.999986 and 10 x 0.999999 = 9.99999 GPU-hours;
    * the GPU was present 3600 s every hour: 1 GPU-hour an hour, so the origins' PricingQuantity is
      14 and 10 GPU-hours exactly, and the day's is 24, as on a day of one version;
    * the hour's amounts sum to its cost to the cent: 3.00 an hour before 14:00, 4.00 after, so
      BilledCost is 14 x 3.00 = 42.00 and 10 x 4.00 = 40.00, no discount applying (every slice is
      held, whole hours: no sharing efficiency, no tier);
    * ListCost = 14 x 3 = 42 and 10 x 4 = 40: equal to BilledCost. Before, the quantity was the
      capacity lines' 13.999986 and 9.99999, and ListCost 41.999958 and 39.99996, below BilledCost:
      a negative discount.

    A GPU held whole by one pod the same day (capacity lines exact: 14 and 10) keeps 14 and 10."""
    prices = load_price_book(write_book(tmp_path, MID_DAY_CHANGE))
    slices = [str(i) for i in range(1, 8)]
    for h in range(24):
        hour = HOUR0 + HOUR * h
        hours = [
            gpu_hour(
                "GPU-m",
                A100,
                [mig("GPU-m", gi, "1g.5gb") for gi in slices],
                [alloc("GPU-m", "ml", f"p{gi}", gi=gi, profile="1g.5gb") for gi in slices],
                hour=hour,
            ),
            gpu_hour("GPU-w", A100, allocations=[alloc("GPU-w", "ml", "whole")], hour=hour),
        ]
        lines = [line for gh in hours for line in price_gpu_hour(gh, prices).lines]
        ledger.write_hour(HourRecord(hour, hours, lines, prices))
    out = tmp_path / "out"
    render(build_report(ledger, NOVEMBER, "team", grain="day"), out, ("focus",))
    path = out / "gpumeter-2026-11-focus-1.3.csv"
    assert schema_problems(path) == [] and focus.check_file(path) == []
    _header, rows = rows_of(path)

    origins: dict[tuple[str, str, str], list[dict]] = {}
    for row in rows:
        key = (row["ResourceId"], row["ChargePeriodStart"], row["ChargePeriodEnd"])
        origins.setdefault(key, []).append(row)

    def total(group: list[dict], column: str) -> Decimal:
        return sum((Decimal(r[column]) for r in group), Decimal(0))

    found = {}
    for key, group in origins.items():
        (price,) = {Decimal(r["ListUnitPrice"]) for r in group}
        found[key] = (
            price,
            total(group, "PricingQuantity"),
            total(group, "ConsumedQuantity"),
            total(group, "ListCost"),
            total(group, "BilledCost"),
        )
        for r in group:  # each row's list cost is its own quantity at the rate, exactly
            assert Decimal(r["ListCost"]) == Decimal(r["PricingQuantity"]) * price
    assert found == {
        ("GPU-m", DAY, AT_14): (3, 14, 14, 42, Decimal("42.00")),
        ("GPU-m", AT_14, NEXT_DAY): (4, 10, 10, 40, Decimal("40.00")),
        ("GPU-w", DAY, AT_14): (3, 14, 14, 42, Decimal("42.00")),
        ("GPU-w", AT_14, NEXT_DAY): (4, 10, 10, 40, Decimal("40.00")),
    }
    # the MIG GPU's origins are its 7 holders' rows, split by their billed cost (1/7 each)
    assert sorted(len(origins[k]) for k in origins if k[0] == "GPU-m") == [7, 7]
