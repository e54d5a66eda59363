"""Rendering a snapshot as Prometheus metric families (a prometheus-client custom collector).

``collect()`` only turns the latest snapshot into families; it never calls NVML. ``describe()`` is
cheap (no snapshot needed), so registering the collector does not trigger a collection.
The exposition of a snapshot is cached per format: concurrent and repeated scrapes of the same
snapshot cost a dictionary lookup.
"""

from __future__ import annotations

import gzip
import threading
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder

from .catalog import CATALOG, MetricSpec, MetricType
from .snapshot import Snapshot

__all__ = ["ExpositionCache", "SnapshotCollector"]


def _family(
    spec: MetricSpec,
    name: str | None = None,
    help_text: str | None = None,
    labels: tuple[str, ...] | None = None,
) -> Metric:
    cls = CounterMetricFamily if spec.type is MetricType.COUNTER else GaugeMetricFamily
    family_name = name or spec.family_name
    if spec.type is MetricType.COUNTER:
        family_name = family_name.removesuffix("_total")
    return cls(
        family_name, help_text or spec.help, labels=list(labels if labels is not None else spec.label_names)
    )


class SnapshotCollector:
    """Renders ``snapshots()`` under native names (docs/metrics.md) or dcgm-exporter's (``naming="dcgm"``)."""

    def __init__(self, snapshots: Callable[[], Snapshot], naming: str = "native", dcgm_options=None):
        if naming not in ("native", "dcgm"):
            raise ValueError(f"naming must be native or dcgm, not {naming!r}")
        self._snapshots = snapshots
        self.naming = naming
        self.dcgm_options = dcgm_options  # exporter.dcgm.DcgmOptions; None: the defaults

    def describe(self) -> Iterator[Metric]:
        if self.naming == "dcgm":
            from .dcgm import DEFAULT_OPTIONS, describe_dcgm

            yield from describe_dcgm(self.dcgm_options or DEFAULT_OPTIONS)
            return
        for spec in CATALOG:
            yield _family(spec)

    def collect(self) -> Iterator[Metric]:
        snapshot = self._snapshots()
        if self.naming == "dcgm":
            from .dcgm import DEFAULT_OPTIONS, collect_dcgm

            yield from collect_dcgm(snapshot, self.dcgm_options or DEFAULT_OPTIONS)
            return
        for spec in CATALOG:
            samples = snapshot.samples(spec.name)
            if not samples:
                continue  # unsupported or absent: no family, never NaN
            family = _family(spec)
            for labels, value in samples:
                family.add_metric(labels, value)
            yield family


class ExpositionCache:
    """The rendered exposition of the current snapshot, per content type and encoding.

    Rendering costs milliseconds (prometheus-client formats and escapes every sample), so it is done
    once per snapshot: ``prepare()``, called by the sampler right after it publishes a snapshot,
    renders every format scrapers asked for before. A scrape then only copies bytes.
    """

    def __init__(self, registry: CollectorRegistry, snapshots: Callable[[], Snapshot]):
        self._registry = registry
        self._snapshots = snapshots
        self._lock = threading.Lock()
        self._key: object = None
        self._cache: dict[tuple[str, bool], bytes] = {}
        self._wanted: dict[tuple[str, bool], Callable] = {}  # formats scrapers asked for, with their encoder
        self._negotiated: dict[str, tuple[Callable, str]] = {}  # Accept header -> (encoder, content type)

    def render(self, accept: str | None, gzip_ok: bool) -> tuple[bytes, str]:
        accept = accept or ""
        chosen = self._negotiated.get(accept)
        if chosen is None:  # content negotiation parses the header: once per distinct header, not per scrape
            chosen = choose_encoder(accept)
            if len(self._negotiated) < 64:  # scrapers send a handful; a client varying it gets no cache
                self._negotiated[accept] = chosen
        encoder, content_type = chosen
        with self._lock:
            self._wanted[(content_type, gzip_ok)] = encoder
            return self._render(self._snapshots(), encoder, content_type, gzip_ok), content_type

    def prepare(self, snapshot: Snapshot | None = None) -> None:
        with self._lock:
            snapshot = snapshot or self._snapshots()
            for (content_type, gzip_ok), encoder in list(self._wanted.items()):
                self._render(snapshot, encoder, content_type, gzip_ok)

    def _render(self, snapshot: Snapshot, encoder, content_type: str, gzip_ok: bool) -> bytes:
        if self._key is not snapshot:
            self._key, self._cache = snapshot, {}
        body = self._cache.get((content_type, gzip_ok))
        if body is None:
            plain = self._cache.get((content_type, False))
            if plain is None:
                plain = self._cache[(content_type, False)] = encoder(self._registry)
            body = gzip.compress(plain, compresslevel=1) if gzip_ok else plain
            self._cache[(content_type, gzip_ok)] = body
        return body
