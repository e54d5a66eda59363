"""DCGM beside gpumeter, end to end on a100-mixed: `gpumeter exporter --simulate a100-mixed` and the
stand-in dcgm-exporter of the same node, scraped by a real Prometheus loading gpumeter's recording rules.
Prometheus answers a utilization for every A100 MIG instance (NVML has none before Hopper), the
fleet-health report measures the MIG GPUs from DCGM and says so, and with the stand-in stopped they are
"not measured" again. The stand-in's exposition is checked line by line against dcgm-exporter's template.
"""

from __future__ import annotations

import re
import shutil
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpumeter.alerts import RULES_FILE
from gpumeter.billing.prom import PrometheusClient
from gpumeter.cli import main
from gpumeter.reports.health import HealthReport, read_devices
from gpumeter.reports.health_render import html_text
from gpumeter.reports.model import Period
from gpumeter.simulator.dcgm_exporter import StandInDcgmExporter, exposition
from gpumeter.simulator.device import SimulatedNode
from gpumeter.simulator.fleet import load_fleet
from gpumeter.simulator.kubelet import StandInKubelet
from tests.support.servers import PrometheusServer, _Process, free_port, wait_http_ok

FLEET = "a100-mixed"
RULE = "uuid_gpu_instance_id:nvidia_gpu_mig_utilization:ratio"
# One line of render_metrics.go's gpuMetricsFormat for a MIG series: the fixed labels in its order, the
# label map (driver version, then the pod's) in key order, a %f value. Modelled on the H100 MIG node's
# /metrics in NVIDIA/dcgm-exporter#512.
MIG_LINE = re.compile(
    r'^DCGM_FI_PROF_GR_ENGINE_ACTIVE\{gpu="\d+",UUID="GPU-[0-9a-f-]+",pci_bus_id="00000000:[0-9A-F]{2}:00\.0",'
    r'device="nvidia\d+",modelName="NVIDIA A100-SXM4-40GB",GPU_I_PROFILE="\dg\.\d+gb",GPU_I_ID="\d+",'
    r'Hostname="gpu-a100-mixed-01",DCGM_FI_DRIVER_VERSION="535\.161\.08"'
    r'(,container="[^"]+",namespace="[^"]+",pod="[^"]+")?\} \d\.\d{6}$'
)


def test_the_stand_in_renders_dcgm_exporters_exposition(clock):
    node = SimulatedNode(load_fleet(FLEET), clock=clock)
    clock.advance(60)
    text = exposition(node)
    lines = text.splitlines()
    assert lines[:2] == [
        "# HELP DCGM_FI_DEV_FB_FREE Framebuffer memory free (in MiB).",
        "# TYPE DCGM_FI_DEV_FB_FREE gauge",
    ]
    engine = [line for line in lines if line.startswith("DCGM_FI_PROF_GR_ENGINE_ACTIVE{")]
    mig = [line for line in engine if "GPU_I_ID" in line]
    # GPUs 0 and 1 are MIG-enabled with 4 GPU instances each: monitored only as their instances
    assert len(mig) == 8 and all(MIG_LINE.match(line) for line in mig), mig
    assert len(engine) == 8 + 4  # and the four whole GPUs
    held = next(line for line in mig if 'GPU_I_ID="1"' in line and 'gpu="0"' in line)
    assert held.endswith("}" + held.rsplit("}", 1)[1])
    assert ',container="trainer",namespace="vision",pod="detector-train"}' in held
    # GI 8 of GPU 0 is free: no pod labels at all (not empty ones)
    free = next(line for line in mig if 'GPU_I_ID="8"' in line and 'gpu="0"' in line)
    assert "pod=" not in free and free.endswith(" 0.000000")
    # framebuffer fields are int64 MiB (%d); GI 8 of GPU 0 (1g.5gb, 4864 MiB) is all free
    assert re.search(r'DCGM_FI_DEV_FB_FREE\{gpu="0",[^}]*GPU_I_ID="8",[^}]*\} 4864$', text, re.M)


def test_the_command_refuses_an_unknown_node(capsys):
    assert main(["simulate", "dcgm-exporter", "--fleet", FLEET, "--node", "nope"]) == 2
    assert "gpumeter simulate dcgm-exporter: " in capsys.readouterr().err


def _gpus(prom_url: str, start: float, end: float):
    period = Period(datetime.fromtimestamp(start, UTC), datetime.fromtimestamp(end, UTC), "live")
    client = PrometheusClient(prom_url)
    try:
        return period, read_devices(client, period)
    finally:
        client.close()


