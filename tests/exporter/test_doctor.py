"""``gpumeter doctor``: on every example fleet through the command, and what makes it exit non-zero."""

from __future__ import annotations

import json

import pytest

from gpumeter.cli import main
from gpumeter.exporter.doctor import diagnose, render_text
from gpumeter.exporter.simulator.device import SimulatedNode
from gpumeter.exporter.simulator.fleet import FLEETS_DIR, load_fleet
from gpumeter.exporter.simulator.nvml import SimulatedNvml

EXAMPLES = [
    (path.stem, node.name) for path in sorted(FLEETS_DIR.glob("*.yaml")) for node in load_fleet(path).nodes
]


@pytest.mark.parametrize(("fleet", "node"), EXAMPLES)
def test_doctor_runs_on_every_example_fleet(capsys, fleet, node):
    status = main(["doctor", "--simulate", fleet, "--simulate-node", node, "--json"])
    report = json.loads(capsys.readouterr().out)
    assert status == report["exit_status"] == 0, report["blocking"]
    spec = load_fleet(fleet).node(node)
    assert [g["uuid"] for g in report["gpus"]] == [g.uuid for g in spec.gpus]
    assert report["driver"] == spec.driver_version and report["kubelet_ok"] is True
    for gpu, gpu_spec in zip(report["gpus"], spec.gpus, strict=True):
        answered = {a["what"]: a["result"] for a in gpu["calls"]}
        assert answered["nvmlDeviceGetPowerUsage"] == "ok"
        # what the driver refuses is named with its return code
        assert answered["nvmlDeviceGetMigMode"] == ("ok" if gpu_spec.model.supports_mig else "NOT_SUPPORTED")
        assert answered["nvmlDeviceGetNvLinkState(0)"] == (
            "ok" if gpu_spec.model.nvlinks else "NOT_SUPPORTED"
        )
        # process utilization: refused under MIG (NOT_SUPPORTED); elsewhere samples, or none (NOT_FOUND)
        assert answered["nvmlDeviceGetProcessUtilization"] in (
            ("NOT_SUPPORTED",) if gpu_spec.mig_enabled else ("ok", "NOT_FOUND")
        )
        assert answered["nvmlDeviceGetComputeRunningProcesses"] == "ok"  # the simulated doctor is privileged
        assert len(gpu["mig"]) == len(gpu_spec.mig)
        assert ("supported" in gpu["gpm"] and "not" not in gpu["gpm"]) == gpu_spec.model.has_gpm
        not_exported = " ".join(gpu["not_exported"])
        assert ("nvidia_gpu_retired_pages_total" in not_exported) != gpu_spec.model.has_retired_pages


def test_the_text_report_names_each_part(capsys):
    status = main(["doctor", "--simulate", "h100-mig"])
    text = capsys.readouterr().out
    assert status == 0
    for part in (
        "driver 550.54.15",
        "nvmlDeviceGetPcieThroughput(TX)",
        "field 194 DEV_TEMPERATURE_SLOWDOWN_TLIMIT: ok",
        "MIG layout",
        "GI 7 / CI 0",
        "XID events: XID events supported; MIG instances' XIDs reach this process",
        "GPM: supported",
        "the exporter will not export",
        "kubelet pod-resources:",
        "nothing blocks monitoring",
    ):
        assert part in text, part


def test_a_lost_gpu_and_a_dead_kubelet_socket_block_monitoring(clock, tmp_path):
    node = SimulatedNode(load_fleet("workstation"), clock=clock)
    node.inject("gpu_lost", 1)
    report = diagnose(
        SimulatedNvml(node), kubelet_socket=str(tmp_path / "absent.sock"), kubelet_required=True, clock=clock
    )
    assert report.exit_status == 1
    text = render_text(report)
    assert "GPU 1: nvmlDeviceGetHandleByIndex: GPU_IS_LOST" in text
    assert "absent.sock: No such file or directory" in text
    assert "GPU 0" in text and "(up)" in text


def test_nvml_that_does_not_start_blocks_and_says_so(clock):
    node = SimulatedNode(load_fleet("workstation"), clock=clock)
    node.inject("nvml_unavailable")
    report = diagnose(SimulatedNvml(node), clock=clock)
    assert report.exit_status == 1
    assert report.nvml.startswith("nvmlInit failed: LIBRARY_NOT_FOUND")
    assert "pod attribution off" in report.kubelet


def test_an_unprivileged_exporter_is_told_what_it_misses(clock):
    node = SimulatedNode(load_fleet("h100-mig"), clock=clock)
    report = diagnose(SimulatedNvml(node), privileged=False, clock=clock)
    assert "MIG instances' XIDs are withheld" in report.gpus[0].xid_events
    assert report.exit_status == 0


def test_doctor_says_whether_the_kubelet_reports_dra_devices_and_slices_can_be_read(capsys):
    status = main(["doctor", "--simulate", "dra", "--simulate-node", "gpu-dra-01"])
    text = capsys.readouterr().out
    assert status == 0
    # dra.yaml's gpu-dra-01: 7 containers through 5 claims; its slice: GPUs 0, 2, 3 and GPU 1's 4 MIG devices
    assert "kubelet dynamic resources (DRA): reported: 7 containers hold devices through 5 DRA claims" in text
    assert (
        "ResourceSlices (DRA): readable: 7 gpu.nvidia.com devices of gpu-dra-01 (3 GPUs, 4 MIG devices)"
        in text
    )
    main(["doctor", "--simulate", "h100-mig"])  # no claims there: says what that may mean
    assert "none reported: no DRA claims on this node, or a kubelet before 1.34" in capsys.readouterr().out


def test_forbidden_resource_slices_are_named_but_do_not_block(clock):
    from gpumeter.exporter.simulator.kubeapi import StandInKubeApi

    fleet = load_fleet("dra")
    node = SimulatedNode(fleet, "gpu-dra-01", clock=clock)
    with StandInKubeApi(fleet) as api:
        api.set_fault("forbidden-dra")
        report = diagnose(SimulatedNvml(node), clock=clock, kube_api=api.base_url, node_name="gpu-dra-01")
    assert report.resource_slices_ok is False and report.exit_status == 0
    assert report.resource_slices.startswith("cannot read the ResourceSlices of gpu-dra-01 (forbidden)")
    assert "resourceslices.resource.k8s.io" in report.resource_slices  # the RBAC it lacks
