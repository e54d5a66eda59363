"""The XID event thread stops promptly, and the stand-in's event sets keep nvml.h's promises."""

from __future__ import annotations

import threading
import time

import pynvml as N
import pytest

from gpumeter.exporter import xid
from gpumeter.exporter.nvml import NvmlSession
from gpumeter.simulator.device import SimulatedNode
from gpumeter.simulator.fleet import load_fleet
from gpumeter.simulator.nvml import SimulatedNvml
from tests.support.simulated import XID_WAIT_MS


def test_stopping_a_running_exporter_waits_out_no_more_than_the_slice_in_progress(simulate):
    """nvml.h promises no wake-up when the set is freed, so the XID thread waits in slices of its own
    wait_ms and stop() waits out at most the one in progress, then frees the set once the thread is out.
    Shown by what the driver was asked, not by timing stop(): every wait was one slice long, and the one
    wait after them, which reads out what the set still held before it is freed, waited for nothing."""
    sim = simulate("h100-mig")
    asked: list[int] = []
    waiting = threading.Event()

    def record(eventset, out, timeout_ms):
        asked.append(getattr(timeout_ms, "value", timeout_ms))
        waiting.set()

    sim.lib.hooks["nvmlEventSetWait_v2"] = record
    sim.sampler.start()
    watcher = sim.sampler.xid_watcher
    thread = watcher._thread
    assert thread is not None and thread.is_alive()
    assert waiting.wait(30)  # the XID thread has reached its wait
    sim.sampler.stop()
    assert not thread.is_alive()
    # the thread's waits, then the one of the stop reading out what the set still held (none: at once)
    slices, drained = asked[:-1], asked[-1:]
    assert slices and set(slices) == {XID_WAIT_MS} and drained == [0], asked
    # The set was freed only after the thread left its wait: the stand-in reports the other order.
    assert watcher.errors == 0
    assert sim.lib.calls["nvmlEventSetFree"] == 1


def test_an_xid_reaches_a_watcher_blocked_in_its_wait(simulate):
    sim = simulate("h100-mig")
    sim.sampler.start()
    time.sleep(3 * xid.WAIT_MS / 1000)  # several slices pass without an event
    sim.node.inject("xid", 2, code=48)
    uuid = sim.node.gpus[2].spec.uuid
    deadline = time.monotonic() + 2
    while 48 not in sim.sampler.xid_watcher.counts(uuid) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sim.sampler.xid_watcher.counts(uuid)[48][0] == 1


@pytest.fixture
def nvml(clock):
    node = SimulatedNode(load_fleet("h100-mig"), clock=clock)
    lib = SimulatedNvml(node)
    session = NvmlSession(lib)
    session.start()
    yield node, lib
    session.stop()


def test_a_wait_without_events_sleeps_its_whole_timeout_then_times_out(nvml):
    eventset = N.nvmlEventSetCreate()
    started = time.monotonic()
    with pytest.raises(N.NVMLError) as caught:
        N.nvmlEventSetWait_v2(eventset, 300)
    assert caught.value.value == N.NVML_ERROR_TIMEOUT
    assert time.monotonic() - started >= 0.3
    N.nvmlEventSetFree(eventset)


class CountedCondition(threading.Condition):
    """A condition that counts the times a thread blocked on it."""

    waits = 0

    def wait(self, timeout=None):
        self.waits += 1
        return super().wait(timeout)


def test_a_queued_event_is_delivered_at_once_and_only_to_a_set_registered_for_it(nvml):
    node, _ = nvml
    eventset = N.nvmlEventSetCreate()
    gpu1 = N.nvmlDeviceGetHandleByIndex(1)
    N.nvmlDeviceRegisterEvents(gpu1, N.nvmlEventTypeXidCriticalError, eventset)
    node.inject("xid", 0, code=13)  # GPU 0 is not registered: dropped
    node.inject("xid", 1, code=31)
    node.events_changed = CountedCondition(node.lock)  # the stand-in's waits block on it
    event = N.nvmlEventSetWait_v2(eventset, 5000)
    assert node.events_changed.waits == 0  # "at once": returned without blocking, whatever the clock says
    assert (event.eventType, event.eventData) == (N.nvmlEventTypeXidCriticalError, 31)
    assert N.nvmlDeviceGetIndex(event.device) == 1
    with pytest.raises(N.NVMLError) as caught:  # and GPU 0's was not queued for this set
        N.nvmlEventSetWait_v2(eventset, 0)
    assert caught.value.value == N.NVML_ERROR_TIMEOUT
    N.nvmlEventSetFree(eventset)


