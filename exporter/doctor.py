"""``gpumeter doctor``: first contact with a node, in a report a user can paste into a bug report.

It asks NVML what the exporter will ask, the way the exporter asks it, and says per GPU which functions
and fields answered, which did not and with which return code (and how long each call took), the MIG
layout, XID event support and whether MIG instances' XIDs reach this process, GPM support, whether the
kubelet's pod-resources socket is reachable, and which series the exporter will therefore not export.
Then one sampling cycle of the real exporter confirms the last point. The exit status is 1 when
something blocks monitoring (NVML does not start, no GPU, a GPU lost or unreadable, a configured kubelet
socket that does not answer), else 0.

``--check`` turns the report into a verdict for a node-problem-detector plugin or a cron job: one line
per finding (a lost GPU, an inactive NVLink, a pending row remap or page retirement, a temperature at or
over slowdown, a critical XID in the kernel log's recent records or during the check, NVML or the kubelet
unreachable) and exit status 1 when there is any, 0 when there is none (docs/doctor.md, "--check").

``--simulate FLEET`` runs it against the stand-in (with the driver's per-call latency and a stand-in
kubelet), which is how it is tested on every example fleet. On a real node it is the evidence for the
stand-in's capability tables (gpumeter/simulator/models.py) and latency table (simulator/latency.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import socket
import stat
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pynvml as N

from gpumeter import contract

from . import collectors as collector_registry
from .catalog import CATALOG, Scope
from .kubelet.client import DEFAULT_SOCKET
from .nvml import NvmlSession, process_is_privileged
from .sampler import Sampler
from .xid import XidWatcher
from .xid_messages import message as xid_message

__all__ = ["Finding", "Report", "add_parser", "diagnose", "read_kmsg"]

OK = "ok"
_CODES = {v: k for k, v in vars(N).items() if k.startswith("NVML_ERROR_") and isinstance(v, int)}
# Field IDs by value; aliases share a value, the first name pynvml defines wins.
_FIELD_NAMES: dict[int, str] = {}
for _name, _value in vars(N).items():
    if _name.startswith("NVML_FI_") and isinstance(_value, int):
        _FIELD_NAMES.setdefault(_value, _name.removeprefix("NVML_FI_"))
# Fields the exporter may ask besides its collectors' batch, so the report shows what they answer.
PROBE_FIELDS = (
    N.NVML_FI_DEV_TEMPERATURE_SHUTDOWN_TLIMIT,
    N.NVML_FI_DEV_TEMPERATURE_SLOWDOWN_TLIMIT,
    N.NVML_FI_DEV_TEMPERATURE_GPU_MAX_TLIMIT,
    N.NVML_FI_DEV_TEMPERATURE_MEM_MAX_TLIMIT,
    N.NVML_FI_DEV_PCIE_COUNT_TX_BYTES,
    N.NVML_FI_DEV_PCIE_COUNT_RX_BYTES,
    N.NVML_FI_DEV_NVLINK_LINK_COUNT,
)


def code_name(code: int) -> str:
    return _CODES.get(code, f"NVML error {code}").removeprefix("NVML_ERROR_")


@dataclass
class Answer:
    what: str  # "nvmlDeviceGetPowerUsage" or "field 82 MEMORY_TEMP"
    result: str  # "ok" or the return code's name
    value: str = ""
    ms: float | None = None


@dataclass
class GpuReport:
    index: int
    uuid: str = ""
    name: str = ""
    up: bool = True
    problem: str = ""
    calls: list[Answer] = field(default_factory=list)
    fields: list[Answer] = field(default_factory=list)
    mig: list[dict[str, Any]] = field(default_factory=list)
    xid_events: str = ""
    gpm: str = ""
    fabric: str = ""  # the NVLink fabric: domain, clique, registration, health (docs/nvml.md §17.2)
    not_exported: list[str] = field(default_factory=list)


# What `--check` finds, one kind per condition that takes a GPU (or the node's monitoring) out of service.
GPU_LOST = "gpu_lost"
NVLINK_INACTIVE = "nvlink_inactive"
ROW_REMAP_PENDING = "row_remap_pending"
PAGE_RETIREMENT_PENDING = "page_retirement_pending"
TEMPERATURE_AT_SLOWDOWN = "temperature_at_slowdown"
FABRIC_UNREGISTERED = "fabric_unregistered"
CRITICAL_XID = "critical_xid"
NVML_UNREACHABLE = "nvml_unreachable"
KUBELET_UNREACHABLE = "kubelet_unreachable"
FINDING_KINDS = (
    GPU_LOST,
    NVLINK_INACTIVE,
    ROW_REMAP_PENDING,
    PAGE_RETIREMENT_PENDING,
    TEMPERATURE_AT_SLOWDOWN,
    FABRIC_UNREGISTERED,
    CRITICAL_XID,
    NVML_UNREACHABLE,
    KUBELET_UNREACHABLE,
)
XID_WINDOW_S = 3600.0  # how far back the kernel log's XIDs count as recent, by default


@dataclass(frozen=True)
class Finding:
    kind: str
    message: str
    gpu: int | None = None
    uuid: str = ""

    def line(self) -> str:
        where = "" if self.gpu is None else f" GPU {self.gpu}" + (f" {self.uuid}" if self.uuid else "")
        return f"{self.kind}{where}: {self.message}"


@dataclass
class Report:
    nvml: str = ""
    driver: str = ""
    cuda: str = ""
    privileged: bool = False
    gpus: list[GpuReport] = field(default_factory=list)
    kubelet: str = ""
    kubelet_ok: bool | None = None  # None: not checked
    dynamic_resources: str = ""  # whether the kubelet reports DRA devices (PodResources dynamic_resources)
    resource_slices: str = ""  # whether this node's ResourceSlices can be read (--kube-api)
    resource_slices_ok: bool | None = None  # None: not checked; never blocking (attribution degrades)
    blocking: list[str] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    kernel_log: str = ""  # what the XID check read, or why it could not

    @property
    def exit_status(self) -> int:
        return 1 if self.blocking else 0

    @property
    def check_status(self) -> int:
        """``--check``'s exit status: 1 with any finding (node-problem-detector's NonOK), else 0."""
        return 1 if self.findings else 0

    def as_dict(self) -> dict:
        from dataclasses import asdict

        return {**asdict(self), "exit_status": self.exit_status, "check_status": self.check_status}

    def check_dict(self) -> dict:
        from dataclasses import asdict

        return {
            "healthy": not self.findings,
            "findings": [asdict(f) for f in self.findings],
            "gpus": len(self.gpus),
            "kernel_log": self.kernel_log,
            "exit_status": self.check_status,
        }


# --- the kernel log: where a critical XID that happened before this run is still to be seen -------------
# The driver's line, e.g. "NVRM: Xid (PCI:0000:00:06): 31, pid=531, ..." (a real H200, alerts/runbook.md).
XID_LINE = re.compile(r"NVRM: Xid \(PCI:([0-9a-fA-F]+):([0-9a-fA-F]+):([0-9a-fA-F]+)\): (\d+),")
KernelLog = Callable[[], tuple[float, list[str]]]  # -> (seconds since boot now, /dev/kmsg records)


def read_kmsg(path: str = "/dev/kmsg") -> tuple[float, list[str]]:
    """The kernel's log buffer as /dev/kmsg records ("prio,seq,usec since boot,flags;message"), read
    without blocking (Documentation/ABI/testing/dev-kmsg); now in the same clock (CLOCK_MONOTONIC, as the
    kernel stamps its records). Raises OSError where it cannot be read (no CAP_SYSLOG, dmesg_restrict)."""
    records = []
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        while True:
            try:
                chunk = os.read(fd, 8192)
            except BlockingIOError:
                break
            except BrokenPipeError:  # a record overwritten while reading: go on with the next one
                continue
            if not chunk:
                break
            records.append(chunk.decode(errors="replace").rstrip("\n"))
    finally:
        os.close(fd)
    return time.clock_gettime(time.CLOCK_MONOTONIC), records


def _pci_key(domain: str, bus: str, device: str) -> tuple[int, int, int]:
    return int(domain, 16), int(bus, 16), int(device, 16)


def recent_xids(
    now: float, records: list[str], window_s: float
) -> list[tuple[tuple[int, int, int], int, float]]:
    """(PCI domain/bus/device, XID, seconds ago) of every NVRM Xid record of the last ``window_s``."""
    found = []
    for record in records:
        prefix, _, message = record.partition(";")
        fields = prefix.split(",")
        match = XID_LINE.search(message)
        if match is None or len(fields) < 3 or not fields[2].isdigit():
            continue
        ago = now - int(fields[2]) / 1e6
        if ago <= window_s:
            found.append((_pci_key(*match.group(1, 2, 3)), int(match.group(4)), ago))
    return found


def _timed(fn: Callable, *args) -> tuple[str, Any, float]:
    started = time.perf_counter()
    try:
        value = fn(*args)
        result = OK
    except N.NVMLError as exc:
        value, result = None, code_name(exc.value)
    except N.NVMLLibraryMismatchError:
        value, result = None, "LIBRARY_MISMATCH"
    return result, value, (time.perf_counter() - started) * 1000


def _show(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    if hasattr(value, "_fields_"):  # a ctypes structure: its first few members
        parts = [f"{name}={getattr(value, name)}" for name, *_ in value._fields_[:4] if name != "version"]
        return ", ".join(parts)
    text = str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _probes(handle) -> list[tuple[str, Callable, tuple]]:
    """The per-device calls the collectors make, in the form the exporter makes them."""
    return [
        ("nvmlDeviceGetTemperatureV", N.nvmlDeviceGetTemperatureV, (handle, N.NVML_TEMPERATURE_GPU)),
        ("nvmlDeviceGetTemperature", N.nvmlDeviceGetTemperature, (handle, N.NVML_TEMPERATURE_GPU)),
        (
            "nvmlDeviceGetTemperatureThreshold(SLOWDOWN)",
            N.nvmlDeviceGetTemperatureThreshold,
            (handle, N.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN),
        ),
        (
            "nvmlDeviceGetTemperatureThreshold(MEM_MAX)",
            N.nvmlDeviceGetTemperatureThreshold,
            (handle, N.NVML_TEMPERATURE_THRESHOLD_MEM_MAX),
        ),
        ("nvmlDeviceGetMarginTemperature", N.nvmlDeviceGetMarginTemperature, (handle,)),
        ("nvmlDeviceGetPowerUsage", N.nvmlDeviceGetPowerUsage, (handle,)),
        ("nvmlDeviceGetEnforcedPowerLimit", N.nvmlDeviceGetEnforcedPowerLimit, (handle,)),
        ("nvmlDeviceGetTotalEnergyConsumption", N.nvmlDeviceGetTotalEnergyConsumption, (handle,)),
        ("nvmlDeviceGetUtilizationRates", N.nvmlDeviceGetUtilizationRates, (handle,)),
        ("nvmlDeviceGetMemoryInfo(v2)", N.nvmlDeviceGetMemoryInfo, (handle, N.nvmlMemory_v2)),
        ("nvmlDeviceGetClockInfo(SM)", N.nvmlDeviceGetClockInfo, (handle, N.NVML_CLOCK_SM)),
        ("nvmlDeviceGetPerformanceState", N.nvmlDeviceGetPerformanceState, (handle,)),
        ("nvmlDeviceGetFanSpeed", N.nvmlDeviceGetFanSpeed, (handle,)),
        ("nvmlDeviceGetCurrentClocksEventReasons", N.nvmlDeviceGetCurrentClocksEventReasons, (handle,)),
        ("nvmlDeviceGetCurrentClocksThrottleReasons", N.nvmlDeviceGetCurrentClocksThrottleReasons, (handle,)),
        (
            "nvmlDeviceGetPcieThroughput(TX)",
            N.nvmlDeviceGetPcieThroughput,
            (handle, N.NVML_PCIE_UTIL_TX_BYTES),
        ),
        ("nvmlDeviceGetNvLinkState(0)", N.nvmlDeviceGetNvLinkState, (handle, 0)),
        ("nvmlDeviceGetMigMode", N.nvmlDeviceGetMigMode, (handle,)),
        ("nvmlGpmQueryDeviceSupport", N.nvmlGpmQueryDeviceSupport, (handle,)),
        ("nvmlDeviceGetSupportedEventTypes", N.nvmlDeviceGetSupportedEventTypes, (handle,)),
        # the processes collector's calls: on a MIG parent, NO_PERMISSION for an unprivileged caller;
        # process utilization NOT_SUPPORTED under MIG, NOT_FOUND without samples (docs/nvml.md §9)
        ("nvmlDeviceGetComputeRunningProcesses", N.nvmlDeviceGetComputeRunningProcesses, (handle,)),
        ("nvmlDeviceGetMPSComputeRunningProcesses", N.nvmlDeviceGetMPSComputeRunningProcesses, (handle,)),
        ("nvmlDeviceGetProcessUtilization", N.nvmlDeviceGetProcessUtilization, (handle, 0)),
    ]


def _fields(handle, wanted: list[tuple[int, int]]) -> list[Answer]:
    """One batched read, as the exporter does; per field its own status. Scoped fields are summarised."""
    ids = list(dict.fromkeys(wanted + [(f, 0) for f in PROBE_FIELDS]))
    result, values, ms = _timed(N.nvmlDeviceGetFieldValues, handle, ids)
    if result != OK:
        return [Answer(f"nvmlDeviceGetFieldValues ({len(ids)} fields)", result, ms=ms)]
    by_field: dict[int, list[tuple[int, str]]] = {}
    for entry in values:
        ret = OK if entry.nvmlReturn == N.NVML_SUCCESS else code_name(entry.nvmlReturn)
        by_field.setdefault(entry.fieldId, []).append((entry.scopeId, ret))
    answers = [Answer(f"nvmlDeviceGetFieldValues ({len(ids)} fields, one call)", OK, ms=ms)]
    for field_id, scoped in sorted(by_field.items()):
        results = sorted({ret for _, ret in scoped})
        scopes = f" scopes {scoped[0][0]}-{scoped[-1][0]}" if len(scoped) > 1 else ""
        answers.append(
            Answer(f"field {field_id} {_FIELD_NAMES.get(field_id, '?')}{scopes}", "/".join(results))
        )
    return answers


def _mig_layout(handle) -> list[dict[str, Any]]:
    layout = []
    result, count, _ = _timed(N.nvmlDeviceGetMaxMigDeviceCount, handle)
    for slot in range(count or 0):
        result, mig, _ = _timed(N.nvmlDeviceGetMigDeviceHandleByIndex, handle, slot)
        if result != OK:
            continue
        entry: dict[str, Any] = {"slot": slot}
        for key, fn in (
            ("gpu_instance_id", N.nvmlDeviceGetGpuInstanceId),
            ("compute_instance_id", N.nvmlDeviceGetComputeInstanceId),
            ("name", N.nvmlDeviceGetName),
            ("uuid", N.nvmlDeviceGetUUID),
        ):
            result, value, _ = _timed(fn, mig)
            entry[key] = value if result == OK else result
        layout.append(entry)
    return layout


def _dynamic_resources(pods) -> str:
    """Whether the kubelet reports DRA devices: a container with ``dynamic_resources`` proves it does;
    none may mean no claims here, or a kubelet without the PodResources DRA gates."""
    claims = {
        (d.claim_namespace, d.claim_name) for p in pods for c in p.containers for d in c.dynamic_resources
    }
    holders = sum(1 for p in pods for c in p.containers if c.dynamic_resources)
    if holders:
        return f"reported: {holders} containers hold devices through {len(claims)} DRA claims"
    return (
        "none reported: no DRA claims on this node, or a kubelet before 1.34 without the "
        "KubeletPodResourcesDynamicResources and KubeletPodResourcesGet feature gates"
    )


def _resource_slices(kube_api: str | None, token_file: str | None, node: str) -> tuple[str, bool | None]:
    if not kube_api:
        return "not checked (no --kube-api): DRA devices are attributed from their names alone", None
    from .kubernetes.api import KubeApiError, PodLister
    from .kubernetes.dra import slice_devices

    try:
        lister = (
            PodLister.in_cluster(timeout=3.0)
            if kube_api == "in-cluster"
            else PodLister(kube_api, token_path=token_file, timeout=3.0)
        )
        try:
            devices = slice_devices(lister.list_resource_slices(node))
        finally:
            lister.close()
    except KubeApiError as exc:
        return f"cannot read the ResourceSlices of {node} ({exc.reason}): {exc}", False
    gpus = sum(1 for d in devices.values() if d.type == "gpu")
    migs = sum(1 for d in devices.values() if d.type == "mig")
    return (
        f"readable: {len(devices)} gpu.nvidia.com devices of {node} ({gpus} GPUs, {migs} MIG devices)",
        True,
    )


def _kubelet(socket_path: str | None, required: bool) -> tuple[str, bool | None, str]:
    if not socket_path:
        return "not checked (no kubelet socket configured): pod attribution off", None, "not checked"
    path = Path(socket_path)
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        if not required:
            return (
                f"{socket_path}: {exc.strerror} (not a Kubernetes node?): pod attribution off",
                None,
                "not checked",
            )
        return f"{socket_path}: {exc.strerror}", False, "not checked"
    if not stat.S_ISSOCK(mode):
        return f"{socket_path}: not a unix socket", False, "not checked"
    if not os.access(socket_path, os.R_OK | os.W_OK):
        return (
            f"{socket_path}: no read/write permission for uid {os.geteuid()} (mount it, run as root)",
            False,
            "not checked",
        )
    from .kubelet.client import KubeletError, PodResourcesClient

    try:
        with PodResourcesClient(socket_path, timeout=3.0) as client:
            started = time.perf_counter()
            pods = client.list()
            devices = client.allocatable().devices
            ms = (time.perf_counter() - started) * 1000
    except KubeletError as exc:
        return str(exc), False, "not checked"
    held = sum(1 for p in pods for c in p.containers if c.devices)
    answer = (
        f"{socket_path}: List and GetAllocatableResources answered in {ms:.1f} ms "
        f"({len(devices)} allocatable device groups, {held} containers holding devices)"
    )
    return answer, True, _dynamic_resources(pods)


def diagnose(
    library: object | None = None,
    *,
    kubelet_socket: str | None = None,
    kubelet_required: bool = False,
    privileged: bool | None = None,
    clock: Callable[[], float] = time.time,
    kube_api: str | None = None,
    kube_api_token_file: str | None = None,
    node_name: str | None = None,
    kernel_log: KernelLog | None = None,
    xid_window_s: float = XID_WINDOW_S,
    expect_gpus: int | None = None,
) -> Report:
    """Everything the report says. ``library``: None for the real libnvidia-ml, else a stand-in.
    ``kernel_log``: where recent XIDs are read (None: not read); ``expect_gpus``: how many GPUs the node
    has, so that one the driver no longer enumerates counts as lost."""
    report = Report(privileged=process_is_privileged() if privileged is None else privileged)
    session = NvmlSession(library)
    try:
        session.start()
    except N.NVMLError as exc:
        report.nvml = f"nvmlInit failed: {code_name(exc.value)} ({exc})"
        report.blocking.append(
            "NVML does not start: is the NVIDIA driver loaded and libnvidia-ml.so.1 found?"
        )
        report.findings.append(Finding(NVML_UNREACHABLE, report.nvml))
        _kubelet_findings(report, kubelet_socket, kubelet_required)
        return report
    snapshot = None
    try:
        report.nvml = N.nvmlSystemGetNVMLVersion()
        report.driver = N.nvmlSystemGetDriverVersion()
        cuda = N.nvmlSystemGetCudaDriverVersion()
        report.cuda = f"{cuda // 1000}.{cuda % 1000 // 10}"
        count = N.nvmlDeviceGetCount()
        if count == 0:
            report.blocking.append("NVML sees no GPU")
        if count == 0 or (expect_gpus is not None and count < expect_gpus):
            expected = f", {expect_gpus} expected" if expect_gpus is not None else ""
            report.findings.append(Finding(GPU_LOST, f"NVML sees {count} GPUs{expected}"))
        chosen = collector_registry.build(xid_watcher=None, privileged=report.privileged)
        for index in range(count):
            report.gpus.append(_gpu(index, chosen, report))
        snapshot = _confirm_with_a_cycle(session, report, clock)
    finally:
        session.stop()
    _gpu_findings(report, snapshot)
    _xid_findings(report, snapshot, kernel_log, xid_window_s)
    _kubelet_findings(report, kubelet_socket, kubelet_required)
    report.resource_slices, report.resource_slices_ok = _resource_slices(
        kube_api, kube_api_token_file, node_name or socket.gethostname()
    )
    return report


def _kubelet_findings(report: Report, socket_path: str | None, required: bool) -> None:
    report.kubelet, report.kubelet_ok, report.dynamic_resources = _kubelet(socket_path, required)
    if report.kubelet_ok is False:
        report.blocking.append(f"kubelet: {report.kubelet}")
        report.findings.append(Finding(KUBELET_UNREACHABLE, report.kubelet))


def _gpu_findings(report: Report, snapshot) -> None:
    """What takes a GPU out of service, as the exporter's own cycle saw it (the series the alerts read)."""
    for gpu in report.gpus:
        if not gpu.up:
            report.findings.append(Finding(GPU_LOST, gpu.problem, gpu.index, gpu.uuid))
    if snapshot is None:
        return
    if not snapshot.nvml_up:
        report.findings.append(Finding(NVML_UNREACHABLE, "the exporter's sampling cycle found NVML down"))
    index = {g.uuid: g.index for g in report.gpus}

    def where(labels) -> tuple[int | None, str]:
        return index.get(labels[1]), labels[1]

    for labels, up in snapshot.samples(contract.NVLINK_UP.name):
        if up == 0:
            report.findings.append(Finding(NVLINK_INACTIVE, f"NVLink {labels[2]} inactive", *where(labels)))
    for labels, pending in snapshot.samples(contract.REMAPPED_ROWS_PENDING.name):
        if pending:
            message = "a row remap waits for the next GPU reset: drain the GPU and reset it"
            report.findings.append(Finding(ROW_REMAP_PENDING, message, *where(labels)))
    for labels, failed in snapshot.samples(contract.REMAPPED_ROWS_FAILURE.name):
        if failed:
            message = "a row remap failed (no spare rows left): an RMA candidate"
            report.findings.append(Finding(ROW_REMAP_PENDING, message, *where(labels)))
    for labels, pending in snapshot.samples(contract.RETIRED_PAGES_PENDING.name):
        if pending:
            message = "a page retirement waits for the next GPU reset or driver reload"
            report.findings.append(Finding(PAGE_RETIREMENT_PENDING, message, *where(labels)))
    # NVLink fabric: a GPU not registered can take no part in multi-node NVLink (GpuFabricRegistrationIncomplete)
    fabric = {labels[:2]: labels for labels, _ in snapshot.samples(contract.FABRIC_INFO.name)}
    for labels, registered in snapshot.samples(contract.FABRIC_REGISTERED.name):
        if not registered:
            info = fabric.get(labels[:2])
            state = f"{info[4]}{', ' + info[5] if info and info[5] else ''}" if info else "unknown"
            message = f"not registered in its NVLink fabric ({state}): no multi-node NVLink for its jobs"
            report.findings.append(Finding(FABRIC_UNREGISTERED, message, *where(labels)))
    slowdown = {
        labels[:2]: value
        for labels, value in snapshot.samples(contract.TEMPERATURE_THRESHOLD.name)
        if labels[2] == "slowdown"
    }
    for labels, celsius in snapshot.samples(contract.TEMPERATURE.name):
        limit = slowdown.get(labels[:2])
        if limit is not None and celsius >= limit:
            message = f"{celsius:.0f} °C, at or over its slowdown threshold {limit:.0f} °C"
            report.findings.append(Finding(TEMPERATURE_AT_SLOWDOWN, message, *where(labels)))


