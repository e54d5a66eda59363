"""The stand-in kubelet: device-ID forms per node option, allocatable devices, lifecycle and CLI."""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gpumeter.exporter.kubelet.client import KubeletError, PodResourcesClient
from gpumeter.simulator.fleet import load_fleet
from gpumeter.simulator.kubelet import StandInKubelet, add_parser, device_id, resource_name

from .helpers import HOUR, with_kubelet

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def a100():
    return load_fleet("a100-mixed")


@pytest.mark.parametrize(
    ("form", "strategy"),
    [("uuid", "mixed"), ("gke", "mixed"), ("legacy-mig", "mixed"), ("uuid", "single")],
)
def test_device_ids_and_resources_per_form(a100, form, strategy):
    node = with_kubelet(a100, device_ids=form, mig_strategy=strategy).nodes[0]
    mig_gpu, whole, shared = node.gpus[0], node.gpus[2], node.gpus[4]
    expected_ids = {
        "uuid": (mig_gpu.mig_uuid(3), whole.uuid, f"{shared.uuid}::2"),
        "gke": ("nvidia0/gi3", "nvidia2", "nvidia4/vgpu2"),
        "legacy-mig": (f"MIG-{mig_gpu.uuid}/3/0", whole.uuid, f"{shared.uuid}::2"),
    }[form]
    got = (device_id(node, mig_gpu, 3), device_id(node, whole), device_id(node, shared, None, 2))
    assert got == expected_ids
    assert resource_name(node, mig_gpu, 3) == (
        "nvidia.com/gpu" if strategy == "single" else "nvidia.com/mig-2g.10gb"
    )
    assert resource_name(node, whole) == "nvidia.com/gpu"
    assert resource_name(node, shared) == "nvidia.com/gpu.shared"


def test_extra_resource_name_for_whole_gpus(a100):
    node = with_kubelet(a100, extra_resources=("nvidia.com/a100",)).nodes[0]
    assert resource_name(node, node.gpus[2]) == "nvidia.com/a100"
    assert resource_name(node, node.gpus[4]) == "nvidia.com/gpu.shared"


def test_allocatable_lists_every_device(a100):
    kubelet = StandInKubelet(a100, a100.nodes[0].name, "/unused", clock=lambda: 0.0)
    by_resource = {d.resource_name: list(d.device_ids) for d in kubelet.allocatable_response().devices}
    assert {r: len(ids) for r, ids in by_resource.items()} == {
        "nvidia.com/mig-3g.20gb": 2,
        "nvidia.com/mig-2g.10gb": 2,
        "nvidia.com/mig-1g.5gb": 4,
        "nvidia.com/gpu": 2,
        "nvidia.com/gpu.shared": 8,
    }


def test_list_follows_the_clock(a100):
    t = [0.0]
    kubelet = StandInKubelet(a100, a100.nodes[0].name, "/unused", clock=lambda: t[0], start=0.0)

    def names():
        return {p.name for p in kubelet.list_response().pod_resources}

    assert "segmenter-1" not in names()  # 2h-14h
    t[0] = 2 * HOUR
    assert "segmenter-1" in names()
    t[0] = 14 * HOUR
    assert "segmenter-1" not in names()
    t[0] = 26 * HOUR
    assert "segmenter-1" in names()


def test_start_replaces_a_stale_socket_and_stop_removes_it(a100, sock):
    Path(sock).write_text("stale")
    kubelet = StandInKubelet(a100, a100.nodes[0].name, sock)
    with kubelet:
        assert kubelet.running
        assert PodResourcesClient(sock).list()
        kubelet.start()  # idempotent
    assert not kubelet.running
    assert not Path(sock).exists()
    kubelet.stop()  # idempotent


def test_stop_wakes_a_delayed_call_and_ends_the_servers_threads(a100, sock):
    """The call is held for an hour; stop() must wake it rather than wait it out (the 60 s guard catches
    only that hang, so a loaded machine cannot fail it)."""
    before = set(threading.enumerate())
    kubelet = StandInKubelet(a100, a100.nodes[0].name, sock).start()
    kubelet.set_fault(delay_s=3600)
    client = PodResourcesClient(sock, timeout=0.2)
    with pytest.raises(KubeletError, match="DEADLINE_EXCEEDED"):
        client.list()
    stopping = threading.Thread(target=kubelet.stop, daemon=True)
    stopping.start()
    stopping.join(60)
    assert not stopping.is_alive(), "stop() waited out the delayed call"
    # grpc's server.stop() leaves the executor it was given: its threads must not outlive the kubelet
    left = [t.name for t in set(threading.enumerate()) - before if t.name.startswith("stand-in-kubelet")]
    assert not left, left


def test_add_parser_wires_simulate_kubelet():
    parser = argparse.ArgumentParser(prog="gpumeter simulate")
    add_parser(parser.add_subparsers(dest="what"))
    args = parser.parse_args(["kubelet", "--fleet", "h100-mig", "--socket", "/tmp/x.sock"])
    assert (args.what, args.fleet, args.node, args.socket, args.speed) == (
        "kubelet", "h100-mig", None, "/tmp/x.sock", 1.0,
    )  # fmt: skip
    assert callable(args.func)
    args = parser.parse_args(["kubelet", "--fleet", "f.yaml", "--node", "n2"])
    assert args.node == "n2"
    assert args.socket == "/var/lib/kubelet/pod-resources/kubelet.sock"


@pytest.mark.spawns
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_runs_until_signalled(sock, sig):
    proc = subprocess.Popen(
        # the command as users run it (it once ran the checkout's exporter/ under a bare name)
        [sys.executable, "-m", "gpumeter", "simulate", "kubelet", "--fleet", "a100-mixed", "--socket", sock],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not Path(sock).exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the stand-in kubelet did not create its socket"
            time.sleep(0.05)
        pods = PodResourcesClient(sock).list()
        assert {p.namespace for p in pods} >= {"vision", "nlp", "data-eng"}  # the fleet's first node, at t=0
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()  # its pipes closed whatever happened above
    assert proc.returncode == 0, err
    assert "stand-in kubelet: node gpu-a100-mixed-01" in out
    assert not Path(sock).exists()


def test_cli_errors_are_reported_not_raised(capsys):
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    args = parser.parse_args(["kubelet", "--fleet", "no-such-fleet"])
    assert args.func(args) == 2
    assert "cannot read fleet file" in capsys.readouterr().err
    args = parser.parse_args(["kubelet", "--fleet", "h100-mig", "--node", "nope"])
    assert args.func(args) == 2
    assert "no node 'nope'" in capsys.readouterr().err