@pytest.mark.prometheus
def test_prometheus_answers_per_mig_utilization_from_dcgm_and_the_report_says_so(tmp_path):
    fleet = load_fleet(FLEET)
    spec = fleet.nodes[0]
    mig_gpus = {g.uuid for g in spec.gpus if g.mig}
    instances = {(g.uuid, str(m.gpu_instance_id)) for g in spec.gpus for m in g.mig}
    assert len(mig_gpus) == 2 and len(instances) == 8
    port = free_port()
    directory = tempfile.mkdtemp(prefix="gpm-", dir="/tmp")  # sun_path is short: not under tmp_path
    socket_path = str(Path(directory) / "kubelet.sock")
    kubelet = StandInKubelet(fleet, spec.name, socket_path).start()
    argv = [
        str(Path(sys.executable).parent / "gpumeter"),
        "exporter",
        f"--simulate={FLEET}",
        f"--kubelet-socket={socket_path}",
        f"--listen=127.0.0.1:{port}",
        "--interval=1",
    ]
    exporter = _Process(argv, tmp_path / "exporter.log")
    dcgm, dcgm_stopped = StandInDcgmExporter(fleet).start(), False
    try:
        wait_http_ok(f"http://127.0.0.1:{port}/metrics", proc=exporter.proc)
        targets = {"gpumeter-exporter": [f"127.0.0.1:{port}"], "dcgm-exporter": [f"127.0.0.1:{dcgm.port}"]}
        with PrometheusServer(tmp_path / "prom", scrape_targets=targets, rule_files=[RULES_FILE]) as prom:
            started = time.time()
            answered = prom.wait_for(
                f'{RULE}{{source="dcgm"}}', predicate=lambda r: len(r) == len(instances), timeout=40
            )
            # every A100 instance, on gpumeter's identity of it (its exporter target, its MIG profile)
            assert {(x["metric"]["uuid"], x["metric"]["gpu_instance_id"]) for x in answered} == instances
            assert {x["metric"]["instance"] for x in answered} == {f"127.0.0.1:{port}"}
            assert all(x["metric"]["mig_profile"] in ("3g.20gb", "2g.10gb", "1g.5gb") for x in answered)
            assert all(0.0 <= float(x["value"][1]) <= 1.0 for x in answered)
            # the held 3g.20gb (80 % busy) is busier than the free 1g.5gb (idle)
            value = {
                (x["metric"]["uuid"], x["metric"]["gpu_instance_id"]): float(x["value"][1]) for x in answered
            }
            gpu0 = spec.gpus[0].uuid
            assert value[(gpu0, "1")] > 0.3 and value[(gpu0, "8")] == 0.0
            pods = prom.wait_for(
                'namespace_pod_container:nvidia_gpu_utilization_ratio:avg{namespace="vision", pod="detector-train"}',
                timeout=20,
            )
            assert float(pods[0]["value"][1]) > 0.3  # a MIG pod's utilization, from DCGM
            time.sleep(3)
            period, gpus = _gpus(prom.url, started, time.time())
            by_uuid = {g.uuid: g for g in gpus}
            for uuid in mig_gpus:
                assert by_uuid[uuid].utilization_source == "dcgm" and by_uuid[uuid].utilization is not None
            assert {g.utilization_source for g in gpus if g.uuid not in mig_gpus} == {"nvml"}
            report = HealthReport(period, prom.url, "USD", gpus, [])
            ((_pool_name, pool),) = report.pools
            assert pool.measured == 6 and pool.sources_text == "nvml 4, dcgm 2" and pool.maturity is not None
            assert "6 (nvml 4, dcgm 2)" in html_text(report)

            dcgm.stop()
            dcgm_stopped, stopped = True, time.time()
            time.sleep(6)
            period, gpus = _gpus(prom.url, stopped + 2, time.time())
            by_uuid = {g.uuid: g for g in gpus}
            for uuid in mig_gpus:  # not measured again
                assert by_uuid[uuid].utilization is None and by_uuid[uuid].utilization_source == ""
            report = HealthReport(period, prom.url, "USD", gpus, [])
            ((_pool_name, pool),) = report.pools
            assert pool.measured == 4 and pool.sources_text == "nvml 4"
    finally:
        exporter.stop()
        if not dcgm_stopped:
            dcgm.stop()
        kubelet.stop()
        shutil.rmtree(directory, ignore_errors=True)
