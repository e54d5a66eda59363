"""GPU processes → their pods: memory and SM utilization per container on each GPU and MIG instance.

NVML names a GPU's processes by host PID (nvmlDeviceGetComputeRunningProcesses, and
nvmlDeviceGetMPSComputeRunningProcesses for MPS clients, which the first does not list); each PID's
``/proc/<pid>/cgroup`` (under ``--proc-root``) names its pod UID and container ID
(exporter/kubernetes/cgroup.py), and the node's pod list (exporter/kubernetes/pods.py, refreshed off
the sampling thread) names the namespace, pod and container. Per cycle and GPU:

- processes: one call on the GPU. On a MIG-enabled GPU the parent lists every instance's processes
  only for a privileged caller; refused (NO_PERMISSION, remembered), each MIG handle is asked instead.
- SM utilization: nvmlDeviceGetProcessUtilization with the newest sample timestamp of the last cycle,
  so each cycle averages the samples taken since (smUtil is % of the GPU's SM time in the sample
  period). NOT_SUPPORTED on MIG-enabled GPUs (remembered): no series there. NOT_FOUND: no process ran
  since the last cycle, 0 for every listed process.

Series are summed per (GPU instance, container); processes outside any known pod are summed into one
series with empty namespace, pod and container, so cardinality stays bounded by the node's pods.
Off by default (``--enable-collectors processes``): it needs the host PID namespace (hostPID) and the
Kubernetes API (``--kube-api``); without a pod list every process is counted under ``pod=""``.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pynvml as N

from gpumeter import contract

from ..kubernetes.cgroup import PodIndex, container_of
from . import register_collector

log = logging.getLogger(__name__)

MEMORY = contract.PROCESS_MEMORY_USED
SM = contract.PROCESS_SM_UTILIZATION
NO_INSTANCE = 0xFFFFFFFF  # nvmlProcessInfo_t's instance IDs when the GPU is not in MIG mode
NOBODY = ("", "", "")  # namespace, pod, container of processes in no known pod


@register_collector("processes", default_enabled=False)
class ProcessCollector:
    needs = ("proc_root", "pod_list")

    def __init__(self, proc_root: str | Path | None = None, pod_list=None):
        self.proc_root = Path(proc_root or "/proc")
        self.pod_list = pod_list  # exporter.kubernetes.pods.PodListCache, or None: no pod names
        self._index = PodIndex(())
        self._version = -1
        self._last_seen: dict[str, int] = {}  # GPU uuid → newest utilization sample seen (µs)
        self._unknown_uids: set[str] = set()

    def _pods(self) -> PodIndex:
        if self.pod_list is None:
            return self._index
        answer = self.pod_list.poll()
        if answer.version != self._version:  # last known pods stay in use while the API is down
            self._index, self._version = PodIndex(answer.pods), answer.version
            self._unknown_uids.clear()
        return self._index

    def update_all(self, devices, out) -> None:
        """The pod list's health, where no fractional attribution reports it (no kubelet socket)."""
        if self.pod_list is None:
            return
        if self.pod_list.health_owner is None:
            self.pod_list.health_owner = self
        if self.pod_list.health_owner is self:
            answer = self.pod_list.snapshot()
            out.add(contract.KUBE_API_UP, (), 1.0 if answer.up else 0.0)
            for reason, count in answer.errors.items():
                out.add(contract.KUBE_API_ERRORS, (reason,), float(count))

    def update(self, device, out) -> None:
        index = self._pods()
        processes = self._list(device)
        if processes is None:
            return
        utilization = None if device.mig_enabled else self._utilization(device)
        memory: dict[tuple[str, ...], float] = {}
        sm: dict[tuple[str, ...], float] = {}
        for info in processes:
            gi = "" if info.gpuInstanceId in (NO_INSTANCE, None) else str(info.gpuInstanceId)
            ref = container_of(info.pid, self.proc_root)
            owner = index.lookup(ref)
            if owner is None:
                owner = NOBODY
                if ref is not None and self.pod_list is not None and ref.pod_uid not in self._unknown_uids:
                    self._unknown_uids.add(ref.pod_uid)  # a container newer than the list: list sooner
                    self.pod_list.wake()
            key = (*device.labels, gi, *owner)
            memory[key] = memory.get(key, 0.0) + float(info.usedGpuMemory or 0)
            if utilization is not None:
                sm[key] = sm.get(key, 0.0) + utilization.get(info.pid, 0.0)
        for key, value in memory.items():
            out.add(MEMORY, key, value)
        for key, value in sm.items():
            out.add(SM, key, min(value, 1.0))

    def _list(self, device) -> list | None:
        """Every compute and MPS client process of the GPU; None when NVML lists none for it."""
        handles = [device.handle]
        listed = device.call("processes", N.nvmlDeviceGetComputeRunningProcesses, device.handle)
        if listed is None and device.mig_enabled:  # the parent refused: ask each instance
            handles = [mig.handle for mig in device.migs]
            listed = []
            for handle in handles:
                listed += device.call("mig_processes", N.nvmlDeviceGetComputeRunningProcesses, handle) or []
        if listed is None:
            return None
        seen = {p.pid for p in listed}
        for handle in handles:
            for p in device.call("mps_processes", N.nvmlDeviceGetMPSComputeRunningProcesses, handle) or ():
                if p.pid not in seen:
                    seen.add(p.pid)
                    listed.append(p)
        return listed

    def _utilization(self, device) -> dict[int, float] | None:
        """Mean SM share per PID over the samples since the last cycle; None where unsupported."""
        if (device.uuid, "process_utilization") in device.session.unsupported:
            return None
        last_seen = self._last_seen.get(device.uuid, 0)
        samples, answered = None, False
        for _ in range(2):  # the sample count can grow between pynvml's size query and its read
            try:
                samples = device.call(
                    "process_utilization", N.nvmlDeviceGetProcessUtilization, device.handle, last_seen
                )
                answered = True
                break
            except N.NVMLError_InsufficientSize:
                continue
        if not answered or (device.uuid, "process_utilization") in device.session.unsupported:
            return None
        if not samples:  # NOT_FOUND: nothing ran since the last cycle
            return {}
        sums: dict[int, list[float]] = {}
        for sample in samples:
            entry = sums.setdefault(sample.pid, [0.0, 0])
            entry[0] += sample.smUtil
            entry[1] += 1
            last_seen = max(last_seen, int(sample.timeStamp))
        self._last_seen[device.uuid] = last_seen
        return {pid: total / count / 100 for pid, (total, count) in sums.items()}
