"""The fleet file: nodes, their GPUs and MIG layouts, workloads, and pods that come and go.

Format (YAML; documented with examples in docs/simulator.md, examples in ``fleets/``)::

    seed: 42                        # every random choice derives from it
    nodes:
      - name: gpu-h100-01
        driver_version: "550.54.15"
        cuda_version: "12.4"
        exporter_privileged: true   # false: NVML withholds MIG instances' XIDs from the exporter
        kubelet:                    # how the stand-in kubelet names devices (optional)
          device_ids: uuid          # uuid | gke | legacy-mig
          mig_strategy: mixed       # mixed: nvidia.com/mig-<profile>; single: nvidia.com/gpu
          sharing_strategy: mps     # how the device plugin shares replicas: time-slicing (default) | mps
        cgroup: {version: v2, driver: systemd, runtime: containerd}   # how /proc/<pid>/cgroup names a
                                    # container (v1|v2, systemd|cgroupfs, containerd|crio|docker; these defaults)
        nvlink_domain: nvl72-rack-a # the NVLink domain its GPUs register in (an NVL72 rack: 18 nodes name
        nvlink_clique: 1            # one); default the node itself. clique: the partition (default 0)
        host_processes:             # GPU processes outside any pod (a host daemon, a job run over ssh)
          - {pid: 2101, gpu: 0, memory_mib: 512, utilization: 0.05, cgroup: /system.slice/render.service}
        gpus:
          - model: H100-SXM5-80GB   # a key of simulator.models.MODELS
            count: 8
            mig: ["1g.10gb*7"]      # profiles; "P*N" repeats; omit for a whole GPU; "3g.40gb:2c+1c" or
                                    # {profile: 3g.40gb, compute_instances: [2, 1]}: two compute instances
            time_slicing: 4         # replicas per whole GPU (nvidia.com/gpu.shared style sharing)
            fractional: hami        # shared by memory/compute grants: hami | gpushare (whole GPUs only)
            vgpus:                  # a vGPU host GPU (whole, not shared otherwise), one entry per VM's vGPU
              - {vm: finance-vm-01, type: H100XM-20C, utilization: 0.6, license: licensed}
            workload: {pattern: diurnal, mean: 0.55, amplitude: 0.25}
            nvlinks: 0              # NVLinks that answer (default: the model's); 0: none, as in a VM
            virtualization: passthrough   # none (default) | passthrough: a GPU passed through to a VM
            dra: true               # handed out by Dynamic Resource Allocation (NVIDIA's DRA driver,
                                    # gpu.nvidia.com), not by the device plugin: pods hold it through claims
    claims:                         # DRA ResourceClaims, allocated (docs/pod-attribution.md §8a)
      - namespace: ml-research
        name: shared-gpu
        node: gpu-h100-01
        devices: [{gpu: 2}]         # or {gpu: 1, gpu_instance_id: 3}: a MIG device; share_id: "a"
                                    # for a device several claims consume by capacity (Kubernetes 1.35+)
        sharing: TimeSlicing        # the claim's opaque GpuConfig/MigDeviceConfig sharing strategy:
                                    # TimeSlicing | MPS; absent: none written (the driver time-slices)
      - {namespace: ml-research, name: job-channel, node: gpu-h100-01, compute_domain: job-domain}
                                    # a ComputeDomain's channel claim (compute-domain.nvidia.com): no devices
    pods:
      - namespace: ml-research
        name: trainer-{gpu}-{gi}    # a range ("0-7") in a device expands the entry into one pod per value;
                                    # {gpu}, {gi} and {replica} in names take that value
        container: main
        node: gpu-h100-01
        devices: [{gpu: 0, gpu_instance_id: 7}]   # or {gpu: 1} whole, or {gpu: 2, replica: 1} time-sliced
                                    # or {gpu: 3, memory_mib: 20480, cores: 30} on a fractional GPU
                                    # (gpushare: memory_mib a multiple of 1024, cores optional)
                                    # or {claim: shared-gpu}: the devices of a claim of its namespace
        utilization: 0.7            # load the pod puts on what it holds
        start: 0h                   # offset from the start of the simulation
        end: 48h                    # optional; absent = runs forever
        every: 24h                  # optional; the start..end window repeats with this period
        pid: 31337                  # optional: the host PID of its process on each device it holds
                                    # (default: derived from its place in the file, see simulator/processes.py)

Every error names the file, the field (as a path such as ``nodes[0].gpus[1].mig``) and the value.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from importlib.resources import files
from pathlib import Path
from typing import Any

import yaml

from .models import MODELS, GpuModel, MigProfile
from .vgpu import LICENSE_STATES, VGPU_TYPES, VgpuSpec, vm_uuid

__all__ = [
    "CLAIM_SHARING",
    "CgroupLayout",
    "ClaimSpec",
    "Fleet",
    "FleetError",
    "GpuSpec",
    "HostProcess",
    "MigInstanceSpec",
    "NodeSpec",
    "PodDevice",
    "PodSpec",
    "Workload",
    "load_fleet",
    "parse_fleet",
]

FLEETS_DIR = Path(str(files("gpumeter.simulator") / "fleets"))  # package data
WORKLOAD_PATTERNS = ("steady", "diurnal", "bursty", "idle")
DEVICE_ID_FORMATS = ("uuid", "gke", "legacy-mig")
MIG_STRATEGIES = ("mixed", "single")
SHARING_STRATEGIES = ("time-slicing", "mps")
# nvmlGpuVirtualizationMode NONE and PASSTHROUGH (a host vGPU is set by vgpus:)
VIRTUALIZATION_MODES = ("none", "passthrough")
# NVIDIA's DRA driver's claim config sharing strategies (api/nvidia.com/resource/v1beta1/sharing.go)
CLAIM_SHARING = ("TimeSlicing", "MPS")
FRACTIONAL_SCHEDULERS = (
    "hami",
    "gpushare",
)  # who hands out memory/compute grants on a GPU  # the device plugin's sharing.timeSlicing / sharing.mps


class FleetError(ValueError):
    """A fleet file that cannot be used; the message names file, field and value."""


@dataclass(frozen=True, slots=True)
class Workload:
    pattern: str = "steady"
    mean: float = 0.5
    amplitude: float = 0.2


# Compute-instance sizes a GPU instance can be split into (nvidia-smi mig -lcip: 1c, 2c, 3c, 4c, 7c).
CI_SLICES = (1, 2, 3, 4, 7)


@dataclass(frozen=True, slots=True)
class MigInstanceSpec:
    """One MIG device: a compute instance of a GPU instance (most GPU instances hold one, all of it)."""

    profile: MigProfile  # the GPU instance's profile
    gpu_instance_id: int
    compute_instance_id: int = 0
    compute_slices: int | None = None  # the compute instance's slices; None: the whole GPU instance

    @property
    def ci_slices(self) -> int:
        return self.profile.compute_slices if self.compute_slices is None else self.compute_slices

    @property
    def name(self) -> str:
        """What follows "MIG " in nvmlDeviceGetName: the GI profile, or "<n>c.<GI profile>" for a smaller CI."""
        if self.ci_slices == self.profile.compute_slices:
            return self.profile.name
        return f"{self.ci_slices}c.{self.profile.name}"

    @property
    def multiprocessors(self) -> int:
        return self.profile.multiprocessors * self.ci_slices // self.profile.compute_slices


@dataclass(frozen=True, slots=True)
class GpuSpec:
    node: str
    index: int
    model: GpuModel
    uuid: str
    mig: tuple[MigInstanceSpec, ...]  # empty: MIG disabled
    time_slicing: int  # replicas; 1 = not shared
    workload: Workload
    fractional: str = ""  # FRACTIONAL_SCHEDULERS; "" = not shared by grants
    vgpu_host: bool = False  # in host vGPU mode (the fleet file has `vgpus:`, maybe empty)
    vgpus: tuple[VgpuSpec, ...] = ()  # the vGPUs running on it, one per VM's vGPU
    passthrough: bool = False  # the node is a VM this GPU is passed through to (NVML: PASSTHROUGH mode)
    dra: bool = False  # handed out by the DRA driver (ResourceSlice devices), not by the device plugin

    @property
    def mig_enabled(self) -> bool:
        return bool(self.mig)

    def mig_uuid(self, gpu_instance_id: int, compute_instance_id: int = 0) -> str:
        """Each MIG device (GPU instance, compute instance) has its own UUID."""
        key = f"{self.uuid}/{gpu_instance_id}" + (f"/{compute_instance_id}" if compute_instance_id else "")
        return _uuid("MIG", key)


CGROUP_VERSIONS, CGROUP_DRIVERS, CONTAINER_RUNTIMES = (
    ("v1", "v2"),
    ("systemd", "cgroupfs"),
    ("containerd", "crio", "docker"),
)


@dataclass(frozen=True, slots=True)
class CgroupLayout:
    """How the node's kubelet and runtime name a container's cgroup (exporter/kubernetes/cgroup.py)."""

    version: str = "v2"
    driver: str = "systemd"
    runtime: str = "containerd"


@dataclass(frozen=True, slots=True)
class HostProcess:
    """A GPU process that belongs to no pod."""

    pid: int
    gpu: int
    memory_mib: int
    utilization: float = 0.0
    cgroup: str = "/system.slice/gpu-host-job.service"
    gpu_instance_id: int | None = None


@dataclass(frozen=True, slots=True)
class NodeSpec:
    name: str
    driver_version: str
    cuda_version: str
    gpus: tuple[GpuSpec, ...]
    device_ids: str = "uuid"
    mig_strategy: str = "mixed"
    extra_resources: tuple[str, ...] = ()
    exporter_privileged: bool = True  # root or CAP_SYS_ADMIN: sees MIG instances' XIDs
    # the device plugin's sharing of replicas (its config's sharing.timeSlicing or sharing.mps), as GPU
    # Feature Discovery labels the node: nvidia.com/gpu.sharing-strategy
    sharing_strategy: str = "time-slicing"
    cgroup: CgroupLayout = CgroupLayout()
    host_processes: tuple[HostProcess, ...] = ()
    # The NVLink domain its GPUs register in (nvmlDeviceGetGpuFabricInfoV's clusterUuid derives from
    # it): the rack of an NVL72 (its 18 compute trays name one domain), else the node itself (an HGX
    # baseboard's NVSwitches reach its own GPUs only). The clique is the partition within the domain.
    nvlink_domain: str = ""
    nvlink_clique: int = 0

    @property
    def fabric_domain(self) -> str:
        return self.nvlink_domain or self.name


@dataclass(frozen=True, slots=True)
class PodDevice:
    gpu: int
    gpu_instance_id: int | None = None
    replica: int | None = None
    memory_mib: int | None = None  # a grant on a fractional GPU (HAMi, gpushare)
    cores: int | None = None  # percent of the GPU's compute; None: no compute grant
    claim: str | None = None  # held through this DRA ResourceClaim (of the pod's namespace)
    share_id: str | None = None  # the claim's share of a device consumed by capacity (DRAConsumableCapacity)


@dataclass(frozen=True, slots=True)
class ClaimSpec:
    """An allocated DRA ResourceClaim: the devices it got and the sharing its opaque config asks for."""

    namespace: str
    name: str
    node: str
    devices: tuple[PodDevice, ...]  # gpu and gpu_instance_id only
    sharing: str = ""  # CLAIM_SHARING, or "" when the claim has no sharing config
    # A ComputeDomain's channel claim (driver compute-domain.nvidia.com): the domain's name; it holds no GPU
    compute_domain: str = ""


@dataclass(frozen=True, slots=True)
class PodSpec:
    namespace: str
    name: str
    container: str
    node: str
    devices: tuple[PodDevice, ...]
    utilization: float
    start_s: float
    end_s: float | None
    every_s: float | None
    labels: tuple[tuple[str, str], ...] = ()
    pid: int | None = None  # its process's host PID; None: derived (simulator/processes.py)
    channels: tuple[str, ...] = ()  # the ComputeDomain channel claims it holds (of its namespace)

    def running(self, t: float) -> bool:
        """Whether the pod holds its devices ``t`` seconds after the simulation started."""
        if t < self.start_s:
            return False
        offset = t - self.start_s
        if self.every_s:
            offset %= self.every_s
        return self.end_s is None or offset < self.end_s - self.start_s


@dataclass(frozen=True, slots=True)
class Fleet:
    seed: int
    nodes: tuple[NodeSpec, ...]
    pods: tuple[PodSpec, ...]
    source: str = "<fleet>"
    claims: tuple[ClaimSpec, ...] = ()
    # the pods of each node, in the fleet's order: made once, as asking every node to look through
    # every pod is quadratic (12,500 nodes x 430,000 pods in the 100,000-GPU bench: hours)
    _pods_by_node: dict[str, tuple[PodSpec, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_node: dict[str, list[PodSpec]] = {}
        for pod in self.pods:
            by_node.setdefault(pod.node, []).append(pod)
        object.__setattr__(self, "_pods_by_node", {name: tuple(pods) for name, pods in by_node.items()})

    def node(self, name: str) -> NodeSpec:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)

    def pods_on(self, node: str) -> tuple[PodSpec, ...]:
        return self._pods_by_node.get(node, ())

    def claims_on(self, node: str) -> tuple[ClaimSpec, ...]:
        return tuple(c for c in self.claims if c.node == node)

    def claim(self, namespace: str, name: str) -> ClaimSpec:
        for claim in self.claims:
            if (claim.namespace, claim.name) == (namespace, name):
                return claim
        raise KeyError((namespace, name))


def _clique(r: _Reader, raw: dict, path: str) -> int:
    clique = r.get(raw, "nvlink_clique", path, int, 0)
    if not 0 <= clique <= 0xFFFFFFFF:  # nvmlGpuFabricInfo cliqueId: unsigned int
        raise r.fail(f"{path}.nvlink_clique", clique, "must be within 0..4294967295")
    return clique


def _uuid(prefix: str, key: str) -> str:
    """Deterministic NVML-style UUID (8-4-4-4-12 hex) derived from a stable key."""
    h = hashlib.sha256(key.encode()).hexdigest()
    return f"{prefix}-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}


# GPUs a simulated node may hold: the largest real servers hold 8 to 16 (an NVL72 rack is 18 nodes of
# 4); `count: 2000000` grew the simulator without bound (2.3 GB in 14 s, issue 42)
MAX_GPUS_PER_NODE = 64


class _Reader:
    def __init__(self, source: str):
        self.source = source

    def fail(self, path: str, value: Any, why: str) -> FleetError:
        return FleetError(f"{self.source}: {path}: {why} (got {value!r})")

    def get(self, mapping: dict, key: str, path: str, kind, default=...):
        if not isinstance(mapping, dict):
            raise self.fail(path, mapping, "expected a mapping")
        if key not in mapping:
            if default is ...:
                raise self.fail(f"{path}.{key}", None, "is required")
            return default
        value = mapping[key]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise self.fail(f"{path}.{key}", value, f"expected {getattr(kind, '__name__', kind)}")
        return value

    def duration(self, value: Any, path: str) -> float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        match = _DURATION.match(str(value))
        if not match:
            raise self.fail(path, value, "expected a duration such as 30s, 15m, 6h or 2d")
        return float(match.group(1)) * _UNITS[match.group(2)]


def _compute_instances(reader: _Reader, profile: MigProfile, value: Any, path: str) -> list[int | None]:
    """Compute-instance sizes for one GPU instance: ``[2, 1]`` (YAML) or ``"2c+1c"`` (after ``:``)."""
    if value is None:
        return [None]
    items = value.split("+") if isinstance(value, str) else value
    if not isinstance(items, list) or not items:
        raise reader.fail(path, value, "expected compute-instance sizes such as [2, 1] or 2c+1c")
    sizes = []
    for item in items:
        text = str(item).strip().removesuffix("c")
        if not text.isdigit() or int(text) not in CI_SLICES or int(text) > profile.compute_slices:
            raise reader.fail(
                path,
                value,
                f"a {profile.name} GPU instance splits into compute instances of "
                f"{', '.join(str(n) for n in CI_SLICES if n <= profile.compute_slices)} slices",
            )
        sizes.append(int(text))
    if sum(sizes) > profile.compute_slices:
        raise reader.fail(
            path,
            value,
            f"compute instances need {sum(sizes)} slices; {profile.name} has {profile.compute_slices}",
        )
    return sizes


def _layout(reader: _Reader, model: GpuModel, entries: list, path: str) -> tuple[MigInstanceSpec, ...]:
    """GPU instances, each with its compute instances: ``"3g.40gb"``, ``"1g.10gb*7"``, ``"3g.40gb:2c+1c"``
    or ``{profile: 3g.40gb, gpu_instance_id: 1, compute_instances: [2, 1]}``."""
    if not model.supports_mig:
        raise reader.fail(path, entries, f"{model.key} has no MIG support")
    names: list[str] = []
    explicit: list[int | None] = []
    splits: list[Any] = []
    for i, entry in enumerate(entries):
        where = f"{path}[{i}]"
        if isinstance(entry, dict):
            name = reader.get(entry, "profile", where, str)
            explicit.append(reader.get(entry, "gpu_instance_id", where, int, None))
            splits.append((entry.get("compute_instances"), f"{where}.compute_instances"))
            names.append(name)
            continue
        if not isinstance(entry, str):
            raise reader.fail(
                where, entry, "expected a profile name such as 1g.10gb, 1g.10gb*7 or 3g.40gb:2c+1c"
            )
        name, _, times = entry.partition("*")
        name, _, split = name.partition(":")
        if times and not times.strip().isdigit():
            raise reader.fail(where, entry, "repeat count after * must be a whole number")
        for _ in range(int(times) if times else 1):
            names.append(name.strip())
            explicit.append(None)
            splits.append((split.strip() or None, where))
    used_ids: set[int] = set()
    counts: dict[str, int] = {}
    compute = memory = 0
    instances = []
    for name, gi, (split, split_path) in zip(names, explicit, splits, strict=True):
        profile = model.mig_profiles.get(name)
        if profile is None:
            raise reader.fail(
                path, name, f"unknown MIG profile for {model.key}; known: {', '.join(model.mig_profiles)}"
            )
        counts[name] = counts.get(name, 0) + 1
        if counts[name] > profile.max_instances:
            raise reader.fail(
                path, name, f"at most {profile.max_instances} instances of {name} fit a {model.key}"
            )
        compute += profile.compute_slices
        memory += profile.memory_slices
        if gi is None:
            gi = next((g for g in profile.gpu_instance_ids if g not in used_ids), None)
        if gi is None or gi in used_ids:
            raise reader.fail(path, name, "no free GPU instance id for this profile")
        used_ids.add(gi)
        for ci, size in enumerate(_compute_instances(reader, profile, split, split_path)):
            instances.append(MigInstanceSpec(profile, gi, ci, size))
    if compute > model.total_compute_slices or memory > model.total_memory_slices:
        raise reader.fail(
            path,
            entries,
            f"layout needs {compute} compute / {memory} memory slices; a {model.key} has "
            f"{model.total_compute_slices} / {model.total_memory_slices}",
        )
    return tuple(instances)


def _range(value: Any) -> list | None:
    if isinstance(value, str) and re.fullmatch(r"\d+-\d+", value.strip()):
        low, high = (int(x) for x in value.split("-"))
        return list(range(low, high + 1))
    return None


def _fill(r: _Reader, template: str, values: dict, path: str) -> str:
    """``trainer-{gpu}-{gi}`` -> ``trainer-3-7``; any other brace is an error, not str.format's."""

    def value(match: re.Match) -> str:
        if match.group(1) not in values:
            known = ", ".join(f"{{{key}}}" for key in values)
            raise r.fail(path, template, f"only {known} may stand in braces here")
        return str(values[match.group(1)])

    filled = re.sub(r"\{([^{}]*)\}", value, template)
    if "{" in filled or "}" in filled:
        raise r.fail(path, template, "unbalanced brace")
    return filled


