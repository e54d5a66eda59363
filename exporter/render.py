"""Rendering a snapshot as Prometheus metric families (a prometheus-client custom collector).

``collect()`` only turns the latest snapshot into families; it never calls NVML. ``describe()`` is
cheap (no snapshot needed), so registering the collector does not trigger a collection.
The exposition of a snapshot is cached per format: concurrent and repeated scrapes of the same
snapshot cost a dictionary lookup.
"""

from __future__ import annotations

import copy
import gzip
import threading
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.utils import floatToGoString

from .catalog import CATALOG, MetricSpec, MetricType
from .snapshot import Snapshot

__all__ = ["ExpositionCache", "LineCache", "SnapshotCollector"]


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


class _Families:
    """A registry stand-in whose ``collect()`` yields the given families: how the library's encoders
    are asked to write one family, or one sample, and nothing else."""

    __slots__ = ("families",)

    def __init__(self, families):
        self.families = families

    def collect(self):
        return iter(self.families)


_PLAIN = (None, None, None)  # a sample's timestamp, exemplar and native histogram when it has none


class LineCache:
    """Writes families exactly as one of prometheus-client's encoders does, reusing each line's text.

    Between snapshots the metric families and every series' name and labels stay the same; only values
    change. prometheus-client validates and escapes every label of every sample on each render (most
    of a render's cost). Here the library's own encoder writes each family header, and each distinct
    series once, as a one-sample family; the text before the value is kept and later renders format
    only the value. A line the library would write other than as ``prefix value\\n`` (a timestamp, an
    exemplar, a sample the text format moves to a family of its own such as ``_created``) makes its
    family be written by the library, every time. Entries not used by a render are dropped, so the
    cache holds the current exposition's series and no more.
    """

    def __init__(self, encoder):
        self._encoder = encoder
        self._trailer = encoder(_Families(())).decode()  # OpenMetrics' "# EOF\n"; nothing for text
        self._headers: dict = {}
        self._lines: dict = {}

    def _write(self, families) -> str:
        text = self._encoder(_Families(families)).decode()
        return text[: len(text) - len(self._trailer)] if self._trailer else text

    def _header(self, metric) -> str | None:
        key = (metric.name, metric.type, metric.documentation, metric.unit)
        header = self._headers.get(key)
        if header is None:
            empty = copy.copy(metric)
            empty.samples = []
            header = self._headers[key] = self._write([empty])
        return header

    def _prefix(self, metric, sample, header: str) -> str | None:
        one = copy.copy(metric)
        one.samples = [sample]
        text = self._write([one])
        value = floatToGoString(sample.value) + "\n"
        if (
            not text.startswith(header)
            or text.count("\n") != header.count("\n") + 1
            or not text.endswith(value)
        ):
            return None
        return text[len(header) : len(text) - len(value)]

    def _learn(self, metric, header: str, lines: dict) -> None:
        """Every line of a family from one library render of it (start-up, a new pod), where the text is
        the header and then one ``prefix value`` line per sample, in order; otherwise nothing is learnt
        here and each sample is learnt alone."""
        samples = metric.samples
        if any(sample[3:] != _PLAIN for sample in samples):
            return
        text = self._write([metric])
        if not text.startswith(header):
            return
        body = text[len(header) :].split("\n")
        if len(body) != len(samples) + 1 or body[-1]:
            return
        learnt = {}
        for sample, line in zip(samples, body, strict=False):
            value = floatToGoString(sample.value)
            prefix = line[: len(line) - len(value)]
            if not line.endswith(value) or not prefix.endswith(" "):
                return
            learnt[(metric.name, sample.name, tuple(sample.labels.items()))] = prefix
        lines.update(learnt)

    def encode(self, families) -> bytes:
        out: list[str] = []
        append = out.append
        seen: dict = {}
        lines = self._lines
        learnt = None
        for metric in families:
            header = self._header(metric)
            mark = len(out)
            append(header)
            for sample in metric.samples:
                if sample[3:] != _PLAIN:
                    break
                key = (metric.name, sample.name, tuple(sample.labels.items()))
                prefix = lines.get(key)
                if prefix is None and learnt is not metric:  # a new series: learn its whole family at once
                    learnt = metric
                    self._learn(metric, header, lines)
                    prefix = lines.get(key)
                if prefix is None:
                    prefix = self._prefix(metric, sample, header)
                    if prefix is None:
                        break
                seen[key] = prefix
                append(prefix)
                append(floatToGoString(sample.value))
                append("\n")
            else:
                continue
            del out[mark:]  # a line that is not ``prefix value``: the library writes this family
            append(self._write([metric]))
        append(self._trailer)
        self._lines = seen
        return "".join(out).encode()


