"""``gpumeter doctor``: on every example fleet through the command, and what makes it exit non-zero."""

from __future__ import annotations

import json

import pytest

from gpumeter.cli import build_parser, main
from gpumeter.exporter import doctor
from gpumeter.exporter.doctor import diagnose, render_text
from gpumeter.simulator.device import SimulatedNode
from gpumeter.simulator.fleet import FLEETS_DIR, load_fleet
from gpumeter.simulator.nvml import SimulatedNvml


def _shape(node) -> tuple:
    """What a node's report depends on besides its names and UUIDs: its GPUs' models and how each is split
    and shared (the NVL72 rack's 18 trays are two shapes)."""
    shared = ("dra", "fractional", "time_slicing", "vgpus", "passthrough", "vgpu_host")
    gpus = tuple(
        (g.model.key, g.mig_enabled, len(g.mig), *(bool(getattr(g, name)) for name in shared))
        for g in node.gpus
    )
    return node.mig_strategy, node.sharing_strategy, node.exporter_privileged, gpus


def _one_per_shape(nodes) -> list:
    first: dict[tuple, object] = {}
    for node in nodes:
        first.setdefault(_shape(node), node)
    return list(first.values())


# every example fleet, each node of a shape of its own
EXAMPLES = [
    (path.stem, node.name)
    for path in sorted(FLEETS_DIR.glob("*.yaml"))
    for node in _one_per_shape(load_fleet(path).nodes)
]


def _doctor(*argv: str) -> int:
    """`gpumeter doctor ARGV`, parsed as the command parses it, over a stand-in that answers at once: what
    doctor reports does not depend on how long each call takes (the tests through main() keep the
    driver's time per call)."""
    return doctor.run(build_parser(["doctor", *argv]).parse_args(["doctor", *argv]), instant=True)


@pytest.mark.parametrize(("fleet", "node"), EXAMPLES)
def test_doctor_runs_on_every_example_fleet(capsys, fleet, node):
    status = _doctor("--simulate", fleet, "--simulate-node", node, "--json")
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
    # dra.yaml's gpu-dra-01: 7 containers through 6 claims (5 of GPUs, and the pretrain pod's ComputeDomain
    # channel); its slice: GPUs 0, 2, 3 and GPU 1's 4 MIG devices
    assert "kubelet dynamic resources (DRA): reported: 7 containers hold devices through 6 DRA claims" in text
    assert (
        "ResourceSlices (DRA): readable: 7 gpu.nvidia.com devices of gpu-dra-01 (3 GPUs, 4 MIG devices)"
        in text
    )
    main(["doctor", "--simulate", "h100-mig"])  # no claims there: says what that may mean
    assert "none reported: no DRA claims on this node, or a kubelet before 1.34" in capsys.readouterr().out


def test_forbidden_resource_slices_are_named_but_do_not_block(clock):
    from gpumeter.simulator.kubeapi import StandInKubeApi

    fleet = load_fleet("dra")
    node = SimulatedNode(fleet, "gpu-dra-01", clock=clock)
    with StandInKubeApi(fleet) as api:
        api.set_fault("forbidden-dra")
        report = diagnose(SimulatedNvml(node), clock=clock, kube_api=api.base_url, node_name="gpu-dra-01")
    assert report.resource_slices_ok is False and report.exit_status == 0
    assert report.resource_slices.startswith("cannot read the ResourceSlices of gpu-dra-01 (forbidden)")
    assert "resourceslices.resource.k8s.io" in report.resource_slices  # the RBAC it lacks


# --- `doctor --check`: a verdict per finding --------------------------------------------------------------
HEALTHY = [(fleet, node) for fleet, node in EXAMPLES]


@pytest.mark.parametrize(("fleet", "node"), HEALTHY)
def test_check_passes_every_healthy_example_fleet(capsys, fleet, node):
    status = _doctor("--check", "--simulate", fleet, "--simulate-node", node)
    out = capsys.readouterr().out
    assert status == 0, out
    assert out.startswith(f"healthy: {len(load_fleet(fleet).node(node).gpus)} GPUs, no finding")


def _check(node, clock, **options):
    return diagnose(SimulatedNvml(node), clock=clock, kernel_log=node.kmsg, **options)


@pytest.mark.parametrize(
    ("fleet", "fault", "params", "kind", "says"),
    [
        ("workstation", "gpu_lost", {}, "gpu_lost", "nvmlDeviceGetHandleByIndex: GPU_IS_LOST"),
        ("h100-mig", "nvlink_down", {"link": 3}, "nvlink_inactive", "NVLink 3 inactive"),
        ("h200", "row_remap", {"kind": "pending"}, "row_remap_pending", "waits for the next GPU reset"),
        ("h200", "row_remap", {"kind": "failure"}, "row_remap_pending", "a row remap failed"),
        ("v100-t4", "page_retire", {"cause": "dbe"}, "page_retirement_pending", "page retirement waits"),
        (
            "b200",
            "fabric_registration",
            {"state": "failed"},
            "fabric_unregistered",
            "not registered in its NVLink fabric (completed, unknown)",
        ),
        (
            "h100-mig",
            "overheat",
            {"celsius": 80},
            "temperature_at_slowdown",
            "at or over its slowdown threshold",
        ),
        (
            "h100-mig",
            "xid",
            {"code": 48},
            "critical_xid",
            "XID 48 (Double Bit ECC Error) in the kernel log 0 s ago",
        ),
    ],
)
def test_check_finds_each_injected_fault_and_exits_1(clock, fleet, fault, params, kind, says):
    node = SimulatedNode(load_fleet(fleet), clock=clock)
    gpu = 1 if fleet == "workstation" else 0
    node.inject(fault, gpu, **params)
    clock.advance(60)  # the GPU heats up; the XID's kernel-log line is a minute old
    report = _check(node, clock)
    assert report.check_status == 1
    found = [f for f in report.findings if f.kind == kind]
    assert len(found) == 1, report.findings
    uuid = "" if kind == "gpu_lost" else node.gpus[gpu].spec.uuid  # a lost GPU's handle gives no UUID
    assert found[0].gpu == gpu and found[0].uuid == uuid
    assert says.replace("0 s ago", "60 s ago") in found[0].line(), found[0].line()
    assert found[0].line().startswith(f"{kind} GPU {gpu}{' ' + uuid if uuid else ''}: ")
    # the same node cleared (and cooled down) is healthy again, but for what stays: the XID's kernel-log
    # line while it is recent, a failed row remap (the damage is permanent)
    node.clear()
    clock.advance(600)
    assert [f.kind for f in _check(node, clock).findings] == (
        [kind] if fault == "xid" or params.get("kind") == "failure" else []
    )


