"""Blackwell in billing: the default price book prices every model the simulator knows, MIG on B200 is
weighted by its profiles' slices (docs/billing.md §8 (o), worked by hand here), and a month of the b200
and gb200-nvl72 fleets bills with no __unpriced__ line and reconciles to the cent."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import yaml

from gpumeter.billing.allocate import price_gpu_hour
from gpumeter.billing.models import UNALLOCATED, UNPRICED, LineKind
from gpumeter.billing.pricer import Pricer
from gpumeter.billing.pricing import load_price_book
from gpumeter.billing.pricing.aliases import resolve_model
from gpumeter.billing.pricing.static import DEFAULT_BOOK
from gpumeter.simulator.fleet import load_fleet
from gpumeter.simulator.models import MODELS
from tests.billing.factories import alloc, book, gpu_hour, mig

D = Decimal
B200 = "NVIDIA B200"
B200_SLICES = {"1g.23gb": (1, 1), "1g.45gb": (1, 2), "2g.45gb": (2, 2), "3g.90gb": (3, 4), "7g.180gb": (7, 8)}


def test_the_default_price_book_prices_every_simulated_model():
    prices = load_price_book(DEFAULT_BOOK)
    version = prices.version_at(datetime(2026, 12, 1, tzinfo=UTC))
    known = set(version.gpus)
    unpriced = [m.nvml_name for m in MODELS.values() if resolve_model(m.nvml_name, known) is None]
    # the older models the default book never priced (A10, RTX 6000 Ada) are not Blackwell's business
    assert unpriced == ["NVIDIA A10", "NVIDIA RTX 6000 Ada Generation"]
    rates = {key: version.gpus[key].hourly_rate for key in version.gpus if key[0] in "BGR"}
    assert rates == {
        "B200-180GB": D("9.00"),
        "B300-288GB": D("11.00"),
        "GB200-186GB": D("10.50"),
        "GB300-288GB": D("12.50"),
        "RTX-PRO-6000-96GB": D("2.40"),
    }
    # each new rate says it is an estimate (no public per-GPU rate was read for them)
    (raw,) = yaml.safe_load(DEFAULT_BOOK.read_text())["versions"]
    assert all(raw["gpus"][key]["source"].startswith("estimate (verify)") for key in rates)


def test_o_b200_mig_layout_billed_by_its_profiles_slice_weights(tmp_path):
    # docs/billing.md §8 (o): the b200 fleet's GPU 6 at 10:00, rate $9.00, compute weights.
    prices = book(tmp_path, {"B200-180GB": {"hourly_rate": "9.00"}})
    u = "GPU-b200-6"
    hour = gpu_hour(
        u,
        B200,
        [
            mig(u, "1", "3g.90gb", slices=B200_SLICES),
            mig(u, "3", "2g.45gb", slices=B200_SLICES),
            mig(u, "7", "1g.23gb", slices=B200_SLICES),
            mig(u, "8", "1g.23gb", slices=B200_SLICES),
        ],
        [
            alloc(u, "inference", "llm-serve", gi="1", profile="3g.90gb"),
            alloc(u, "ml-research", "notebook", gi="3", profile="2g.45gb"),
            alloc(u, "inference", "embedder", gi="7", profile="1g.23gb"),
        ],
    )
    priced = price_gpu_hour(hour, prices)
    amounts = {
        (line.namespace, line.gpu_instance_id or line.kind.value): line.amount for line in priced.lines
    }
    # exact: 3/7*9 = 3.857142.., 2/7*9 = 2.571428.., 1/7*9 = 1.285714.. (twice); floors
    # 3.85 + 2.57 + 1.28 + 1.28 = 8.98, residue 2 cents to the largest remainders: .7142 (3g), then
    # .5714 twice, a tie between the embedder's 1g and the unallocated 1g that the tenant line wins.
    assert amounts == {
        ("inference", "1"): D("3.86"),
        ("ml-research", "3"): D("2.57"),
        ("inference", "7"): D("1.29"),
        (UNALLOCATED, "unallocated"): D("1.28"),
    }
    assert priced.device_cost == D("9.00") == sum(line.amount for line in priced.lines)


def test_a_month_of_the_blackwell_fleets_bills_no_unpriced_line_and_reconciles_to_the_cent():
    """November 2026 (720 hours) of every GPU of b200 (8) and gb200-nvl72 (72), priced by the default book.
    Each GPU-hour is built from the fleet file: its MIG layout and the pods its schedule runs that hour."""
    prices = load_price_book(DEFAULT_BOOK)
    pricer = Pricer(prices)
    start = datetime(2026, 11, 1, tzinfo=UTC)
    rates = {"NVIDIA B200": D("9.00"), "NVIDIA GB200": D("10.50")}  # the default book's, by hand
    billed: dict[str, Decimal] = defaultdict(D)
    lines_seen = 0
    for name in ("b200", "gb200-nvl72"):
        fleet = load_fleet(name)
        for node in fleet.nodes:
            pods = fleet.pods_on(node.name)
            for gpu in node.gpus:
                slices = {
                    m.profile.name: (m.profile.compute_slices, m.profile.memory_slices) for m in gpu.mig
                }
                for h in range(720):
                    hour = start + timedelta(hours=h)
                    held = [
                        alloc(
                            gpu.uuid,
                            pod.namespace,
                            pod.name,
                            gi="" if d.gpu_instance_id is None else str(d.gpu_instance_id),
                            profile=next(
                                (m.profile.name for m in gpu.mig if m.gpu_instance_id == d.gpu_instance_id),
                                "",
                            ),
                        )
                        for pod in pods
                        if pod.running(h * 3600 + 1800)  # every schedule starts and ends on the hour
                        for d in pod.devices
                        if d.gpu == gpu.index
                    ]
                    instances = [
                        mig(gpu.uuid, str(m.gpu_instance_id), m.profile.name, slices=slices) for m in gpu.mig
                    ]
                    priced = pricer.price(gpu_hour(gpu.uuid, gpu.model.nvml_name, instances, held, hour=hour))
                    assert not [
                        x for x in priced.lines if x.kind is LineKind.UNPRICED or x.namespace == UNPRICED
                    ]
                    assert sum(x.amount for x in priced.lines) == priced.device_cost
                    for x in priced.lines:
                        billed[gpu.model.nvml_name] += x.amount
                    lines_seen += len(priced.lines)
    # 8 B200s and 72 GB200s, every hour of 720, whole: the month is rate x GPU-hours, to the cent
    assert billed == {
        "NVIDIA B200": 8 * 720 * rates["NVIDIA B200"],
        "NVIDIA GB200": 72 * 720 * rates["NVIDIA GB200"],
    }
    assert billed["NVIDIA B200"] == D("51840.00") and billed["NVIDIA GB200"] == D("544320.00")
    assert lines_seen > 80 * 720