def _xid_findings(report: Report, snapshot, kernel_log: KernelLog | None, window_s: float) -> None:
    """Critical XIDs: those the kernel log holds from the last ``window_s`` (the driver writes every XID
    there, so one from before this run is seen), and any NVML event during the check's own cycles."""
    seen: dict[tuple[int | None, str, int], str] = {}
    if snapshot is not None:
        for labels, count in snapshot.samples(contract.XID_ERRORS.name):
            if count and int(labels[2]) in contract.CRITICAL_XIDS:
                seen[(int(labels[0]), labels[1], int(labels[2]))] = "during the check"
    if kernel_log is None:
        report.kernel_log = "not read"
    else:
        try:
            now, records = kernel_log()
        except OSError as exc:
            report.kernel_log = f"not readable ({exc.strerror or exc}): XIDs before this run not checked"
        else:
            report.kernel_log = f"{len(records)} records read, XIDs of the last {window_s:.0f} s count"
            by_pci = {}
            for device in snapshot.devices if snapshot is not None else ():
                domain, bus, rest = device.pci_bus_id.split(":")
                by_pci[_pci_key(domain, bus, rest.split(".")[0])] = (device.index, device.uuid)
            for pci, code, ago in recent_xids(now, records, window_s):
                if code in contract.CRITICAL_XIDS:
                    address = f"PCI {pci[0]:04x}:{pci[1]:02x}:{pci[2]:02x}"
                    gpu, uuid = by_pci.get(pci, (None, address))
                    where = "" if gpu is not None else f" ({address})"  # a GPU NVML no longer lists
                    seen[(gpu, uuid, code)] = f"in the kernel log {ago:.0f} s ago{where}"
    for (gpu, uuid, code), when in sorted(seen.items(), key=lambda item: (item[0][0] is None, item[0])):
        message = f"XID {code} ({xid_message(code)}) {when}"
        report.findings.append(Finding(CRITICAL_XID, message, gpu, uuid if gpu is not None else ""))