def test_an_nvlink_asleep_to_save_power_is_no_finding(clock):
    node = SimulatedNode(load_fleet("h100-mig"), clock=clock)
    node.inject("nvlink_sleep", 0, link=2)
    assert _check(node, clock).findings == []


def test_a_critical_xid_ages_out_of_the_window_and_an_application_xid_never_counts(clock):
    node = SimulatedNode(load_fleet("h100-mig"), clock=clock)
    node.inject("xid", 0, code=31)  # an application's memory fault: the job's bug, not the GPU's
    node.inject("xid", 0, code=119)
    clock.advance(601)
    assert [f.message for f in _check(node, clock, xid_window_s=900).findings] == [
        "XID 119 (GSP RPC Timeout) in the kernel log 601 s ago"
    ]
    assert _check(node, clock, xid_window_s=600).findings == []


def test_xid_79_is_both_a_lost_gpu_and_a_critical_xid(clock):
    node = SimulatedNode(load_fleet("a100-pcie"), clock=clock)
    node.inject("xid", 2, code=79)
    findings = _check(node, clock).findings
    # a GPU off the bus gives NVML no handle, so the kernel log's line is known by its PCI address only
    assert [f.line() for f in findings] == [
        "gpu_lost GPU 2: nvmlDeviceGetHandleByIndex: GPU_IS_LOST",
        "critical_xid: XID 79 (GPU has fallen off the bus) in the kernel log 0 s ago (PCI 0000:37:00)",
    ]


def test_nvml_and_the_kubelet_unreachable_are_findings(clock, tmp_path):
    node = SimulatedNode(load_fleet("workstation"), clock=clock)
    node.inject("nvml_unavailable")
    report = diagnose(
        SimulatedNvml(node), clock=clock, kubelet_socket=str(tmp_path / "gone.sock"), kubelet_required=True
    )
    assert [f.kind for f in report.findings] == ["nvml_unreachable", "kubelet_unreachable"]
    assert "LIBRARY_NOT_FOUND" in report.findings[0].message
    assert "gone.sock: No such file or directory" in report.findings[1].message


def test_a_gpu_the_driver_no_longer_lists_is_lost_when_the_count_is_known(clock):
    node = SimulatedNode(load_fleet("workstation"), clock=clock)
    report = _check(node, clock, expect_gpus=3)
    assert [f.line() for f in report.findings] == ["gpu_lost: NVML sees 2 GPUs, 3 expected"]


def test_an_unreadable_kernel_log_is_said_not_hidden(clock):
    node = SimulatedNode(load_fleet("workstation"), clock=clock)

    def denied():
        raise PermissionError(1, "Operation not permitted")

    report = diagnose(SimulatedNvml(node), clock=clock, kernel_log=denied)
    assert report.findings == []
    assert report.kernel_log == "not readable (Operation not permitted): XIDs before this run not checked"


def test_the_kernel_log_is_read_as_dev_kmsg_records(tmp_path):
    from gpumeter.exporter.doctor import read_kmsg, recent_xids

    log = tmp_path / "kmsg"  # a regular file reads to its end, as /dev/kmsg reads to EAGAIN
    log.write_text(
        "3,1,45990995,-;NVRM: Xid (PCI:0000:00:06): 31, pid=531, name=python3, channel 0x0000000a\n"
    )
    now, records = read_kmsg(str(log))
    assert now > 0 and records == [
        "3,1,45990995,-;NVRM: Xid (PCI:0000:00:06): 31, pid=531, name=python3, channel 0x0000000a"
    ]
    assert recent_xids(46.0 + 10, records, 60) == [((0, 0, 6), 31, pytest.approx(10.009005))]


def test_check_json_and_its_exit_status_through_the_command(capsys):
    status = main(["doctor", "--check", "--json", "--simulate", "h100-mig"])
    verdict = json.loads(capsys.readouterr().out)
    assert status == verdict["exit_status"] == 0
    assert verdict["healthy"] is True and verdict["findings"] == [] and verdict["gpus"] == 8
    assert verdict["kernel_log"].startswith("0 records read")


def test_xid_window_must_be_positive(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["doctor", "--check", "--xid-window", "-5", "--simulate", "h100-mig"])
    assert exited.value.code == 2
    assert "--xid-window: a positive number of seconds, not '-5'" in capsys.readouterr().err
