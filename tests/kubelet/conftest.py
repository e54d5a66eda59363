from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpumeter.exporter.kubelet.attribution import PodAttribution
from gpumeter.exporter.kubelet.client import PodResourcesClient
from gpumeter.simulator.fleet import Fleet, load_fleet
from gpumeter.simulator.kubelet import StandInKubelet

from .helpers import Clock


@pytest.fixture
def sock() -> Iterator[str]:
    """A unix socket path short enough for sun_path (< 108 bytes), whatever pytest's tmp_path is."""
    directory = tempfile.mkdtemp(prefix="gpm-", dir="/tmp")
    try:
        yield str(Path(directory) / "kubelet.sock")
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def clock() -> Clock:
    return Clock(0.0)


class Harness:
    """A stand-in kubelet for a fleet's first node, a client and a PodAttribution reading it."""

    def __init__(self, fleet: Fleet, sock: str, clock: Clock, timeout: float = 2.0, **attribution):
        self.fleet = fleet
        self.node = fleet.nodes[0]
        self.kubelet = StandInKubelet(fleet, self.node.name, sock, clock=clock, start=0.0)
        self.client = PodResourcesClient(sock, timeout=timeout)
        # as the exporter does: replicas are MPS where the node's device plugin shares by MPS
        attribution.setdefault("replicas_under_mps", self.node.sharing_strategy == "mps")
        self.attribution = PodAttribution(self.client, self.node.name, **attribution)


@pytest.fixture
def harness(sock, clock):
    made: list[Harness] = []

    def make(fleet: Fleet | str, timeout: float = 2.0, **attribution) -> Harness:
        if isinstance(fleet, str):
            fleet = load_fleet(fleet)
        h = Harness(fleet, sock, clock, timeout=timeout, **attribution)
        h.kubelet.start()
        made.append(h)
        return h

    yield make
    for h in made:
        h.kubelet.stop()
        h.client.close()