def _expand_pods(r: _Reader, raw_pods: list):
    """Yield (index, pod mapping), one per value of any range in a pod's single device."""
    for p, raw in enumerate(raw_pods):
        devices = raw.get("devices") if isinstance(raw, dict) else None
        if not (isinstance(devices, list) and len(devices) == 1 and isinstance(devices[0], dict)):
            yield p, raw
            continue
        keys = {"gpu": "gpu", "gpu_instance_id": "gi", "replica": "replica"}
        axes = [(k, _range(v)) for k, v in devices[0].items() if k in keys and _range(v)]
        if not axes:
            yield p, raw
            continue
        combos: list[dict] = [{}]
        for key, values in axes:
            combos = [{**c, key: v} for c in combos for v in values]
        for combo in combos:
            names = {keys[k]: v for k, v in {**devices[0], **combo}.items() if k in keys}
            expanded = {
                k: (
                    _fill(r, v, names, f"pods[{p}].{k}")
                    if isinstance(v, str) and k in ("name", "container")
                    else v
                )
                for k, v in raw.items()
            }
            expanded["devices"] = [{**devices[0], **combo}]
            yield p, expanded


def parse_fleet(data: Any, source: str = "<fleet>") -> Fleet:
    r = _Reader(source)
    if not isinstance(data, dict):
        raise r.fail("(top level)", data, "expected a mapping with nodes:")
    seed = r.get(data, "seed", "", int, 0)
    raw_nodes = r.get(data, "nodes", "", list)
    nodes = []
    gpus_by_node: dict[str, tuple[GpuSpec, ...]] = {}
    for n, raw in enumerate(raw_nodes):
        path = f"nodes[{n}]"
        name = r.get(raw, "name", path, str)
        if name in gpus_by_node:
            raise r.fail(f"{path}.name", name, "duplicate node name")
        kubelet = r.get(raw, "kubelet", path, dict, {})
        device_ids = r.get(kubelet, "device_ids", f"{path}.kubelet", str, "uuid")
        if device_ids not in DEVICE_ID_FORMATS:
            raise r.fail(
                f"{path}.kubelet.device_ids", device_ids, f"expected one of {', '.join(DEVICE_ID_FORMATS)}"
            )
        strategy = r.get(kubelet, "mig_strategy", f"{path}.kubelet", str, "mixed")
        if strategy not in MIG_STRATEGIES:
            raise r.fail(
                f"{path}.kubelet.mig_strategy", strategy, f"expected one of {', '.join(MIG_STRATEGIES)}"
            )
        extra = tuple(r.get(kubelet, "extra_resources", f"{path}.kubelet", list, []))
        sharing = r.get(kubelet, "sharing_strategy", f"{path}.kubelet", str, "time-slicing")
        if sharing not in SHARING_STRATEGIES:
            raise r.fail(
                f"{path}.kubelet.sharing_strategy",
                sharing,
                f"expected one of {', '.join(SHARING_STRATEGIES)}",
            )
        gpus: list[GpuSpec] = []
        for g, group in enumerate(r.get(raw, "gpus", path, list)):
            gpath = f"{path}.gpus[{g}]"
            key = r.get(group, "model", gpath, str)
            if key not in MODELS:
                raise r.fail(f"{gpath}.model", key, f"unknown GPU model; known: {', '.join(MODELS)}")
            model = MODELS[key]
            count = r.get(group, "count", gpath, int, 1)
            if not 1 <= count <= MAX_GPUS_PER_NODE - len(gpus):
                raise r.fail(
                    f"{gpath}.count", count, f"must be from 1 to {MAX_GPUS_PER_NODE} GPUs a node in all"
                )
            mig = (
                _layout(r, model, r.get(group, "mig", gpath, list), f"{gpath}.mig") if "mig" in group else ()
            )
            replicas = r.get(group, "time_slicing", gpath, int, 1)
            if replicas < 1 or (replicas > 1 and mig):
                raise r.fail(
                    f"{gpath}.time_slicing", replicas, "must be >= 1, and only on whole (non-MIG) GPUs"
                )
            fractional = r.get(group, "fractional", gpath, str, "")
            if fractional and (fractional not in FRACTIONAL_SCHEDULERS or mig or replicas > 1):
                raise r.fail(
                    f"{gpath}.fractional",
                    fractional,
                    f"expected one of {', '.join(FRACTIONAL_SCHEDULERS)}, on a whole GPU without time_slicing",
                )
            vgpu_host = "vgpus" in group
            if vgpu_host and (mig or replicas > 1 or fractional):
                raise r.fail(
                    f"{gpath}.vgpus",
                    group["vgpus"],
                    "a vGPU host GPU is whole: no mig, time_slicing or fractional",
                )
            vgpu_entries = r.get(group, "vgpus", gpath, list, [])
            # A board's NVLinks answer only where the fabric is there: the real H200s of
            # tests/data/real-gpu/, single GPUs passed through to a VM, answer NOT_SUPPORTED for the link
            # count (field 91) and every link's state.
            nvlinks = r.get(group, "nvlinks", gpath, int, model.nvlinks)
            if not 0 <= nvlinks <= model.nvlinks:
                raise r.fail(f"{gpath}.nvlinks", nvlinks, f"must be within 0..{model.nvlinks} on a {key}")
            if nvlinks != model.nvlinks:
                model = replace(model, nvlinks=nvlinks)
            dra = r.get(group, "dra", gpath, bool, False)
            if dra and (replicas > 1 or fractional or vgpu_host):
                raise r.fail(
                    f"{gpath}.dra",
                    dra,
                    "a DRA GPU is shared through its claims: no time_slicing, fractional or vgpus",
                )
            virtualization = r.get(group, "virtualization", gpath, str, "none")
            if virtualization not in VIRTUALIZATION_MODES or (virtualization != "none" and vgpu_host):
                raise r.fail(
                    f"{gpath}.virtualization",
                    virtualization,
                    f"expected one of {', '.join(VIRTUALIZATION_MODES)} (a vGPU host is set by vgpus:)",
                )
            wl = r.get(group, "workload", gpath, dict, {})
            pattern = r.get(wl, "pattern", f"{gpath}.workload", str, "steady")
            if pattern not in WORKLOAD_PATTERNS:
                raise r.fail(
                    f"{gpath}.workload.pattern", pattern, f"expected one of {', '.join(WORKLOAD_PATTERNS)}"
                )
            mean = r.get(wl, "mean", f"{gpath}.workload", float, 0.5)
            amplitude = r.get(wl, "amplitude", f"{gpath}.workload", float, 0.2)
            if not 0 <= mean <= 1:
                raise r.fail(f"{gpath}.workload.mean", mean, "must be within 0..1")
            if not 0 <= amplitude <= 1:  # before: 50 was taken, and the load clamped to 0..1
                raise r.fail(f"{gpath}.workload.amplitude", amplitude, "must be within 0..1")
            workload = Workload(pattern, mean, amplitude)
            for _ in range(count):
                index = len(gpus)
                uuid = _uuid("GPU", f"{seed}/{name}/{index}")
                vgpus = _vgpus(r, model, vgpu_entries, f"{gpath}.vgpus", f"{seed}/{name}/{index}")
                gpus.append(
                    GpuSpec(
                        name,
                        index,
                        model,
                        uuid,
                        mig,
                        replicas,
                        workload,
                        fractional,
                        vgpu_host,
                        vgpus,
                        passthrough=virtualization == "passthrough",
                        dra=dra,
                    )
                )
        gpus_by_node[name] = tuple(gpus)
        nodes.append(
            NodeSpec(
                name=name,
                driver_version=str(r.get(raw, "driver_version", path, (str, int, float), "550.54.15")),
                cuda_version=str(r.get(raw, "cuda_version", path, (str, int, float), "12.4")),
                gpus=tuple(gpus),
                device_ids=device_ids,
                mig_strategy=strategy,
                extra_resources=extra,
                exporter_privileged=r.get(raw, "exporter_privileged", path, bool, True),
                sharing_strategy=sharing,
                cgroup=_cgroup_layout(r, raw, path),
                host_processes=_host_processes(r, raw, path, tuple(gpus)),
                nvlink_domain=r.get(raw, "nvlink_domain", path, str, ""),
                nvlink_clique=_clique(r, raw, path),
            )
        )
    claims = _claims(r, data, gpus_by_node)
    pods = []
    for p, raw in _expand_pods(r, r.get(data, "pods", "", list, [])):
        path = f"pods[{p}]"
        node = r.get(raw, "node", path, str)
        if node not in gpus_by_node:
            raise r.fail(f"{path}.node", node, "no such node in this fleet")
        gpus = gpus_by_node[node]
        devices = []
        channels: list[str] = []
        for d, dev in enumerate(r.get(raw, "devices", path, list)):
            dpath = f"{path}.devices[{d}]"
            if isinstance(dev, dict) and "claim" in dev:
                namespace = r.get(raw, "namespace", path, str)
                claimed = _claimed(r, dev, dpath, claims, namespace, node)
                if claimed is None:  # a ComputeDomain's channel: no GPU
                    channels.append(dev["claim"])
                devices.extend(claimed or [])
                continue
            gpu = r.get(dev, "gpu", dpath, int)
            if not 0 <= gpu < len(gpus):
                raise r.fail(f"{dpath}.gpu", gpu, f"node {node} has GPUs 0..{len(gpus) - 1}")
            gi = r.get(dev, "gpu_instance_id", dpath, int, None)
            spec = gpus[gpu]
            if spec.mig_enabled and gi not in {m.gpu_instance_id for m in spec.mig}:
                raise r.fail(
                    f"{dpath}.gpu_instance_id",
                    gi,
                    f"GPU {gpu} of {node} is in MIG mode; name one of "
                    f"its GPU instances {sorted(m.gpu_instance_id for m in spec.mig)}",
                )
            if not spec.mig_enabled and gi is not None:
                raise r.fail(f"{dpath}.gpu_instance_id", gi, f"GPU {gpu} of {node} is not in MIG mode")
            replica = r.get(dev, "replica", dpath, int, None)
            if replica is not None and not 0 <= replica < spec.time_slicing:
                raise r.fail(
                    f"{dpath}.replica", replica, f"GPU {gpu} has {spec.time_slicing} time-slicing replicas"
                )
            if spec.dra:
                raise r.fail(
                    f"{dpath}.gpu", gpu, f"GPU {gpu} of {node} is handed out by DRA: hold it through a claim"
                )
            memory_mib = r.get(dev, "memory_mib", dpath, int, None)
            cores = r.get(dev, "cores", dpath, int, None)
            if spec.fractional:
                if memory_mib is None or not 0 < memory_mib <= spec.model.memory_mib:
                    raise r.fail(
                        f"{dpath}.memory_mib",
                        memory_mib,
                        f"GPU {gpu} of {node} is shared by {spec.fractional}: grant 1..{spec.model.memory_mib} MiB",
                    )
                if spec.fractional == "gpushare" and memory_mib % 1024:
                    raise r.fail(
                        f"{dpath}.memory_mib", memory_mib, "gpushare grants whole GiB: a multiple of 1024"
                    )
                if cores is not None and not 0 < cores <= 100:
                    raise r.fail(f"{dpath}.cores", cores, "must be within 1..100 (percent)")
            elif memory_mib is not None or cores is not None:
                raise r.fail(f"{dpath}.memory_mib", memory_mib, f"GPU {gpu} of {node} is not fractional")
            devices.append(PodDevice(gpu, gi, replica, memory_mib, cores))
        utilization = r.get(raw, "utilization", path, float, 0.6)
        if not 0 <= utilization <= 1:  # before: -5 was taken, and the load clamped to 0
            raise r.fail(f"{path}.utilization", utilization, "must be within 0..1")
        start = r.duration(raw.get("start", 0), f"{path}.start")
        end = r.duration(raw["end"], f"{path}.end") if raw.get("end") is not None else None
        every = r.duration(raw["every"], f"{path}.every") if raw.get("every") is not None else None
        if end is not None and end <= start:
            raise r.fail(f"{path}.end", raw.get("end"), "must be after start")
        labels = r.get(raw, "labels", path, dict, {})
        pods.append(
            PodSpec(
                namespace=r.get(raw, "namespace", path, str),
                name=r.get(raw, "name", path, str),
                container=r.get(raw, "container", path, str, "main"),
                node=node,
                devices=tuple(devices),
                utilization=utilization,
                start_s=start,
                end_s=end,
                every_s=every,
                labels=tuple(sorted((str(k), str(v)) for k, v in labels.items())),
                pid=_pid(r, raw, f"{path}.pid"),
                channels=tuple(channels),
            )
        )
    _check_pids(r, nodes, pods)
    return Fleet(seed=seed, nodes=tuple(nodes), pods=tuple(pods), source=source, claims=claims)