class ExpositionCache:
    """The rendered exposition of the current snapshot, per content type and encoding.

    A render is done once per snapshot: ``prepare()``, called by the sampler right after it publishes
    a snapshot, renders every format scrapers asked for before, from one ``collect()`` of the
    registry, each through its format's ``LineCache``; a scrape then only copies bytes, taking no lock.
    While a render is under way, scrapes of a format rendered before get that earlier body (a cycle
    old) instead of queueing behind it. The bytes are the ones the negotiated prometheus-client
    encoder would write (tests/exporter/test_render.py).
    """

    def __init__(self, registry: CollectorRegistry, snapshots: Callable[[], Snapshot]):
        self._registry = registry
        self._snapshots = snapshots
        self._lock = threading.Lock()
        self._families: list[Metric] | None = None  # the snapshot's families, collected once
        # (snapshot, its bodies per format), replaced whole so that a scrape reads it without the lock
        self._rendered: tuple[object, dict[tuple[str, bool], bytes]] = (None, {})
        self._previous: dict[tuple[str, bool], bytes] = {}  # the last body rendered per format, any snapshot
        self._wanted: dict[tuple[str, bool], Callable] = {}  # formats scrapers asked for, with their encoder
        self._writers: dict[str, LineCache] = {}  # content type -> its line cache
        self._negotiated: dict[str, tuple[Callable, str]] = {}  # Accept header -> (encoder, content type)

    def render(self, accept: str | None, gzip_ok: bool) -> tuple[bytes, str]:
        accept = accept or ""
        chosen = self._negotiated.get(accept)
        if chosen is None:  # content negotiation parses the header: once per distinct header, not per scrape
            chosen = choose_encoder(accept)
            if len(self._negotiated) < 64:  # scrapers send a handful; a client varying it gets no cache
                self._negotiated[accept] = chosen
        encoder, content_type = chosen
        wanted = (content_type, gzip_ok)
        rendered_for, rendered = self._rendered
        if rendered_for is self._snapshots() and wanted in rendered:  # the common case: no lock
            return rendered[wanted], content_type
        if not self._lock.acquire(blocking=False):
            # The sampler is rendering a new snapshot: answer from the previous one (a cycle old)
            # rather than make every scraper wait for the render.
            previous = self._previous.get(wanted)
            if previous is not None:
                return previous, content_type
            self._lock.acquire()
        try:
            self._wanted[wanted] = encoder
            return self._render(self._snapshots(), encoder, content_type, gzip_ok), content_type
        finally:
            self._lock.release()

    def prepare(self, snapshot: Snapshot | None = None) -> None:
        with self._lock:
            snapshot = snapshot or self._snapshots()
            for (content_type, gzip_ok), encoder in list(self._wanted.items()):
                self._render(snapshot, encoder, content_type, gzip_ok)

    def _render(self, snapshot: Snapshot, encoder, content_type: str, gzip_ok: bool) -> bytes:
        rendered_for, cache = self._rendered
        if rendered_for is not snapshot:
            cache, self._families = {}, None
            self._rendered = (snapshot, cache)
        body = cache.get((content_type, gzip_ok))
        if body is None:
            plain = cache.get((content_type, False))
            if plain is None:
                if self._families is None:
                    self._families = list(self._registry.collect())
                writer = self._writers.get(content_type)
                if writer is None:
                    # content types name the encoder's format, version and escaping; a client varying
                    # them (at most 64 Accept headers are kept) is served by a bounded set of caches
                    writer = LineCache(encoder)
                    if len(self._writers) < 16:
                        self._writers[content_type] = writer
                plain = cache[(content_type, False)] = writer.encode(self._families)
            body = gzip.compress(plain, compresslevel=1) if gzip_ok else plain
            cache[(content_type, gzip_ok)] = self._previous[(content_type, gzip_ok)] = body
        return body
