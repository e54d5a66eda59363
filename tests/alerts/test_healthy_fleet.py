"""Ten minutes of healthy load on the 8×H100 MIG fleet fire no alert, not even a pending one.

The exporter runs the simulated h100-mig node (56 MIG instances) with the stand-in kubelet for pod
attribution, both on one manual clock, and is sampled every 5 s for 10 minutes of simulated time
(121 samples). Every series it serves at every step becomes an ``input_series`` of a promtool unit test
generated on the fly, with the labels a real scrape adds (``job="gpumeter-exporter"``, ``instance``) and
``up`` = 1. The test loads the real rule files, unchanged (``for:`` durations included), and asserts:

* ``exp_alerts: []`` for every alert of both rule files at 1, 2, 5 and 10 minutes;
* no ``ALERTS`` series at all during the 10 minutes (``max_over_time(ALERTS[10m])`` is empty), so an alert
  whose ``for:`` is longer than the window (15m, 30m, 3h) is not even pending; GpuPoolHeadroomLow and
  GpuPoolSpareLow aside, pending when every GPU is held (a full pool has no spare, healthy or not);
* a few positive checks, so that "nothing fires" cannot come from data the rules never see (the joins on
  instance/uuid match, the recording rules see 8 GPUs and the allocations).

Three windows of the fleet's pod schedule are run: the node's first 10 minutes (GPUs 4-5 without pods,
6-7 fine-tuning at 85 %), 5h55m-6h05m (the fine-tuning jobs end, GPUs 6-7 cool down and lose their
allocations) and 8h01m-8h11m (the research notebooks are running too: every GPU is loaded).

A control run injects a HW-thermal throttle into the same pipeline and checks that the generated test
does fail with GpuHardwareSlowdown, so the healthy result is not vacuous.

Timestamp-valued series (``*_timestamp_seconds``) are rebased to promtool's clock, which starts at 0:
promtool's ``time()`` at step i is 5·i s, the exporter's clock then read T0 + 5·i s.
"""

from __future__ import annotations

import math
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from gpumeter.alerts import RULE_FILES
from gpumeter.exporter.app import build_exporter
from gpumeter.exporter.config import ExporterConfig
from gpumeter.simulator.device import SimulatedNode
from gpumeter.simulator.fleet import load_fleet
from gpumeter.simulator.kubelet import StandInKubelet
from gpumeter.simulator.nvml import SimulatedNvml
from tests.support.servers import require_binary

FLEET = "h100-mig"
STEP_S = 5
STEPS = 120  # 10 minutes
T0 = 1_790_000_000.0
JOB = "gpumeter-exporter"
INSTANCE = "gpu-h100-mig-01:9835"
EVAL_TIMES = ("1m", "2m", "5m", "10m")
# window: (start in the fleet's schedule, MIG instances held by pods at the first and at the last step)
WINDOWS = {
    "first-10m": (0.0, 42, 42),
    "finetune-ends": (5 * 3600 + 55 * 60.0, 42, 28),
    "all-busy": (8 * 3600 + 60.0, 56, 56),
}

SeriesKey = tuple[str, tuple[tuple[str, str], ...]]


class ManualClock:
    def __init__(self, now: float):
        self.now = now

    def __call__(self) -> float:
        return self.now


def record(offset: float, fault: Callable[[SimulatedNode], None] | None = None) -> dict[SeriesKey, list]:
    """Sample the exporter every STEP_S for STEPS steps, starting ``offset`` seconds into the fleet's
    schedule; returns every series' values (None where it was absent), timestamps rebased to 0."""
    clock = ManualClock(T0)
    fleet = load_fleet(FLEET)
    node_name = fleet.nodes[0].name
    socket_dir = tempfile.mkdtemp(dir="/tmp")  # unix socket paths must be short
    socket_path = f"{socket_dir}/kubelet.sock"
    kubelet = StandInKubelet(fleet, node_name, socket_path, clock=clock, start=T0 - offset).start()
    node = SimulatedNode(fleet, node_name, clock=clock, start=T0 - offset)
    # the kubelet's deadline is a hang guard here: a healthy kubelet answers, and how soon a loaded test
    # machine lets it is not this test's question (the default 2 s ran out beside a make check at load 30,
    # and one missed query is a pending GpumeterKubeletAttributionDown)
    settings = ExporterConfig(
        listen="127.0.0.1:0",
        kubelet_socket=socket_path,
        hostname=node_name,
        interval=STEP_S,
        kubelet_timeout=60.0,
    )
    exporter = build_exporter(settings, clock=clock, library=SimulatedNvml(node), node=node)
    if fault is not None:
        fault(node)
    values: dict[SeriesKey, list] = {}
    try:
        for step in range(STEPS + 1):
            if step:
                clock.now += STEP_S
            exporter.sampler.sample_once()
            for family in exporter.registry.collect():  # what /metrics renders, without the text round trip
                for sample in family.samples:
                    value = sample.value
                    if sample.name.endswith("_timestamp_seconds") and value > 0:
                        value -= T0
                    key = (sample.name, tuple(sorted(sample.labels.items())))
                    values.setdefault(key, [None] * (STEPS + 1))[step] = value
    finally:
        exporter.sampler.stop()
        kubelet.stop()
        shutil.rmtree(socket_dir, ignore_errors=True)
    return values


