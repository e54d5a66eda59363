"""A command's life until SIGINT or SIGTERM, the same for every long-running gpumeter process.

A signal sent to a process can be delivered to any of its threads (gRPC's, the scheduler's, a listener's).
CPython's C handler then only flags it, and runs the Python handler when the main thread next executes
bytecode. A main thread blocked in an unbounded ``Event.wait()`` never does, so the handler that would set
the event never runs: that is how Ctrl-C in ``make demo`` left an exporter (gRPC threads) and the billing
service (APScheduler's) running until the demo killed them. `wait_until_set` wakes on the signal itself,
and `stop_on_signals` installs handlers that never wait for a lock.

Bulk work (an ingest, a re-price, a report) runs with the cyclic collector paused: `no_collections`;
the worker processes it spawns die with the command that started them: `die_with_parent`; how many
run side by side follows the CPUs the process may use, its container's limit included: `usable_cpus`.

This module imports nothing from the parts.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import math
import os
import select
import signal
import socket
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

__all__ = [
    "SLICE_SECONDS",
    "die_with_parent",
    "no_collections",
    "stop_on_signals",
    "usable_cpus",
    "wait_until_set",
]

log = logging.getLogger(__name__)

SLICE_SECONDS = 0.5  # how late another thread's set() may be noticed; each slice costs one wake-up


def wait_until_set(stop: threading.Event, slice_seconds: float = SLICE_SECONDS) -> None:
    """Block until ``stop`` is set (by a signal handler or another thread).

    In the main thread it never waits on the event itself. ``Event.wait`` holds the event's lock, a
    plain ``Lock``, at each slice's start and end. A signal's Python handler runs in this thread at
    whatever point the thread has reached, and one that calls ``stop.set()`` there waits for that
    lock forever. An exporter was found so, still sampling long after SIGTERM, its main thread in
    ``Event.set`` called from ``Condition.__exit__`` (py-spy).

    So it reads ``is_set()``, which takes no lock, and sleeps in ``select`` on the signal wake-up
    socket. The C-level handler writes to that socket, whichever thread the signal was given to,
    so the Python handler runs at once and holds no lock of this thread's. Another thread's
    ``set()`` is seen within a slice. Handlers only ever run in the main thread, so anywhere else
    the event is waited on as it is."""
    if threading.current_thread() is not threading.main_thread():
        while not stop.wait(slice_seconds):
            pass
        return
    wake, woken = socket.socketpair()
    wake.setblocking(False)
    woken.setblocking(False)
    previous = signal.set_wakeup_fd(woken.fileno(), warn_on_full_buffer=False)
    try:
        while not stop.is_set():
            if select.select([wake], [], [], slice_seconds)[0]:
                wake.recv(4096)  # the signals' numbers: their handlers run as this returns
    finally:
        signal.set_wakeup_fd(previous)
        wake.close()
        woken.close()


def stop_on_signals(
    stop: threading.Event, signals: Iterable[int] = (signal.SIGINT, signal.SIGTERM)
) -> dict[int, Any]:
    """Make ``signals`` set ``stop``; returns the handlers they had, to restore.

    The first signal sets the event; later ones do nothing. A Python handler can itself be
    interrupted by the next signal's: Ctrl-C pressed twice, or a terminal's SIGINT followed by a
    supervisor's SIGTERM. The inner handler then runs inside the outer one's ``stop.set()``, while
    that holds the event's lock, a plain ``Lock``, and another ``set()`` there waits for it forever
    (a scratch script firing signals every 0-20 ms hit it within a few hundred). So only a handler
    that wins a non-blocking claim calls ``set()``: a nested one finds the claim taken and returns,
    and the outer ``set()`` finishes."""
    claim = threading.Lock()

    def handler(signum, frame) -> None:
        if claim.acquire(blocking=False):  # never waits: held for good by the first signal
            stop.set()

    return {sig: signal.signal(sig, handler) for sig in signals}


@contextlib.contextmanager
def no_collections() -> Iterator[None]:
    """The cyclic collector paused, restored after: around work that makes millions of objects which
    reference counting frees, and almost no cycles (an ingest's hours, a report's charges and rows).

    The collector's young collections, every 200,000 allocations, find the objects in flight alive and
    scan and promote them again and again, and its full ones scan everything held: 7.3 s of the
    10,000-GPU ingest bench's 62.7 s of CPU (docs/billing.md §6.2), and a tenth of the 1,000-GPU
    report (docs/performance.md). The few cycles made meanwhile wait for a later collection. The pause
    is the process's: `billing serve`'s other threads go without collections while it lasts."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(parent: int) -> None:
    """In a spawned worker process (an ingest's, a report's line sums): ask the kernel for SIGKILL when
    the parent dies (prctl PR_SET_PDEATHSIG, Linux), so that a killed command leaves no worker
    writing or reading for minutes after it; exit at once if ``parent`` is gone already."""
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        log.warning(
            "worker %s will not die with its parent: prctl failed (errno %s)", os.getpid(), ctypes.get_errno()
        )
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def give_back_memory() -> None:
    """Hand what the heap has freed back to the system (glibc's malloc_trim), where a process's
    large, short-lived work is over and a long one follows beside another process: freed memory
    otherwise stays resident (a report's grouping, its sums' worker's month of rows). Elsewhere than
    glibc, nothing."""
    import ctypes

    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if trim is not None:
        trim(0)


