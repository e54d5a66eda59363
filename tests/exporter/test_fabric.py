"""The NVLink fabric: nvmlDeviceGetGpuFabricInfoV through the real pynvml path, its faults, its series, and
what --naming dcgm makes of them and of the power limits and the clock-event bitmask."""

from __future__ import annotations

import math
import re
import uuid as uuidlib

import pytest

from gpumeter.simulator.fleet import load_fleet

FABRIC = "nvidia_gpu_fabric_"


def samples(sim, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """{sorted label pairs: value} of one series in the exporter's text."""
    out = {}
    for line in sim.text().splitlines():
        if line.startswith(name + "{"):
            labels, value = line[len(name) + 1 :].rsplit("} ", 1)
            out[tuple(sorted(re.findall(r'(\w+)="([^"]*)"', labels)))] = float(value)
    return out


def by_gpu(sim, name: str, **match) -> dict[str, float]:
    return {
        dict(k)["gpu"]: v
        for k, v in samples(sim, name).items()
        if all(dict(k)[label] == wanted for label, wanted in match.items())
    }


def domains(sim) -> set[str]:
    return {dict(k)["nvlink_domain"] for k in samples(sim, "nvidia_gpu_fabric_info")}


def test_a_gb200_tray_reports_every_gpu_registered_and_healthy_in_the_rack_domain(simulate):
    first = simulate("gb200-nvl72", node="gb200-nvl72-01")
    last = simulate("gb200-nvl72", node="gb200-nvl72-18")
    for sim in (first, last):
        sim.sample(5)
        info = samples(sim, "nvidia_gpu_fabric_info")
        assert len(info) == 4
        assert {(dict(k)["state"], dict(k)["status"], dict(k)["clique_id"]) for k in info} == {
            ("completed", "success", "32766")
        }
        assert by_gpu(sim, "nvidia_gpu_fabric_registered") == dict.fromkeys("0123", 1.0)
        assert by_gpu(sim, "nvidia_gpu_fabric_health_overall") == dict.fromkeys("0123", 1.0)  # healthy
        assert set(by_gpu(sim, "nvidia_gpu_fabric_health_condition", condition="degraded_bw").values()) == {
            0.0
        }
    # two trays of one rack: one NVLink domain
    assert domains(first) == domains(last) and len(domains(first)) == 1


def test_an_hgx_b200_baseboard_is_its_own_domain(simulate):
    b200 = simulate("b200")
    rack = simulate("gb200-nvl72")
    b200.sample(5)
    rack.sample(5)
    assert len(domains(b200)) == 1 and domains(b200) != domains(rack)
    assert len(by_gpu(b200, "nvidia_gpu_fabric_registered")) == 8


def test_hopper_on_driver_550_answers_v2_without_health(simulate):
    # h100-mig runs driver 550: the v3 struct is refused (version mismatch), v2 answers; Hopper's health
    # fields are NOT_SUPPORTED, so no condition and no overall series, but the mask (0) is there
    sim = simulate("h100-mig")
    sim.sample(5)
    assert by_gpu(sim, "nvidia_gpu_fabric_registered") == {str(g): 1.0 for g in range(8)}
    assert by_gpu(sim, "nvidia_gpu_fabric_health_mask") == {str(g): 0.0 for g in range(8)}
    assert samples(sim, "nvidia_gpu_fabric_health_condition") == {}
    assert samples(sim, "nvidia_gpu_fabric_health_overall") == {}
    assert sim.lib.calls["nvmlDeviceGetGpuFabricInfoV"] > 0


@pytest.mark.parametrize("fleet", ["workstation", "a100-pcie", "h200-vm", "v100-t4"])
def test_boards_without_a_fabric_export_no_fabric_series(simulate, fleet):
    # PCIe boards, pre-Hopper GPUs and a GPU alone in a VM answer NOT_SUPPORTED (or lack the struct)
    sim = simulate(fleet)
    sim.sample(5)
    sim.sample(5)
    assert not any(line.startswith(FABRIC) for line in sim.text().splitlines())


def test_degraded_health_and_a_failed_registration_are_reported_and_cleared(simulate):
    sim = simulate("gb200-nvl72")
    sim.sample(5)
    sim.node.inject("fabric_health", 1)  # degraded bandwidth
    sim.node.inject("fabric_health", 3, condition="route_unhealthy")
    sim.node.inject("fabric_registration", 2)  # failed: completed with NVML_ERROR_UNKNOWN
    sim.sample(5)
    assert by_gpu(sim, "nvidia_gpu_fabric_health_condition", condition="degraded_bw") == {
        "0": 0.0,
        "1": 1.0,
        "2": 0.0,
        "3": 0.0,
    }
    assert by_gpu(sim, "nvidia_gpu_fabric_health_condition", condition="route_unhealthy")["3"] == 1.0
    # NVML's summary: limited capacity (3) for degraded bandwidth, unhealthy (2) for a route
    assert by_gpu(sim, "nvidia_gpu_fabric_health_overall") == {"0": 1.0, "1": 3.0, "2": 1.0, "3": 2.0}
    assert by_gpu(sim, "nvidia_gpu_fabric_registered") == {"0": 1.0, "1": 1.0, "2": 0.0, "3": 1.0}
    failed = [dict(k) for k in samples(sim, "nvidia_gpu_fabric_info") if dict(k)["gpu"] == "2"]
    assert [(f["state"], f["status"]) for f in failed] == [("completed", "unknown")]
    # degraded bandwidth is field 0 = TRUE (1) in place of FALSE (2): the mask one less than healthy
    masks = by_gpu(sim, "nvidia_gpu_fabric_health_mask")
    assert masks["0"] - masks["1"] == 1

    sim.node.inject("fabric_registration", 0, state="in_progress")
    sim.sample(5)
    gpu0 = [dict(k) for k in samples(sim, "nvidia_gpu_fabric_info") if dict(k)["gpu"] == "0"]
    assert [(f["state"], f["status"]) for f in gpu0] == [("in_progress", "")]
    assert by_gpu(sim, "nvidia_gpu_fabric_registered")["0"] == 0.0

    sim.node.clear()
    sim.sample(5)
    assert set(by_gpu(sim, "nvidia_gpu_fabric_registered").values()) == {1.0}
    assert set(by_gpu(sim, "nvidia_gpu_fabric_health_overall").values()) == {1.0}


@pytest.mark.parametrize(
    ("fleet", "fault", "params", "message"),
    [
        ("workstation", "fabric_health", {}, "RTX-6000-Ada answers no NVLink fabric"),
        ("a100-pcie", "fabric_registration", {}, "A100-PCIe-40GB answers no NVLink fabric"),
        ("h100-mig", "fabric_health", {}, "from Blackwell on"),
        ("b200", "fabric_health", {"condition": "melted"}, "condition must be one of degraded_bw"),
        ("b200", "fabric_registration", {"state": "done"}, "state must be one of not_started"),
        ("b200", "fabric_registration", {"status": 0}, "status must be an NVML return code"),
    ],
)
def test_fabric_faults_refuse_what_the_board_cannot_answer(simulate, fleet, fault, params, message):
    sim = simulate(fleet)
    with pytest.raises(ValueError, match=message):
        sim.node.inject(fault, 0, **params)


def test_nvl72_fleet_is_one_domain_of_72_gpus_and_b200_has_the_worked_example_layout():
    rack = load_fleet("gb200-nvl72")
    assert len(rack.nodes) == 18
    assert {n.fabric_domain for n in rack.nodes} == {"nvl72-rack-a"}
    assert sum(len(n.gpus) for n in rack.nodes) == 72
    b200 = load_fleet("b200")
    (node,) = b200.nodes
    layout = [(m.profile.name, m.gpu_instance_id) for m in node.gpus[6].mig]
    assert layout == [("3g.90gb", 1), ("2g.45gb", 3), ("1g.23gb", 7), ("1g.23gb", 8)]


# --- --naming dcgm ---------------------------------------------------------------------------------------
def dcgm_values(sim, name: str) -> dict[str, str]:
    """{gpu: value as printed} of a dcgm-named field."""
    out = {}
    for line in sim.text().splitlines():
        if line.startswith(name + "{"):
            labels, value = line[len(name) + 1 :].rsplit("} ", 1)
            out[dict(re.findall(r'(\w+)="([^"]*)"', labels))["gpu"]] = value
    return out


def test_dcgm_naming_serves_fabric_health_and_power_limits_as_dcgm_exporter_484(simulate):
    sim = simulate("gb200-nvl72", naming="dcgm")
    sim.sample(5)
    sim.node.inject("fabric_health", 1)
    sim.sample(5)
    text = sim.text()
    # opt-in fields of 4.8.4 (#719, #720): gauges; limits in W as doubles
    for name in (
        "DCGM_FI_DEV_FABRIC_HEALTH_SUMMARY",
        "DCGM_FI_DEV_FABRIC_HEALTH_MASK",
        "DCGM_FI_DEV_POWER_MGMT_LIMIT",
        "DCGM_FI_DEV_ENFORCED_POWER_LIMIT",
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
    ):
        assert f"# TYPE {name} gauge" in text, name
    assert {g: float(v) for g, v in dcgm_values(sim, "DCGM_FI_DEV_FABRIC_HEALTH_SUMMARY").items()} == {
        "0": 1.0,
        "1": 3.0,
        "2": 1.0,
        "3": 1.0,
    }
    assert {float(v) for v in dcgm_values(sim, "DCGM_FI_DEV_POWER_MGMT_LIMIT").values()} == {1000.0}
    assert {float(v) for v in dcgm_values(sim, "DCGM_FI_DEV_ENFORCED_POWER_LIMIT").values()} == {1000.0}
    # the deprecated name only where a collectors file asks for it
    assert "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS" not in text


# nvmlClocksEventReason* bits (nvml.h), as OpenCost's saturation queries test them: floor(x / bit) % 2
BITS = {"gpu_idle": 0x1, "sw_power_cap": 0x4, "hw_slowdown": 0x8, "sw_thermal": 0x20, "hw_thermal": 0x40}


def bit_set(value: float, bit: int) -> bool:
    return math.floor(value / bit) % 2 == 1


def test_clock_event_reasons_bitmask_answers_opencosts_bit_tests(simulate):
    sim = simulate("b200", naming="dcgm")
    sim.sample(5)
    sim.node.inject("throttle", 2, reason="hw_slowdown")
    sim.node.inject("throttle", 2, reason="hw_thermal")
    sim.sample(5)
    mask = {g: float(v) for g, v in dcgm_values(sim, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS").items()}
    assert bit_set(mask["2"], BITS["hw_slowdown"]) and bit_set(mask["2"], BITS["hw_thermal"])
    assert not bit_set(mask["2"], BITS["gpu_idle"]) and not bit_set(mask["2"], BITS["sw_thermal"])
    assert not bit_set(mask["0"], BITS["hw_slowdown"]) and not bit_set(mask["0"], BITS["hw_thermal"])
    # the mask is the sum of the active reasons' bits, each read from the native per-reason series
    native = simulate("b200")
    native.sample(5)
    native.node.inject("throttle", 2, reason="hw_slowdown")
    native.node.inject("throttle", 2, reason="hw_thermal")
    native.sample(5)
    reasons = {
        dict(k)["reason"]
        for k, v in samples(native, "nvidia_gpu_clocks_event_active").items()
        if dict(k)["gpu"] == "2" and v == 1.0
    }
    assert {"hw_slowdown", "hw_thermal"} <= reasons
    assert mask["2"] == sum(
        bit
        for reason, bit in (("gpu_idle", 1), ("sw_power_cap", 4), ("hw_slowdown", 8), ("hw_thermal", 64))
        if reason in reasons
    )


def test_a_collectors_file_may_ask_for_the_throttle_reasons_under_their_older_name(simulate, tmp_path):
    csv = tmp_path / "throttle.csv"
    csv.write_text(
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS, gauge, Current clock throttle reasons.\n"
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS, gauge, Current clock event reasons.\n"
    )
    sim = simulate("b200", naming="dcgm", collectors=str(csv))
    sim.sample(5)
    sim.node.inject("throttle", 4, reason="hw_thermal")
    sim.sample(5)
    old = dcgm_values(sim, "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS")
    assert old == dcgm_values(sim, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS") and len(old) == 8
    assert bit_set(float(old["4"]), BITS["hw_thermal"])


# --- gpumeter doctor ------------------------------------------------------------------------------------
def test_doctor_says_whether_each_gpu_has_a_fabric_and_its_state(clock):
    from gpumeter.exporter import doctor
    from gpumeter.simulator.device import SimulatedNode
    from gpumeter.simulator.nvml import SimulatedNvml

    node = SimulatedNode(load_fleet("gb200-nvl72"), "gb200-nvl72-03", clock=clock)
    node.inject("fabric_health", 1)
    node.inject("fabric_registration", 2)
    report = doctor.diagnose(SimulatedNvml(node), privileged=True)
    fabric = [gpu.fabric for gpu in report.gpus]
    domain = str(uuidlib.UUID(bytes=node.gpus[0].fabric.cluster))
    assert fabric[0] == (
        f"v3: NVLink domain {domain}, clique 32766, registration completed (success); health: no condition "
        "reported (healthy)"
    )
    assert fabric[1].endswith("registration completed (success); health: degraded_bw (limited capacity)")
    assert "registration completed (unknown)" in fabric[2]
    assert f"  NVLink fabric: {fabric[0]}" in doctor.render_text(report)

    vm = SimulatedNode(load_fleet("h200-vm"), None, clock=clock)
    (gpu,) = doctor.diagnose(SimulatedNvml(vm), privileged=True).gpus
    assert gpu.fabric.startswith("not available (NOT_SUPPORTED")
    hopper = SimulatedNode(load_fleet("h100-mig"), None, clock=clock)
    first = doctor.diagnose(SimulatedNvml(hopper), privileged=True).gpus[0]
    assert first.fabric.startswith("v2: NVLink domain ") and first.fabric.endswith(
        "registration completed (success); health not reported (before Blackwell)"
    )
