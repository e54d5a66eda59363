"""What `Pricer` keeps between hours (billing/pricer.py; docs/billing.md §6.2): the results last asked
for, as many as three hours of the fleet's GPU-hours, however large the fleet.

Before, at most 20,000 results were kept and all dropped when full: on the 100,000-GPU bench every
result was let go before its GPU's next hour asked for it, and every GPU-hour was priced afresh
(docs/performance.md, "A 100,000-GPU day"). Here the floor is 10 results and the fleet 300 GPUs, the
same case at a scale a test affords. Each GPU is its own tenant, so no two GPU-hours share a result:
a GPU's hour can only be priced from its own earlier one.
"""

from __future__ import annotations

from datetime import timedelta

from gpumeter.billing.allocate import price_gpu_hour
from gpumeter.billing.pricer import Pricer
from tests.billing.factories import H100, HOUR0, alloc, book, gpu_hour

GPUS = 300
FLOOR = 10


def _hour(n: int, gpus) -> list:
    """Hour ``n`` of the GPUs ``gpus``, each held whole by a pod of its own."""
    at = HOUR0 + timedelta(hours=n)
    return [
        gpu_hour(f"GPU-{g}", H100, allocations=[alloc(f"GPU-{g}", "team", f"pod-{g}")], hour=at) for g in gpus
    ]


def _price(pricer: Pricer, prices, hour: list) -> None:
    for gh in hour:
        assert pricer.price(gh).lines == price_gpu_hour(gh, prices).lines, gh.device.uuid


def test_a_fleet_larger_than_the_floor_reuses_every_gpus_hour_before(tmp_path):
    prices = book(tmp_path, {"H100-80GB": {"hourly_rate": "4.00"}})
    pricer = Pricer(prices, min_entries=FLOOR)
    _price(pricer, prices, _hour(0, range(GPUS)))
    assert (pricer.misses, pricer.hits) == (GPUS, 0)
    # with room for only FLOOR results, each would have gone before its GPU's next hour
    _price(pricer, prices, _hour(1, range(GPUS)))
    assert (pricer.misses, pricer.hits) == (GPUS, GPUS)


def test_what_is_kept_shrinks_with_the_fleet_the_longest_unasked_for_first(tmp_path):
    prices = book(tmp_path, {"H100-80GB": {"hourly_rate": "4.00"}})
    pricer = Pricer(prices, min_entries=FLOOR)
    _price(pricer, prices, _hour(0, range(GPUS)))
    _price(pricer, prices, _hour(1, range(10, GPUS)))  # GPUs 0-9 not asked for: the oldest now
    # the fleet shrinks to 10 GPUs, new ones: room for 3 hours of 10 (30) once the next hour starts
    _price(pricer, prices, _hour(2, range(GPUS, GPUS + 10)))
    assert (pricer.misses, pricer.hits) == (GPUS + 10, GPUS - 10)
    _price(pricer, prices, _hour(3, range(GPUS + 10, GPUS + 20)))
    # kept: the 30 last asked for (GPUs 290-299 of hour 1, then hours 2 and 3's new ones); GPU 0,
    # asked for longest ago, went first, and so did GPU 289
    _price(pricer, prices, _hour(4, [GPUS - 1, GPUS + 5, GPUS + 15]))
    assert (pricer.misses, pricer.hits) == (GPUS + 20, GPUS - 10 + 3)
    _price(pricer, prices, _hour(5, [0, GPUS - 11]))
    assert pricer.misses == GPUS + 22
