"""Issue 52's "Done when", live: a GB200 NVL72 rack (18 nodes, 72 GPUs) and an HGX B200 node, each node an
exporter with its stand-in kubelet in its own process, scraped by a real Prometheus with the project's rules.

* Every GPU has the contract's device series, including its fabric state and health, and every MIG
  instance its MIG series; every pod the fleet files run holds its GPU or instance.
* The rack is one NVLink domain of 72 registered GPUs, the HGX baseboard one of 8.
* A degraded fabric health injected on one GPU and a failed registration on another fire
  GpuFabricHealthDegraded, GpuFabricRegistrationIncomplete and GpuNvlinkDomainShrank (rules as shipped,
  ``for:`` divided by 60 as in test_fault_injection_e2e.py), and the fleet dashboard's fabric row shows them.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpumeter import contract
from gpumeter.dashboards.build import GENERATED
from gpumeter.simulator.fleet import load_fleet
from tests.alerts.test_fault_injection_e2e import JOB, scaled_rule_files
from tests.dashboards.promql import queries, substitute
from tests.support.exporter_process import ExporterProcess
from tests.support.servers import PrometheusServer

pytestmark = [pytest.mark.slow, pytest.mark.prometheus]

RACK, HGX = "gb200-nvl72", "b200"
DEGRADED = ("gb200-nvl72-05", 1)  # (node, gpu): fabric health degraded_bw
UNREGISTERED = ("gb200-nvl72-09", 2)  # (node, gpu): registration failed

# What every Blackwell GPU serves (an idle or busy one, MIG or not), and every MIG instance
DEVICE_SERIES = (
    contract.GPU_INFO,
    contract.GPU_UP,
    contract.TEMPERATURE,
    contract.MEMORY_TEMPERATURE,
    contract.TEMPERATURE_THRESHOLD,
    contract.POWER,
    contract.POWER_LIMIT,
    contract.POWER_MANAGEMENT_LIMIT,
    contract.ENERGY,
    contract.MEMORY_TOTAL,
    contract.MEMORY_USED,
    contract.CLOCK,
    contract.CLOCK_MAX,
    contract.CLOCKS_EVENT_ACTIVE,
    contract.CLOCKS_EVENT_SECONDS,
    contract.ECC_ERRORS,
    contract.PCIE_LINK_GENERATION,
    contract.NVLINK_UP,
    contract.NVLINK_ERRORS,
    contract.FABRIC_INFO,
    contract.FABRIC_REGISTERED,
    contract.FABRIC_HEALTH,
    contract.FABRIC_HEALTH_OVERALL,
    contract.FABRIC_HEALTH_MASK,
)
# NVML reports row remapping of GPUs outside MIG mode only (the simulator follows it)
WHOLE_GPU_SERIES = (contract.REMAPPED_ROWS,)
MIG_SERIES = (contract.MIG_INFO, contract.MIG_MEMORY_TOTAL, contract.MIG_MEMORY_USED, contract.SM_ACTIVE)


@pytest.fixture(scope="module")
def live(tmp_path_factory) -> Iterator[tuple[PrometheusServer, dict[str, ExporterProcess]]]:
    workdir = tmp_path_factory.mktemp("blackwell-live")
    sockets = Path(tempfile.mkdtemp(prefix="gmb", dir="/tmp"))  # unix socket paths must stay short
    exporters: dict[str, ExporterProcess] = {}
    try:
        for fleet in (RACK, HGX):
            for node in load_fleet(fleet).nodes:
                exporters[node.name] = ExporterProcess(
                    fleet, node.name, str(sockets / f"{node.name}.sock"), workdir
                )
        with PrometheusServer(
            workdir / "prometheus",
            scrape_targets={JOB: [f"127.0.0.1:{e.port}" for e in exporters.values()]},
            rule_files=scaled_rule_files(workdir / "rules"),
            scrape_interval="1s",
            evaluation_interval="1s",
        ) as prom:
            prom.wait_for("count(nvidia_gpu_fabric_info) == 80", timeout=120)
            # and the rules have seen every GPU: an evaluation between the first and the last node's
            # first scrape recorded a part of the rack (40 of its 72 GPUs pooled, 2026-12-07)
            prom.wait_for("sum(pool:nvidia_gpu_info:count) == 80", timeout=120)
            yield prom, exporters
    finally:
        for exporter in exporters.values():
            exporter.stop()
        shutil.rmtree(sockets, ignore_errors=True)


def _uuid(fleet: str, node: str, gpu: int) -> str:
    return load_fleet(fleet).node(node).gpus[gpu].uuid


def test_every_gpu_and_mig_instance_serves_the_contracts_series(live):
    prom, _ = live
    fleets = [load_fleet(RACK), load_fleet(HGX)]
    gpus = {g.uuid: g for f in fleets for n in f.nodes for g in n.gpus}
    assert len(gpus) == 80
    for series in DEVICE_SERIES:
        seen = {r["metric"]["uuid"] for r in prom.query(f"group by (uuid) ({series.name})")}
        assert seen == set(gpus), (series.name, sorted(set(gpus) - seen)[:3])
    for series in WHOLE_GPU_SERIES:
        seen = {r["metric"]["uuid"] for r in prom.query(f"group by (uuid) ({series.name})")}
        assert seen == {u for u, g in gpus.items() if not g.mig}, series.name
    instances = {(g.uuid, str(m.gpu_instance_id)) for g in gpus.values() for m in g.mig}
    assert len(instances) == 4 + 4 + 7  # gb200-nvl72-18's GPU 3; b200's GPUs 6 and 7
    for series in MIG_SERIES:
        seen = {
            (r["metric"]["uuid"], r["metric"]["gpu_instance_id"])
            for r in prom.query(f'group by (uuid, gpu_instance_id) ({series.name}{{gpu_instance_id!=""}})')
        }
        assert seen == instances, series.name
    # every pod of the fleet files that is running now (the always-on ones) holds what its file says
    held = {
        (
            r["metric"]["namespace"],
            r["metric"]["pod"],
            r["metric"]["uuid"],
            r["metric"].get("gpu_instance_id", ""),
        )
        for r in prom.query("group by (namespace, pod, uuid, gpu_instance_id) (nvidia_gpu_allocation)")
    }
    for fleet in fleets:
        for pod in fleet.pods:
            if pod.end_s is not None:
                continue  # scheduled pods may be outside their window now
            for device in pod.devices:
                gpu = fleet.node(pod.node).gpus[device.gpu]
                gi = "" if device.gpu_instance_id is None else str(device.gpu_instance_id)
                assert (pod.namespace, pod.name, gpu.uuid, gi) in held, (pod.name, pod.node)


def test_the_rack_is_one_nvlink_domain_of_72_gpus_and_the_baseboard_one_of_8(live):
    prom, _ = live
    # GPUs that report each domain (a GPU whose registration failed still reports it: the other test's
    # fault does not change this, whichever runs first)
    domains = prom.query("count by (nvlink_domain) (group by (nvlink_domain, uuid) (nvidia_gpu_fabric_info))")
    assert sorted(int(r["value"][1]) for r in domains) == [8, 72]
    states = prom.query('count(nvidia_gpu_fabric_info{state="completed"})')
    assert int(states[0]["value"][1]) == 80
    # a rack spanning 18 nodes pools as one (docs/capacity.md, "Pools"); the HGX node by its model
    pools = {r["metric"]["pool"]: int(r["value"][1]) for r in prom.query("pool:nvidia_gpu_info:count")}
    (rack_pool,) = [p for p in pools if p.startswith("nvlink-")]
    assert pools == {rack_pool: 72, "NVIDIA B200": 8}


def test_injected_fabric_faults_fire_the_fabric_alerts_and_show_on_the_dashboard(live):
    prom, exporters = live
    # before: the domain had 72 registered GPUs, and no fabric alert fires (one may be pending while the
    # 18 trays' first scrapes arrive one by one)
    prom.wait_for("max_over_time(nvlink_domain:nvidia_gpu_fabric_registered:count[1d]) == 72", timeout=60)
    assert prom.query('ALERTS{alertstate="firing", alertname=~"GpuFabric.*|GpuNvlinkDomainShrank"}') == []
    node, gpu = DEGRADED
    exporters[node].inject({"fault": "fabric_health", "gpu": gpu, "condition": "degraded_bw"})
    node, gpu = UNREGISTERED
    exporters[node].inject({"fault": "fabric_registration", "gpu": gpu, "state": "failed"})
    degraded, unregistered = _uuid(RACK, *DEGRADED), _uuid(RACK, *UNREGISTERED)

    firing = prom.wait_for(
        'ALERTS{alertstate="firing", alertname=~"GpuFabricHealthDegraded|GpuFabricRegistrationIncomplete|'
        'GpuNvlinkDomainShrank"}',
        timeout=120,
        predicate=lambda result: len({r["metric"]["alertname"] for r in result}) == 3,
    )
    by_name = {r["metric"]["alertname"]: r["metric"] for r in firing}
    assert len(firing) == 3, firing  # one GPU each, one domain: nothing else fires
    assert by_name["GpuFabricHealthDegraded"]["uuid"] == degraded
    assert by_name["GpuFabricHealthDegraded"]["condition"] == "degraded_bw"
    assert by_name["GpuFabricHealthDegraded"]["hostname"] == DEGRADED[0]
    assert by_name["GpuFabricRegistrationIncomplete"]["uuid"] == unregistered
    assert by_name["GpuFabricRegistrationIncomplete"]["status"] == "unknown"
    shrank = by_name["GpuNvlinkDomainShrank"]
    rack_domain = prom.query(f'nvidia_gpu_fabric_info{{uuid="{degraded}"}}')[0]["metric"]["nvlink_domain"]
    assert shrank["nvlink_domain"] == rack_domain
    assert (
        int(
            float(
                prom.query(
                    f'nvlink_domain:nvidia_gpu_fabric_registered:count{{nvlink_domain="{rack_domain}"}}'
                )[0]["value"][1]
            )
        )
        == 71
    )

    # the fleet dashboard's NVLink domain row, its queries as Grafana would send them for "All"
    fleet = json.loads((GENERATED / "gpumeter-fleet.json").read_text())
    (faults_query,) = [f.expr for f in queries(fleet) if f.where == "panel 'Fabric faults' / A"]
    faults = prom.query(substitute(faults_query))
    assert {(r["metric"]["uuid"], r["metric"]["condition"]) for r in faults} == {
        (degraded, "degraded_bw"),
        (unregistered, "not registered"),
    }