# --- DRA ResourceClaims -------------------------------------------------------------------------------
def _claims(r: _Reader, data: dict, gpus_by_node: dict[str, tuple[GpuSpec, ...]]) -> tuple[ClaimSpec, ...]:
    out: list[ClaimSpec] = []
    for c, raw in enumerate(r.get(data, "claims", "", list, [])):
        path = f"claims[{c}]"
        namespace, name = r.get(raw, "namespace", path, str), r.get(raw, "name", path, str)
        if any((x.namespace, x.name) == (namespace, name) for x in out):
            raise r.fail(f"{path}.name", name, f"a claim {namespace}/{name} is listed twice")
        node = r.get(raw, "node", path, str)
        if node not in gpus_by_node:
            raise r.fail(f"{path}.node", node, "no such node in this fleet")
        gpus = gpus_by_node[node]
        devices = []
        compute_domain = r.get(raw, "compute_domain", path, str, "")
        if compute_domain and raw.get("devices"):
            raise r.fail(f"{path}.devices", raw["devices"], "a ComputeDomain's channel claim holds no GPU")
        for d, dev in enumerate([] if compute_domain else r.get(raw, "devices", path, list)):
            dpath = f"{path}.devices[{d}]"
            gpu = r.get(dev, "gpu", dpath, int)
            if not 0 <= gpu < len(gpus) or not gpus[gpu].dra:
                raise r.fail(f"{dpath}.gpu", gpu, f"not a GPU of {node} marked dra: true")
            gi = r.get(dev, "gpu_instance_id", dpath, int, None)
            if gpus[gpu].mig_enabled != (gi is not None) or (
                gi is not None and gi not in {m.gpu_instance_id for m in gpus[gpu].mig}
            ):
                raise r.fail(
                    f"{dpath}.gpu_instance_id", gi, "name one of the GPU's MIG instances exactly on a MIG GPU"
                )
            share_id = r.get(dev, "share_id", dpath, str, None)
            devices.append(PodDevice(gpu, gi, share_id=share_id))
        sharing = r.get(raw, "sharing", path, str, "")
        if sharing and sharing not in CLAIM_SHARING:
            raise r.fail(f"{path}.sharing", sharing, f"expected one of {', '.join(CLAIM_SHARING)}")
        out.append(ClaimSpec(namespace, name, node, tuple(devices), sharing, compute_domain))
    taken: dict[tuple, str] = {}
    for claim in out:  # a device is allocated to one claim, or by capacity: a share_id per claim
        for dev in claim.devices:
            device = (claim.node, dev.gpu, dev.gpu_instance_id)
            holders = [
                who
                for (*d, share), who in taken.items()
                if tuple(d) == device and (share is None or dev.share_id is None or share == dev.share_id)
            ]
            if holders:
                raise r.fail(
                    "claims", f"{claim.namespace}/{claim.name}", f"device already allocated to {holders[0]}"
                )
            taken[(*device, dev.share_id)] = f"{claim.namespace}/{claim.name}"
    return tuple(out)


