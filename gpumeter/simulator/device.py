"""Simulated GPUs: seeded, deterministic dynamics and the faults that can be injected into them.

Load comes from the pods that hold a device (or, on a node without pods, from the GPU group's
workload pattern). Power follows load up to the enforced limit (then ``sw_power_cap``), temperature
follows power with a 30 s lag, and clocks are cut when the GPU runs hot. Counters (energy, violation
time, ECC, NVLink, PCIe replays) only grow. Time is whatever the injected clock says, so a test can
step it and the history generator can fast-forward a month.
"""

from __future__ import annotations

import math
import random
import threading
from collections import deque
from dataclasses import dataclass, field

from .fabric import FabricState, cluster_uuid
from .fleet import Fleet, GpuSpec, MigInstanceSpec, NodeSpec, Workload
from .vgpu import simulated_vgpus

__all__ = ["FAULTS", "THROTTLE_BITS", "EventSet", "SimulatedGpu", "SimulatedMig", "SimulatedNode", "pci_bus"]

# nvmlClocksEventReason* bits (docs/nvml.md §5.2)
THROTTLE_BITS = {
    "gpu_idle": 0x1,
    "applications_clocks": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal": 0x20,
    "hw_thermal": 0x40,
    "hw_power_brake": 0x80,
    "display_clocks": 0x100,
}
# Violation-time counters exist for these reasons (fields 74, 76, 269, 270, 271)
VIOLATION_REASONS = ("sw_power_cap", "sync_boost", "sw_thermal", "hw_thermal", "hw_power_brake")

FAULTS = (
    "overheat",
    "throttle",
    "nvlink_crc",
    "nvlink_down",
    "nvlink_replay",
    "xid",
    "ecc",
    "row_remap",
    "gpu_lost",
    "nvml_unavailable",
    "mig_reconfigure",
    "unsupported",
    "nvml_error",
    "nvlink_sleep",
    "page_retire",
    "pcie_downtrain",
    "fabric_health",
    "fabric_registration",
)


# What an injected value may be: what hardware can show, so a fault cannot make a reading wrap or
# overflow (`celsius: 1e308` read back as 0.0 degrees C). The counts bound one injection, not the counter.
MAX_OVERHEAT_C = 150.0  # above ambient: past any GPU's shutdown temperature
MAX_RATE_PER_S = 1e9  # NVLink CRC errors per second
MAX_COUNT = 1_000_000_000
MAX_XID = 1024  # Xid codes are below 200 today
MAX_NVML_CODE = 1 << 16


def _bounded(params: dict, key: str, default: float, low: float, high: float, whole: bool = False) -> float:
    """``params[key]`` (``default`` when absent) as a number in [low, high]; ValueError naming the
    parameter and the value otherwise (a bool, text, NaN, infinite, out of range)."""
    value = params.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{key} must be a number (got {value!r})")
    if not low <= value <= high or (whole and value != int(value)):  # NaN fails the range
        kind = "a whole number" if whole else "a number"
        raise ValueError(f"{key} must be {kind} in [{low:g}, {high:g}] (got {value!r})")
    return float(value)


def _count(params: dict, default: int = 1) -> int:
    return int(_bounded(params, "count", default, 0, MAX_COUNT, whole=True))


def pci_bus(index: int) -> int:
    """The PCI bus of the node's GPU ``index``: what the stand-in's nvmlDeviceGetPciInfo answers."""
    return 0x17 + 0x10 * index


NVLINK_INACTIVE, NVLINK_ACTIVE, NVLINK_SLEEP = 0, 1, 2  # NVML_NVLINK_STATE_* (nvml.h)

NO_INSTANCE = 0xFFFFFFFF  # nvmlEventData_t's gpuInstanceId/computeInstanceId when not attributable

