"""The store's own time inside an ingest: an httpx transport that times every request billing sends,
from the moment it is sent to the last byte of its answer.

Billing asks one question at a time (its query thread), so the sum of these is the time the store
was busy answering it, measured in the same run as the ingest's wall time: the floor under that wall
time that no billing code lowers (docs/performance.md, "Status"). It includes the network and the
reading of the bytes, a little more than the store's own CPU, so the ratio it gives billing is, if
anything, flattering by that much.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx


class TimedTransport(httpx.HTTPTransport):
    """`httpx.HTTPTransport` that adds each request's time to ``busy_s`` once its answer is read."""

    def __init__(self, **options: object) -> None:
        super().__init__(**options)  # type: ignore[arg-type]
        self.busy_s = 0.0
        self.requests = 0
        self._lock = threading.Lock()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        started = time.perf_counter()
        response = super().handle_request(request)
        response.stream = _Timed(response.stream, lambda: self._add(time.perf_counter() - started))
        return response

    def _add(self, seconds: float) -> None:
        with self._lock:
            self.busy_s += seconds
            self.requests += 1


class _Timed(httpx.SyncByteStream):
    def __init__(self, inner: httpx.SyncByteStream, done) -> None:
        self._inner, self._done, self._counted = inner, done, False

    def __iter__(self) -> Iterator[bytes]:
        yield from self._inner
        self._count()

    def close(self) -> None:
        self._count()  # an answer refused part-read counts up to here
        self._inner.close()

    def _count(self) -> None:
        if not self._counted:
            self._counted = True
            self._done()
