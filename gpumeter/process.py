"""A command's life until SIGINT or SIGTERM, the same for every long-running gpumeter process.

A signal sent to a process can be delivered to any of its threads (gRPC's, the scheduler's, a listener's).
CPython's C handler then only flags it, and runs the Python handler when the main thread next executes
bytecode. A main thread blocked in an unbounded ``Event.wait()`` never does, so the handler that would set
the event never runs: that is how Ctrl-C in ``make demo`` left an exporter (gRPC threads) and the billing
service (APScheduler's) running until the demo killed them. Sleeping in slices lets a flagged handler run.

This module imports nothing from the parts.
"""

from __future__ import annotations

import threading
import time

__all__ = ["SLICE_SECONDS", "wait_until_set"]

SLICE_SECONDS = 0.5  # how late a stop may be noticed; each slice costs one wake-up of the main thread


def wait_until_set(stop: threading.Event, slice_seconds: float = SLICE_SECONDS) -> None:
    """Block until ``stop`` is set (by a signal handler or another thread), waking every slice.

    It sleeps between looks at the flag instead of waiting on the event. ``Event.wait`` holds the
    event's lock, a plain ``Lock``, at each slice's start and end. A signal's Python handler runs in
    this thread at whatever point the thread has reached, and one that calls ``stop.set()`` there
    waits for that lock forever: an exporter was found so, still sampling long after SIGTERM, its
    main thread in ``Event.set`` called from ``Condition.__exit__`` (py-spy). ``is_set()`` takes no
    lock, and ``time.sleep`` runs a pending handler while this thread holds none."""
    while not stop.is_set():
        time.sleep(slice_seconds)