def _gpu(index: int, chosen, report: Report) -> GpuReport:
    gpu = GpuReport(index)
    result, handle, _ = _timed(N.nvmlDeviceGetHandleByIndex, index)
    if result != OK:
        gpu.up, gpu.problem = False, f"nvmlDeviceGetHandleByIndex: {result}"
        report.blocking.append(f"GPU {index}: {gpu.problem}")
        return gpu
    for key, fn in (("uuid", N.nvmlDeviceGetUUID), ("name", N.nvmlDeviceGetName)):
        result, value, _ = _timed(fn, handle)
        setattr(gpu, key, value if result == OK else f"({result})")
    raw: dict[str, Any] = {}
    for what, fn, args in _probes(handle):
        result, value, ms = _timed(fn, *args)
        raw[what] = value
        gpu.calls.append(Answer(what, result, _show(value) if result == OK else "", ms))
    # The batch the collectors ask for, after their discovery (link counts, thresholds ...)
    from .nvml import DeviceContext

    device = DeviceContext(NvmlSession(), index, handle, gpu.uuid, gpu.name, "", None, None)
    for collector in chosen:
        if hasattr(collector, "discover"):
            try:
                collector.discover(device)
            except Exception:  # the probes above already show what failed
                pass
    wanted = [f for c in chosen if hasattr(c, "fields") for f in c.fields(device)]
    gpu.fields = _fields(handle, wanted)
    if gpu.fields[0].result in ("GPU_IS_LOST",) or (len(gpu.fields) == 1 and gpu.fields[0].result != OK):
        gpu.up, gpu.problem = False, f"nvmlDeviceGetFieldValues: {gpu.fields[0].result}"
        report.blocking.append(f"GPU {index} ({gpu.uuid}): {gpu.problem}")
    mode = raw["nvmlDeviceGetMigMode"]
    if mode is not None and mode[0] == N.NVML_DEVICE_MIG_ENABLE:
        gpu.mig = _mig_layout(handle)
    events = next(a for a in gpu.calls if a.what == "nvmlDeviceGetSupportedEventTypes")
    if events.result != OK:
        gpu.xid_events = f"not available ({events.result}): no XID counts for this GPU"
    else:
        xid = bool(raw["nvmlDeviceGetSupportedEventTypes"] & N.nvmlEventTypeXidCriticalError)
        gpu.xid_events = "XID events supported" if xid else "XID events not supported by this GPU"
        if xid and gpu.mig:
            gpu.xid_events += (
                "; MIG instances' XIDs reach this process"
                if report.privileged
                else "; MIG instances' XIDs are withheld (no CAP_SYS_ADMIN): only whole-GPU XIDs"
            )
    gpu.fabric = _fabric(device)
    gpm = next(a for a in gpu.calls if a.what == "nvmlGpmQueryDeviceSupport")
    support = raw["nvmlGpmQueryDeviceSupport"]
    if support is not None and support.isSupportedDevice:
        gpu.gpm = (
            "supported: SM active and occupancy, tensor, DRAM, graphics-engine and FP pipe activity, "
            "NVLink rates, per GPU or MIG GPU instance"
        )
    else:
        gpu.gpm = (
            f"not supported ({gpm.result if gpm.result != OK else 'isSupportedDevice 0'}): no profiling "
            "metrics (SM active, occupancy, tensor, DRAM) for this GPU; NVML GPM needs Hopper or later, and "
            "DCGM's profiling module is the only source on older GPUs"
        )
    return gpu


