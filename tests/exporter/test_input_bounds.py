"""Simulator and exporter inputs refused with one line, before they grow: a fleet's GPUs per node
and workload ranges, the exporter's numeric flags, the fault port's cross-site requests, and control
characters in log lines."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import tracemalloc
from wsgiref.simple_server import WSGIRequestHandler, make_server

import pytest

import gpumeter
from gpumeter.cli import EscapingFormatter
from gpumeter.simulator.admin import make_admin_app
from gpumeter.simulator.device import SimulatedNode
from gpumeter.simulator.fleet import FleetError, load_fleet, parse_fleet
from tests.support import loopback


def _fleet(group: dict, pod: dict | None = None) -> dict:
    fleet = {"nodes": [{"name": "n1", "gpus": [{"model": "H100-SXM5-80GB", **group}]}]}
    if pod is not None:
        fleet["pods"] = [
            {
                "namespace": "ns",
                "name": "p",
                "container": "main",
                "node": "n1",
                "devices": [{"gpu": 0}],
                **pod,
            }
        ]
    return fleet


@pytest.mark.parametrize(
    ("fleet", "refusal"),
    [
        (
            _fleet({"count": 2_000_000}),
            "nodes[0].gpus[0].count: must be from 1 to 64 GPUs a node in all (got 2000000)",
        ),
        (_fleet({"count": 0}), "nodes[0].gpus[0].count: must be from 1 to 64"),
        (
            _fleet({"workload": {"amplitude": 50}}),
            "nodes[0].gpus[0].workload.amplitude: must be within 0..1 (got 50.0)",
        ),
        (_fleet({"workload": {"amplitude": -0.1}}), "workload.amplitude: must be within 0..1 (got -0.1)"),
        (_fleet({"count": 1}, {"utilization": -5}), "pods[0].utilization: must be within 0..1 (got -5.0)"),
        (_fleet({"count": 1}, {"utilization": 1.5}), "pods[0].utilization: must be within 0..1 (got 1.5)"),
    ],
)
def test_a_fleet_out_of_bounds_is_refused_in_one_line(fleet, refusal):
    """Refused before it grew (2.3 GB in 14 s before): measured in bytes allocated, not seconds."""
    tracemalloc.start()
    try:
        with pytest.raises(FleetError) as refused:
            parse_fleet(fleet, "fleet.yaml")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(refused.value) == f"fleet.yaml: {refusal}" or refusal in str(refused.value)
    assert "\n" not in str(refused.value)
    assert peak < 16 * 2**20, f"{peak / 2**20:.0f} MiB allocated before the refusal"


def test_the_largest_real_node_is_still_a_fleet():
    fleet = parse_fleet(_fleet({"count": 64, "workload": {"amplitude": 1.0}}, {"utilization": 1.0}))
    assert len(fleet.nodes[0].gpus) == 64


@pytest.mark.parametrize(
    ("flag", "value", "refusal"),
    [
        ("--kubelet-keep-cycles", "-3", "kubelet_keep_cycles: must be from 0 to 10000 (got '-3')"),
        ("--kubelet-timeout", "0", "kubelet_timeout: must be from 0.01 to 60 (got '0.0')"),
        ("--kubelet-timeout", "nan", "kubelet_timeout: must be from 0.01 to 60 (got 'nan')"),
        ("--kube-api-refresh", "1e9", "kube_api_refresh: must be from 0 to 86400 (got '1000000000.0')"),
    ],
)
def test_an_exporter_flag_out_of_range_is_refused_in_one_line(capsys, flag, value, refusal):
    """In process: the command refuses before it starts anything (a child process cost seconds a case)."""
    argv = ["exporter", "--simulate", "workstation", "--listen", "127.0.0.1:0", flag, value]
    assert gpumeter.main(argv) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [f"gpumeter exporter: {refusal}"], err


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def fault_port(clock):
    node = SimulatedNode(load_fleet("workstation"), clock=clock)
    server = make_server("127.0.0.1", 0, make_admin_app(node), handler_class=_Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


def test_the_fault_port_takes_json_from_its_own_origin_only(fault_port):
    fault = {"fault": "overheat", "gpu": 0, "celsius": 95}
    # what a web page can send cross-site without a preflight: refused
    page = loopback.post(
        f"{fault_port}/faults",
        content=b'{"fault": "overheat", "gpu": 0}',
        headers={"Content-Type": "text/plain", "Origin": "https://evil.example"},
    )
    assert page.status_code == 403, page.text
    plain = loopback.post(
        f"{fault_port}/faults",
        content=b'{"fault": "overheat", "gpu": 0}',
        headers={"Content-Type": "text/plain"},
    )
    assert plain.status_code == 415 and "application/json" in plain.json()["error"]
    cross = loopback.post(f"{fault_port}/faults", json=fault, headers={"Origin": "http://127.0.0.1:1"})
    assert cross.status_code == 403
    cleared = loopback.delete(f"{fault_port}/faults", headers={"Origin": "https://evil.example"})
    assert cleared.status_code == 403
    # the CLI client (no Origin) and a page served by the endpoint's own origin
    assert loopback.post(f"{fault_port}/faults", json=fault).status_code == 200
    host = fault_port.removeprefix("http://")
    assert (
        loopback.post(f"{fault_port}/faults", json=fault, headers={"Origin": f"http://{host}"}).status_code
        == 200
    )


@pytest.mark.spawns
def test_gpumeter_simulate_inject_still_injects(fault_port):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpumeter",
            "simulate",
            "inject",
            "--admin",
            fault_port.removeprefix("http://"),
            "overheat",
            "--gpu",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ},
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.spawns
def test_every_log_line_of_the_cli_has_its_control_characters_escaped():
    """A label value or an error text with ESC and a newline, logged through `gpumeter`'s own
    logging set-up: one line, the sequences written out, none reaching the terminal."""
    code = (
        "import logging, sys; from gpumeter import cli; from gpumeter.billing import cli as billing; "
        "billing.cmd_prices_check = lambda args: logging.getLogger('t').warning('pod %s', 'p\\x1b[2J\\nFAKE\\u200b'); "
        "sys.exit(cli.main(['billing', 'prices', 'check', 'x']))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env={**os.environ}
    )
    assert done.returncode == 0, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.endswith("WARNING t: pod p\\x1b[2J\\nFAKE\\u200b") and "\x1b" not in line, line


def test_a_traceback_keeps_its_lines_each_escaped():
    import logging

    formatter = EscapingFormatter("%(message)s")
    try:
        raise ValueError("bad \x1b[31m value")
    except ValueError:
        record = logging.LogRecord("t", logging.ERROR, __file__, 1, "failed: %s", ("a\nb",), sys.exc_info())
    text = formatter.format(record)
    assert text.splitlines()[0] == "failed: a\\nb"
    assert (
        "Traceback (most recent call last):" in text and "\x1b" not in text and "bad \\x1b[31m value" in text
    )
