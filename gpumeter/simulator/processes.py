"""The simulated node's GPU processes: what NVML lists per GPU and MIG instance, and ``/proc/<pid>/cgroup``.

Every running pod has one process per device it holds; a fleet node's ``host_processes`` belong to no
pod. A pod's process is in its container's cgroup, named the way the node's kubelet and runtime name it
(``cgroup: {version, driver, runtime}``; the layouts exporter/kubernetes/cgroup.py reads), and the
stand-in Kubernetes API reports the same pod UID and container ID (simulator/kubeapi.py), so the two
agree exactly as a real node's do. PIDs are host PIDs: a pod's ``pid``, else ``10000 + 100·i + d`` for
the i-th pod entry of the node and its d-th device.

On an MPS node the clients of a shared GPU are MPS clients: NVML lists them through
``nvmlDeviceGetMPSComputeRunningProcesses`` ("processes with a MPS compute context", nvml.h), and
``nvmlDeviceGetComputeRunningProcesses`` lists the MPS server (nvidia-cuda-mps-server, which the
device plugin's MPS control daemon runs in its own pod: a cgroup that names a pod the fleet does not
have). That split is from the header's descriptions, not from a dump: confirm on hardware.

Memory: the device's (GPU's, or GPU instance's) memory in use, split over its processes in proportion
to the load each puts on it; a host process uses what the fleet says. SM share: what the pod's
``utilization`` puts on the device (divided by the replicas for a time-sliced or MPS replica), scaled
down together when they add up to more than the whole GPU.

With ``proc_root`` set (``SimulatedNode.proc_root``), the table writes ``<proc_root>/<pid>/cgroup`` for
every listed process and removes the directories of processes that ended, so ``--proc-root`` of a
simulated exporter reads what a real node's ``/proc`` would hold.
"""

from __future__ import annotations

import hashlib
import shutil
import uuid as uuidlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .fleet import CgroupLayout, NodeSpec, PodSpec

__all__ = [
    "MPS_SERVER_MEMORY_BYTES",
    "SimProcess",
    "build_table",
    "cgroup_text",
    "container_id",
    "pod_uid",
    "process_table",
    "runtime_scheme",
]

MIB = 1024 * 1024
# What the MPS server holds on a GPU it serves: a model figure (its own context), not a measurement.
MPS_SERVER_MEMORY_BYTES = 256 * MIB
MPS_SERVER_PID_BASE = 7000  # + GPU index
_MPS_NAMESPACE_POD = ("nvidia-device-plugin", "nvidia-device-plugin-mps-control-daemon")
# cgroup v1 controllers listed in /proc/<pid>/cgroup, one line each (a v1 host mounts each hierarchy)
_V1_CONTROLLERS = ("12:pids", "11:memory", "10:cpu,cpuacct", "9:devices", "4:freezer", "1:name=systemd")
_SCOPE_PREFIX = {"containerd": "cri-containerd-", "crio": "crio-", "docker": "docker-"}
_SCHEME = {"containerd": "containerd://", "crio": "cri-o://", "docker": "docker://"}


def pod_uid(node: str, namespace: str, name: str) -> str:
    """The pod's metadata.uid, as the stand-in Kubernetes API reports it."""
    return str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"pod/{node}/{namespace}/{name}"))


def container_id(node: str, namespace: str, name: str, container: str) -> str:
    """The runtime's 64-hex container ID (containerStatuses[].containerID without its scheme)."""
    return hashlib.sha256(f"container/{node}/{namespace}/{name}/{container}".encode()).hexdigest()


def runtime_scheme(layout: CgroupLayout) -> str:
    return _SCHEME[layout.runtime]


def cgroup_text(layout: CgroupLayout, uid: str, cid: str, qos: str = "burstable") -> str:
    """``/proc/<pid>/cgroup`` of a container's process (kubelet pkg/kubelet/cm naming: QoS level
    ``burstable`` for a pod whose requests are below its limits, as GPU pods' CPU usually is)."""
    if layout.driver == "systemd":
        uid_ = uid.replace("-", "_")  # systemd slice names cannot hold "-" inside a unit name part
        path = (
            f"/kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{uid_}.slice/"
            f"{_SCOPE_PREFIX[layout.runtime]}{cid}.scope"
        )
    else:
        path = f"/kubepods/{qos}/pod{uid}/{cid}"
    if layout.version == "v2":
        return f"0::{path}\n"
    return "".join(f"{controller}:{path}\n" for controller in _V1_CONTROLLERS)


@dataclass(frozen=True, slots=True)
class SimProcess:
    pid: int
    gpu: int
    gpu_instance_id: int | None  # None on a whole GPU
    compute_instance_id: int | None
    load: float  # share of the device's SM time it uses, 0..1
    memory_bytes: int
    cgroup: str  # the text of /proc/<pid>/cgroup
    mps_client: bool = False
    pod: PodSpec | None = None


def _pod_processes(spec: NodeSpec, pods: tuple[PodSpec, ...], running: list[PodSpec]) -> list[SimProcess]:
    order = {id(p): i for i, p in enumerate(pods)}
    mps = spec.sharing_strategy == "mps"
    out = []
    for pod in running:
        uid = pod_uid(spec.name, pod.namespace, pod.name)
        cid = container_id(spec.name, pod.namespace, pod.name, pod.container)
        cgroup = cgroup_text(spec.cgroup, uid, cid)
        for d, device in enumerate(pod.devices):
            gpu = spec.gpus[device.gpu]
            pid = (pod.pid + d) if pod.pid else 10000 + 100 * order[id(pod)] + d
            load = pod.utilization / (gpu.time_slicing if device.replica is not None else 1)
            ci = None
            if device.gpu_instance_id is not None:
                ci = _first_ci(spec, device.gpu, device.gpu_instance_id)
            out.append(
                SimProcess(
                    pid,
                    device.gpu,
                    device.gpu_instance_id,
                    ci,
                    max(0.0, min(1.0, load)),
                    0,
                    cgroup,
                    mps and device.replica is not None,
                    pod,
                )
            )
    return out