def _fabric(device) -> str:
    """Whether the GPU answers nvmlDeviceGetGpuFabricInfoV (or the v1 call), and what: its NVLink domain,
    clique, registration and, from Blackwell on, its health."""
    from .collectors.fabric import HEALTH_FIELDS, condition_reported, read_fabric, status_name

    info = read_fabric(device, in_cycle=False)
    if info is None:
        return (
            "not available (NOT_SUPPORTED, or the driver lacks the call): no NVLink fabric series for this "
            "GPU (PCIe boards, GPUs before Hopper and a GPU alone in a VM have no fabric)"
        )
    import uuid as uuidlib

    states = ("not supported", "not started", "in progress", "completed")
    state = int(info.state)
    text = (
        f"{device.static.get('fabric_version', '?').replace('fabric_', '')}: NVLink domain "
        f"{uuidlib.UUID(bytes=bytes(info.clusterUuid))}, clique {int(info.cliqueId)}, registration "
        f"{states[state] if state < len(states) else state}"
    )
    if state == N.NVML_GPU_FABRIC_STATE_COMPLETED:
        text += f" ({status_name(int(info.status))})"
    mask = getattr(info, "healthMask", None)
    if mask is not None:
        reported = [c for c in HEALTH_FIELDS if condition_reported(c, int(mask))]
        known = [c for c in HEALTH_FIELDS if condition_reported(c, int(mask)) is not None]
        if not known:
            text += "; health not reported (before Blackwell)"
        else:
            text += "; health: " + (", ".join(reported) if reported else "no condition reported")
    summary = getattr(info, "healthSummary", 0)
    if summary:
        text += f" ({ {1: 'healthy', 2: 'unhealthy', 3: 'limited capacity'}.get(int(summary), summary) })"
    return text