def _claimed(
    r: _Reader, dev: dict, path: str, claims: tuple[ClaimSpec, ...], namespace: str, node: str
) -> list[PodDevice] | None:
    """A pod's ``{claim: NAME}``: the claim's devices, held through it; None for a ComputeDomain's channel
    claim, which holds no GPU."""
    name = r.get(dev, "claim", path, str)
    claim = next((c for c in claims if (c.namespace, c.name) == (namespace, name)), None)
    if claim is None or claim.node != node:
        raise r.fail(f"{path}.claim", name, f"no claim {name} of namespace {namespace} on node {node}")
    if claim.compute_domain:
        return None
    return [replace(d, claim=name) for d in claim.devices]


# --- processes (issue 15 point 5): what NVML lists per GPU and /proc/<pid>/cgroup says of each -------
PID_MAX = 4194304  # Linux's largest pid_max (PID_MAX_LIMIT on 64-bit)


def _pid(r: _Reader, raw: dict, path: str) -> int | None:
    value = raw.get("pid") if isinstance(raw, dict) else None
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 < value < PID_MAX:
        raise r.fail(path, value, f"expected a process ID within 2..{PID_MAX - 1}")
    return value


def _cgroup_layout(r: _Reader, raw: dict, path: str) -> CgroupLayout:
    spec = r.get(raw, "cgroup", path, dict, {})
    values = {}
    for key, allowed, default in (
        ("version", CGROUP_VERSIONS, "v2"),
        ("driver", CGROUP_DRIVERS, "systemd"),
        ("runtime", CONTAINER_RUNTIMES, "containerd"),
    ):
        value = r.get(spec, key, f"{path}.cgroup", str, default)
        if value not in allowed:
            raise r.fail(f"{path}.cgroup.{key}", value, f"expected one of {', '.join(allowed)}")
        values[key] = value
    return CgroupLayout(**values)