def _first_ci(spec: NodeSpec, gpu: int, gpu_instance_id: int) -> int:
    return min(
        (m.compute_instance_id for m in spec.gpus[gpu].mig if m.gpu_instance_id == gpu_instance_id),
        default=0,
    )


UsedMemory = Callable[[int, "int | None"], int]  # (GPU index, GPU instance or None) -> bytes in use


def build_table(
    spec: NodeSpec, pods: tuple[PodSpec, ...], running: list[PodSpec], used: UsedMemory
) -> list[SimProcess]:
    """The processes of ``running`` pods (``pods``: every pod entry of the node, for PIDs) and of the
    node's host processes; ``used`` says what each device has in use, which pod processes split."""
    procs = _pod_processes(spec, pods, running)
    # the SM time of a device is whole: scale its processes' loads down together when over-committed
    per_device: dict[tuple[int, int | None], list[int]] = {}
    for i, p in enumerate(procs):
        per_device.setdefault((p.gpu, p.gpu_instance_id), []).append(i)
    for members in per_device.values():
        total = sum(procs[i].load for i in members)
        if total > 1.0:
            for i in members:
                p = procs[i]
                procs[i] = SimProcess(**{**_fields(p), "load": p.load / total})
    for host in spec.host_processes:
        ci = None if host.gpu_instance_id is None else _first_ci(spec, host.gpu, host.gpu_instance_id)
        procs.append(
            SimProcess(
                host.pid,
                host.gpu,
                host.gpu_instance_id,
                ci,
                host.utilization,
                host.memory_mib * MIB,
                f"0::{host.cgroup}\n",
            )
        )
    procs = _with_memory(used, procs)
    if spec.sharing_strategy == "mps":
        for gpu in sorted({p.gpu for p in procs if p.mps_client}):
            uid = pod_uid(spec.name, *_MPS_NAMESPACE_POD)
            cid = container_id(spec.name, *_MPS_NAMESPACE_POD, "mps-control-daemon")
            procs.append(
                SimProcess(
                    MPS_SERVER_PID_BASE + gpu,
                    gpu,
                    None,
                    None,
                    0.0,
                    MPS_SERVER_MEMORY_BYTES,
                    cgroup_text(spec.cgroup, uid, cid),
                )
            )
    return procs


def process_table(node) -> list[SimProcess]:
    """The processes on the node's GPUs now (``node`` is a SimulatedNode, synced by the caller)."""
    cached = node.__dict__.get("_proc_table")
    if cached is not None and cached[0] == node._t:  # one table per simulated instant
        return cached[1]

    def used(gpu_index: int, gi: int | None) -> int:
        gpu = node.gpus[gpu_index]
        if gi is None:
            return gpu.memory_used_bytes
        return next((m.memory_used_bytes for m in gpu.migs if m.gpu_instance_id == gi), 0)

    procs = build_table(node.spec, node.pods, node.running_pods(), used)
    root = getattr(node, "proc_root", None)
    if root is not None:
        _write_proc(node, Path(root), procs)
    node.__dict__["_proc_table"] = (node._t, procs)
    return procs


def _fields(p: SimProcess) -> dict:
    return {name: getattr(p, name) for name in SimProcess.__slots__}


def _with_memory(used: UsedMemory, procs: list[SimProcess]) -> list[SimProcess]:
    """Pod processes get the device's memory in use, split by load; host processes keep theirs."""
    groups: dict[tuple[int, int | None], list[int]] = {}
    for i, p in enumerate(procs):
        if p.pod is not None:
            groups.setdefault((p.gpu, p.gpu_instance_id), []).append(i)
    for (gpu_index, gi), members in groups.items():
        host = sum(
            p.memory_bytes for p in procs if p.pod is None and (p.gpu, p.gpu_instance_id) == (gpu_index, gi)
        )
        if any(procs[i].mps_client for i in members):
            host += MPS_SERVER_MEMORY_BYTES
        available = max(0, used(gpu_index, gi) - host)
        weights = [procs[i].pod.utilization + 0.05 for i in members]  # type: ignore[union-attr]
        total = sum(weights)
        for i, weight in zip(members, weights, strict=True):
            share = int(available * weight / total)
            pod = procs[i].pod
            granted = [d.memory_mib for d in pod.devices if d.gpu == gpu_index and d.memory_mib]  # type: ignore[union-attr]
            if granted:  # HAMi's and gpushare's in-container limits keep a process within its grant
                share = min(share, int(granted[0] * MIB * 0.9))
            procs[i] = SimProcess(**{**_fields(procs[i]), "memory_bytes": share})
    return procs


def _write_proc(node, root: Path, procs: list[SimProcess]) -> None:
    written: dict[int, str] = node.__dict__.setdefault("_proc_written", {})
    wanted = {p.pid: p.cgroup for p in procs}
    for pid in set(written) - set(wanted):
        shutil.rmtree(root / str(pid), ignore_errors=True)
        del written[pid]
    for pid, text in wanted.items():
        if written.get(pid) != text:
            directory = root / str(pid)
            directory.mkdir(parents=True, exist_ok=True)
            (directory / "cgroup").write_text(text, encoding="utf-8")
            written[pid] = text
