"""PodResourcesClient against the real gRPC stand-in kubelet on a unix socket."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import grpc
import pytest

from gpumeter.exporter.kubelet.client import (
    AllocatableResources,
    ContainerDevices,
    ContainerResources,
    KubeletError,
    PodResources,
    PodResourcesClient,
)
from gpumeter.simulator.fleet import load_fleet
from gpumeter.simulator.kubelet import StandInKubelet


@pytest.fixture
def kubelet(sock, clock):
    fleet = load_fleet("a100-mixed")
    with StandInKubelet(fleet, fleet.nodes[0].name, sock, clock=clock, start=0.0) as k:
        yield k


def test_list_and_allocatable_answer_plain_dataclasses(kubelet, sock):
    with PodResourcesClient(sock) as client:
        pods = client.list()
        allocatable = client.allocatable()
    assert isinstance(pods, tuple) and all(type(p) is PodResources for p in pods)
    labeler = next(p for p in pods if p.name == "labeler")
    assert labeler.namespace == "vision"
    gpu2 = kubelet.node.gpus[2].uuid
    assert labeler.containers == (ContainerResources("main", (ContainerDevices("nvidia.com/gpu", (gpu2,)),)),)
    assert type(allocatable) is AllocatableResources
    assert len(allocatable.device_ids()) == 2 * 4 + 2 + 2 * 4
    assert all(type(i) is str for i in allocatable.device_ids())


def test_socket_missing(sock):
    """Refused at once, not at the deadline: the error is the missing file's (with a minute's deadline,
    waiting it out would end in DEADLINE_EXCEEDED instead), so no clock is needed to tell."""
    client = PodResourcesClient(sock, timeout=60)
    with pytest.raises(KubeletError, match="No such file"):
        client.list()
    with pytest.raises(KubeletError, match="No such file"):
        client.allocatable()


def test_not_a_socket(sock):
    Path(sock).write_text("")
    with pytest.raises(KubeletError, match="not a unix socket"):
        PodResourcesClient(sock).list()


def test_nothing_listening_on_the_socket(sock):
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(sock)  # a socket file nobody accepts on (a kubelet that died without cleaning up)
    listener.close()
    with pytest.raises(KubeletError) as info:
        PodResourcesClient(sock, timeout=0.5).list()
    assert info.value.code == "UNAVAILABLE"


def test_timeout(kubelet, sock):
    """The stand-in holds its answer for an hour (stopping it wakes the call): DEADLINE_EXCEEDED can only
    be the client's own deadline firing, so no wall-clock bound is needed to show it."""
    kubelet.set_fault(delay_s=3600)
    client = PodResourcesClient(sock, timeout=0.2)
    with pytest.raises(KubeletError) as info:
        client.list()
    assert info.value.code == "DEADLINE_EXCEEDED"


def test_each_call_has_its_own_deadline(kubelet, sock):
    """Two answers of 2 s each within a 3.5 s deadline: both come (1.5 s to spare for a loaded machine,
    each), and together they took longer than the deadline, which therefore is per call."""
    kubelet.set_fault(delay_s=2.0)
    client = PodResourcesClient(sock, timeout=3.5)
    started = time.monotonic()
    client.list()
    client.allocatable()
    assert time.monotonic() - started > client.timeout  # both answered: the deadline is per call


@pytest.mark.parametrize("code", [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL,
                                  grpc.StatusCode.PERMISSION_DENIED])  # fmt: skip
def test_grpc_errors_become_kubelet_errors(kubelet, sock, code):
    kubelet.set_fault(error=code)
    with pytest.raises(KubeletError) as info:
        PodResourcesClient(sock).list()
    assert info.value.code == code.name


def test_kubelet_restart_is_survived(kubelet, sock):
    client = PodResourcesClient(sock, timeout=1.0)
    assert client.list()
    kubelet.stop()
    assert not Path(sock).exists()
    with pytest.raises(KubeletError):
        client.list()
    kubelet.start()
    assert client.list()  # same client object: the channel is re-created
    kubelet.set_fault(error=grpc.StatusCode.UNAVAILABLE)
    with pytest.raises(KubeletError):
        client.list()
    kubelet.set_fault()
    assert client.allocatable().devices
    client.close()