def _number(value: float | None) -> str:
    if value is None:
        return "_"
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _series(name: str, labels: tuple[tuple[str, str], ...]) -> str:
    def quoted(v: str) -> str:
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'

    pairs = [*labels, ("instance", INSTANCE), ("job", JOB)]  # what a scrape with honor_labels adds
    return name + "{" + ", ".join(f"{k}={quoted(v)}" for k, v in pairs) + "}"


def promtool_test(values: dict[SeriesKey, list], alert_names: list[str], promql_tests: list[dict]) -> dict:
    series = [{"series": f'up{{instance="{INSTANCE}", job="{JOB}"}}', "values": f"1x{STEPS}"}]
    series += [
        {"series": _series(name, labels), "values": " ".join(map(_number, vals))}
        for (name, labels), vals in sorted(values.items())
    ]
    return {
        "rule_files": [str(p.resolve()) for p in RULE_FILES],
        "evaluation_interval": f"{STEP_S}s",
        "tests": [
            {
                "interval": f"{STEP_S}s",
                "input_series": series,
                "alert_rule_test": [
                    {"eval_time": t, "alertname": name, "exp_alerts": []}
                    for t in EVAL_TIMES
                    for name in alert_names
                ],
                "promql_expr_test": promql_tests,
            }
        ],
    }


def run_promtool(tmp_path: Path, test: dict) -> subprocess.CompletedProcess:
    path = tmp_path / "healthy-fleet-test.yaml"
    path.write_text(yaml.safe_dump(test, sort_keys=False, width=1_000_000))
    return subprocess.run(
        [require_binary("promtool"), "test", "rules", str(path)],
        capture_output=True,
        text=True,
        timeout=240,
    )


def _final(values: dict[SeriesKey, list], name: str) -> list[tuple[dict, float]]:
    return [(dict(labels), v[-1]) for (n, labels), v in values.items() if n == name and v[-1] is not None]


def _positive_checks(values: dict[SeriesKey, list]) -> list[dict]:
    """Checks that must hold on this data, so that 'no alert' is not 'no data'."""
    hostname = _final(values, "nvidia_gpu_info")[0][0]["hostname"]
    allocations = len(_final(values, "nvidia_gpu_allocation"))
    return [
        {
            "expr": "count(nvidia_gpu_temperature_celsius * on(instance, uuid) group_left(hostname, model) "
            "nvidia_gpu_info)",
            "eval_time": "10m",
            "exp_samples": [{"labels": "{}", "value": 8}],
        },
        {
            "expr": "hostname:nvidia_gpu_info:count",
            "eval_time": "10m",
            "exp_samples": [
                {"labels": f'hostname:nvidia_gpu_info:count{{hostname="{hostname}"}}', "value": 8}
            ],
        },
        {
            "expr": "count(nvidia_gpu_allocation)",
            "eval_time": "10m",
            "exp_samples": [{"labels": "{}", "value": allocations}],
        },
        # GpuPoolHeadroomLow and its per-pool twin GpuPoolSpareLow are about the pool, not the node's
        # health: with every GPU held (all-busy) the pool has no spare by definition and the alerts are
        # rightly pending (they fire only after 30m).
        {
            "expr": 'max_over_time(ALERTS{alertname!~"GpuPoolHeadroomLow|GpuPoolSpareLow"}[10m])',
            "eval_time": "10m",
            "exp_samples": [],
        },
    ]


@pytest.mark.prometheus
@pytest.mark.parametrize(("offset", "held_first", "held_last"), WINDOWS.values(), ids=WINDOWS.keys())
def test_ten_minutes_of_healthy_load_fire_nothing(
    tmp_path: Path, alert_rules, offset: float, held_first: int, held_last: int
):
    values = record(offset)

    # the recording is what a busy healthy node serves
    assert len(_final(values, "nvidia_gpu_info")) == 8
    assert all(v == 1 for _, v in _final(values, "nvidia_gpu_up"))
    assert len(_final(values, "nvidia_gpu_mig_info")) == 56
    allocations = [v for (name, _), v in values.items() if name == "nvidia_gpu_allocation"]
    held = (sum(v[0] is not None for v in allocations), sum(v[-1] is not None for v in allocations))
    assert held == (held_first, held_last), "the stand-in kubelet's pods are not the window's"
    assert all(v == 1 for _, v in _final(values, "gpumeter_exporter_kubelet_up"))
    temperatures = [v for _, v in _final(values, "nvidia_gpu_temperature_celsius")]
    assert len(temperatures) == 8 and max(temperatures) < 80, temperatures

    result = run_promtool(
        tmp_path, promtool_test(values, [r["alert"] for r in alert_rules], _positive_checks(values))
    )
    assert result.returncode == 0, (
        f"alerts on healthy load:\n{result.stdout[-6000:]}\n{result.stderr[-6000:]}"
    )
    assert "SUCCESS" in result.stdout + result.stderr


@pytest.mark.prometheus
def test_the_generated_test_catches_an_alert(tmp_path: Path, alert_rules):
    """Control: the same pipeline with a HW-thermal throttle on GPU 5 makes promtool fail on it."""
    values = record(0.0, fault=lambda node: node.inject("throttle", 5, reason="hw_thermal"))
    result = run_promtool(tmp_path, promtool_test(values, [r["alert"] for r in alert_rules], []))
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "alertname: GpuHardwareSlowdown" in output
    assert 'gpu="5"' in output and 'reason="hw_thermal"' in output
    assert "alertname: GpuTemperatureAtSlowdown" not in output  # a forced throttle, not a hot GPU
