"""The rules and the Alertmanager config in the real servers.

Prometheus scrapes a static exposition (what the exporter serves for a small node) under the job name
`gpumeter-exporter` with honor_labels, loads both rule files, and must evaluate every rule without an
error (no many-to-many joins, no bad templates) with the expected alerts pending and recording rules
computed. Alertmanager runs deploy/alertmanager/alertmanager.yml (webhook URL and waits shortened): each
severity reaches its receiver, and GpuLost inhibits the other alerts of its GPU.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
import yaml

from gpumeter.alerts import RULE_FILES
from gpumeter.deploy.demo import local_alertmanager_config
from gpumeter.simulator.metrics_server import StandInServer
from tests.support import loopback
from tests.support.servers import AlertmanagerServer, PrometheusServer

pytestmark = pytest.mark.slow

COMMON = 'instance="node1:9400",job="gpumeter-exporter"'
EXPOSITION = "\n".join(
    [
        "# TYPE nvidia_gpu_info gauge",
        'nvidia_gpu_info{gpu="0",uuid="GPU-a",model="NVIDIA H100 80GB HBM3",pci_bus_id="00000000:18:00.0",'
        'driver_version="580.65.06",cuda_version="13.0",mig_mode="disabled",hostname="node1"} 1',
        'nvidia_gpu_info{gpu="1",uuid="GPU-b",model="NVIDIA H100 80GB HBM3",pci_bus_id="00000000:2a:00.0",'
        'driver_version="580.65.06",cuda_version="13.0",mig_mode="enabled",hostname="node1"} 1',
        "# TYPE nvidia_gpu_up gauge",
        'nvidia_gpu_up{gpu="0",uuid="GPU-a"} 1',
        'nvidia_gpu_up{gpu="1",uuid="GPU-b"} 0',
        "# TYPE nvidia_gpu_temperature_celsius gauge",
        'nvidia_gpu_temperature_celsius{gpu="0",uuid="GPU-a"} 90',
        "# TYPE nvidia_gpu_temperature_threshold_celsius gauge",
        'nvidia_gpu_temperature_threshold_celsius{gpu="0",uuid="GPU-a",threshold="slowdown"} 87',
        'nvidia_gpu_temperature_threshold_celsius{gpu="0",uuid="GPU-a",threshold="gpu_max"} 83',
        'nvidia_gpu_temperature_threshold_celsius{gpu="0",uuid="GPU-a",threshold="memory_max"} 95',
        "# TYPE nvidia_gpu_utilization_ratio gauge",
        'nvidia_gpu_utilization_ratio{gpu="0",uuid="GPU-a"} 0.5',
        "# TYPE nvidia_gpu_power_watts gauge",
        'nvidia_gpu_power_watts{gpu="0",uuid="GPU-a"} 400',
        'nvidia_gpu_power_watts{gpu="1",uuid="GPU-b"} 100',
        "# TYPE nvidia_gpu_clocks_event_active gauge",
        'nvidia_gpu_clocks_event_active{gpu="0",uuid="GPU-a",reason="hw_thermal"} 1',
        'nvidia_gpu_clocks_event_active{gpu="0",uuid="GPU-a",reason="sw_power_cap"} 1',
        "# TYPE nvidia_gpu_mig_info gauge",
        'nvidia_gpu_mig_info{gpu="1",uuid="GPU-b",gpu_instance_id="1",compute_instance_id="0",mig_profile="3g.40gb",'
        'mig_uuid="MIG-b1",compute_slices="3",memory_slices="4"} 1',
        "# TYPE nvidia_gpu_mig_sm_utilization_ratio gauge",
        'nvidia_gpu_mig_sm_utilization_ratio{gpu="1",uuid="GPU-b",gpu_instance_id="1",compute_instance_id="0",'
        'mig_profile="3g.40gb"} 0.25',
        "# TYPE nvidia_gpu_allocation gauge",
        'nvidia_gpu_allocation{hostname="node1",namespace="ml",pod="train",container="main",resource="nvidia.com/gpu",'
        'uuid="GPU-a",gpu="0",gpu_instance_id="",mig_profile=""} 1',
        'nvidia_gpu_allocation{hostname="node1",namespace="vision",pod="infer",container="main",'
        'resource="nvidia.com/mig-3g.40gb",uuid="GPU-b",gpu="1",gpu_instance_id="1",mig_profile="3g.40gb"} 1',
        "# TYPE gpumeter_exporter_nvml_up gauge",
        "gpumeter_exporter_nvml_up 1",
        "# TYPE gpumeter_exporter_kubelet_up gauge",
        "gpumeter_exporter_kubelet_up 1",
        "",
    ]
)


@pytest.fixture
def http_server() -> Iterator[tuple[StandInServer, list[dict]]]:
    """A loopback HTTP server: GET returns EXPOSITION, POST bodies (JSON) are collected."""
    posts: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            body = EXPOSITION.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):
            posts.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = StandInServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server, posts
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.mark.prometheus
def test_rules_evaluate_cleanly_on_scraped_data(tmp_path: Path, http_server):
    server, _ = http_server
    target = f"127.0.0.1:{server.server_address[1]}"
    with PrometheusServer(
        tmp_path, scrape_targets={"gpumeter-exporter": [target]}, rule_files=list(RULE_FILES)
    ) as prom:
        # honor_labels keeps the exposition's labels; the target adds instance and job
        prom.wait_for('nvidia_gpu_up{job="gpumeter-exporter", uuid="GPU-b"} == 0')
        prom.wait_for('ALERTS{alertname="GpuLost", alertstate="pending", hostname="node1", uuid="GPU-b"}')
        prom.wait_for('ALERTS{alertname="GpuTemperatureAtSlowdown", alertstate="pending", uuid="GPU-a"}')
        prom.wait_for('ALERTS{alertname="GpuHardwareSlowdown", alertstate="pending", reason="hw_thermal"}')
        equivalents = prom.wait_for("namespace:nvidia_gpu_allocated_gpu_equivalents:sum")
        assert {r["metric"]["namespace"]: round(float(r["value"][1]), 6) for r in equivalents} == {
            "ml": 1.0,
            "vision": round(3 / 7, 6),
        }
        joined = prom.wait_for(
            "allocation:nvidia_gpu_utilization_ratio:join", predicate=lambda r: len(r) == 2
        )
        assert {r["metric"]["pod"]: float(r["value"][1]) for r in joined} == {"train": 0.5, "infer": 0.25}
        assert not prom.query('ALERTS{reason="sw_power_cap"}')

        # every rule has been evaluated at least once, and none failed
        def all_evaluated(_):
            groups = loopback.get(f"{prom.url}/api/v1/rules", timeout=10).json()["data"]["groups"]
            return all(rule["health"] != "unknown" for group in groups for rule in group["rules"])

        prom.wait_for("vector(1)", predicate=all_evaluated)
        groups = loopback.get(f"{prom.url}/api/v1/rules", timeout=10).json()["data"]["groups"]
        bad = [
            (rule["name"], rule.get("lastError"))
            for group in groups
            for rule in group["rules"]
            if rule["health"] != "ok"
        ]
        assert not bad


def _alert(name: str, severity: str, **labels: str) -> dict:
    now = datetime.now(UTC)
    return {
        "labels": {"alertname": name, "severity": severity, **labels},
        "annotations": {"summary": f"{name}."},
        "startsAt": now.isoformat(),
        "endsAt": (now + timedelta(hours=1)).isoformat(),
    }


def _fast_config(tmp_path: Path, webhook: str) -> Path:
    """The shipped config with the test's webhook and no waiting, nothing else changed."""
    path = tmp_path / "alertmanager.yml"
    path.write_text(yaml.safe_dump(local_alertmanager_config(lambda _: webhook, "1s")))
    return path


