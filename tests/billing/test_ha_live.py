"""HA pairs live (issue 17, item 2): two real Prometheus servers scraping one exporter every second
under the external labels replica="r1" and replica="r2", both remote-writing into one
VictoriaMetrics, as a kube-prometheus-stack pair with a long-term store runs.

r1 is stopped partway (a replica lost); then the exporter stops, so r2 marks every series stale and
remote-writes those staleness markers too (the path docs/billing.md §6.4 left untested with imported
history). The same hours billed from VictoriaMetrics (both replicas' series side by side, nothing
de-duplicated there: billing's own ``max by`` merges them, and the engines list r1's series first),
from r2 alone and from the pair itself (`ReplicaSetClient`) must be one ledger, the complete
replica's; r1 alone bills less.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from gpumeter.billing.ingest import IngestConfig, ingest_hours
from gpumeter.billing.ledger import MEMORY_URL, open_ledger
from gpumeter.billing.models import hour_floor
from gpumeter.billing.prom import PrometheusClient, ReplicaSetClient, open_client
from tests.billing import factories
from tests.support.exporter_process import ExporterProcess
from tests.support.servers import PrometheusServer, VictoriaMetricsServer

FLEET, NODE = "h100-mig", "gpu-h100-mig-01"  # 8 H100s in MIG 1g.10gb x 7, pods on the instances
CONFIG = IngestConfig(scrape_interval=1)  # PrometheusServer scrapes every second
pytestmark = [pytest.mark.prometheus, pytest.mark.victoriametrics, pytest.mark.slow]


def _samples(server, selector: str) -> float:
    """Samples of ``selector`` in the last hour, summed over its series."""
    found = server.query(f"sum(count_over_time({selector}[1h]))")
    return float(found[0]["value"][1]) if found else 0.0


def _bill(client, book, hours):
    ledger = open_ledger(MEMORY_URL)
    for hour in hours:  # one hour at a time: instant queries at the hour's end, as the hourly service
        result = ingest_hours(client, ledger, book, [hour], CONFIG)
        assert result.failed == [] and result.ingested == [hour], result
    return ledger


def _state(ledger, hours):
    counts = {k: v for k, v in ledger.counts().items() if k != "ingest_runs"}
    lines = sorted(
        (x.hour, x.uuid, x.kind, x.namespace, x.pod, x.gpu_instance_id, x.amount, x.quantity)
        for x in ledger.lines(hours[0], hours[-1] + timedelta(hours=1))
    )
    facts = sorted(
        (a.uuid, a.gpu_instance_id, a.namespace, a.pod, a.allocated_seconds)
        for hour in hours
        for gh in ledger.facts(hour)
        for a in gh.allocations
    )
    return counts, lines, facts


def test_a_live_pair_remote_writing_to_victoriametrics_bills_the_complete_replica(tmp_path):
    book = factories.book(tmp_path, {"H100-80GB": {"hourly_rate": "6.88"}})
    exporter = ExporterProcess(FLEET, NODE, str(tmp_path / "kubelet.sock"), tmp_path)
    # VictoriaMetrics answers only up to now - 30 s by default (-search.latencyOffset): look at all
    vm = VictoriaMetricsServer(
        tmp_path / "vm", extra_args=["-search.latencyOffset=0s", "-search.disableCache"]
    ).start()
    replicas = {
        name: PrometheusServer(
            tmp_path / name,
            scrape_targets={"gpu": [f"127.0.0.1:{exporter.port}"]},
            external_labels={"replica": name},
            remote_write=[f"{vm.url}/api/v1/write"],
        )
        for name in ("r1", "r2")
    }
    r1, r2 = replicas["r1"], replicas["r2"]
    started = datetime.now(UTC)
    try:
        for server in (r1, r2):
            server.start()
        for server in (r1, r2):
            server.wait_for("count_over_time(nvidia_gpu_allocation[1h]) > 8", timeout=60)
        r1.stop()  # the replica lost: r2 goes on scraping
        r2.wait_for("count_over_time(nvidia_gpu_allocation[1h]) > 16", timeout=60)
        exporter.stop()  # its target down: r2 writes a staleness marker for every series
        r2.wait_for("absent(nvidia_gpu_allocation)", timeout=60)
        r2.wait_for('up{job="gpu"} == 0', timeout=60)
        allocations = _samples(r2, "nvidia_gpu_allocation")
        assert allocations > 0
        # everything r2 holds has reached VictoriaMetrics (remote write sends within seconds)
        vm.wait_for(
            'sum(count_over_time(nvidia_gpu_allocation{replica="r2"}[1h]))',
            predicate=lambda found: bool(found) and float(found[0]["value"][1]) == allocations,
            timeout=60,
        )
        assert 0 < _samples(vm, 'nvidia_gpu_allocation{replica="r1"}') < allocations

        hours = sorted({hour_floor(started), hour_floor(datetime.now(UTC))})
        with PrometheusClient(vm.url) as client:
            from_store = _bill(client, book, hours)
        with PrometheusClient(r2.url) as client:
            from_r2 = _bill(client, book, hours)
        r1.start()  # the pair answers again (no new samples: the exporter is gone)
        with open_client(f"{r1.url},{r2.url}") as client:
            assert isinstance(client, ReplicaSetClient)
            from_pair = _bill(client, book, hours)
        with PrometheusClient(r1.url) as client:
            from_r1 = _bill(client, book, hours)
    finally:
        for server in (r1, r2):
            server.stop()
        vm.stop()
        exporter.stop()

    complete = _state(from_r2, hours)
    _, lines, facts = complete
    assert facts and lines  # pods held MIG instances, and their hours were priced
    held = sum(seconds for *_, seconds in facts)
    assert held > 0 and sum(line[6] for line in lines) > Decimal(0)
    assert _state(from_store, hours) == complete
    assert _state(from_pair, hours) == complete
    assert sum(seconds for *_, seconds in _state(from_r1, hours)[2]) < held  # r1 alone misses the tail
