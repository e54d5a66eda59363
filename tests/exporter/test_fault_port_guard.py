"""The simulator's fault port answers only requests addressed to it, and only with values hardware can show.

Both were accepted: a request with ``Host: rebind.example:PORT`` (a page whose name was re-pointed
to 127.0.0.1 by DNS rebinding is same-origin to the browser, so the Origin check passes), and
``celsius: 1e308``, after which the GPU read 0 degrees C. The port now answers 421 to a Host that
does not name its listen address and 400, naming the parameter, to a value out of its bounds.
"""

from __future__ import annotations

import pytest

from gpumeter.simulator.device import SimulatedNode
from gpumeter.simulator.fleet import load_fleet
from tests.support import loopback


@pytest.fixture
def fault_port(simulate):
    """The real exporter's fault port (simulated GPUs), bound to 127.0.0.1 on a free port."""
    sim = simulate("h200", admin_listen="127.0.0.1:0")
    sim.exporter.start()
    try:
        admin = next(s for s in sim.exporter.servers if s is not sim.exporter.servers[0])
        yield sim, f"127.0.0.1:{admin.server_address[1]}"
    finally:
        sim.exporter.stop()


def test_a_request_naming_another_host_is_refused(fault_port):
    sim, address = fault_port
    port = address.rsplit(":", 1)[1]
    fault = {"fault": "overheat", "gpu": 0, "celsius": 40}
    for host in (f"rebind.example:{port}", "127.0.0.1:1", f"10.0.0.1:{port}", "rebind.example"):
        refused = loopback.post(f"http://{address}/faults", json=fault, headers={"Host": host})
        assert refused.status_code == 421, (host, refused.text)
        assert repr(host) in refused.json()["error"]
        listed = loopback.get(f"http://{address}/faults", headers={"Host": host})
        assert listed.status_code == 421, host
    assert sim.node.gpus[0].overheat_c == 0.0  # nothing injected
    for host in (address, f"localhost:{port}"):
        assert (
            loopback.post(f"http://{address}/faults", json=fault, headers={"Host": host}).status_code == 200
        )
    assert sim.node.gpus[0].overheat_c == 40.0


@pytest.mark.parametrize(
    ("fault", "parameter"),
    [
        ({"fault": "overheat", "celsius": 1e308}, "celsius"),
        ({"fault": "overheat", "celsius": -5}, "celsius"),
        ({"fault": "overheat", "celsius": "hot"}, "celsius"),
        ({"fault": "nvlink_crc", "rate": 1e308}, "rate"),
        ({"fault": "nvlink_crc", "count": 10**30}, "count"),
        ({"fault": "ecc", "count": -1}, "count"),
        ({"fault": "ecc", "count": 1.5}, "count"),
        ({"fault": "row_remap", "kind": "corrected", "count": 1e308}, "count"),
        ({"fault": "xid", "code": 10**20}, "code"),
        ({"fault": "nvml_error", "code": 1 << 40}, "code"),
    ],
)
def test_an_injected_value_out_of_its_bounds_is_refused(fault_port, fault, parameter):
    _, address = fault_port
    refused = loopback.post(f"http://{address}/faults", json={**fault, "gpu": 0})
    assert refused.status_code == 400, refused.text
    assert parameter in refused.json()["error"]


def test_the_hottest_injection_allowed_reads_back_hot(clock):
    node = SimulatedNode(load_fleet("h200"), clock=clock)
    node.inject("overheat", 0, celsius=150)
    clock.advance(3600)
    node.advance_to(clock())
    assert node.gpus[0].temperature_c > 150