def _host_processes(r: _Reader, raw: dict, path: str, gpus: tuple[GpuSpec, ...]) -> tuple[HostProcess, ...]:
    out = []
    for i, entry in enumerate(r.get(raw, "host_processes", path, list, [])):
        where = f"{path}.host_processes[{i}]"
        pid = _pid(r, entry, f"{where}.pid") if isinstance(entry, dict) else None
        if pid is None:
            raise r.fail(f"{where}.pid", None, "is required")
        gpu = r.get(entry, "gpu", where, int)
        if not 0 <= gpu < len(gpus):
            raise r.fail(f"{where}.gpu", gpu, f"the node has GPUs 0..{len(gpus) - 1}")
        gi = r.get(entry, "gpu_instance_id", where, int, None)
        if gpus[gpu].mig_enabled != (gi is not None):
            raise r.fail(f"{where}.gpu_instance_id", gi, "name a GPU instance exactly on a MIG-enabled GPU")
        if gi is not None and gi not in {m.gpu_instance_id for m in gpus[gpu].mig}:
            raise r.fail(f"{where}.gpu_instance_id", gi, f"GPU {gpu} has no such GPU instance")
        memory = r.get(entry, "memory_mib", where, int, 0)
        if not 0 <= memory <= gpus[gpu].model.memory_mib:
            raise r.fail(f"{where}.memory_mib", memory, f"must be within 0..{gpus[gpu].model.memory_mib}")
        utilization = r.get(entry, "utilization", where, float, 0.0)
        if not 0 <= utilization <= 1:
            raise r.fail(f"{where}.utilization", utilization, "must be within 0..1")
        cgroup = r.get(entry, "cgroup", where, str, HostProcess.cgroup)
        out.append(HostProcess(pid, gpu, memory, utilization, cgroup, gi))
    return tuple(out)