def _confirm_with_a_cycle(session: NvmlSession, report: Report, clock):
    """Two cycles of the real sampler (GPM needs two samples): which device and MIG series came out."""
    sampler = Sampler(
        NvmlSession(session.library),
        collector_registry.build(xid_watcher=XidWatcher(clock=clock), privileged=report.privileged),
        hostname="doctor",
        clock=clock,
        xid_watcher=None,
    )
    try:
        sampler.sample_once()
        time.sleep(0.15)  # GPM wants its two samples more than 100 ms apart (nvml.h)
        snapshot = sampler.sample_once()
    finally:
        sampler.session.stop()
    by_gpu: dict[str, set[str]] = {}
    for name, samples in snapshot.series.items():
        for labels, _ in samples:
            if len(labels) >= 2:
                by_gpu.setdefault(labels[1], set()).add(name)
    if not snapshot.nvml_up:
        report.blocking.append("the exporter's sampling cycle found NVML down")
    for gpu in report.gpus:
        exported = by_gpu.get(gpu.uuid, set())
        up = snapshot.value("nvidia_gpu_up", (str(gpu.index), gpu.uuid))
        if up == 0 and gpu.up:
            gpu.up, gpu.problem = False, "nvidia_gpu_up 0 in the exporter's cycle"
            report.blocking.append(f"GPU {gpu.index} ({gpu.uuid}): {gpu.problem}")
        for spec in CATALOG:
            if spec.scope is Scope.MIG and not gpu.mig:
                continue
            if spec.scope in (Scope.DEVICE, Scope.MIG) and spec.name not in exported:
                if spec.name.startswith("nvidia_gpu_xid") or spec.name == "nvidia_gpu_mig_xid_errors_total":
                    continue  # event counts appear with the first event, not before
                gpu.not_exported.append(f"{spec.name} ({spec.nvml})")
    return snapshot


