"""Faults injected into the simulator reach a webhook through the real pipeline, and clear again.

simulated 8×H100 MIG node + stand-in kubelet -> exporter (/metrics) -> Prometheus (the project's rules,
1 s scrape and evaluation) -> Alertmanager (deploy/alertmanager/alertmanager.yml) -> a webhook in the test.

What is changed for test time, and nothing else:

* Rules: a copy of both rule files with every ``for:`` divided by FOR_SCALE (one minute of ``for:``
  becomes one second, see :func:`scaled_duration`); expressions, range windows, labels and annotations are
  the shipped ones. Range windows stay in real (Prometheus) time, which matters below.
* Alertmanager: a copy of the shipped config with every receiver's webhook URL pointed at the test's
  HTTP server and every ``group_wait``/``group_interval`` set to 1s (in production they are 30s-1h: a
  first notification would wait 30 s, and a resolution up to ``group_interval`` after the last
  notification of its group). ``repeat_interval`` (1h-24h) is left as shipped: the test never waits for
  a repeated notification, and keeping it means each change of state is notified once. Routes, grouping
  and inhibition rules are the shipped ones.
* Exporter time: the simulator and the stand-in kubelet run on a :class:`SimulatedClock` that runs 30×
  faster than real time while the thermal faults and the lost GPUs play out (temperature follows power
  with a 30 s time constant and a lost GPU is looked for again every 60 s of exporter time: 1 s and 2 s of
  test time), and at real speed (1×) for the HW-thermal throttle, see below.

Faults and what the receiver must get (GPUs 0, 6 and 7 stay healthy and must get nothing; no alert without
a ``gpu`` label may arrive either, e.g. an exporter alert):

====  ==============================  ============================================================
GPU   fault                           expected at the webhook
====  ==============================  ============================================================
1     overheat +38 °C (cooling fails)  GpuTemperatureAtSlowdown (pager), GpuMemoryTemperatureNearMax,
                                      GpuSoftwareThermalSlowdown, GpuHardwareSlowdown{hw_thermal};
                                      after clear: GpuTemperatureAtSlowdown and
                                      GpuMemoryTemperatureNearMax resolved
2     XID 79 (fell off the bus)       GpuLost (pager); GpuXidCritical{xid="79"} (pager) by the time the
                                      GPU is back; after clear: GpuLost resolved
3     GPU lost                        GpuLost; after clear (re-discovery): GpuLost resolved
4     NVLink CRC burst, link 3        GpuNvlinkCrcErrors{link="3"} for crc_flit and crc_data
5     HW-thermal throttle             GpuHardwareSlowdown{reason="hw_thermal"}; after clear: resolved
====  ==============================  ============================================================

Resolutions the test cannot wait for, because a ``[5m]``/``[15m]`` range window of the real expression
keeps the alert firing after the fault clears (by design: intermittent faults keep their alert):

* GpuHardwareSlowdown, GpuHardwareSlowdownSustained and GpuSoftwareThermalSlowdown fire on
  ``rate(nvidia_gpu_clocks_event_seconds_total[5m]) > 0.05`` as well as on the active flag: once a
  throttle has lasted more than 15 s (5 % of 5 minutes) of exporter time, the alert resolves only when
  the throttled seconds have left the 5-minute window, about 5 minutes (real) after the throttle ended.
  This is why GPU 5's throttle runs at 1× and is cleared as soon as its alert arrives (< 15 s): its
  resolution then comes from the active flag alone. GPU 1's slowdown alerts (30× clock) stay firing.
* GpuNvlinkCrcErrors (``increase(...[15m]) > 0``) stays firing 15 minutes after the last error.

XID 79: GpuXidCritical fires at once (``for: 0m``) and GpuLost a minute later, from when on it inhibits
the XID alert of its GPU. In production the XID page goes out first (group_wait 30 s < 1 minute); here
both take about a second, so the test requires GpuXidCritical{xid="79"} by the time the GPU is back.

GpuLost's "Pods on it:" names no pod here: the exporter forgets a lost GPU's MIG instances at its next
re-discovery, and with them the GPU's allocations (see test_exporter_findings.py).
"""

from __future__ import annotations

import re
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from gpumeter.alerts import RULE_FILES
from gpumeter.deploy.demo import local_alertmanager_config
from gpumeter.exporter.app import build_exporter
from gpumeter.exporter.config import ExporterConfig
from gpumeter.simulator.kubelet import StandInKubelet
from tests.support import loopback
from tests.support.servers import AlertmanagerServer, PrometheusServer, Webhook

pytestmark = pytest.mark.slow

