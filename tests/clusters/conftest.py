"""Two clusters behind one global store, real parts only (docs/kubernetes.md, "Many clusters behind
one global store").

Each cluster, east and west, is what tests/dashboards/conftest.py runs for one: the simulated fleets'
exporters (with stand-in kubelets and faults), stand-in kube-state-metrics, Volcano and Kubernetes API,
a billing service over its own ledger, and its own real Prometheus, which scrapes them, evaluates the
gpumeter rules itself, and remote-writes what it scraped into one real VictoriaMetrics with
``external_labels: {cluster: …}``. There a real vmalert evaluates the same rule files (every ``for:``
divided by 60, as in tests/alerts/test_fault_injection_e2e.py) and sends to a real Alertmanager with a
webhook behind it.

The clusters share node names (the collision a global store meets) but differ in everything else:
west's fleets are the same files with another seed (so other UUIDs and loads), it has one more node,
other faults, other pending pods, quotas, Volcano queues and prices.

The Prometheus servers do not remote-write their own rule results or ALERTS: in a global store the
rules are evaluated once, there (vmalert, Thanos Ruler, Mimir's ruler), and a cluster's recorded series
would otherwise meet the global ruler's under the same labels.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from wsgiref.simple_server import make_server

import pytest
import yaml

from gpumeter.billing.config import Budget
from gpumeter.reports.schedule import ReportSchedule
from gpumeter.service import JOBS, build_app, job_triggers
from gpumeter.simulator.fleet import FLEETS_DIR, load_fleet
from gpumeter.simulator.kube_state_metrics import PendingPod, Quota, StandInKubeStateMetrics
from gpumeter.simulator.kubeapi import StandInKubeApi
from gpumeter.simulator.volcano import StandInVolcano, VolcanoQueue
from tests.alerts.test_fault_injection_e2e import fast_alertmanager_config, scaled_rule_files
from tests.dashboards import conftest as one
from tests.support.exporter_process import ExporterProcess
from tests.support.servers import (
    AlertmanagerServer,
    PrometheusServer,
    VictoriaMetricsServer,
    VmalertServer,
    Webhook,
)

# Recorded series (level:metric:operation) and the alerts' own series stay in the cluster's Prometheus.
KEEP_RULE_RESULTS_LOCAL = {
    "source_labels": ["__name__"],
    "regex": "ALERTS|ALERTS_FOR_STATE|.+:.+",
    "action": "drop",
}


@dataclass(frozen=True)
class ClusterSpec:
    name: str
    seed_offset: int  # added to every fleet's seed: other UUIDs, other loads
    fleets: tuple[tuple[str, str, bool], ...]  # (fleet, node, with a stand-in kubelet)
    faults: dict[str, list[dict]]
    pending: tuple[PendingPod, ...]
    quotas: tuple[Quota, ...]
    queues: tuple[VolcanoQueue, ...]
    ledger: one.LedgerSpec
    budgets: dict[str, Budget]
    # scrape targets nothing listens on (a job named n times: n of them), so that a cluster has exporters
    # or a billing service down; three exporters' GpumeterExporterDown keep west's count of firing alerts
    # above east's whatever other alerts are still pending when a test looks
    dead_targets: tuple[str, ...] = ()


WEST_FAULTS = {
    "gpu-h100-mig-01": [
        {"fault": "throttle", "gpu": 5, "reason": "hw_slowdown"},
        {"fault": "throttle", "gpu": 4, "reason": "sw_thermal"},
        {"fault": "overheat", "gpu": 6, "celsius": 40},
        {"fault": "xid", "gpu": 2, "code": 48, "gpu_instance_id": 8},
        {"fault": "ecc", "gpu": 2, "error_type": "uncorrected", "count": 5},
        {"fault": "nvlink_crc", "gpu": 1, "link": 3, "rate": 20},
        {"fault": "nvlink_down", "gpu": 1, "link": 4},
    ],
    # the fabric row: a route recovery on another GPU than east's degraded one, and no failed registration
    "gpu-b200-01": [{"fault": "fabric_health", "gpu": 5, "condition": "route_recovery"}],
    "gpu-a100-mixed-01": [
        {"fault": "xid", "gpu": 5, "code": 31},
        {"fault": "row_remap", "gpu": 2, "kind": "pending"},
        {"fault": "row_remap", "gpu": 2, "kind": "uncorrected", "count": 3},
    ],
}

WEST_TEAMS = {**one.TEAMS, "nlp": "language-west", "vision": "vision-west"}  # same namespaces, other owners

CLUSTERS = (
    ClusterSpec(
        "east",
        0,
        one.FLEETS,
        one.FAULTS,
        one.PENDING,
        one.QUOTAS,
        one.VOLCANO_QUEUES,
        one.LedgerSpec(),
        one.BUDGETS,
    ),
    ClusterSpec(
        "west",
        1000,
        # one node more than east: a second MIG host, the h100-mig node renamed
        (*one.FLEETS, ("h100-mig:gpu-h100-mig-02", "gpu-h100-mig-02", True)),
        {
            **{node: [] for _, node, _ in one.FLEETS},
            **WEST_FAULTS,
            "gpu-h200-01": [{"fault": "gpu_lost", "gpu": 7}],
            "gpu-h100-mig-02": [],
        },
        (
            PendingPod("ml-training", "wait-7g", "nvidia.com/mig-7g.80gb", 1, created_s=-3000),
            PendingPod("nlp", "wait-1gpu", "nvidia.com/gpu", 1, created_s=-120),
        ),
        (Quota("nlp", "gpus", "requests.nvidia.com/gpu", hard=4, used=3),),
        (
            VolcanoQueue("inference", deserved=6, allocated=3, requested=5, pending_podgroups=1),
            VolcanoQueue("training", deserved=2, allocated=4, requested=8, pending_podgroups=3),
        ),
        one.LedgerSpec(
            rates={"A100-40GB": "2.40", "H100-80GB": "5.10"},
            currency="EUR",
            teams=WEST_TEAMS,
            hours_back=(5, 4, 3),
            failed=False,
        ),
        {
            "search": Budget("search", Decimal(20), "EUR"),
            "language-west": Budget("language-west", Decimal(900), "EUR"),
        },
        dead_targets=(one.EXPORTER_JOB, one.EXPORTER_JOB, one.EXPORTER_JOB, one.BILLING_JOB),
    ),
)


@dataclass
class Cluster:
    spec: ClusterSpec
    prometheus: PrometheusServer
    exporters: dict[str, ExporterProcess] = field(default_factory=dict)


@dataclass
class Stack:
    clusters: dict[str, Cluster]
    victoriametrics: VictoriaMetricsServer
    vmalert: VmalertServer
    webhook: Webhook


def fleet_file(fleet: str, seed_offset: int, workdir: Path) -> str:
    """The shipped example ``fleet`` with its seed moved by ``seed_offset`` (other UUIDs, other loads);
    ``name:node`` also renames its node (pods and all), for a second node of the same make."""
    name, _, node = fleet.partition(":")
    if not seed_offset and not node:
        return name
    text = (FLEETS_DIR / f"{name}.yaml").read_text(encoding="utf-8")
    if node:
        (old_node,) = [n.name for n in load_fleet(name).nodes]
        text = text.replace(old_node, node)
    data = yaml.safe_load(text)
    data["seed"] = int(data.get("seed", 0)) + seed_offset + (7 if node else 0)
    path = workdir / f"{node or name}-seed{data['seed']}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return str(path)


class _Parts:
    """Everything a cluster runs besides its Prometheus, stopped in reverse."""

    def __init__(self) -> None:
        self.stops: list = []

    def add(self, part, stop=None):
        self.stops.append(stop or part.stop)
        return part

    def stop(self) -> None:
        for stop in reversed(self.stops):
            try:
                stop()
            except Exception:  # stop the rest whatever one of them raises
                pass


def _start_cluster(
    spec: ClusterSpec, workdir: Path, sockets: Path, vm: VictoriaMetricsServer, rules, parts: _Parts
):
    workdir.mkdir(parents=True)
    fleets = {name: fleet_file(name, spec.seed_offset, workdir) for name, _, _ in spec.fleets}
    kube_state = []
    for index, name in enumerate(sorted({f for f, _, kubelet in spec.fleets if kubelet})):
        extra = (spec.pending, spec.quotas) if index == 0 else ((), ())
        kube_state.append(parts.add(StandInKubeStateMetrics(load_fleet(fleets[name]), *extra).start()))
    volcano = parts.add(StandInVolcano(spec.queues).start())
    kube_api = parts.add(StandInKubeApi(load_fleet(fleets["shared-modes"])).start())
    exporters = {}
    for index, (name, node, with_kubelet) in enumerate(spec.fleets):
        socket = str(sockets / f"{spec.name[0]}{index}.sock") if with_kubelet else ""
        api = kube_api.base_url if node in one.KUBE_API_NODES else ""
        exporters[node] = parts.add(
            ExporterProcess(fleets[name], node, socket, workdir, api, spec.faults.get(node, []))
        )
    ledger = one._billing_ledger(workdir, spec.ledger)
    parts.stops.append(ledger.close)
    server = make_server("127.0.0.1", 0, build_app(ledger, budgets=spec.budgets), handler_class=one._Quiet)
    threading.Thread(target=server.serve_forever, name=f"billing-{spec.name}", daemon=True).start()
    parts.stops.append(lambda: (server.shutdown(), server.server_close()))
    # ports below 1024 that nothing here listens on (a free port picked now could be taken later)
    closed = iter(range(1, 1 + len(spec.dead_targets)))
    dead = {
        job: [f"127.0.0.1:{next(closed)}" for _ in range(spec.dead_targets.count(job))]
        for job in (one.EXPORTER_JOB, one.BILLING_JOB)
    }
    prometheus = PrometheusServer(
        workdir / "prometheus",
        scrape_targets={
            one.EXPORTER_JOB: [f"127.0.0.1:{e.port}" for e in exporters.values()] + dead[one.EXPORTER_JOB],
            one.BILLING_JOB: [f"127.0.0.1:{server.server_address[1]}"] + dead[one.BILLING_JOB],
            one.KSM_JOB: [f"127.0.0.1:{k.port}" for k in kube_state],
            one.VOLCANO_JOB: [f"127.0.0.1:{volcano.port}"],
        },
        rule_files=rules,
        scrape_interval="2s",
        evaluation_interval="2s",
        external_labels={"cluster": spec.name},
        remote_write=[{"url": f"{vm.url}/api/v1/write", "write_relabel_configs": [KEEP_RULE_RESULTS_LOCAL]}],
    )
    parts.add(prometheus.start())
    return Cluster(spec, prometheus, exporters)


# What both the clusters' Prometheus servers and VictoriaMetrics must show before the tests look:
# the faults' series, the rules' results and the alerts the faults raise.
READY = (
    "nvidia_gpu_allocation",
    "nvidia_gpu_xid_errors_total",
    "gpumeter_billing_cost_total",
    "nvidia_gpu_remapped_rows_pending == 1",
    "increase(nvidia_gpu_nvlink_errors_total[1h]) > 0",
    "count_over_time(nvidia_gpu_info[1m]) > 5",
    "uuid:nvidia_gpu_clocks_event_seconds:rate5m > 0",
    "namespace_pod_resource:kube_pod_pending_gpu_wait:seconds",
    "hostname:nvidia_gpu_mig_fragmentation:ratio",
    "queue_resource:volcano_queue_gpu_deserved_used:ratio",
    "allocation:nvidia_gpu_utilization_ratio:join",
    'ALERTS{alertname="GpuXidCritical", alertstate="firing"}',
    'ALERTS{alertname="GpuHardwareSlowdown", alertstate="firing"}',
)


@pytest.fixture(scope="package")
def stack() -> Iterator[Stack]:
    workdir = Path(tempfile.mkdtemp(prefix="gm-clusters-"))
    sockets = Path(tempfile.mkdtemp(prefix="gmc", dir="/tmp"))  # unix socket paths must stay short
    parts = _Parts()
    try:
        rules = scaled_rule_files(workdir / "rules")
        webhook = parts.add(Webhook().__enter__(), lambda: webhook.__exit__(None, None, None))
        am_config = fast_alertmanager_config(workdir / "alertmanager.yml", webhook.url)
        alertmanager = AlertmanagerServer(workdir / "alertmanager", am_config).__enter__()
        parts.stops.append(lambda: alertmanager.__exit__(None, None, None))
        vm = parts.add(
            VictoriaMetricsServer(
                workdir / "victoriametrics", extra_args=["-search.latencyOffset=0s", "-search.disableCache"]
            ).start()
        )
        vmalert = parts.add(
            VmalertServer(
                workdir / "vmalert",
                datasource=vm.url,
                rule_files=rules,
                alertmanager=alertmanager.url,
                evaluation_interval="2s",
            ).start()
        )
        # the billing services' job status, as a `billing serve` starts with it (tests/dashboards does the same)
        schedule = ReportSchedule()
        JOBS.start(datetime.now(UTC), job_triggers(schedule, schedule.trigger()), due_at_start=("ingest",))
        clusters = {
            spec.name: _start_cluster(spec, workdir / spec.name, sockets, vm, rules, parts)
            for spec in CLUSTERS
        }
        for name, cluster in clusters.items():
            for promql in READY:
                cluster.prometheus.wait_for(promql, timeout=180)
                vm.wait_for(with_cluster_matcher(promql, name), timeout=180)
        yield Stack(clusters, vm, vmalert, webhook)
    finally:
        parts.stop()
        shutil.rmtree(sockets, ignore_errors=True)
        shutil.rmtree(workdir, ignore_errors=True)


def with_cluster_matcher(promql: str, cluster: str) -> str:
    from gpumeter.dashboards.core import with_cluster

    return with_cluster(promql).replace('"$cluster"', f'"{cluster}"')
