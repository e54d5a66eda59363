"""The drill-down with concrete variable values, as the data links set them: from the fleet's
throttled GPUs to that GPU (throttle timeline, the pods on its MIG instances), to the pod's MIG
instance, to what its namespace costs its team. Each injected fault shows in the panel meant for it."""

from __future__ import annotations

import json

import pytest

from gpumeter.dashboards.build import GENERATED
from tests.dashboards.promql import panels, substitute

pytestmark = pytest.mark.slow

MODELS = {path.stem: json.loads(path.read_text()) for path in sorted(GENERATED.glob("*.json"))}
H100 = "gpu-h100-mig-01"
A100 = "gpu-a100-mixed-01"


def run(prom, uid: str, title: str, ref: str = "A", at: float | None = None, **values: str) -> list[dict]:
    """The panel's query, answered now or ``at`` a past moment."""
    panel = next(p for p in panels(MODELS[uid]) if p["title"] == title)
    expr = next(t["expr"] for t in panel["targets"] if t["refId"] == ref)
    answer = prom.query(substitute(expr, values), time=at)
    return [r["metric"] | {"value": float(r["value"][1])} for r in answer]


def test_fleet_lists_the_throttled_gpu(prom):
    rows = run(prom, "gpumeter-fleet", "Throttled GPUs (clock event reasons active now)")
    # the throttled GPU among the rows, in whatever order Prometheus gives them (the overheated GPU 2
    # may be slowing down too by the time this runs)
    assert any({"hostname": H100, "gpu": "3", "reason": "hw_slowdown"}.items() <= r.items() for r in rows), (
        rows
    )
    assert not any(r["reason"] in ("gpu_idle", "applications_clocks", "display_clocks") for r in rows)


def test_fleet_lists_erroring_gpus_and_alerts(prom, stack):
    problems = {(r["hostname"], r["gpu"], r["problem"]) for r in run(prom, "gpumeter-fleet", "Erroring GPUs")}
    assert {
        (H100, "1", "XID errors"),
        (H100, "1", "uncorrected ECC errors"),
        (A100, "2", "row remap pending (reset needed)"),
        (H100, "0", "NVLinks down"),
        (H100, "0", "NVLink errors in range"),
        (A100, "4", "XID errors"),
    } <= problems
    alerts = {
        (r["alertname"], r.get("gpu"))
        for r in run(prom, "gpumeter-fleet", "Alerts firing and pending", at=stack.ready_at)
    }
    assert ("GpuHardwareSlowdown", "3") in alerts and ("GpuXidCritical", "1") in alerts


def test_fleet_power_is_per_physical_gpu(prom):
    """The H100 node's power is the sum of its 8 GPUs, whatever its 56 MIG instances."""
    (total,) = run(prom, "gpumeter-fleet", "Power draw", hostname=H100)
    per_gpu = prom.query(
        f'sum(nvidia_gpu_power_watts * on(instance, uuid) group_left() nvidia_gpu_info{{hostname="{H100}"}})'
    )
    assert total["value"] == pytest.approx(float(per_gpu[0]["value"][1]), rel=0.05)
    (gpus,) = run(prom, "gpumeter-fleet", "GPUs", hostname=H100)
    assert gpus["value"] == 8


def test_node_detail_of_the_throttled_gpu(prom):
    lanes = run(prom, "gpumeter-node", "Clock event (throttle) reasons", hostname=H100, gpu="3")
    active = {r["reason"] for r in lanes if r["value"] == 1}
    assert active >= {"hw_slowdown", "sw_thermal"}
    assert {r["gpu"] for r in lanes} == {"3"}
    pods = run(
        prom, "gpumeter-node", "Pods holding these GPUs or their MIG instances", hostname=H100, gpu="3"
    )
    assert len(pods) == 7 and {r["namespace"] for r in pods} == {"search-inference"}
    assert {r["gpu_instance_id"] for r in pods} == {str(gi) for gi in range(7, 14)}
    headroom = run(prom, "gpumeter-node", "Headroom to slowdown", hostname=H100, gpu="3")
    assert len(headroom) == 1 and 0 < headroom[0]["value"] < 60
    limits = run(prom, "gpumeter-node", "Power draw / enforced limit", hostname=H100, gpu="3")
    assert len(limits) == 1 and 0 < limits[0]["value"] <= 1.01


def test_node_detail_shows_xids_nvlink_and_memory_errors(prom):
    xids = run(prom, "gpumeter-node", "XID errors", hostname=H100, gpu="1")
    assert [(r["xid"], r["value"]) for r in xids] == [("48", 1.0)]
    links = run(prom, "gpumeter-node", "NVLink state per link", hostname=H100, gpu="0")
    assert {r["link"] for r in links if r["value"] == 0} == {"2"}
    errors = run(prom, "gpumeter-node", "NVLink errors per link", hostname=H100, gpu="0")
    assert {r["link"] for r in errors if r["value"] > 0} == {"1"}
    pending = run(prom, "gpumeter-node", "Row remap pending / failed", hostname=A100, gpu="2")
    assert [r["value"] for r in pending] == [1.0]


def test_mig_dashboard_shows_the_pod_on_its_instance(prom):
    values = {"hostname": H100, "gpu": "3", "namespace": "search-inference"}
    held = run(prom, "gpumeter-mig", "Pods on MIG instances", **values)
    assert {(r["pod"], r["gpu_instance_id"], r["mig_profile"]) for r in held} == {
        (f"ranker-3-{gi}", str(gi), "1g.10gb") for gi in range(7, 14)
    }
    assert all(r["mig_uuid"].startswith("MIG-") for r in held)
    utilization = run(prom, "gpumeter-mig", "Pods on MIG instances", "B", **values)
    assert len(utilization) == 7 and all(0 <= r["value"] <= 1 for r in utilization)
    memory = run(prom, "gpumeter-mig", "Pods on MIG instances", "C", **values)
    assert len(memory) == 7 and all(0 < r["value"] < 1 for r in memory)
    # The A100's GI 8 (1g.5gb) of GPU 0 is held by nobody (fleet file).
    free = run(prom, "gpumeter-mig", "MIG instances nobody holds", hostname=A100, gpu="0")
    assert {(r["gpu_instance_id"], r["mig_profile"]) for r in free} == {("8", "1g.5gb")}


def test_cost_of_the_pods_namespace_and_team(prom):
    rows = run(prom, "gpumeter-cost", "Cost and GPU-hours by namespace", namespace="search-inference")
    assert [(r["team"], r["currency"]) for r in rows] == [("search", "USD")]
    # two ingested hours of six 1g.10gb instances of an H100 at 6.88/h: 2 x 6 x 6.88 / 7
    assert rows[0]["value"] == pytest.approx(2 * 6 * 6.88 / 7, abs=0.02)
    platform = {r["kind"]: r["value"] for r in run(prom, "gpumeter-cost", "Cost left with the platform")}
    assert set(platform) == {"unallocated", "stranded", "sharing_shortfall"}
    unpriced = run(prom, "gpumeter-cost", "Unpriced GPU-hours by model")
    assert [(r["model"], r["value"]) for r in unpriced] == [("NVIDIA VR200", 2.0)]