FOR_SCALE = 60  # one minute of `for:` -> one second of test
FAST = 30.0  # exporter seconds per real second while thermal faults and lost GPUs play out
JOB = "gpumeter-exporter"
HEALTHY = {"0", "6", "7"}

_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
_DURATION = re.compile(r"(\d+)(ms|s|m|h|d|w)")


def scaled_duration(value: str, scale: int = FOR_SCALE) -> str:
    """A Prometheus duration divided by ``scale``: "10m" -> "10s", "3h" -> "180s", "0m" -> "0s"."""
    parts = _DURATION.findall(value)
    if not parts or "".join(n + u for n, u in parts) != value:
        raise ValueError(f"not a Prometheus duration: {value!r}")
    ms = sum(int(n) * _UNITS_MS[u] for n, u in parts) // scale
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def scaled_rule_files(directory: Path) -> list[Path]:
    """Copies of the rule files with every ``for:`` scaled down; nothing else is touched."""
    directory.mkdir(parents=True, exist_ok=True)
    copies = []
    for path in RULE_FILES:
        content = yaml.safe_load(path.read_text())
        for group in content["groups"]:
            for rule in group["rules"]:
                if "for" in rule:
                    rule["for"] = scaled_duration(rule["for"])
        copy = directory / path.name
        copy.write_text(yaml.safe_dump(content, sort_keys=False, allow_unicode=True, width=1_000_000))
        copies.append(copy)
    return copies


def fast_alertmanager_config(path: Path, webhook: str) -> Path:
    """The shipped Alertmanager config with the test's webhook and 1 s group_wait/group_interval."""
    path.write_text(yaml.safe_dump(local_alertmanager_config(lambda _: webhook, "1s"), sort_keys=False))
    return path


def test_scaled_duration():
    assert scaled_duration("10m") == "10s"
    assert scaled_duration("0m") == "0s"
    assert scaled_duration("3h") == "180s"
    assert scaled_duration("1h30m") == "90s"
    assert scaled_duration("30s") == "500ms"
    with pytest.raises(ValueError):
        scaled_duration("10 minutes")


def test_scaled_copies_change_only_for(tmp_path: Path):
    for original, copy in zip(RULE_FILES, scaled_rule_files(tmp_path), strict=True):
        before, after = yaml.safe_load(original.read_text()), yaml.safe_load(copy.read_text())
        for group_before, group_after in zip(before["groups"], after["groups"], strict=True):
            for rule_before, rule_after in zip(group_before["rules"], group_after["rules"], strict=True):
                assert {k: v for k, v in rule_before.items() if k != "for"} == {
                    k: v for k, v in rule_after.items() if k != "for"
                }
                if "for" in rule_before:
                    assert rule_after["for"] == scaled_duration(rule_before["for"])


class SimulatedClock:
    """Exporter time: starts at the wall clock and runs ``speed`` times faster than it; ``set_speed``
    changes the pace from now on, keeping time continuous and increasing."""

    def __init__(self, speed: float):
        self._lock = threading.Lock()
        self._real = time.monotonic()
        self._now = time.time()
        self._speed = speed

    def __call__(self) -> float:
        with self._lock:
            return self._now + (time.monotonic() - self._real) * self._speed

    def set_speed(self, speed: float) -> None:
        with self._lock:
            real = time.monotonic()
            self._now += (real - self._real) * self._speed
            self._real, self._speed = real, speed


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[tuple]:
    """(exporter, clock, prometheus, alertmanager, webhook), all running."""
    socket_dir = tempfile.mkdtemp(dir="/tmp")  # unix socket paths must be short
    socket_path = f"{socket_dir}/kubelet.sock"
    clock = SimulatedClock(FAST)
    exporter = build_exporter(
        ExporterConfig(listen="127.0.0.1:0", simulate="h100-mig", kubelet_socket=socket_path, interval=1),
        clock=clock,
    )
    node = exporter.node
    kubelet = StandInKubelet(node.fleet, node.spec.name, socket_path, clock=clock, start=node.start).start()
    try:
        with Webhook() as webhook:
            am_config = fast_alertmanager_config(tmp_path / "alertmanager.yml", webhook.url)
            with AlertmanagerServer(tmp_path / "am", am_config) as am:
                exporter.start()
                try:
                    with PrometheusServer(
                        tmp_path / "prometheus",
                        scrape_targets={JOB: [f"127.0.0.1:{exporter.port}"]},
                        rule_files=scaled_rule_files(tmp_path / "rules"),
                        scrape_interval="1s",
                        evaluation_interval="1s",
                        alertmanager=f"127.0.0.1:{am.port}",
                    ) as prom:
                        yield exporter, clock, prom, am, webhook
                finally:
                    exporter.stop()
    finally:
        kubelet.stop()
        shutil.rmtree(socket_dir, ignore_errors=True)


