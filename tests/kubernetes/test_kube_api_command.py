"""``gpumeter simulate kube-api``: the stand-in Kubernetes API as a command, run as a user would from an
empty directory, answering the pod list an exporter's ``--kube-api`` reads."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import httpx
import pytest

import gpumeter
from gpumeter.simulator.fleet import load_fleet
from gpumeter.simulator.processes import container_id, pod_uid
from tests.support import loopback
from tests.support.servers import free_port


def _command(*args: str, cwd) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "gpumeter", "simulate", "kube-api", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _pods(base: str, node: str) -> list[dict]:
    deadline = time.monotonic() + 30
    while True:
        try:
            answer = loopback.get(f"{base}/api/v1/pods", params={"fieldSelector": f"spec.nodeName={node}"})
            return answer.json()["items"]
        except httpx.HTTPError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@pytest.mark.spawns
def test_serves_one_nodes_pods_with_uids_container_ids_and_grants(tmp_path):
    port = free_port()
    proc = _command(
        "--fleet",
        "shared-modes",
        "--node",
        "gpu-shared-frac-01",
        "--listen",
        f"127.0.0.1:{port}",
        cwd=tmp_path,
    )
    try:
        pods = _pods(f"http://127.0.0.1:{port}", "gpu-shared-frac-01")
        # the fleet's five grants on that node, each a pod with its UID and its container's ID
        fleet = load_fleet("shared-modes")
        expected = {(p.namespace, p.name) for p in fleet.pods_on("gpu-shared-frac-01")}
        assert {(p["metadata"]["namespace"], p["metadata"]["name"]) for p in pods} == expected
        llm = next(p for p in pods if p["metadata"]["name"] == "llm-serve")
        assert llm["metadata"]["uid"] == pod_uid("gpu-shared-frac-01", "genai", "llm-serve")
        (status,) = llm["status"]["containerStatuses"]
        assert status["containerID"] == "containerd://" + container_id(
            "gpu-shared-frac-01", "genai", "llm-serve", "server"
        )
        gpu0 = fleet.node("gpu-shared-frac-01").gpus[0]
        assert (
            llm["metadata"]["annotations"]["hami.io/vgpu-devices-allocated"]
            == f"{gpu0.uuid},NVIDIA,40960,50:;"
        )
        # --node: another node of the fleet has no pods here
        assert _pods(f"http://127.0.0.1:{port}", "gpu-shared-ts-01") == []
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert f"on http://127.0.0.1:{port}" in out
    assert list(tmp_path.iterdir()) == []  # it wrote nothing where it ran


def test_an_unknown_node_or_a_bad_listen_address_is_one_line_and_exit_2(tmp_path, capsys):
    """In process: each is refused before the stand-in starts (a child process each cost seconds)."""
    for args, says in (
        (("--fleet", "shared-modes", "--node", "nope"), "no node 'nope' in"),
        (("--fleet", "shared-modes", "--listen", "localhost"), "--listen: expected HOST:PORT"),
        (("--fleet", str(tmp_path / "missing.yaml")), "cannot read fleet file"),
    ):
        assert gpumeter.main(["simulate", "kube-api", *args]) == 2, args
        err = capsys.readouterr().err
        assert says in err and len(err.strip().splitlines()) == 1, err
