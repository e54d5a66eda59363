"""The fleet-health report's pools in a ledger billed from a global store (docs/billing.md §2.3): a
pool is one cluster's, as the pool rules compute it (``pool:… by (cluster, pool)``), so two clusters'
nodes of one pool label are two pools, named ``cluster/pool``, in the capacity and in the incidents.

Three hours (h0..h2) of two clusters, each with two A100s of one UUID pair (GPU-1, GPU-2) on nodes
labelled "a100":

| GPU | h0 | h1 | h2 |
|---|---|---|---|
| east GPU-1 | held | held | held |
| east GPU-2 | held | held | nothing held |
| west GPU-1 | nothing held | nothing held | held |
| west GPU-2 | nothing held | nothing held | nothing held |

east/a100: 6 GPU-hours billed, 5 held, headroom 1 - 5/6 = 1/6; spare GPUs 0, 0, 1: mean 1/3, fewest 0.
A 10 % policy asks 0.2 spare GPUs of each hour's 2: h0 and h1 are under (2 hours).
west/a100: 6 billed, 1 held, headroom 5/6; spare 2, 2, 1: mean 5/3, fewest 1, no hour under.
Merged into one pool "a100" (the bug) it had spare 2, 2, 2, fewest 2 and no hour under the policy,
though east had no spare GPU for two hours.
"""

from __future__ import annotations

import csv
import io
import json
from datetime import timedelta
from decimal import Decimal

import pytest

from gpumeter.billing.allocate import price_gpu_hour
from gpumeter.billing.ledger import open_ledger
from gpumeter.billing.ledger.base import HourRecord
from gpumeter.billing.models import Device, GpuHour
from gpumeter.reports.health import GpuHealth, HealthReport, read_ledger
from gpumeter.reports.health_render import render
from gpumeter.reports.model import range_period
from tests.billing.factories import A100, HOUR0, alloc, book

PERIOD = range_period(HOUR0, HOUR0 + timedelta(hours=3))
HELD = {  # hour -> the (cluster, uuid) held
    0: {("east", "GPU-1"), ("east", "GPU-2")},
    1: {("east", "GPU-1"), ("east", "GPU-2")},
    2: {("east", "GPU-1"), ("west", "GPU-1")},
}
GPUS = [(cluster, uuid) for cluster in ("east", "west") for uuid in ("GPU-1", "GPU-2")]
# as build_health maps the GPUs Prometheus saw, by `gpu_key`: every node labelled "a100"
POOLS = {f"{cluster}/{uuid}": "a100" for cluster, uuid in GPUS}


@pytest.fixture
def ledger(tmp_path):
    prices = book(tmp_path, {"A100-40GB": "3.00"})
    led = open_ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    for h, holding in HELD.items():
        hour = HOUR0 + timedelta(hours=h)
        hours = [
            GpuHour(
                hour,
                Device(uuid, A100, 3600, f"{cluster}-{uuid}", "0", cluster=cluster),
                [],
                [alloc(uuid, "ml", f"p-{uuid}")] if (cluster, uuid) in holding else [],
            )
            for cluster, uuid in GPUS
        ]
        lines = [line for gh in hours for line in price_gpu_hour(gh, prices, {}).lines]
        led.write_hour(HourRecord(hour, hours, lines, prices))
    yield led
    led.close()


def _figures(capacity):
    return {
        name: (c.gpu_hours, c.held, c.hours, c.spare_gpu_hours, c.min_spare, c.hours_below_policy)
        for name, c in capacity.items()
    }


def test_two_clusters_pools_of_one_label_keep_their_own_capacity(ledger):
    _currency, _teams, capacity = read_ledger(ledger, PERIOD, POOLS, 0.10)
    assert _figures(capacity) == {
        "east/a100": (6, Decimal(5), 3, 1, 0, 2),  # h0, h1 under the policy
        "west/a100": (6, Decimal(1), 3, 5, 1, 0),
    }
    assert capacity["east/a100"].headroom == pytest.approx(1 / 6)
    assert capacity["east/a100"].mean_spare == pytest.approx(1 / 3)
    assert capacity["west/a100"].headroom == pytest.approx(5 / 6)
    assert capacity["west/a100"].mean_spare == pytest.approx(5 / 3)
    # GPUs Prometheus did not see pool by their lines' price-book model, still per cluster
    _, _, unseen = read_ledger(ledger, PERIOD, {}, 0.10)
    assert _figures(unseen) == {
        "east/A100-40GB": (6, Decimal(5), 3, 1, 0, 2),
        "west/A100-40GB": (6, Decimal(1), 3, 5, 1, 0),
    }


def test_the_pools_name_their_cluster_in_every_format(ledger, tmp_path):
    """The incidents' pools are per cluster too (east's 0.9 and 0.7, west's 0.1 and 0.3: means 0.8 and
    0.2), and the pool rows of the CSV carry their own cluster's capacity."""
    currency, teams, capacity = read_ledger(ledger, PERIOD, POOLS, 0.10)
    utilization = {("east", "GPU-1"): 0.9, ("east", "GPU-2"): 0.7, ("west", "GPU-1"): 0.1}
    utilization[("west", "GPU-2")] = 0.3
    gpus = [
        GpuHealth(
            uuid,
            A100,
            f"{cluster}-{uuid}",
            hours_up=3,
            utilization=utilization[(cluster, uuid)],
            utilization_source="nvml",
            pool="a100",
            cluster=cluster,
        )
        for cluster, uuid in GPUS
    ]
    report = HealthReport(PERIOD, "http://prometheus", currency, gpus, teams, [], capacity, 0.10)
    pools = {name: (i.gpus, i.hours_up, i.utilization) for name, i in report.pools}
    assert pools == {
        "east/a100": (2, 6, pytest.approx(0.8)),
        "west/a100": (2, 6, pytest.approx(0.2)),
    }
    files = render(report, tmp_path, ("html", "csv", "json"))
    doc = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert [(p["pool"], p["gpus"], p["mean_utilization"]) for p in doc["pools"]] == [
        ("east/a100", 2, 0.8),
        ("west/a100", 2, 0.2),
    ]
    assert [
        (p["pool"], p["gpu_hours_held"], p["min_spare_gpus"], p["hours_below_spare_policy"])
        for p in doc["pool_capacity"]
    ] == [("east/a100", "5.000000", 0, 2), ("west/a100", "1.000000", 1, 0)]
    pools_csv = next(name for name in files if name.endswith("-pools.csv"))
    rows = list(csv.DictReader(io.StringIO((tmp_path / pools_csv).read_text(), newline="")))
    assert [
        (r["name"], r["gpus"], r["gpu_hours_billed"], r["min_spare_gpus"], r["hours_below_spare_policy"])
        for r in rows
        if r["level"] == "pool"
    ] == [("east/a100", "2", "6", "0", "2"), ("west/a100", "2", "6", "1", "0")]
    html = next(tmp_path.glob("*.html")).read_text()
    assert 'data-pool="east/a100"' in html and 'data-pool="west/a100"' in html
    assert 'data-pool="a100"' not in html
    assert "2 of 3" in html and "16.7 %" in html  # east: under the policy 2 hours, headroom 1/6
    assert "a pool is one cluster's, named cluster/pool" in html
