"""This node's pod list, refreshed on its own thread so a slow Kubernetes API never stalls sampling.

Fractional grants (exporter/kubernetes/fractional.py) and per-process attribution (the ``processes``
collector) both read the node's pods. Listing them is an HTTP round trip to the API server that may
take up to the client's timeout (2 s by default); inside the sampling cycle that would delay every
NVML sample behind it. So the list is fetched here, on a thread of its own, every ``refresh_s``
seconds, and the sampler only reads the last answer (:meth:`snapshot`), which never blocks.

Before :meth:`start` (tests that drive ``sample_once`` by hand) :meth:`poll` lists in the caller's
thread when a refresh is due, so such tests see each answer at once. A consumer that sees a pod it
does not know yet (a process of a new container) calls :meth:`wake` to list sooner, at most every
``min_refresh_s``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .api import MALFORMED, REASONS, KubeApiError, PodLister

__all__ = ["PodList", "PodListCache"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PodList:
    """One answer: the pods (PodList items), whether the last list succeeded, and a version that
    grows with every successful list (consumers re-derive their indexes when it changes)."""

    pods: tuple[dict[str, Any], ...] = ()
    up: bool = False
    version: int = 0
    errors: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REASONS, 0))


class PodListCache:
    def __init__(
        self,
        lister: PodLister,
        node: str,
        refresh_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        min_refresh_s: float = 5.0,
    ):
        self.lister, self.node, self.refresh_s, self.clock = lister, node, refresh_s, clock
        self.min_refresh_s = min(min_refresh_s, refresh_s)
        # who adds gpumeter_exporter_kube_api_up/_errors_total to the snapshot: the first reader that
        # claims it (fractional attribution, else the processes collector), so they are there once
        self.health_owner: object | None = None
        self._current = PodList()
        self._errors = dict.fromkeys(REASONS, 0)
        self._listed_at: float | None = None
        self._failing_logged = False
        self._lock = threading.Lock()  # one list at a time
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- reading (never blocks once started) ----------------------------------------------------
    def snapshot(self) -> PodList:
        return self._current  # replaced whole; readers never see half an answer

    def poll(self) -> PodList:
        """The last answer; lists first in this thread when due and no refresh thread runs."""
        if self._thread is None:
            now = self.clock()
            if self._listed_at is None or now - self._listed_at >= self.refresh_s:
                self.refresh()
        return self._current

    def wake(self) -> None:
        """Ask for a list sooner than ``refresh_s`` (rate-limited to ``min_refresh_s``)."""
        self._wake.set()

    # --- listing --------------------------------------------------------------------------------
    def refresh(self) -> PodList:
        with self._lock:
            self._listed_at = self.clock()
            try:
                pods = tuple(self.lister.list_pods(self.node))
            except KubeApiError as exc:
                self._failed(exc.reason, exc)
            except Exception as exc:  # a bug must not stop the thread or the sampler
                log.exception("listing the pods of %s failed", self.node)
                self._failed(MALFORMED, exc)
            else:
                if not self._current.up:
                    log.info("the Kubernetes API lists the pods of %s: %d pods", self.node, len(pods))
                self._failing_logged = False
                self._current = PodList(pods, True, self._current.version + 1, dict(self._errors))
            return self._current

    def _failed(self, reason: str, exc: Exception) -> None:
        self._errors[reason] += 1
        if not self._failing_logged:  # once per outage
            self._failing_logged = True
            log.warning(
                "listing the pods of %s failed; fractional holdings as the kubelet says, GPU processes "
                "not attributed to pods until it answers: %s",
                self.node,
                exc,
            )
        self._current = PodList(self._current.pods, False, self._current.version, dict(self._errors))

    # --- the thread -----------------------------------------------------------------------------
    def start(self) -> PodListCache:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="pod-list", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=5)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.refresh()
            woken = self._wake.wait(max(self.refresh_s, 0.1))
            if woken:
                self._wake.clear()
                self._stop.wait(max(self.min_refresh_s, 0.1))  # rate limit on wake-ups
