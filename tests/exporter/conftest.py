"""Fixtures for exporter tests: a manual clock and a simulated exporter running the real pynvml path."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from prometheus_client import generate_latest

from gpumeter.exporter.app import Exporter, build_exporter
from gpumeter.exporter.config import ExporterConfig
from gpumeter.simulator.device import SimulatedNode
from gpumeter.simulator.fleet import Fleet, load_fleet
from gpumeter.simulator.nvml import SimulatedNvml
from tests.support.simulated import XID_WAIT_MS

T0 = 1_790_000_000.0  # a fixed start time (2026-09-21), so golden files are stable


class ManualClock:
    def __init__(self, now: float = T0):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class Simulated:
    exporter: Exporter
    node: SimulatedNode
    lib: SimulatedNvml
    clock: ManualClock

    @property
    def sampler(self):
        return self.exporter.sampler

    def sample(self, advance: float = 5.0):
        self.clock.advance(advance)
        return self.exporter.sampler.sample_once()

    def text(self) -> str:
        return generate_latest(self.exporter.registry).decode()

    def value(self, name: str, **labels) -> float | None:
        return self.exporter.registry.get_sample_value(name, labels)


@pytest.fixture
def clock():
    return ManualClock()


@pytest.fixture
def simulate(clock):
    """simulate("h100-mig", node=None, missing={...}, latency=None, **config) -> Simulated; stopped after
    the test. ``node`` picks a node of the fleet (default: the first).
    ``latency`` (e.g. simulator.latency.CALL_LATENCY_S) makes each stand-in call take the driver's time.
    The slow counters (nvml.SLOW_FIELDS) are read every cycle here (``counter_interval`` 0), since the tests
    check what each reading gives; test_sampling.py tests their own cadence."""
    started: list[Simulated] = []

    def make(fleet: str | Fleet, *, node=None, missing=frozenset(), latency=None, **config) -> Simulated:
        fleet = load_fleet(fleet) if isinstance(fleet, str) else fleet
        node = SimulatedNode(fleet, node, clock=clock)
        lib = SimulatedNvml(node, missing=missing, latency=latency)
        defaults = {
            "listen": "127.0.0.1:0",
            "kubelet_socket": None,
            "hostname": node.spec.name,
            "interval": 5.0,
            "counter_interval": 0.0,
        }
        settings = ExporterConfig(**{**defaults, **config})
        exporter = build_exporter(settings, clock=clock, library=lib, node=node, xid_wait_ms=XID_WAIT_MS)
        sim = Simulated(exporter, node, lib, clock)
        started.append(sim)
        return sim

    yield make
    for sim in started:
        sim.exporter.sampler.stop()