def render_text(report: Report) -> str:
    out = ["gpumeter doctor", ""]
    out.append(f"NVML {report.nvml or '-'}, driver {report.driver or '-'}, CUDA {report.cuda or '-'}")
    out.append(f"process privileged (CAP_SYS_ADMIN): {'yes' if report.privileged else 'no'}")
    out.append(f"GPUs: {len(report.gpus)}")
    for gpu in report.gpus:
        out += [
            "",
            f"== GPU {gpu.index}: {gpu.name} {gpu.uuid} ({'up' if gpu.up else 'DOWN: ' + gpu.problem})",
        ]
        out.append("  functions (result, time, value):")
        width = max((len(a.what) for a in gpu.calls), default=0)
        for a in gpu.calls:
            ms = f"{a.ms:8.3f} ms" if a.ms is not None else ""
            out.append(f"    {a.what:<{width}}  {a.result:<20} {ms}  {a.value}".rstrip())
        out.append("  fields (batched, per-entry status):")
        for a in gpu.fields:
            ms = f"  {a.ms:.3f} ms" if a.ms is not None else ""
            out.append(f"    {a.what}: {a.result}{ms}")
        if gpu.mig:
            out.append("  MIG layout (slot: GPU instance / compute instance, name, UUID):")
            for m in gpu.mig:
                out.append(
                    f"    {m['slot']}: GI {m['gpu_instance_id']} / CI {m['compute_instance_id']}, {m['name']}, {m['uuid']}"
                )
        else:
            out.append("  MIG: not enabled")
        out.append(f"  XID events: {gpu.xid_events}")
        out.append(f"  GPM: {gpu.gpm}")
        out.append(f"  NVLink fabric: {gpu.fabric}")
        if gpu.not_exported:
            out.append("  the exporter will not export (series, and where it would come from):")
            out += [f"    {line}" for line in gpu.not_exported]
    without_gpm = [g for g in report.gpus if not g.gpm.startswith("supported")]
    if without_gpm:
        out += [
            "",
            f"profiling metrics: absent on {len(without_gpm)} of {len(report.gpus)} GPUs of this node (no NVML "
            "GPM before Hopper; docs/metrics.md); nvidia_gpu_utilization_ratio is the only activity measure there",
        ]
    out += [
        "",
        f"kubelet pod-resources: {report.kubelet}",
        f"kubelet dynamic resources (DRA): {report.dynamic_resources}",
        f"ResourceSlices (DRA): {report.resource_slices}",
        "",
    ]
    if report.blocking:
        out.append("BLOCKING:")
        out += [f"  {line}" for line in report.blocking]
    else:
        out.append("nothing blocks monitoring")
    return "\n".join(out) + "\n"