# A workload model, not an NVML fact: data bytes per second per NVLink link at full load, per direction
# (an all-reduce-heavy job moves about a third of H100's 26.562 GB/s per link and direction, field 164).
NVLINK_DATA_RATE = {"tx": 9e9, "rx": 8.5e9}
AMBIENT_C = 28.0
THERMAL_TAU_S = 30.0
STEP_S = 5.0  # longest integration step when time jumps (fast-forward)
LOAD_NOISE = 0.05  # each step's load is drawn within this of the workload's (uniform, either side)
IDLE_LOAD = 0.02  # below it the GPU is not in use: the gpu_idle clocks-event reason, PCIe power saving


def _load_at(workload: Workload, t: float, rng: random.Random) -> float:
    noise = rng.uniform(-LOAD_NOISE, LOAD_NOISE)
    if workload.pattern == "idle":
        return 0.0
    if workload.pattern == "diurnal":
        base = workload.mean + workload.amplitude * math.sin(2 * math.pi * (t % 86400) / 86400 - math.pi / 2)
    elif workload.pattern == "bursty":
        base = workload.mean + (workload.amplitude if int(t // 600) % 3 == 0 else -workload.amplitude / 2)
    else:
        base = workload.mean
    return min(1.0, max(0.0, base + noise))


@dataclass(eq=False)
class EventSet:
    """One nvmlEventSet_t: the GPUs registered with it (index -> event mask) and the events delivered to it
    and not yet waited for, each (gpu, event type, data, gpu instance, compute instance).

    NVML delivers an event to every set registered for its GPU and type, and only events that happen
    after the registration: on a real H200 a native and a dcgm-naming exporter, two event sets on one
    GPU, both counted each of four XIDs (tests/data/real-gpu/h200-580.159.04/faults/xid.json). A queue
    shared by all sets gave each event to whichever waiter took it first."""

    masks: dict[int, int] = field(default_factory=dict)
    queue: deque[tuple[int, int, int, int, int]] = field(default_factory=deque)


@dataclass
class SimulatedMig:
    spec: MigInstanceSpec
    uuid: str
    load: float = 0.0
    memory_used_bytes: int = 0
    sm_busy_seconds: float = 0.0  # integral of SM activity, what GPM samples difference

    @property
    def gpu_instance_id(self) -> int:
        return self.spec.gpu_instance_id

    @property
    def compute_instance_id(self) -> int:
        return self.spec.compute_instance_id


@dataclass
class SimulatedGpu:
    spec: GpuSpec
    rng: random.Random
    migs: list[SimulatedMig] = field(default_factory=list)
    load: float = 0.0
    power_w: float = 0.0
    temperature_c: float = AMBIENT_C + 10
    energy_mj: float = 0.0
    power_limit_w: float = 0.0
    throttle: int = 0
    violation_ns: dict[str, float] = field(default_factory=lambda: dict.fromkeys(VIOLATION_REASONS, 0.0))
    ecc: dict[str, int] = field(default_factory=lambda: {"corrected": 0, "uncorrected": 0})
    remapped: dict[str, int] = field(default_factory=lambda: {"corrected": 0, "uncorrected": 0})
    remap_pending: bool = False
    remap_failure: bool = False
    # Retired pages (before Ampere): by cause, and whether a retirement waits for the next reset
    retired: dict[str, int] = field(default_factory=lambda: {"corrected": 0, "uncorrected": 0})
    retire_pending: bool = False
    pcie_replays: int = 0
    pcie_bytes: dict[str, float] = field(default_factory=lambda: {"tx": 0.0, "rx": 0.0})  # fields 197/198
    sm_busy_seconds: float = 0.0  # whole-GPU integral of SM activity, what a GPU's GPM samples difference
    # Per link, NVLink data bytes sent and received: fields 138/139 (KiB) and GPM's NVLink rates.
    nvlink_bytes: list[dict[str, float]] = field(default_factory=list)
    # Per link, what field 165 answers. nvml.h (NVIDIA/go-nvml), "NVML_FI_DEV_NVLINK_GET_STATE state enums":
    # NVML_NVLINK_STATE_INACTIVE 0, _ACTIVE 1, _SLEEP 2 (a power-saving state, not a fault).
    nvlink_state: list[int] = field(default_factory=list)
    # per link: crc_flit, crc_data, replay, recovery
    nvlink_errors: list[dict[str, float]] = field(default_factory=list)
    lost: bool = False
    # Times the GPU fell off the bus. A handle from an NVML initialisation before the fall stays lost even
    # after the GPU is back: only a real re-initialisation attaches it again (see nvml.SimulatedNvml).
    falls: int = 0
    # injected conditions
    overheat_c: float = 0.0
    forced_reasons: set[str] = field(default_factory=set)
    crc_rate: dict[int, float] = field(default_factory=dict)  # link -> CRC errors per second
    unsupported: set[str] = field(default_factory=set)  # C function names answering NOT_SUPPORTED
    # Injected NVML return codes: C function name (or "*" for every call on this GPU) -> code
    nvml_errors: dict[str, int] = field(default_factory=dict)
    # An injected PCIe link below its maximum: (generation, width, only while not in use); None: full link
    pcie_downtrained: tuple[int, int, bool] | None = None
    fabric: FabricState = field(default_factory=lambda: FabricState(supported=False, blackwell=False))

    def pcie_link(self) -> tuple[int, int]:
        """The link's current (generation, width). The driver's power saving lowers it only while the GPU
        is not in use (nvidia-smi -q, "GPU Link Info": "These may be reduced when the GPU is not in
        use"); a link that trained down stays down under load."""
        if self.pcie_downtrained is not None:
            generation, width, power_saving = self.pcie_downtrained
            if not power_saving or self.load < IDLE_LOAD:
                return generation, width
        return self.model.pcie_gen, self.model.pcie_width

    def __post_init__(self) -> None:
        model = self.spec.model
        self.pcie_rng = random.Random(self.rng.random())
        self.power_limit_w = model.power_limit_w
        self.power_w = model.idle_power_w
        self.nvlink_state = [NVLINK_ACTIVE] * model.nvlinks
        self.nvlink_bytes = [{"tx": 0.0, "rx": 0.0} for _ in range(model.nvlinks)]
        self.nvlink_errors = [
            dict.fromkeys(("crc_flit", "crc_data", "replay", "recovery"), 0.0) for _ in range(model.nvlinks)
        ]
        self.set_layout(self.spec.mig)

    @property
    def model(self):
        return self.spec.model

    def fall_off_the_bus(self) -> None:
        if not self.lost:
            self.falls += 1
        self.lost = True

    def set_layout(self, instances: tuple[MigInstanceSpec, ...]) -> None:
        self.migs = [
            SimulatedMig(spec=i, uuid=self.spec.mig_uuid(i.gpu_instance_id, i.compute_instance_id))
            for i in instances
        ]

    def gpu_instance(self, gpu_instance_id: int) -> list[SimulatedMig]:
        """The compute instances (MIG devices) of one GPU instance; they share its memory."""
        return [m for m in self.migs if m.gpu_instance_id == gpu_instance_id]

    @property
    def mig_enabled(self) -> bool:
        return bool(self.migs)

    @property
    def memory_total_bytes(self) -> int:
        return self.model.memory_mib * 1024 * 1024

    @property
    def memory_reserved_bytes(self) -> int:
        return self.model.reserved_bytes

    @property
    def memory_used_bytes(self) -> int:
        if self.migs:  # memory belongs to GPU instances: count each once, however many CIs it has
            return sum({m.gpu_instance_id: m.memory_used_bytes for m in self.migs}.values())
        usable = self.memory_total_bytes - self.memory_reserved_bytes
        return int(usable * min(0.95, 0.02 + 0.8 * self.load))

    def clock_mhz(self, clock: str) -> int:
        top = self.model.clocks_max_mhz[clock]
        if self.load < 0.02:
            return int(top * 0.3)
        factor = 0.75 + 0.25 * min(1.0, self.load * 1.5)
        if self.throttle & (
            THROTTLE_BITS["hw_slowdown"] | THROTTLE_BITS["hw_thermal"] | THROTTLE_BITS["hw_power_brake"]
        ):
            factor /= 2
        elif self.throttle & (THROTTLE_BITS["sw_thermal"] | THROTTLE_BITS["sw_power_cap"]):
            factor *= 0.85
        return int(top * factor) if clock != "memory" else top

    @property
    def performance_state(self) -> int:
        return 0 if self.load >= 0.02 else 8

    @property
    def fan_percent(self) -> int:
        span = self.model.slowdown_c - AMBIENT_C
        return int(min(100, max(30, 30 + 70 * (self.temperature_c - AMBIENT_C - 10) / span)))

    def pcie_kbps(self, direction: str) -> int:
        # Its own random stream: the exporter reads throughput beside the sampler, and sharing the
        # dynamics' stream would make every other value depend on thread timing.
        noise = self.pcie_rng.uniform(-0.1, 0.1)
        return int(self.pcie_mean_bytes_per_second(direction) / 1000 * (1 + noise))

    def pcie_mean_bytes_per_second(self, direction: str) -> float:
        return self.load * (0.6 if direction == "tx" else 0.4) * 25e9

    # --- dynamics -------------------------------------------------------------------------------
    def step(self, t: float, dt: float, demand: float, mig_loads: dict[int, float]) -> None:
        model = self.model
        self.load = demand
        for mig in self.migs:
            mig.load = mig_loads.get(mig.gpu_instance_id, 0.0)
            held = mig.gpu_instance_id in mig_loads
            mig.memory_used_bytes = int(
                mig.spec.profile.memory_mib * 1024 * 1024 * (0.1 + 0.75 * mig.load if held else 0.0)
            )
            mig.sm_busy_seconds += mig.load * dt
        wanted = model.idle_power_w + (model.power_limit_w - model.idle_power_w) * demand * 1.05
        reasons = set(self.forced_reasons)
        if wanted > self.power_limit_w:
            reasons.add("sw_power_cap")
        self.power_w = min(wanted, self.power_limit_w) * (1 + self.rng.uniform(-0.02, 0.02))
        if demand < IDLE_LOAD:
            reasons.add("gpu_idle")
        # Healthy full load settles 12 °C under the SW-thermal limit; an injected overheat adds to it.
        k = (model.gpu_max_c - 12 - AMBIENT_C) / model.power_limit_w
        steady = AMBIENT_C + k * self.power_w + self.overheat_c
        self.temperature_c += (steady - self.temperature_c) * (1 - math.exp(-dt / THERMAL_TAU_S))
        if self.temperature_c >= model.gpu_max_c:
            reasons.add("sw_thermal")
        if self.temperature_c >= model.slowdown_c:
            reasons.update(("hw_thermal", "hw_slowdown"))
        self.throttle = sum(THROTTLE_BITS[r] for r in reasons)
        for reason in VIOLATION_REASONS:
            if reason in reasons:
                self.violation_ns[reason] += dt * 1e9
        self.energy_mj += self.power_w * dt * 1000
        for direction in self.pcie_bytes:
            self.pcie_bytes[direction] += self.pcie_mean_bytes_per_second(direction) * dt
        self.sm_busy_seconds += (demand if not self.migs else 0.0) * dt
        for link, counters in enumerate(self.nvlink_bytes):
            if self.nvlink_state[link] != NVLINK_INACTIVE:  # an inactive link carries nothing
                for direction, rate in NVLINK_DATA_RATE.items():
                    counters[direction] += demand * rate * dt
        for link, rate in self.crc_rate.items():
            self.nvlink_errors[link]["crc_flit"] += rate * dt * 0.7
            self.nvlink_errors[link]["crc_data"] += rate * dt * 0.3


class SimulatedNode:
    """All GPUs of one fleet node, advanced lazily to the injected clock's time."""

    def __init__(
        self, fleet: Fleet, node: NodeSpec | str | None = None, *, clock, start: float | None = None
    ):
        self.fleet = fleet
        self.spec = fleet.node(node) if isinstance(node, str) else (node or fleet.nodes[0])
        self.clock = clock
        self.start = clock() if start is None else start
        self.lock = threading.RLock()
        self.gpus = [
            SimulatedGpu(spec=g, rng=random.Random(fleet.seed * 1009 + g.index)) for g in self.spec.gpus
        ]
        domain = cluster_uuid(fleet.seed, self.spec.fabric_domain)
        for gpu in self.gpus:
            gpu.fabric = FabricState.for_gpu(
                gpu.model.arch, gpu.model.has_fabric, domain, self.spec.nvlink_clique
            )
        self.pods = fleet.pods_on(self.spec.name)
        self.vgpus = simulated_vgpus(self.gpus)  # nvmlVgpuInstance_t -> the vGPUs running on this host
        self.pod_driven = bool(self.pods)
        self.nvml_available = True
        # the live event sets of every library on this node; an event is queued on each set registered
        # for it (EventSet), as (gpu, event type, data, gpu instance, compute instance), NO_INSTANCE
        # where not attributable
        self.event_sets: list[EventSet] = []
        # Whether the exporter reading this node has the privileges NVML wants before it reports MIG
        # instances' events to a parent-GPU registration (nvml.h, nvmlDeviceRegisterEvents).
        self.privileged = self.spec.exporter_privileged
        self.proc_root: str | None = None  # where simulator/processes.py writes the node's fake /proc
        self.events_changed = threading.Condition(self.lock)  # wakes a thread blocked in nvmlEventSetWait
        # What the driver writes to the kernel log (/dev/kmsg records, "prio,seq,usec,flags;message",
        # usec since boot = since the node's start): an NVRM Xid line per injected XID.
        self.kernel_log: list[str] = []
        self._t = self.start
        self._step(self.start, 0.0)

    # --- time -----------------------------------------------------------------------------------
    def sync(self) -> None:
        """Advance to the clock's time; cheap when little time has passed."""
        now = self.clock()
        if now - self._t >= 0.05:
            with self.lock:
                self.advance_to(now)

    def advance_to(self, now: float) -> None:
        with self.lock:
            while self._t < now:
                dt = min(STEP_S, now - self._t)
                self._t += dt
                self._step(self._t, dt)

    @property
    def elapsed(self) -> float:
        return self._t - self.start

    def running_pods(self, t: float | None = None):
        offset = (self._t if t is None else t) - self.start
        return [p for p in self.pods if p.running(offset)]

    def _step(self, t: float, dt: float) -> None:
        running = self.running_pods(t) if self.pod_driven else []
        for gpu in self.gpus:
            mig_loads: dict[int, float] = {}
            whole = 0.0
            for pod in running:
                for dev in pod.devices:
                    if dev.gpu != gpu.spec.index:
                        continue
                    jitter = gpu.rng.uniform(-LOAD_NOISE, LOAD_NOISE)
                    if dev.gpu_instance_id is not None:
                        mig_loads[dev.gpu_instance_id] = min(1.0, max(0.0, pod.utilization + jitter))
                    else:
                        whole += max(0.0, pod.utilization + jitter) / (
                            gpu.spec.time_slicing if dev.replica is not None else 1
                        )
            if gpu.mig_enabled:
                total = gpu.model.total_compute_slices
                demand = (
                    sum(mig_loads.get(m.gpu_instance_id, 0.0) * m.spec.ci_slices for m in gpu.migs) / total
                )
                if not self.pod_driven:
                    base = _load_at(gpu.spec.workload, t - self.start, gpu.rng)
                    mig_loads = {m.gpu_instance_id: base for m in gpu.migs}
                    demand = base
            elif self.pod_driven:
                demand = min(1.0, whole)
            else:
                demand = _load_at(gpu.spec.workload, t - self.start, gpu.rng)
            gpu.step(t, dt, demand, mig_loads)

    # --- faults ---------------------------------------------------------------------------------
    def _event(self, gpu: int, kind: int, data: int, gpu_instance: int, compute_instance: int) -> None:
        """Queue an event on every event set registered for this GPU and event type (caller holds the
        lock); one registered later never sees it."""
        for eventset in self.event_sets:
            if eventset.masks.get(gpu, 0) & kind:
                eventset.queue.append((gpu, kind, data, gpu_instance, compute_instance))
        self.events_changed.notify_all()

    def _log_xid(self, gpu: SimulatedGpu, code: int) -> None:
        """The driver's kernel-log line for an XID, in the form a real H200 wrote it (alerts/runbook.md,
        "What dmesg shows"); the PCI address is the one nvmlDeviceGetPciInfo answers for this GPU."""
        from gpumeter.exporter.xid_messages import message

        usec = int((self._t - self.start) * 1e6)
        line = f"NVRM: Xid (PCI:0000:{pci_bus(gpu.spec.index):02x}:00): {code}, pid=4242, name=python3, {message(code)}"
        self.kernel_log.append(f"3,{len(self.kernel_log)},{usec},-;{line}")

    def kmsg(self) -> tuple[float, list[str]]:
        """What reading /dev/kmsg gives: seconds since boot (the node's start) and the records."""
        with self.lock:
            return self.clock() - self.start, list(self.kernel_log)

    def inject(self, fault: str, gpu: int | None = None, **params) -> str:
        """Inject a fault; returns a one-line description. Raises ValueError on a bad request."""
        if fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}; known: {', '.join(FAULTS)}")
        with self.lock:
            self.advance_to(self.clock())  # the fault starts now, not at the last sample
            if fault == "nvml_unavailable":
                self.nvml_available = bool(params.get("clear", False))
                return f"NVML {'unavailable' if not self.nvml_available else 'available'}"
            target = self._gpu(gpu)
            if fault == "overheat":
                target.overheat_c = _bounded(params, "celsius", 30.0, 0.0, MAX_OVERHEAT_C)
            elif fault == "throttle":
                reason = params.get("reason", "hw_slowdown")
                if reason not in THROTTLE_BITS:
                    raise ValueError(f"unknown throttle reason {reason!r}; known: {', '.join(THROTTLE_BITS)}")
                target.forced_reasons.add(reason)
            elif fault == "nvlink_crc":
                link = self._link(target, params.get("link", 0))
                if "rate" in params:
                    target.crc_rate[link] = _bounded(params, "rate", 0.0, 0.0, MAX_RATE_PER_S)
                else:
                    count = _count(params, 1000)
                    target.nvlink_errors[link]["crc_flit"] += count * 0.7
                    target.nvlink_errors[link]["crc_data"] += count * 0.3
            elif fault == "nvlink_down":
                target.nvlink_state[self._link(target, params.get("link", 0))] = NVLINK_INACTIVE
            elif fault == "nvlink_sleep":
                target.nvlink_state[self._link(target, params.get("link", 0))] = NVLINK_SLEEP
            elif fault == "nvlink_replay":
                target.nvlink_errors[self._link(target, params.get("link", 0))]["replay"] += _count(params)
            elif fault == "xid":
                code = int(_bounded(params, "code", 79, 1, MAX_XID, whole=True))
                gi, ci = params.get("gpu_instance_id"), params.get("compute_instance_id")
                if gi is not None and not target.gpu_instance(int(gi)):
                    raise ValueError(f"GPU {target.spec.index} has no GPU instance {gi}")
                if ci is not None and (
                    gi is None or int(ci) not in {m.compute_instance_id for m in target.gpu_instance(int(gi))}
                ):
                    raise ValueError(
                        f"GPU instance {gi} of GPU {target.spec.index} has no compute instance {ci}"
                    )
                self._log_xid(target, code)
                self._event(
                    target.spec.index,
                    0x8,
                    code,
                    NO_INSTANCE if gi is None else int(gi),
                    NO_INSTANCE if ci is None else int(ci),
                )
                if code == 79:
                    target.fall_off_the_bus()
            elif fault == "ecc":
                kind = params.get("error_type", "uncorrected")
                target.ecc[kind] += _count(params)
                if kind == "uncorrected":
                    self._event(target.spec.index, 0x2, 0, NO_INSTANCE, NO_INSTANCE)
            elif fault == "row_remap":
                kind = params.get("kind", "pending")
                if kind == "pending":
                    target.remap_pending = True
                elif kind == "failure":
                    target.remap_failure = True
                else:
                    target.remapped[kind] += _count(params)
            elif fault == "page_retire":
                if not target.model.has_retired_pages:
                    raise ValueError(
                        f"a {target.model.key} remaps rows instead of retiring pages (row_remap)"
                    )
                cause = params.get("cause", "dbe")
                if cause not in ("sbe", "dbe"):
                    raise ValueError(f"cause must be sbe or dbe (got {cause!r})")
                target.retired["corrected" if cause == "sbe" else "uncorrected"] += _count(params)
                target.retire_pending = True
            elif fault == "gpu_lost":
                target.fall_off_the_bus()
            elif fault == "unsupported":
                target.unsupported.add(params["function"])
            elif fault == "nvml_error":
                code = params.get("code", 999)  # 999: NVML_ERROR_UNKNOWN
                if isinstance(code, bool) or not isinstance(code, int) or not 0 < code <= MAX_NVML_CODE:
                    raise ValueError(f"code must be an NVML return code, a positive integer (got {code!r})")
                target.nvml_errors[str(params.get("function", "*"))] = code
            elif fault == "pcie_downtrain":
                model = target.model
                generation = int(params.get("gen", max(1, model.pcie_gen - 2)))
                width = int(params.get("width", model.pcie_width))
                if (
                    not 1 <= generation <= model.pcie_gen
                    or width not in (1, 2, 4, 8, 16)
                    or width > model.pcie_width
                ):
                    raise ValueError(
                        f"gen must be 1..{model.pcie_gen} and width one of 1, 2, 4, 8, 16 up to "
                        f"{model.pcie_width} on a {model.key} (got gen {generation}, width {width})"
                    )
                target.pcie_downtrained = (generation, width, bool(params.get("power_saving", False)))
            elif fault in ("fabric_health", "fabric_registration"):
                if not target.fabric.supported:
                    raise ValueError(
                        f"a {target.model.key} answers no NVLink fabric (NOT_SUPPORTED: PCIe, pre-Hopper or "
                        "without NVLinks)"
                    )
                if fault == "fabric_health":
                    target.fabric.degrade(str(params.get("condition", "degraded_bw")))
                else:
                    target.fabric.register(str(params.get("state", "failed")), params.get("status", 999))
            elif fault == "mig_reconfigure":
                from .fleet import _layout, _Reader

                layout = params.get("layout", [])
                instances = _layout(_Reader("inject"), target.model, layout, "layout") if layout else ()
                target.set_layout(instances)
            return f"{fault} on GPU {target.spec.index}"

    def clear(self, gpu: int | None = None) -> str:
        """Remove every injected condition (counters keep their values, as on hardware)."""
        with self.lock:
            self.advance_to(self.clock())
            self.nvml_available = True
            for target in self.gpus if gpu is None else [self._gpu(gpu)]:
                target.overheat_c = 0.0
                target.forced_reasons.clear()
                target.crc_rate.clear()
                target.nvlink_state = [NVLINK_ACTIVE] * target.model.nvlinks
                target.remap_pending = False
                target.retire_pending = False  # a reset applies the pending retirement
                target.lost = False
                target.unsupported.clear()
                target.nvml_errors.clear()
                target.pcie_downtrained = None
                target.fabric.reset()
        return "cleared"

    def _gpu(self, index: int | None) -> SimulatedGpu:
        if index is None or not 0 <= int(index) < len(self.gpus):
            raise ValueError(
                f"gpu must be one of 0..{len(self.gpus) - 1} on {self.spec.name} (got {index!r})"
            )
        return self.gpus[int(index)]

    @staticmethod
    def _link(gpu: SimulatedGpu, link) -> int:
        if not 0 <= int(link) < gpu.model.nvlinks:
            raise ValueError(
                f"link must be one of 0..{gpu.model.nvlinks - 1} on a {gpu.model.key} (got {link!r})"
            )
        return int(link)