def usable_cpus(cgroup_root: Path = Path("/sys/fs/cgroup"), proc_self: Path = Path("/proc/self")) -> int:
    """The CPUs this process can keep busy: those it may run on (``sched_getaffinity``), no more than
    its cgroups' CPU quota, rounded up (a container's CPU limit: cgroup v2 ``cpu.max``, v1
    ``cpu.cfs_quota_us`` over ``cpu.cfs_period_us``, the least along the cgroup's path).

    ``os.cpu_count()`` counts the node's CPUs: in a pod limited to 1 CPU on a 64-core node it said 64,
    and the work sized by it (a report's day windows, ingest's default workers) ran side by side on
    one CPU's time, throttled, each holding its own memory."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cpus = os.cpu_count() or 1
    quota = _cpu_quota(cgroup_root, proc_self)
    if quota is not None:
        cpus = min(cpus, math.ceil(quota))
    return max(1, cpus)


def _cpu_quota(root: Path, proc_self: Path) -> float | None:
    """The least CPU quota (in CPUs) of the process's cgroup and its parents; None: none set, or no
    cgroup file to read it from."""
    try:
        memberships = (proc_self / "cgroup").read_text().splitlines()
    except OSError:
        return None
    quotas: list[float] = []
    for line in memberships:
        if line.count(":") < 2:  # not a membership line
            continue
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2, alone or beside v1 (hybrid: mounted at unified/)
            mount = root if (root / "cgroup.controllers").exists() else root / "unified"
            quotas += _along(mount, path, _v2_quota)
        elif "cpu" in controllers.split(","):  # v1's cpu controller, mounted as cpu/ (a link)
            quotas += _along(root / "cpu", path, _v1_quota)
    return min(quotas, default=None)


def _along(mount: Path, path: str, quota_of) -> list[float]:
    """The quotas set on the cgroup at ``path`` under ``mount`` and on each of its parents."""
    found = []
    parts = [p for p in path.split("/") if p]
    for depth in range(len(parts), -1, -1):
        quota = quota_of(mount.joinpath(*parts[:depth]))
        if quota is not None:
            found.append(quota)
    return found


def _v2_quota(group: Path) -> float | None:
    try:
        limit, period = (group / "cpu.max").read_text().split()
        return None if limit == "max" else int(limit) / int(period)
    except (OSError, ValueError):
        return None


def _v1_quota(group: Path) -> float | None:
    try:
        quota = int((group / "cpu.cfs_quota_us").read_text())
        period = int((group / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None