def add_parser(subparsers) -> None:
    doctor = subparsers.add_parser(
        "doctor", help="what NVML, MIG, XID events, GPM and the kubelet answer on this node, for a bug report"
    )
    doctor.add_argument(
        "--simulate", metavar="FLEET", help="run against the stand-in for a fleet (e.g. h100-mig)"
    )
    doctor.add_argument(
        "--simulate-node", metavar="NODE", help="which node of the fleet (default: the first)"
    )
    doctor.add_argument(
        "--kubelet-socket",
        default=None,
        help=f"the kubelet pod-resources socket (default {DEFAULT_SOCKET}; with --simulate a stand-in kubelet)",
    )
    doctor.add_argument(
        "--kube-api",
        default=None,
        help="in-cluster or an API server URL: check that this node's DRA ResourceSlices can be read "
        "(with --simulate: a stand-in API unless given)",
    )
    doctor.add_argument("--kube-api-token-file", default=None, help="bearer token file for --kube-api URL")
    doctor.add_argument(
        "--node-name",
        default=None,
        help="this node's Kubernetes name (default: $NODE_NAME, which the DaemonSet sets, else the hostname: "
        "in a pod without host networking that is the pod's name)",
    )
    doctor.add_argument("--json", action="store_true", help="the report as JSON")
    doctor.add_argument(
        "--check",
        action="store_true",
        help="a verdict: one line per finding (lost GPU, inactive NVLink, pending row remap or page "
        "retirement, temperature at slowdown, recent critical XID, NVML or kubelet unreachable); exit 1 with any",
    )
    doctor.add_argument(
        "--xid-window",
        type=_seconds,
        default=XID_WINDOW_S,
        metavar="SECONDS",
        help=f"with --check: how old a kernel-log XID may be and still count (default {XID_WINDOW_S:.0f})",
    )
    doctor.add_argument(
        "--expect-gpus",
        type=int,
        metavar="N",
        help="with --check: the node's GPU count, so that a GPU the driver no longer lists counts as lost",
    )
    doctor.add_argument(
        "--kernel-log", default="/dev/kmsg", metavar="PATH", help="where XIDs are read (default /dev/kmsg)"
    )
    doctor.set_defaults(func=run)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"--xid-window: a positive number of seconds, not {text!r}")
    return value


