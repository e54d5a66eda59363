"""The fleet-health report's pool capacity (docs/reports.md, "Fleet health"; docs/capacity.md, "Pools"): headroom and the spare
policy per pool over the month, from the ledger's hourly lines, against figures worked out by hand.

Three hours (h0..h2) of four GPUs; "a100" pools three of them by a node label, the H100's node has
none and it pools by its model (as the pool table does):

| GPU | h0 | h1 | h2 |
|---|---|---|---|
| g1 A100, whole | held | held | held |
| g2 A100, MIG 3g + 4g | 3g held | 3g held | nothing held |
| g3 A100, whole | nothing held | held | held |
| g4 H100, whole | held | nothing held | nothing held |

a100: 9 GPU-hours billed; held 3 (g1) + 2 x 3/7 (g2's 3g: 3 of 7 compute slices) + 2 (g3) = 41/7,
headroom 1 - (41/7) / 9 = 22/63 = 0.349206; spare GPUs (nothing held) 1, 0, 1: mean 2/3, fewest 0. Under
a 10 % policy an hour needs 0.3 spare GPUs: h1 is under (1 hour); under 40 % (1.2): all 3.
H100: 3 billed, 1 held, headroom 2/3; spare 0, 1, 1; under 10 % (0.1 of its one GPU): h0, and under
40 % (0.4) still h0 only.
A GPU holding one MIG instance (g2 in h0, h1) is not spare: its free 4g slices count in the headroom only.
"""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from datetime import timedelta
from decimal import Decimal

import pytest

from gpumeter.billing.allocate import price_gpu_hour
from gpumeter.billing.ledger import open_ledger
from gpumeter.billing.ledger.base import HourRecord
from gpumeter.reports.health import HealthReport, read_ledger
from gpumeter.reports.health_render import render
from gpumeter.reports.model import range_period
from tests.billing.factories import A100, H100, HOUR0, alloc, book, gpu_hour, mig

PERIOD = range_period(HOUR0, HOUR0 + timedelta(hours=3))
# as build_health maps the GPUs Prometheus saw: a node's pool label, else the GPU's model (g4)
POOLS = {"g1": "a100", "g2": "a100", "g3": "a100", "g4": H100}


@pytest.fixture
def ledger(tmp_path):
    prices = book(tmp_path, {"A100-40GB": "3.00", "H100-80GB": "6.88"})
    led = open_ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    instances = [mig("g2", "1", "3g.20gb"), mig("g2", "2", "4g.20gb")]
    held = {  # hour -> the GPUs (and g2's instance) held
        0: {"g1", "g2:1", "g4"},
        1: {"g1", "g2:1", "g3"},
        2: {"g1", "g3"},
    }
    for h, holding in held.items():
        hour = HOUR0 + timedelta(hours=h)
        hours = [
            gpu_hour("g1", A100, allocations=[alloc("g1", "ns-a", "p1")], hour=hour),
            gpu_hour(
                "g2",
                A100,
                instances=instances,
                allocations=[alloc("g2", "ns-b", "p2", gi="1", profile="3g.20gb")]
                if "g2:1" in holding
                else [],
                hour=hour,
            ),
            gpu_hour(
                "g3", A100, allocations=[alloc("g3", "ns-a", "p3")] if "g3" in holding else [], hour=hour
            ),
            gpu_hour(
                "g4", H100, allocations=[alloc("g4", "ns-c", "p4")] if "g4" in holding else [], hour=hour
            ),
        ]
        lines = [line for gh in hours for line in price_gpu_hour(gh, prices, {}).lines]
        led.write_hour(HourRecord(hour, hours, lines, prices))
    yield led
    led.close()


def test_headroom_and_spare_hours_per_pool_match_the_hand_worked_hours(ledger):
    _currency, _teams, capacity = read_ledger(ledger, PERIOD, POOLS, 0.10)
    assert set(capacity) == {"a100", H100}
    a100, h100 = capacity["a100"], capacity[H100]
    assert (a100.gpu_hours, a100.hours, a100.spare_gpu_hours, a100.min_spare) == (9, 3, 2, 0)
    assert float(a100.held) == pytest.approx(41 / 7, abs=1e-6)  # the lines' quantities are rounded
    assert a100.headroom == pytest.approx(22 / 63, abs=1e-6) and a100.mean_spare == pytest.approx(2 / 3)
    assert a100.hours_below_policy == 1  # h1
    assert (h100.gpu_hours, h100.held, h100.spare_gpu_hours, h100.min_spare, h100.hours_below_policy) == (
        3,
        Decimal(1),
        2,
        0,
        1,  # h0
    )
    assert h100.headroom == pytest.approx(2 / 3)
    _, _, stricter = read_ledger(ledger, PERIOD, POOLS, 0.40)
    assert stricter["a100"].hours_below_policy == 3 and stricter[H100].hours_below_policy == 1


def test_the_capacity_is_in_every_format(ledger, tmp_path):
    currency, teams, capacity = read_ledger(ledger, PERIOD, POOLS, 0.10)
    report = HealthReport(PERIOD, "http://prometheus", currency, [], teams, [], capacity, 0.10)
    files = render(report, tmp_path, ("html", "csv", "json"))
    doc = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert [
        (p["pool"], p["hours_below_spare_policy"], p["min_spare_gpus"]) for p in doc["pool_capacity"]
    ] == [
        (H100, 1, 0),
        ("a100", 1, 0),
    ]
    assert doc["pool_capacity"][1]["headroom"] == round(22 / 63, 6)
    pools_csv = next(name for name in files if name.endswith("-pools.csv"))
    rows = list(csv.DictReader(io.StringIO((tmp_path / pools_csv).read_text(), newline="")))
    # the pool rows come from Prometheus' GPUs (none here): the fleet row carries no capacity
    assert rows[-1]["level"] == "fleet" and rows[-1]["headroom"] == ""
    html = next(tmp_path.glob("*.html")).read_text()
    assert 'id="pool-capacity"' in html and "1 of 3" in html and "34.9 %" in html


@pytest.mark.spawns
def test_a_spare_policy_outside_0_to_1_is_refused_in_one_line(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "gpumeter", "report", "--kind", "health", "--spare-policy", "1.5"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert done.returncode == 2
    assert "argument --spare-policy: expected a share from 0 to 1 (value '1.5')" in done.stderr
