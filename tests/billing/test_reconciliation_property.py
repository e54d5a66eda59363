"""Conservation: for random layouts, allocations and prices, every GPU-hour's lines sum exactly to
its device cost and no line is negative (docs/billing.md §4-5)."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from decimal import Decimal

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpumeter.billing.allocate import _UNREUSABLE, _price_gpu_hour, price_gpu_hour
from gpumeter.billing.ledger import layouts
from gpumeter.billing.models import GpuHour
from gpumeter.billing.pricer import Pricer
from gpumeter.billing.pricing import PriceBook, PriceVersion
from gpumeter.billing.pricing.base import GpuPrice
from tests.billing.factories import A100, H100, HOUR0, alloc, gpu_hour, mig
from tests.support.hypothesis_profiles import examples

PROFILES = ["1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"]

rates = st.decimals(min_value=Decimal("0"), max_value=Decimal("99.999999"), places=6)
efficiencies = st.decimals(min_value=Decimal("0"), max_value=Decimal("1"), places=3)
seconds = st.integers(min_value=0, max_value=3600)
shares = st.sampled_from(["1", "0.5", "0.25", "0.333333", "0.125", "0.1"])


@st.composite
def scenario(draw):
    rate = draw(rates)
    version = PriceVersion(
        effective_from=HOUR0,
        effective_to=None,
        gpus={"A100-40GB": GpuPrice("A100-40GB", rate), "H100-80GB": GpuPrice("H100-80GB", rate)},
        slice_weight=draw(st.sampled_from(["compute", "memory", "max"])),
        idle=draw(st.sampled_from(["platform", "spread"])),
        sharing_efficiency={"mig": draw(efficiencies), "time_slicing": draw(efficiencies)},
    )
    currency = draw(st.sampled_from(["USD", "JPY", "KWD"]))
    book = PriceBook(currency, (version,))
    uuid = "GPU-p"
    present = draw(seconds)
    if draw(st.booleans()):  # MIG, with a random (possibly impossible, overlapping) layout
        instances = [
            mig(uuid, str(i), draw(st.sampled_from(PROFILES)), draw(seconds))
            for i in range(draw(st.integers(0, 8)))
        ]
        allocations = []
        for _ in range(draw(st.integers(0, 10))):
            gi = str(draw(st.integers(0, 9)))
            profile = next((m.mig_profile for m in instances if m.gpu_instance_id == gi), "2g.10gb")
            allocations.append(
                alloc(uuid, f"ns{draw(st.integers(0, 3))}", f"p{_}", draw(seconds), draw(shares), gi, profile)
            )
        return book, gpu_hour(uuid, A100, instances, allocations, seconds=present)
    allocations = [
        alloc(uuid, f"ns{draw(st.integers(0, 3))}", f"p{i}", draw(seconds), draw(shares))
        for i in range(draw(st.integers(0, 8)))
    ]
    return book, gpu_hour(uuid, H100, [], allocations, seconds=present)


@settings(max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario())
def test_lines_sum_exactly_to_device_cost_and_are_never_negative(case):
    book, hour = case
    priced = price_gpu_hour(hour, book)
    assert priced.device_cost is not None
    total = sum((line.amount for line in priced.lines), Decimal(0))
    assert total == priced.device_cost
    assert all(line.amount >= 0 for line in priced.lines)
    assert all(line.quantity >= 0 for line in priced.lines)
    # the device cost itself is the hour's rate x presence, rounded once half-even
    rate = book.versions[0].gpus["A100-40GB"].hourly_rate
    exact = rate * Decimal(min(hour.device.present_seconds, 3600)) / Decimal(3600)
    exponent = {"USD": 2, "JPY": 0, "KWD": 3}[book.currency]
    assert priced.device_cost == exact.quantize(Decimal(1).scaleb(-exponent), rounding="ROUND_HALF_EVEN")


utilizations = st.one_of(st.none(), st.decimals(min_value=Decimal(0), max_value=Decimal(1), places=3))


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario(), st.data())
def test_the_memoised_pricer_gives_exactly_what_price_gpu_hour_gives(case, data):
    """`Pricer` re-uses a priced GPU-hour for another hour with the same inputs: same lines, with
    that hour's own hour, uuid, team and utilization (and tier efficiency)."""
    book, first = case
    tiers = ((Decimal(0), Decimal("0.5"), Decimal("0.4")), (Decimal("0.5"), Decimal(1), Decimal(1)))
    version = replace(book.versions[0], utilization_tiers=tiers)
    book = replace(book, versions=(version,))

    def utilized(item):
        return replace(item, uuid="GPU-q", utilization=data.draw(utilizations))

    device = replace(first.device, uuid="GPU-q", utilization=data.draw(utilizations))
    later = GpuHour(
        first.hour + timedelta(hours=5),
        device,
        [utilized(i) for i in first.instances],
        [utilized(a) for a in first.allocations],
    )
    teams = data.draw(st.dictionaries(st.sampled_from(["ns0", "ns1", "ns2"]), st.sampled_from(["t1", "t2"])))
    pricer = Pricer(book)
    assert pricer.price(first) == price_gpu_hour(first, book)
    assert pricer.price(later, teams) == price_gpu_hour(later, book, teams)
    # kept for re-use unless it warned or its rounding tie left a line at 0 (then priced afresh)
    _, _, tie = _price_gpu_hour(first, book, {})
    reused = not price_gpu_hour(first, book).warnings and tie is not _UNREUSABLE
    assert pricer.hits == (1 if reused else 0)

    # and as ingest hands them over: listed in the canonical order, carrying their layout's key,
    # which the memo is then keyed by (its kept lines point at allocations by position)
    def carried(gh: GpuHour) -> GpuHour:
        instances, allocations, key = layouts.canonical(gh)
        return GpuHour(gh.hour, gh.device, instances, allocations, layout=key)

    pricer = Pricer(book)
    assert pricer.price(carried(first)) == price_gpu_hour(carried(first), book)
    assert pricer.price(carried(later), teams) == price_gpu_hour(carried(later), book, teams)
    # the order of the lists changes no line, only the order of warnings
    assert price_gpu_hour(carried(later), book, teams).lines == price_gpu_hour(later, book, teams).lines


