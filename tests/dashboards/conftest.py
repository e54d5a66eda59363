"""A real Prometheus that has scraped the simulated fleets (with pods, through stand-in kubelets) and
the billing service's /metrics, with the gpumeter recording and alerting rules loaded; and a real
VictoriaMetrics holding the same series, remote-written to it by that Prometheus (scraped samples,
recorded series and ALERTS alike), so that every dashboard query runs on both engines.

Faults are injected so that panels that are legitimately empty on a healthy fleet (throttling, XIDs,
ECC and row-remap errors, NVLink trouble, alerts) have data to show.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from wsgiref.simple_server import WSGIRequestHandler, make_server

import pytest

from gpumeter.billing.allocate import price_gpu_hour
from gpumeter.billing.config import Budget
from gpumeter.billing.ledger import open_ledger
from gpumeter.billing.ledger.base import HourRecord
from gpumeter.billing.models import Allocation, Device, GpuHour, MigInstance
from gpumeter.reports.schedule import ReportSchedule
from gpumeter.service import JOBS, build_app, job_triggers
from gpumeter.simulator.fleet import load_fleet
from gpumeter.simulator.kube_state_metrics import PendingPod, Quota, StandInKubeStateMetrics
from gpumeter.simulator.kubeapi import StandInKubeApi
from gpumeter.simulator.volcano import StandInVolcano, VolcanoQueue
from tests.billing.factories import book
from tests.support.exporter_process import ExporterProcess
from tests.support.servers import PrometheusServer, VictoriaMetricsServer

ROOT = Path(__file__).resolve().parents[2]
RULE_FILES = [ROOT / "alerts" / "gpumeter-rules.yaml", ROOT / "alerts" / "gpumeter-alerts.yaml"]
EXPORTER_JOB = "gpumeter-exporter"
BILLING_JOB = "gpumeter-billing"
KSM_JOB = "kube-state-metrics"
VOLCANO_JOB = "volcano-scheduler"
# A queue within its share with jobs waiting, and one borrowing (docs/capacity.md §Volcano queues).
VOLCANO_QUEUES = (
    VolcanoQueue("research", deserved=8, allocated=6, requested=10, pending_podgroups=2),
    VolcanoQueue("batch", deserved=4, allocated=6, requested=6),
)
# GPU demand the fleets' pods do not show (they all run): a 3g.20gb pod waiting 40 minutes, two whole
# GPUs waiting 5; and a GPU quota, for the capacity dashboard.
PENDING = (
    PendingPod("ml-research", "wait-3g", "nvidia.com/mig-3g.20gb", 1, created_s=-2400),
    PendingPod("vision", "wait-2gpu", "nvidia.com/gpu", 2, created_s=-300),
)
QUOTAS = (Quota("vision", "gpus", "requests.nvidia.com/gpu", hard=8, used=6),)
# (fleet, node, with a stand-in kubelet): the workstation has no Kubernetes but has fans.
FLEETS = (
    ("h100-mig", "gpu-h100-mig-01", True),
    ("a100-mixed", "gpu-a100-mixed-01", True),
    ("h200", "gpu-h200-01", True),  # whole Hopper GPUs: GPM profiling and NVLink rates per GPU
    ("workstation", "ws-01", False),
    ("v100-t4", "gpu-v100-01", True),  # before Ampere: retired pages instead of row remapping
    # shared GPUs: HAMi/gpushare grants read from the stand-in Kubernetes API, and a vGPU host of VMs
    ("shared-modes", "gpu-shared-frac-01", True),
    ("shared-modes", "gpu-shared-vgpu-01", False),
    # Blackwell on an NVSwitch baseboard: the NVLink fabric (no kubelet: its pods would change the others' rows)
    ("b200", "gpu-b200-01", False),
)
KUBE_API_NODES = {"gpu-shared-frac-01"}  # exporters that list their node's pods from the Kubernetes API
# Monthly budgets (docs/billing.md §4.4): search's is crossed by its two hours, research's is not
BUDGETS = {
    "search": Budget("search", Decimal(10), "USD"),
    "research": Budget("research", Decimal(5000), "USD"),
}
TEAMS = {
    "search-inference": "search",
    "ml-research": "research",
    "ml-training": "research",
    "vision": "vision",
    "nlp": "language",
    "data-eng": "data",
    "analytics": "data",
}
H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-40GB"


@dataclass
class Stack:
    prometheus: PrometheusServer
    victoriametrics: VictoriaMetricsServer
    exporters: dict[str, ExporterProcess]
    # when every wait below held: the faults' alerts are firing then. Some resolve by design a few
    # minutes after the fault (GpuXidCritical: 5 min), while a session's last test may come 10 min
    # later, so a test of what was firing asks Prometheus about this moment.
    ready_at: float


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args):
        pass


def _billing_hours(hour: datetime) -> list[GpuHour]:
    """A few GPU-hours like the simulated fleets': H100 MIG 1g.10gb x7, A100 3g+2g+1g+1g with one
    slice unheld, A100 3g+3g (stranded 7th slice), an A100 time-sliced four ways, and a GPU model the
    price book lacks (unpriced)."""
    h100 = "GPU-h100-0"
    h100_mig = [MigInstance(h100, str(gi), "1g.10gb", 1, 1, 3600) for gi in range(7, 14)]
    h100_alloc = [
        Allocation(h100, "search-inference", f"ranker-0-{gi}", "server", 3600, Decimal(1), str(gi), "1g.10gb")
        for gi in range(7, 13)
    ]
    a100 = "GPU-a100-0"
    a100_mig = [
        MigInstance(a100, "1", "3g.20gb", 3, 4, 3600),
        MigInstance(a100, "3", "2g.10gb", 2, 2, 3600),
        MigInstance(a100, "7", "1g.5gb", 1, 1, 3600),
        MigInstance(a100, "8", "1g.5gb", 1, 1, 3600),
    ]
    a100_alloc = [
        Allocation(a100, "vision", "detector-train", "trainer", 3600, Decimal(1), "1", "3g.20gb"),
        Allocation(a100, "nlp", "tokenizer-svc", "server", 3600, Decimal(1), "3", "2g.10gb"),
        Allocation(a100, "nlp", "embedder-7", "server", 1800, Decimal(1), "7", "1g.5gb"),
    ]
    stranded = "GPU-a100-1"
    stranded_mig = [
        MigInstance(stranded, "1", "3g.20gb", 3, 4, 3600),
        MigInstance(stranded, "2", "3g.20gb", 3, 4, 3600),
    ]
    stranded_alloc = [
        Allocation(stranded, "vision", "segmenter-1", "trainer", 3600, Decimal(1), "1", "3g.20gb")
    ]
    sliced = "GPU-a100-4"
    sliced_alloc = [
        Allocation(
            sliced, "data-eng", f"etl-{r}", "worker", 3600, Decimal("0.25"), resource="nvidia.com/gpu.shared"
        )
        for r in range(3)
    ]
    whole = "GPU-a100-2"
    return [
        GpuHour(hour, Device(h100, H100, 3600, "gpu-h100-mig-01", "0", True), h100_mig, h100_alloc),
        GpuHour(hour, Device(a100, A100, 3600, "gpu-a100-mixed-01", "0", True), a100_mig, a100_alloc),
        GpuHour(
            hour, Device(stranded, A100, 3600, "gpu-a100-mixed-01", "1", True), stranded_mig, stranded_alloc
        ),
        GpuHour(hour, Device(sliced, A100, 3600, "gpu-a100-mixed-01", "4"), [], sliced_alloc),
        GpuHour(
            hour,
            Device(whole, A100, 3600, "gpu-a100-mixed-01", "2"),
            [],
            [Allocation(whole, "vision", "labeler", "main", 3600)],
        ),
        GpuHour(
            hour,
            Device("GPU-vr200-0", "NVIDIA VR200", 3600, "gpu-vr200-01", "0"),
            [],
            [Allocation("GPU-vr200-0", "analytics", "notebook-0", "jupyter", 3600)],
        ),
    ]


RATES = {"A100-40GB": "3.00", "H100-80GB": "6.88"}


@dataclass(frozen=True)
class LedgerSpec:
    """What the billing ledger holds (tests/clusters gives its second cluster another one)."""

    rates: dict[str, str] = field(default_factory=lambda: dict(RATES))
    currency: str = "USD"
    teams: dict[str, str] = field(default_factory=lambda: dict(TEAMS))
    hours_back: tuple[int, ...] = (3, 2)
    failed: bool = True


def _billing_ledger(workdir: Path, spec: LedgerSpec = LedgerSpec()):
    prices = book(
        workdir,
        {model: {"hourly_rate": rate} for model, rate in spec.rates.items()},
        sharing_efficiency={"mig": 1, "time_slicing": "0.75", "vgpu": 1},
        currency=spec.currency,
    )
    ledger = open_ledger(f"sqlite:///{workdir / 'ledger.db'}")
    now = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    for back in spec.hours_back:
        hour = now - timedelta(hours=back)
        hours = _billing_hours(hour)
        lines = [line for gh in hours for line in price_gpu_hour(gh, prices, spec.teams).lines]
        ledger.write_hour(HourRecord(hour, hours, lines, prices))
    if spec.failed:
        ledger.record_failure(now - timedelta(hours=1), "Prometheus unreachable (test)")
    # an hour ingested two days ago with no GPU in it: the budget forecast's 7-day window holds an
    # ingested hour (so the forecast is exported), and no cost changes
    ledger.write_hour(HourRecord(now - timedelta(days=2), [], [], prices))
    return ledger


# Faults per node, so that the panels that are empty on a healthy fleet have something to show: a GPU
# throttled by a hardware slowdown and by SW thermal, one overheating, XIDs (one on a MIG instance),
# uncorrected ECC errors, a pending row remap (A100 outside MIG mode), an NVLink CRC burst and a link down,
# a degraded fabric and a failed fabric registration.
FAULTS = {
    "gpu-h100-mig-01": [
        {"fault": "throttle", "gpu": 3, "reason": "hw_slowdown"},
        {"fault": "throttle", "gpu": 3, "reason": "sw_thermal"},
        {"fault": "overheat", "gpu": 2, "celsius": 45},
        {"fault": "xid", "gpu": 1, "code": 48, "gpu_instance_id": 8},
        {"fault": "ecc", "gpu": 1, "error_type": "uncorrected", "count": 2},
        {"fault": "nvlink_crc", "gpu": 0, "link": 1, "rate": 50},
        {"fault": "nvlink_down", "gpu": 0, "link": 2},
    ],
    # NVML reports row remapping of GPUs outside MIG mode only (the simulator follows it).
    "gpu-a100-mixed-01": [
        {"fault": "xid", "gpu": 4, "code": 31},
        {"fault": "row_remap", "gpu": 2, "kind": "pending"},
        {"fault": "row_remap", "gpu": 2, "kind": "uncorrected", "count": 1},
    ],
    "gpu-h200-01": [],
    "ws-01": [],
    "gpu-v100-01": [],
    "gpu-shared-frac-01": [],
    "gpu-shared-vgpu-01": [],
    # the fabric row's faults: degraded bandwidth on one GPU, a registration that failed on another
    "gpu-b200-01": [
        {"fault": "fabric_health", "gpu": 1, "condition": "degraded_bw"},
        {"fault": "fabric_registration", "gpu": 2, "state": "failed"},
    ],
}


def _wait(prom: PrometheusServer, promql: str, timeout: float = 60.0) -> None:
    prom.wait_for(promql, timeout=timeout)


@pytest.fixture(scope="package")
def stack() -> Iterator[Stack]:
    workdir = Path(tempfile.mkdtemp(prefix="gm-dash-"))
    sockets = Path(tempfile.mkdtemp(prefix="gmk", dir="/tmp"))  # unix socket paths must stay short
    exporters: dict[str, ExporterProcess] = {}
    ledger = server = prom = vm = None
    kube_state: list[StandInKubeStateMetrics] = []
    volcano = StandInVolcano(VOLCANO_QUEUES).start()
    kube_api = StandInKubeApi(load_fleet("shared-modes")).start()
    try:
        # one stand-in kube-state-metrics per fleet with Kubernetes; the demand and quotas on the first
        for index, fleet_name in enumerate(sorted({f for f, _, kubelet in FLEETS if kubelet})):
            extra = (PENDING, QUOTAS) if index == 0 else ((), ())
            kube_state.append(StandInKubeStateMetrics(load_fleet(fleet_name), *extra).start())
        for index, (fleet_name, node, with_kubelet) in enumerate(FLEETS):
            socket = str(sockets / f"{index}.sock") if with_kubelet else ""
            api = kube_api.base_url if node in KUBE_API_NODES else ""
            exporters[node] = ExporterProcess(fleet_name, node, socket, workdir, api, FAULTS[node])
        ledger = _billing_ledger(workdir)
        # the job status a `billing serve` starts with (its ingest and report triggers), not whatever
        # an earlier test in this worker left in the process-wide JOBS
        schedule = ReportSchedule()
        JOBS.start(datetime.now(UTC), job_triggers(schedule, schedule.trigger()), due_at_start=("ingest",))
        server = make_server("127.0.0.1", 0, build_app(ledger, budgets=BUDGETS), handler_class=_Quiet)
        threading.Thread(target=server.serve_forever, name="billing-metrics", daemon=True).start()
        # VictoriaMetrics answers only up to now - 30 s by default (-search.latencyOffset, for samples
        # still in flight); the fleets are seconds old here, so look at everything that has arrived.
        vm = VictoriaMetricsServer(
            workdir / "victoriametrics", extra_args=["-search.latencyOffset=0s", "-search.disableCache"]
        ).start()
        prom = PrometheusServer(
            workdir / "prometheus",
            remote_write=[f"{vm.url}/api/v1/write"],
            scrape_targets={
                EXPORTER_JOB: [f"127.0.0.1:{e.port}" for e in exporters.values()],
                BILLING_JOB: [f"127.0.0.1:{server.server_address[1]}"],
                KSM_JOB: [f"127.0.0.1:{k.port}" for k in kube_state],
                VOLCANO_JOB: [f"127.0.0.1:{volcano.port}"],
            },
            rule_files=RULE_FILES,
        ).start()
        # Enough samples for rates and for the rules and alerts to have evaluated.
        for promql in (
            f"count(nvidia_gpu_info) == {sum(len(load_fleet(f).node(n).gpus) for f, n, _ in FLEETS)}",
            "nvidia_gpu_allocation",
            "nvidia_gpu_xid_errors_total",
            "allocation:nvidia_gpu_utilization_ratio:join",
            "gpumeter_billing_cost_total",
            'ALERTS{alertname="GpuHardwareSlowdown"}',
            'ALERTS{alertname="GpuXidCritical"}',
            "nvidia_gpu_remapped_rows_pending == 1",
            "increase(nvidia_gpu_nvlink_errors_total[1h]) > 0",
            "uuid:nvidia_gpu_clocks_event_seconds:rate5m > 0",
            "count_over_time(nvidia_gpu_info[1m]) > 5",
            "namespace_pod_resource:kube_pod_pending_gpu_wait:seconds",
            "hostname:nvidia_gpu_mig_fragmentation:ratio",
            "queue_resource:volcano_queue_gpu_deserved_used:ratio",
        ):
            _wait(prom, promql)
        yield Stack(prom, vm, exporters, time.time())
    finally:
        if prom is not None:
            prom.stop()
        if vm is not None:
            vm.stop()
        if server is not None:
            server.shutdown()
            server.server_close()
        for exporter in exporters.values():
            exporter.stop()
        for stand_in in kube_state:
            stand_in.stop()
        volcano.stop()
        kube_api.stop()
        if ledger is not None:
            ledger.close()
        shutil.rmtree(sockets, ignore_errors=True)
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="package")
def prom(stack: Stack) -> PrometheusServer:
    return stack.prometheus


@pytest.fixture(scope="package")
def victoriametrics(stack: Stack) -> VictoriaMetricsServer:
    """The VictoriaMetrics behind the stack's Prometheus, once the remote write has caught up with
    what the Prometheus readiness checks waited for (the slowest: an alert that has fired)."""
    vm = stack.victoriametrics
    deadline = time.monotonic() + 60
    for promql in ('ALERTS{alertname="GpuXidCritical"}', "hostname:nvidia_gpu_mig_fragmentation:ratio"):
        while not vm.query(promql):
            if time.monotonic() > deadline:
                raise AssertionError(f"VictoriaMetrics never received {promql} by remote write")
            time.sleep(0.25)
    return vm


@pytest.fixture(params=["prometheus", pytest.param("victoriametrics", marks=pytest.mark.victoriametrics)])
def query_backend(request, stack: Stack):
    """The engine a dashboard query runs on: the Prometheus itself, or VictoriaMetrics fed by it."""
    return stack.prometheus if request.param == "prometheus" else request.getfixturevalue("victoriametrics")


def settle(seconds: float) -> None:
    time.sleep(seconds)