def _check_pids(r: _Reader, nodes: list[NodeSpec], pods: list[PodSpec]) -> None:
    """A PID names one process per node: an explicit one may appear once."""
    explicit: dict[str, list[PodSpec]] = {}  # by node, made once: not every node through every pod
    for p in pods:
        if p.pid:
            explicit.setdefault(p.node, []).append(p)
    for node in nodes:
        seen: dict[int, str] = {}
        named = [(h.pid, f"host process on GPU {h.gpu}") for h in node.host_processes]
        named += [(p.pid, f"pod {p.namespace}/{p.name}") for p in explicit.get(node.name, ())]
        for pid, who in named:
            if pid in seen:
                raise r.fail(f"{node.name}: pid", pid, f"used by both {seen[pid]} and {who}")
            seen[pid] = who


# --- vGPU hosts ---------------------------------------------------------------------------------------
def _vgpus(r: _Reader, model: GpuModel, entries: list, path: str, key: str) -> tuple[VgpuSpec, ...]:
    """The vGPUs of one host GPU: ``{vm, type, utilization, license}`` each."""
    types = VGPU_TYPES.get(model.key, {})
    if entries and not types:
        raise r.fail(path, entries, f"the stand-in knows no vGPU types for {model.key}")
    vgpus: list[VgpuSpec] = []
    for i, entry in enumerate(entries):
        where = f"{path}[{i}]"
        vm = r.get(entry, "vm", where, str)
        type_name = r.get(entry, "type", where, str)
        if type_name not in types:
            raise r.fail(
                f"{where}.type", type_name, f"unknown vGPU type for {model.key}; known: {', '.join(types)}"
            )
        vtype = types[type_name]
        # NVIDIA Virtual GPU Software User Guide, "Homogeneous ... time-sliced vGPUs": in the default
        # (homogeneous) mode every vGPU on one physical GPU is of the same type.
        if vgpus and vgpus[0].type != vtype:
            raise r.fail(
                f"{where}.type",
                type_name,
                f"a GPU runs vGPUs of one type; this one runs {vgpus[0].type.name}",
            )
        if len(vgpus) >= vtype.max_instances:
            raise r.fail(
                f"{where}.type", type_name, f"at most {vtype.max_instances} {type_name} fit a {model.key}"
            )
        utilization = r.get(entry, "utilization", where, float, 0.5)
        if not 0 <= utilization <= 1:
            raise r.fail(f"{where}.utilization", utilization, "must be within 0..1")
        license_state = r.get(entry, "license", where, str, "licensed")
        if license_state not in LICENSE_STATES:
            raise r.fail(f"{where}.license", license_state, f"expected one of {', '.join(LICENSE_STATES)}")
        if any(v.vm == vm for v in vgpus):
            raise r.fail(f"{where}.vm", vm, "one vGPU per VM on a GPU here")
        vgpus.append(
            VgpuSpec(
                vm=vm,
                type=vtype,
                utilization=utilization,
                license=license_state,
                vm_id=vm_uuid(f"vm/{vm}"),
                uuid=vm_uuid(f"vgpu/{key}/{i}"),
            )
        )
    return tuple(vgpus)


def load_fleet(path: str | Path) -> Fleet:
    """Load a fleet file; a bare name such as ``h100-mig`` means one of the shipped examples."""
    candidate = Path(path)
    if not candidate.exists() and (FLEETS_DIR / f"{path}.yaml").exists():
        candidate = FLEETS_DIR / f"{path}.yaml"
    try:
        text = candidate.read_text(encoding="utf-8")
    except OSError as exc:
        raise FleetError(f"{path}: cannot read fleet file: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise FleetError(f"{candidate}: not UTF-8 text (byte at offset {exc.start})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise FleetError(f"{candidate}: malformed YAML: {exc}") from None
    except (ValueError, OverflowError) as exc:  # PyYAML's readers raise these bare: a date 2026-13-01
        raise FleetError(f"{candidate}: a value YAML cannot read: {exc}") from None
    return parse_fleet(data, source=str(candidate))


def scaled_clock(speed: float) -> tuple[float, Callable[[], float]]:
    """Now, and a clock that runs ``speed`` simulated seconds per real second from now: the stand-ins'
    ``--speed``."""
    t0 = time.time()
    return t0, lambda: t0 + (time.time() - t0) * speed