@pytest.mark.alertmanager
def test_alertmanager_routes_and_inhibits(tmp_path: Path, http_server):
    server, posts = http_server
    config = _fast_config(tmp_path, f"http://127.0.0.1:{server.server_address[1]}/webhook")
    gpu_a = {"instance": "node1:9400", "uuid": "GPU-a", "gpu": "0", "hostname": "node1"}
    alerts = [
        _alert("GpuLost", "critical", **gpu_a),
        _alert("GpuXidCritical", "critical", xid="79", **gpu_a),  # inhibited by GpuLost
        _alert(
            "GpuRowRemapPending", "warning", instance="node1:9400", uuid="GPU-b", gpu="1", hostname="node1"
        ),
        _alert(
            "GpuXidApplication",
            "info",
            instance="node1:9400",
            uuid="GPU-b",
            gpu="1",
            hostname="node1",
            xid="13",
        ),
        _alert(
            "GpuAllocatedButIdle",
            "warning",
            team="vision",
            namespace="vision",
            pod="nb",
            **gpu_a | {"uuid": "GPU-c"},
        ),
    ]
    with AlertmanagerServer(tmp_path / "am", config) as am:
        response = loopback.post(f"{am.url}/api/v2/alerts", json=alerts, timeout=10)
        assert response.status_code == 200
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            received = {(p["receiver"], a["labels"]["alertname"]) for p in posts for a in p["alerts"]}
            if len(received) >= 3:
                break
            time.sleep(0.2)
        time.sleep(2)  # anything wrongly routed or not inhibited would arrive by now
        received = {(p["receiver"], a["labels"]["alertname"]) for p in posts for a in p["alerts"]}
        assert received == {
            ("pager", "GpuLost"),
            ("ticket", "GpuRowRemapPending"),
            ("team-owners", "GpuAllocatedButIdle"),
        }
        states = {a["labels"]["alertname"]: a["status"] for a in am.alerts()}
        assert states["GpuXidCritical"]["state"] == "suppressed"
        assert states["GpuXidCritical"]["inhibitedBy"]
        assert states["GpuLost"]["state"] == "active"
