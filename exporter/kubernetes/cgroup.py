"""A process → its Kubernetes pod and container, from ``/proc/<pid>/cgroup``.

NVML names the processes on a GPU by PID only. The kubelet puts every container in a cgroup whose path
carries the pod's UID and the container's runtime ID; the pod list (exporter/kubernetes/api.py) maps
those to namespace, pod and container (``status.containerStatuses[].containerID``). Layouts read,
one line of ``/proc/<pid>/cgroup`` each (kubelet ``pkg/kubelet/cm`` naming; runtimes' scope names):

=========================== ============================================================================
cgroup v2, systemd driver   ``0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid with _>.slice/cri-containerd-<id>.scope``
cgroup v2, cgroupfs driver  ``0::/kubepods/burstable/pod<uid>/<id>``
cgroup v1, cgroupfs driver  ``4:memory:/kubepods/besteffort/pod<uid>/<id>`` (one line per controller)
cgroup v1, systemd driver   ``…:/kubepods.slice/kubepods-pod<uid with _>.slice/docker-<id>.scope``
Guaranteed pods             no QoS level: ``/kubepods/pod<uid>/…``, ``kubepods-pod<uid>.slice``
CRI-O                       ``crio-<id>.scope``; its ``crio-conmon-<id>.scope`` is the monitor, not the container
=========================== ============================================================================

``<id>`` is the runtime's 64-hex container ID. A process outside any pod (host daemons, or a pod
whose path this does not recognise) resolves to None. ``proc_root`` is injectable (``--proc-root``;
in a container the host's ``/proc`` mounted elsewhere) so tests use a directory of files.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ContainerRef", "PodIndex", "container_of", "parse_cgroup"]

_POD = re.compile(
    r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})(?:\.slice)?$"
)
_CONTAINER = re.compile(r"^(?:(?:cri-containerd|crio|docker|containerd)-)?([0-9a-f]{64})(?:\.scope)?$")
_RUNTIME_PREFIX = re.compile(r"^[a-z0-9-]+://")  # containerd://, cri-o://, docker://


@dataclass(frozen=True, slots=True)
class ContainerRef:
    pod_uid: str  # with dashes, as metadata.uid
    container_id: str  # the runtime's ID, without its scheme


def _from_path(path: str) -> ContainerRef | None:
    parts = [p for p in path.split("/") if p]
    for i, part in enumerate(parts):
        pod = _POD.search(part)
        if pod is None:
            continue
        uid = pod.group(1).replace("_", "-")
        for rest in parts[i + 1 :]:
            container = _CONTAINER.match(rest)
            if container:
                return ContainerRef(uid, container.group(1))
        return (
            None  # the pod's own cgroup, not a container's (the pause sandbox has an ID: PodIndex lacks it)
        )
    return None


def parse_cgroup(text: str) -> ContainerRef | None:
    """The pod and container of one ``/proc/<pid>/cgroup``; the v2 line first, else any v1 line."""
    lines = [line.split(":", 2) for line in text.splitlines() if line.count(":") >= 2]
    ordered = sorted(lines, key=lambda f: f[0] != "0" or f[1] != "")  # "0::/path" is cgroup v2
    for _, _, path in ordered:
        ref = _from_path(path.strip())
        if ref is not None:
            return ref
    return None


def container_of(pid: int, proc_root: str | Path = "/proc") -> ContainerRef | None:
    """The pod and container of a process; None for one outside a pod or already gone."""
    try:
        text = (Path(proc_root) / str(int(pid)) / "cgroup").read_text(encoding="utf-8", errors="replace")
    except OSError:  # exited between NVML's list and this read, or no permission: not attributable
        return None
    return parse_cgroup(text)


class PodIndex:
    """(pod UID, container ID) → (namespace, pod, container), from a PodList's items."""

    def __init__(self, pods: Iterable[dict[str, Any]]):
        self._by_id: dict[tuple[str, str], tuple[str, str, str]] = {}
        for pod in pods:
            meta = pod.get("metadata") or {}
            status = pod.get("status") or {}
            uid = str(meta.get("uid", ""))
            for key in ("initContainerStatuses", "containerStatuses", "ephemeralContainerStatuses"):
                for container in status.get(key) or ():
                    cid = _RUNTIME_PREFIX.sub("", str(container.get("containerID", "")))
                    if uid and cid:
                        self._by_id[(uid, cid)] = (
                            str(meta.get("namespace", "")),
                            str(meta.get("name", "")),
                            str(container.get("name", "")),
                        )

    def lookup(self, ref: ContainerRef | None) -> tuple[str, str, str] | None:
        return None if ref is None else self._by_id.get((ref.pod_uid, ref.container_id))