def this_node(flag: str | None, environ) -> str:
    """The node whose DRA ResourceSlices are read: --node-name, else $NODE_NAME (the DaemonSet's, from
    the downward API, as the exporter takes it), else the hostname, which in a pod without host
    networking is the pod's name and finds no slices."""
    return flag or environ.get("NODE_NAME") or socket.gethostname()


def run(args: argparse.Namespace, *, instant: bool = False) -> int:
    """The command. ``instant``: the stand-in answers at once instead of taking the driver's time per
    call (for tests of what doctor reports, which need not wait out each call's cost)."""
    options = {"xid_window_s": args.xid_window, "expect_gpus": args.expect_gpus}
    if args.simulate:
        report = _simulated(
            args.simulate,
            args.simulate_node,
            args.kubelet_socket,
            kube_api=args.kube_api,
            instant=instant,
            **options,
        )
    else:
        socket_path = args.kubelet_socket if args.kubelet_socket is not None else DEFAULT_SOCKET
        report = diagnose(
            kubelet_socket=socket_path,
            kubelet_required=args.kubelet_socket is not None,
            kube_api=args.kube_api,
            kube_api_token_file=args.kube_api_token_file,
            node_name=this_node(args.node_name, os.environ),
            kernel_log=lambda: read_kmsg(args.kernel_log),
            **options,
        )
    if args.check:
        sys.stdout.write(
            json.dumps(report.check_dict(), indent=2) + "\n" if args.json else render_check(report)
        )
        return report.check_status
    sys.stdout.write(json.dumps(report.as_dict(), indent=2) + "\n" if args.json else render_text(report))
    return report.exit_status


def render_check(report: Report) -> str:
    """One line per finding, for a node-problem-detector plugin's message or a cron job's mail."""
    if not report.findings:
        return f"healthy: {len(report.gpus)} GPUs, no finding (kernel log: {report.kernel_log})\n"
    return "".join(f.line() + "\n" for f in report.findings)


def _simulated(
    fleet_name: str,
    node_name: str | None,
    socket_path: str | None,
    kube_api: str | None = None,
    instant: bool = False,
    **options,
) -> Report:
    from gpumeter.simulator.device import SimulatedNode
    from gpumeter.simulator.fleet import FleetError, load_fleet
    from gpumeter.simulator.kubeapi import StandInKubeApi
    from gpumeter.simulator.kubelet import StandInKubelet
    from gpumeter.simulator.latency import CALL_LATENCY_S
    from gpumeter.simulator.nvml import SimulatedNvml

    try:
        fleet = load_fleet(fleet_name)
        node = SimulatedNode(fleet, node_name, clock=time.time)
    except (FleetError, KeyError) as exc:
        raise SystemExit(f"gpumeter doctor: {exc}") from None
    library = SimulatedNvml(node, latency=None if instant else CALL_LATENCY_S)
    options.update(privileged=node.privileged, kernel_log=node.kmsg)
    with contextlib.ExitStack() as stack:
        if kube_api is None:
            kube_api = stack.enter_context(StandInKubeApi(fleet)).base_url
        if socket_path is None:
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="gpumeter-doctor-"))
            socket_path = stack.enter_context(
                StandInKubelet(fleet, node.spec.name, Path(tmp) / "kubelet.sock")
            ).socket_path
        return diagnose(
            library,
            kubelet_socket=socket_path,
            kubelet_required=True,
            kube_api=kube_api,
            node_name=node.spec.name,
            **options,
        )