def test_a_re_used_mig_hour_gives_a_holder_without_its_own_utilization_its_instances():
    """A MIG holder with no utilization of its own takes its instance's, on a memo hit as when priced
    afresh (`price_gpu_hour`): the kept result names the holder's unit, and the hour's instance
    readings fill it. The property test above seldom reaches this (its random MIG layouts mostly
    warn, and are never re-used)."""
    book = PriceBook(
        "USD", (PriceVersion(HOUR0, None, {"A100-40GB": GpuPrice("A100-40GB", Decimal("3.00"))}),)
    )

    def hour(at: int, big: str, small: str, device: str) -> GpuHour:
        instances = [mig("GPU-m", "1", "3g.20gb"), mig("GPU-m", "5", "2g.10gb")]
        instances = [
            replace(instances[0], utilization=Decimal(big)),
            replace(instances[1], utilization=Decimal(small)),
        ]
        allocations = [
            alloc("GPU-m", "ns0", "big", gi="1", profile="3g.20gb"),
            alloc("GPU-m", "ns1", "small", gi="5", profile="2g.10gb"),
        ]
        gh = gpu_hour("GPU-m", A100, instances, allocations, hour=HOUR0 + timedelta(hours=at))
        return replace(gh, device=replace(gh.device, utilization=Decimal(device)))

    pricer = Pricer(book)
    first, later = hour(0, "0.250", "0.500", "0.100"), hour(1, "0.750", "0.125", "0.900")
    assert pricer.price(first) == price_gpu_hour(first, book)
    priced = pricer.price(later)
    assert pricer.hits == 1
    assert priced == price_gpu_hour(later, book)
    held = {line.pod: line.utilization for line in priced.lines if line.pod}
    assert held == {"big": Decimal("0.750"), "small": Decimal("0.125")}  # the instances', not the GPU's 0.900