def _check_labels(
    alert: dict, *, gpu: str, uuid: str, hostname: str, instance: str, severities: dict
) -> None:
    labels = alert["labels"]
    name = labels["alertname"]
    assert labels["gpu"] == gpu and labels["uuid"] == uuid, labels
    assert labels["hostname"] == hostname, labels  # every device rule joins nvidia_gpu_info for it
    assert labels["instance"] == instance and labels["job"] == JOB, labels
    assert labels["severity"] == severities[name], labels
    receiver = {"critical": "pager", "warning": "ticket"}[labels["severity"]]
    assert alert["receiver"] == receiver, (name, alert["receiver"])
    description = alert["annotations"]["description"]
    assert "<no value>" not in description and "<error" not in description, description
    assert alert["annotations"]["runbook_url"].endswith("#" + name.lower())


def test_faults_reach_the_webhook_and_resolve(stack, alert_rules):
    exporter, clock, prom, _am, webhook = stack
    node = exporter.node
    hostname = node.spec.name
    instance = f"127.0.0.1:{exporter.port}"
    severities = {r["alert"]: r["labels"]["severity"] for r in alert_rules}
    uuid = {str(g.spec.index): g.spec.uuid for g in node.gpus}

    def check(alert: dict, gpu: str) -> None:
        _check_labels(
            alert, gpu=gpu, uuid=uuid[gpu], hostname=hostname, instance=instance, severities=severities
        )

    # Healthy start: scraped a few times (counters have a value before the faults), nothing even pending.
    prom.wait_for(f'sum_over_time(up{{job="{JOB}"}}[1m]) >= 3', timeout=30)
    prom.wait_for('count(nvidia_gpu_nvlink_errors_total{gpu="4"}) > 0', timeout=10)
    assert prom.query("ALERTS") == []
    # ALERTS is checked from here on: before its first scrape any fresh Prometheus has GpumeterExporterAbsent
    # pending (absent(up{...})), which its 15m `for:` is there to absorb
    healthy_since = time.monotonic()

    # --- Phase 1, exporter clock at 30×: overheat, XID 79, lost GPU, NVLink CRC burst -------------
    # The simulator advances lazily (when sampled) and applies a fault to the time since it last did:
    # sync first, so that a fault starts now and not up to one sample (30 s at 30×) earlier.
    node.sync()
    node.inject("overheat", 1, celsius=38)  # full-load-healthy GPU settles ~91 °C: slowdown is 89 °C
    node.inject("xid", 2, code=79)
    node.inject("gpu_lost", 3)
    node.inject("nvlink_crc", 4, link=3, count=1000)
    phase1 = webhook.wait_for(
        [
            ("firing", "GpuTemperatureAtSlowdown", {"gpu": "1"}),
            ("firing", "GpuMemoryTemperatureNearMax", {"gpu": "1"}),
            ("firing", "GpuSoftwareThermalSlowdown", {"gpu": "1", "reason": "sw_thermal"}),
            ("firing", "GpuHardwareSlowdown", {"gpu": "1", "reason": "hw_thermal"}),
            ("firing", "GpuLost", {"gpu": "2"}),
            ("firing", "GpuLost", {"gpu": "3"}),
            ("firing", "GpuNvlinkCrcErrors", {"gpu": "4", "link": "3", "error_type": "crc_flit"}),
            ("firing", "GpuNvlinkCrcErrors", {"gpu": "4", "link": "3", "error_type": "crc_data"}),
        ],
        timeout=60,
    )
    for (_, _, labels), alert in phase1.items():
        check(alert, dict(labels)["gpu"])
    at_slowdown = webhook.find("firing", "GpuTemperatureAtSlowdown", gpu="1")
    assert at_slowdown["labels"]["model"] == "NVIDIA H100 80GB HBM3"
    # "Pods on it:" names none: a lost MIG GPU loses its allocations at re-discovery (exporter finding,
    # test_exporter_findings.py), before GpuLost fires
    lost = webhook.find("firing", "GpuLost", gpu="2")["annotations"]["description"]
    assert "has been lost or unreadable for at least 1 minute. Pods on it:" in lost
    # GpuXidCritical fired at once too (for: 0m); whether its first notification beat GpuLost's inhibition
    # is a race here (both ~1 s); it is required below, once the GPU is back and nothing inhibits it

    # --- the faults that can clear are cleared: the GPUs cool down, the lost ones are found again -----
    node.sync()
    for gpu in (1, 2, 3):
        node.clear(gpu)
    cleared = webhook.wait_for(
        [
            ("resolved", "GpuTemperatureAtSlowdown", {"gpu": "1"}),
            ("resolved", "GpuMemoryTemperatureNearMax", {"gpu": "1"}),
            ("resolved", "GpuLost", {"gpu": "2"}),
            ("resolved", "GpuLost", {"gpu": "3"}),
            ("firing", "GpuXidCritical", {"gpu": "2", "xid": "79"}),
        ],
        timeout=45,
    )
    for (_, _, labels), alert in cleared.items():
        check(alert, dict(labels)["gpu"])
    xid = webhook.find("firing", "GpuXidCritical", gpu="2")
    assert "XID 79 on GPU 2" in xid["annotations"]["description"]
    assert "fallen off the bus" in xid["annotations"]["description"]

    # --- Phase 2, exporter clock at 1×: a HW-thermal throttle, cleared as soon as it is notified ------
    clock.set_speed(1.0)
    node.sync()
    node.inject("throttle", 5, reason="hw_thermal")
    slowdown = webhook.wait_for([("firing", "GpuHardwareSlowdown", {"gpu": "5", "reason": "hw_thermal"})], 30)
    node.sync()
    node.clear(5)
    throttled = node.gpus[5].violation_ns["hw_thermal"] / 1e9
    # under 15 s of throttling the [5m] rate stays below 0.05: the active flag alone decides resolution
    assert throttled < 14, f"throttled {throttled:.1f}s: the rate term would hold the alert for 5 minutes"
    check(next(iter(slowdown.values())), "5")
    resolved = webhook.wait_for(
        [("resolved", "GpuHardwareSlowdown", {"gpu": "5", "reason": "hw_thermal"})], 30
    )
    check(next(iter(resolved.values())), "5")

    # --- nothing else, and nothing for the healthy GPUs ------------------------------------------------
    time.sleep(3)  # anything wrongly routed or not inhibited would have arrived by now
    allowed = {
        "1": {
            "GpuTemperatureAtSlowdown",
            "GpuTemperatureNearSlowdown",  # inhibited by GpuTemperatureAtSlowdown; allowed, not expected
            "GpuMemoryTemperatureNearMax",
            "GpuSoftwareThermalSlowdown",
            "GpuHardwareSlowdown",
            "GpuHardwareSlowdownSustained",  # 30 s of scaled `for:` if the test runs that long
        },
        "2": {"GpuLost", "GpuXidCritical"},
        "3": {"GpuLost"},
        "4": {"GpuNvlinkCrcErrors"},
        "5": {"GpuHardwareSlowdown"},
        # GPUs 2 and 3 lost leave their NVLink domain (the HGX baseboard) with fewer registered GPUs: the
        # domain's alert, which names the domain and no GPU (GpuLost says which)
        None: {"GpuNvlinkDomainShrank"},
    }
    unexpected = [
        (a["status"], a["labels"]["alertname"], a["labels"].get("gpu"))
        for a in webhook.received()
        if a["labels"]["alertname"] not in allowed.get(a["labels"].get("gpu"), set())
    ]
    assert not unexpected
    for alert in webhook.received():
        if "gpu" not in alert["labels"]:  # the NVLink domain's alert (allowed above): it names the domain
            assert alert["labels"]["nvlink_domain"] and alert["labels"]["severity"] == "warning", alert
            continue
        check(alert, alert["labels"]["gpu"])
        if alert["labels"]["alertname"] == "GpuHardwareSlowdown" and alert["labels"]["gpu"] == "1":
            assert alert["labels"]["reason"] in {"hw_thermal", "hw_slowdown"}  # the simulator sets both
    # not even pending: Prometheus never had an alert for a healthy GPU or, but for the domain's, without a GPU
    window = f"{int(time.monotonic() - healthy_since)}s"
    assert prom.query(f'max_over_time(ALERTS{{gpu=~"{"|".join(sorted(HEALTHY))}"}}[{window}])') == []
    assert prom.query(f'max_over_time(ALERTS{{gpu="", alertname!="GpuNvlinkDomainShrank"}}[{window}])') == []
    # every rule evaluated without an error on the exporter's real output
    groups = loopback.get(f"{prom.url}/api/v1/rules", timeout=10).json()["data"]["groups"]
    assert [(r["name"], r.get("lastError")) for g in groups for r in g["rules"] if r["health"] != "ok"] == []
