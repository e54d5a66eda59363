"""A command's life until SIGINT or SIGTERM, the same for every long-running gpumeter process.

A signal sent to a process can be delivered to any of its threads (gRPC's, the scheduler's, a listener's).
CPython's C handler then only flags it, and runs the Python handler when the main thread next executes
bytecode. A main thread blocked in an unbounded ``Event.wait()`` never does, so the handler that would set
the event never runs: that is how Ctrl-C in ``make demo`` left an exporter (gRPC threads) and the billing
service (APScheduler's) running until the demo killed them. Waiting in slices lets a flagged handler run.

This module imports nothing from the parts.
"""

from __future__ import annotations

import threading

__all__ = ["SLICE_SECONDS", "wait_until_set"]

SLICE_SECONDS = 0.5  # how late a stop may be noticed; each slice costs one wake-up of the main thread


def wait_until_set(stop: threading.Event, slice_seconds: float = SLICE_SECONDS) -> None:
    """Block until ``stop`` is set (by a signal handler or another thread), waking every slice."""
    while not stop.wait(slice_seconds):
        pass
