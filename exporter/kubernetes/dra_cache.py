"""This node's DRA devices (ResourceSlices) and the sharing config of the claims its pods use, listed on
a thread of its own so a slow Kubernetes API never stalls sampling.

Every ``refresh_s`` seconds: one list of the node's ResourceSlices
(``GET /apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName=<node>``), and one GET of
each ResourceClaim the kubelet last reported on the node (:meth:`want`), whose allocation and opaque
config say how each device is shared. A claim seen for the first time wakes the thread (at most every
``min_refresh_s``), so a new shared claim is read within seconds; until then its devices are
attributed from their names alone. The sampler never calls the API: it reads :meth:`snapshot` (or
:meth:`poll` in tests that drive cycles by hand, as kubernetes/pods.py does).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from .api import MALFORMED, REASONS, KubeApiError, PodLister
from .dra import SliceDevice, claim_compute_domain, claim_strategies, slice_devices

__all__ = ["DraCache", "DraView"]

log = logging.getLogger(__name__)

ClaimKey = tuple[str, str]  # (namespace, name)


@dataclass(frozen=True)
class DraView:
    """One answer: the node's devices by (pool, device), each known claim's strategy by (pool,
    device), whether the last refresh read everything, and the errors so far by reason."""

    devices: dict[tuple[str, str], SliceDevice] = field(default_factory=dict)
    claims: dict[ClaimKey, dict[tuple[str, str], str]] = field(default_factory=dict)
    up: bool = False
    listed: bool = False  # a ResourceSlice list has succeeded at least once
    errors: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REASONS, 0))
    # the ComputeDomain (its UID) of each known claim of a compute-domain channel (dra.claim_compute_domain)
    domains: dict[ClaimKey, str] = field(default_factory=dict)


class DraCache:
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
        self._current = DraView()
        self._errors = dict.fromkeys(REASONS, 0)
        self._wanted: frozenset[ClaimKey] = frozenset()
        self._listed_at: float | None = None
        self._failing_logged = False
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- what the attribution asks for ----------------------------------------------------------
    def want(self, claims: Iterable[ClaimKey]) -> None:
        """The claims the kubelet reports now; one not read yet makes the next refresh come sooner."""
        wanted = frozenset(claims)
        new = wanted - self._current.claims.keys()
        self._wanted = wanted
        if new:
            self._wake.set()

    def snapshot(self) -> DraView:
        return self._current  # replaced whole: readers never see half an answer

    def poll(self) -> DraView:
        """The last answer; refreshes in this thread first when due (or a new claim is wanted) and no
        refresh thread runs."""
        if self._thread is None:
            now = self.clock()
            due = self._listed_at is None or now - self._listed_at >= self.refresh_s
            if due or self._wanted - self._current.claims.keys():
                self.refresh()
        return self._current

    # --- reading the API ------------------------------------------------------------------------
    def refresh(self) -> DraView:
        with self._lock:
            self._listed_at = self.clock()
            previous, ok = self._current, True
            devices, listed = previous.devices, previous.listed
            try:
                devices, listed = slice_devices(self.lister.list_resource_slices(self.node)), True
            except Exception as exc:  # KubeApiError, or a bug: never stops the thread or the sampler
                ok = self._failed(exc)
            claims: dict[ClaimKey, dict[tuple[str, str], str]] = {}
            domains: dict[ClaimKey, str] = {}
            for key in sorted(self._wanted):
                try:
                    claim = self.lister.get_resource_claim(*key)
                    claims[key] = claim_strategies(claim)
                    if domain := claim_compute_domain(claim):
                        domains[key] = domain
                except Exception as exc:
                    ok = self._failed(exc)
                    if key in previous.claims:  # a claim's allocation does not change: keep it
                        claims[key] = previous.claims[key]
                        if key in previous.domains:
                            domains[key] = previous.domains[key]
            if ok and not previous.up:
                log.info(
                    "the Kubernetes API answers for DRA on %s: %d devices, %d claims",
                    self.node,
                    len(devices),
                    len(claims),
                )
                self._failing_logged = False
            self._current = DraView(devices, claims, ok, listed, dict(self._errors), domains)
            return self._current

    def _failed(self, exc: Exception) -> bool:
        reason = exc.reason if isinstance(exc, KubeApiError) else MALFORMED
        if not isinstance(exc, KubeApiError):
            log.exception("reading the DRA objects of %s failed", self.node)
        self._errors[reason] += 1
        if not self._failing_logged:  # once per outage
            self._failing_logged = True
            log.warning(
                "reading ResourceSlices/ResourceClaims for %s failed; DRA devices are attributed from "
                "their names alone (gpumeter_exporter_dra_api_up 0) until it answers: %s",
                self.node,
                exc,
            )
        return False

    # --- the thread -----------------------------------------------------------------------------
    def start(self) -> DraCache:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="dra-objects", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.refresh()
            if self._wake.wait(max(self.refresh_s, 0.1)):
                self._wake.clear()
                # rate limit on wake-ups: at least min_refresh_s between two refreshes
                since = self.clock() - (self._listed_at or 0.0)
                if since < self.min_refresh_s:
                    self._stop.wait(self.min_refresh_s - since)
