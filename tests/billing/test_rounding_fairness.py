"""Identical tenants pay the same over a month (issue 13, point 6; docs/billing.md §5).

Three identical pods time-slice one H100 (replicas = 3, share 0.333333333 each, kept to 9 places)
for all of November 2026 (720 hours) at $6.88 an hour, which does not divide by 3.

By hand, each hour: each pod 0.333333333 × 6.88 = 2.2933333311 → floor 2.29, remainder .3333333;
`__unallocated__` 0.000000001 × 6.88 → 0, remainder 0.0000000069. Floors 6.87, residue 1 cent, and
the three pods tie for it.

- Before (ties to the first line in name order): pod `p-a` got the cent all 720 hours:
  p-a 720 × 2.30 = 1,656.00, p-b = p-c = 720 × 2.29 = 1,648.80, a spread of $7.20 a month.
- Now (ties in turns by the hour, docs/billing.md §5): over a run of n hours with the same tie, each
  pod gets the cent ⌊n/3⌋ or ⌈n/3⌉ times, so identical pods' totals differ by at most one cent.
  720 = 3 × 240: each pod gets it 240 times: 240 × 2.30 + 480 × 2.29 = 552.00 + 1,099.20 = 1,651.20.
  Bound: 0.01; the three together 3 × 1,651.20 = 4,953.60 = 720 × 6.88.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

from hypothesis import given
from hypothesis import strategies as st

from gpumeter.billing.allocate import price_gpu_hour
from gpumeter.billing.ledger.base import hour_totals
from gpumeter.billing.pricer import PricedLines, Pricer
from gpumeter.billing.rounding import rotate
from tests.billing.factories import H100, alloc, book, gpu_hour

D = Decimal
NOVEMBER = datetime(2026, 11, 1, tzinfo=UTC)
PODS = ("p-a", "p-b", "p-c")
SPREAD_BOUND = D("0.01")  # one cent: one run of 720 hours with the same three-way tie
OLD_SPREAD = D("1656.00") - D("1648.80")  # $7.20: every cent of the month to p-a


def _month_hours(uuid: str):
    held = [alloc(uuid, "inference", pod, share="0.333333333") for pod in PODS]
    return [gpu_hour(uuid, H100, allocations=held, hour=NOVEMBER + timedelta(hours=h)) for h in range(720)]


def test_three_identical_pods_pay_the_same_month_within_a_cent(tmp_path):
    prices = book(tmp_path, {"H100-80GB": {"hourly_rate": "6.88"}})
    pricer = Pricer(prices)  # the ingest's path: one hour priced, the next 719 re-used from memory
    totals = dict.fromkeys(PODS, D(0))
    for hour in _month_hours("GPU-fair"):
        priced = price_gpu_hour(hour, prices)
        remembered = pricer.price(hour)
        # what an audited hour sums, read before the re-used lines are made: the tie's turn taken
        billed = [(line.amount, line.currency) for line in priced.lines]
        assert remembered.billed() == billed, hour.hour
        assert remembered.teams() == [line.team for line in priced.lines], hour.hour
        assert hour_totals(PricedLines([remembered])) == {("", ""): (D("6.88"), "USD")}, hour.hour
        assert remembered.lines == priced.lines, hour.hour
        assert sum(line.amount for line in priced.lines) == priced.device_cost == D("6.88"), hour.hour
        for line in priced.lines:
            totals[line.pod] += line.amount
    assert pricer.hits == 719
    assert totals == dict.fromkeys(PODS, D("1651.20"))
    spread = max(totals.values()) - min(totals.values())
    assert spread <= SPREAD_BOUND < OLD_SPREAD


def test_the_cent_moves_between_pods_not_names(tmp_path):
    """The turn order is the lines' key digests, not their names: renaming the pods does not hand
    the first hour's cent to the alphabetically first one every time."""
    prices = book(tmp_path, {"H100-80GB": {"hourly_rate": "6.88"}})
    firsts = set()
    for uuid in ("GPU-0", "GPU-1", "GPU-2", "GPU-3", "GPU-4", "GPU-5"):
        (hour,) = _month_hours(uuid)[:1]
        (winner,) = [line.pod for line in price_gpu_hour(hour, prices).lines if line.amount == D("2.30")]
        firsts.add(winner)
    assert len(firsts) > 1, "the same name wins the first hour on every GPU"


@given(
    members=st.integers(min_value=2, max_value=12),
    data=st.data(),
    first_turn=st.integers(min_value=0, max_value=10**7),
    turns=st.integers(min_value=1, max_value=800),
)
def test_turns_favour_no_member_by_more_than_one(members, data, first_turn, turns):
    """The bound of docs/billing.md §5: over any run of consecutive hours with the same tie, each
    tied line gets the extra unit ⌊n·e/k⌋ or ⌈n·e/k⌉ times."""
    extra = data.draw(st.integers(min_value=1, max_value=members - 1))
    counts = dict.fromkeys(range(members), 0)
    for turn in range(first_turn, first_turn + turns):
        chosen = rotate(list(range(members)), extra, turn)
        assert len(set(chosen)) == extra
        for member in chosen:
            counts[member] += 1
    assert max(counts.values()) - min(counts.values()) <= 1
    assert sum(counts.values()) == turns * extra