def test_freeing_a_set_does_not_wake_its_waiter_and_the_waiter_sees_the_misuse(nvml):
    eventset = N.nvmlEventSetCreate()
    outcome: dict[str, object] = {}

    def wait():
        started = time.monotonic()
        try:
            N.nvmlEventSetWait_v2(eventset, 400)
        except N.NVMLError as exc:
            outcome["code"] = exc.value
        outcome["took"] = time.monotonic() - started

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.05)
    N.nvmlEventSetFree(eventset)
    waiter.join(timeout=5)
    assert outcome["took"] >= 0.4  # slept its whole timeout: the free woke nothing
    assert outcome["code"] == N.NVML_ERROR_UNKNOWN


def test_a_new_set_never_takes_the_token_of_a_live_one(nvml):
    node, _ = nvml
    first, second = N.nvmlEventSetCreate(), N.nvmlEventSetCreate()
    N.nvmlDeviceRegisterEvents(N.nvmlDeviceGetHandleByIndex(1), N.nvmlEventTypeXidCriticalError, second)
    N.nvmlEventSetFree(first)
    third = N.nvmlEventSetCreate()
    N.nvmlDeviceRegisterEvents(N.nvmlDeviceGetHandleByIndex(0), N.nvmlEventTypeXidCriticalError, third)
    node.inject("xid", 1, code=31)
    event = N.nvmlEventSetWait_v2(second, 1000)  # second still holds its own registration
    assert (N.nvmlDeviceGetIndex(event.device), event.eventData) == (1, 31)
    N.nvmlEventSetFree(second)
    N.nvmlEventSetFree(third)


def test_every_set_registered_for_an_event_gets_it(nvml):
    """Two event sets on one GPU (two exporters watching it) each get every XID: on a real H200 a native
    and a dcgm-naming exporter both counted each of four XIDs
    (tests/data/real-gpu/h200-580.159.04/faults/xid.json). A set registered for another GPU gets none."""
    node, _ = nvml
    gpu1 = N.nvmlDeviceGetHandleByIndex(1)
    first, second, other = N.nvmlEventSetCreate(), N.nvmlEventSetCreate(), N.nvmlEventSetCreate()
    for eventset in (first, second):
        N.nvmlDeviceRegisterEvents(gpu1, N.nvmlEventTypeXidCriticalError, eventset)
    N.nvmlDeviceRegisterEvents(N.nvmlDeviceGetHandleByIndex(0), N.nvmlEventTypeXidCriticalError, other)
    node.inject("xid", 1, code=31)
    node.inject("xid", 1, code=43)
    for eventset in (first, second):
        assert [N.nvmlEventSetWait_v2(eventset, 1000).eventData for _ in range(2)] == [31, 43]
    with pytest.raises(N.NVMLError) as caught:
        N.nvmlEventSetWait_v2(other, 50)
    assert caught.value.value == N.NVML_ERROR_TIMEOUT
    for eventset in (first, second, other):
        N.nvmlEventSetFree(eventset)


def test_an_event_from_before_the_registration_is_not_delivered(nvml):
    """docs/nvml.md §8: events from before registration are not delivered (an XID counter starts at 0 when
    the exporter starts)."""
    node, _ = nvml
    eventset = N.nvmlEventSetCreate()
    node.inject("xid", 1, code=13)
    N.nvmlDeviceRegisterEvents(N.nvmlDeviceGetHandleByIndex(1), N.nvmlEventTypeXidCriticalError, eventset)
    with pytest.raises(N.NVMLError) as caught:
        N.nvmlEventSetWait_v2(eventset, 50)
    assert caught.value.value == N.NVML_ERROR_TIMEOUT
    node.inject("xid", 1, code=31)
    assert N.nvmlEventSetWait_v2(eventset, 1000).eventData == 31
    N.nvmlEventSetFree(eventset)
