"""The exposition cache writes the bytes prometheus-client's negotiated encoder writes, for every example
fleet under both namings, on the first render of a snapshot and on later ones (where only values are
formatted and the rest of each line comes from the cache)."""

from __future__ import annotations

import gzip
import threading

import pytest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.samples import Exemplar, Sample

from gpumeter.exporter.render import ExpositionCache, LineCache
from tests.exporter.test_exposition import EXAMPLES

ACCEPT_HEADERS = [
    "",  # no header: text 0.0.4
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
    # Prometheus 2.x and 3.x
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
    "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,text/plain;version=1.0.0;"
    "escaping=allow-utf-8;q=0.5,*/*;q=0.1",
    "application/openmetrics-text; version=1.0.0; escaping=dots",
    "text/plain; version=1.0.0; escaping=values",
]


@pytest.mark.parametrize("naming", ["native", "dcgm"])
@pytest.mark.parametrize(("fleet", "node"), EXAMPLES)
def test_the_cached_exposition_is_what_prometheus_client_writes(simulate, fleet, node, naming):
    sim = simulate(fleet, node=node, naming=naming)
    exposition = sim.exporter.exposition
    for cycle in range(2):  # the first render learns every line; the second reuses them with new values
        sim.sample()
        for n, accept in enumerate(ACCEPT_HEADERS):
            encoder, content_type = choose_encoder(accept)
            expected = encoder(sim.exporter.registry)
            gzipped = cycle == 1 and n % 2 == 1  # the re-used lines served both plain and compressed
            body, served_type = exposition.render(accept, gzip_ok=gzipped)
            assert served_type == content_type
            if gzipped:
                body = gzip.decompress(body)
            assert body == expected, f"{fleet}/{node} {naming} cycle {cycle}, Accept {accept!r}"
            assert body.count(b"\n") > 100


class Families:
    def __init__(self, families):
        self.families = families

    def collect(self):
        return iter(self.families)


def odd_families(value: float) -> list[Metric]:
    """Families whose lines are not all ``prefix value``, and label values that need escaping."""
    gauge = GaugeMetricFamily("odd_gauge", 'help with \\ and "quotes"\nand a newline', labels=["a", "b"])
    gauge.add_metric(['quote " backslash \\ newline \n', "ünïcödé"], value)
    gauge.add_metric(["x", "y"], value * 1e7)  # Go writes large numbers with an exponent
    gauge.add_metric(["inf", "y"], float("inf"))
    gauge.add_metric(["nan", "y"], float("nan"))
    gauge.add_metric(["neg", "y"], -value)
    stamped = GaugeMetricFamily("odd_stamped", "a sample with a timestamp", labels=["a"])
    stamped.add_metric(["1"], value, timestamp=1_790_000_000.5)
    created = CounterMetricFamily(
        "odd_created", "a counter with _created", labels=["a"], created=1_790_000_000
    )
    created.add_metric(["1"], value)
    exemplar = CounterMetricFamily("odd_exemplar", "a counter with an exemplar", labels=["a"])
    exemplar.add_metric(["1"], value)
    exemplar.samples[0] = Sample(
        "odd_exemplar_total", {"a": "1"}, value, None, Exemplar({"trace_id": "abc"}, float(value))
    )
    info = InfoMetricFamily("odd", "an info family", value={"version": "1"})
    utf8 = GaugeMetricFamily("odd_utf8", "a label name outside the legacy set", labels=["a.b"])
    utf8.add_metric(["1"], value)
    return [gauge, stamped, created, exemplar, info, utf8]


@pytest.mark.parametrize("accept", ACCEPT_HEADERS)
def test_lines_the_cache_cannot_reuse_are_written_by_prometheus_client(accept):
    encoder, _ = choose_encoder(accept)
    cache = LineCache(encoder)
    for value in (1.0, 2.5, 1.0, 3.25):  # values change; a sample with an exemplar equal to its value too
        families = odd_families(value)
        assert cache.encode(families) == encoder(Families(families))


def test_a_series_gone_from_the_snapshot_leaves_the_cache():
    encoder, _ = choose_encoder("")
    cache = LineCache(encoder)
    for pods in (["a", "b", "c"], ["c", "d"], ["e"]):
        family = GaugeMetricFamily("pod_gauge", "one series per pod", labels=["pod"])
        for pod in pods:
            family.add_metric([pod], 1.0)
        assert cache.encode([family]) == encoder(Families([family]))
        assert len(cache._lines) == len(pods)


class Snapshots:
    """The sampler's ``snapshot()``: a new object each cycle."""

    def __init__(self):
        self.current = object()

    def __call__(self):
        return self.current


class BlockingFamilies(Families):
    """A registry whose collect() waits, as a render of a big node does, until it is let go."""

    def __init__(self, families):
        super().__init__(families)
        self.entered, self.release = threading.Event(), threading.Event()
        self.block = False

    def collect(self):
        if self.block:
            self.entered.set()
            assert self.release.wait(60)
        return super().collect()


def test_a_scrape_during_a_render_gets_the_previous_answer_at_once():
    """While the sampler renders a new snapshot, a scrape of a format rendered before answers with the
    previous snapshot's bytes instead of waiting (50 scrapers used to queue behind each render); once
    the render is done, scrapes get the new snapshot."""
    registry, snapshots = BlockingFamilies(odd_families(1.0)), Snapshots()
    exposition = ExpositionCache(registry, snapshots)
    before, _ = exposition.render("", gzip_ok=False)
    registry.families, registry.block = odd_families(2.0), True
    snapshots.current = object()  # the sampler publishes a new snapshot and starts rendering it
    render = threading.Thread(target=exposition.prepare)
    render.start()
    try:
        assert registry.entered.wait(10)
        during, _ = exposition.render("", gzip_ok=False)
        # answered while the render is still held (no clock needed): a scrape that waited for it would
        # have outlived the render's 60 s hold
        assert render.is_alive() and not registry.release.is_set()
        assert during == before
    finally:
        registry.release.set()
        render.join(10)
    after, _ = exposition.render("", gzip_ok=False)
    assert after != before and b"2.0" in after


def test_a_format_never_rendered_waits_for_the_render_rather_than_answer_nothing():
    registry, snapshots = BlockingFamilies(odd_families(1.0)), Snapshots()
    exposition = ExpositionCache(registry, snapshots)
    exposition.render("", gzip_ok=False)
    registry.block = True
    snapshots.current = object()
    render = threading.Thread(target=exposition.prepare)
    render.start()
    assert registry.entered.wait(10)
    answers: list[bytes] = []
    scrape = threading.Thread(target=lambda: answers.append(exposition.render("", gzip_ok=True)[0]))
    scrape.start()
    scrape.join(0.5)
    assert scrape.is_alive(), "a gzip answer exists for no snapshot yet: the scrape must wait for the render"
    registry.release.set()
    render.join(10)
    scrape.join(10)
    assert gzip.decompress(answers[0]).count(b"\n") > 2
