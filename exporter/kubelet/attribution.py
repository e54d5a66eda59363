"""Pod attribution: which pod's container holds which GPU, MIG instance or time-slice, once per cycle.

The exporter's sampler calls :meth:`PodAttribution.sample` once per sampling cycle (never from a scrape).
It asks the kubelet for List and GetAllocatableResources, resolves every device ID through the cycle's
device inventory and adds to the snapshot:

* ``nvidia_gpu_allocation{hostname,namespace,pod,container,resource,uuid,gpu,gpu_instance_id,mig_profile,
  sharing}`` = the share held: 1 for a whole GPU or MIG instance, 1/replicas for a time-sliced or MPS
  replica (replicas counted from GetAllocatableResources). Two replicas of one GPU in one container are
  one series (2/N). Every pod sharing a GPU gets its own series. ``sharing`` is ``exclusive`` (a whole
  GPU), ``mig`` (a MIG instance), or for a replica ``time_slicing`` or ``mps``: the device plugin gives
  both the same IDs, so the node's strategy (GPU Feature Discovery's ``nvidia.com/gpu.sharing-strategy``,
  passed as ``--gpu-sharing-strategy``) tells them apart.
* ``gpumeter_exporter_kubelet_up`` 1/0 and ``gpumeter_exporter_kubelet_errors_total``.
* Dynamic Resource Allocation (``dynamic_resources``, exporter/kubernetes/dra.py): each ``gpu.nvidia.com``
  device a container holds through a claim, resolved through the node's ResourceSlices (read off the
  sampling thread by kubernetes/dra_cache.py; never a call per sample) or, without them, from its
  name; ``resource`` is ``resourceclaim/<claim>``, the share 1/the containers holding the device, and
  ``sharing`` the claim's config's strategy (``nvidia_gpu_allocation_dra_info`` names claim and device;
  ``gpumeter_exporter_dra_devices_unresolved`` counts devices that resolve to nothing).

The mapping is rebuilt from every successful List, so a pod's series disappear the cycle after it ends.
When the kubelet is slow or gone, the last good allocations are kept for ``keep_cycles`` cycles (a kubelet
restart does not punch holes into billing) and then dropped. It never raises.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from gpumeter import contract
from gpumeter.exporter.kubernetes import dra
from gpumeter.exporter.snapshot import DeviceIdentity, SnapshotBuilder

from .client import AllocatableResources, KubeletError, PodResources
from .devices import Inventory, is_gpu_resource, parse_device_id, replica_counts, resolve, share

__all__ = ["ALLOCATION", "KUBELET_ERRORS", "KUBELET_UP", "LABELS", "Allocation", "DraRef", "PodAttribution"]

log = logging.getLogger(__name__)

ALLOCATION = contract.ALLOCATION
KUBELET_UP = contract.KUBELET_UP
KUBELET_ERRORS = contract.KUBELET_ERRORS
LABELS = (
    "hostname",
    "namespace",
    "pod",
    "container",
    "resource",
    "uuid",
    "gpu",
    "gpu_instance_id",
    "mig_profile",
    "sharing",
)
assert ALLOCATION.labels == LABELS, "catalog label order changed; update Allocation.labels"

_MAX_REMEMBERED = 10_000  # bound on the "logged once" sets


@dataclass(frozen=True, slots=True)
class DraRef:
    """The claim and device a DRA allocation is held through (``nvidia_gpu_allocation_dra_info``)."""

    claim_namespace: str
    claim_name: str
    driver: str
    pool: str
    device: str
    # the ComputeDomain (UID) the container joined through a compute-domain.nvidia.com channel claim; "" when
    # it joined none, or when the claim could not be read (without --kube-api)
    compute_domain: str = ""


@dataclass(frozen=True, slots=True)
class Allocation:
    """One ``nvidia_gpu_allocation`` series."""

    namespace: str
    pod: str
    container: str
    resource: str
    uuid: str  # the parent GPU's UUID
    gpu: int
    gpu_instance_id: int | None
    mig_profile: str
    sharing: str  # contract.SHARING_MODES
    share: float
    dra: DraRef | None = None  # held through a DRA claim

    def dra_labels(self, hostname: str) -> tuple[str, ...]:
        """``nvidia_gpu_allocation_dra_info``'s labels (only for a DRA allocation)."""
        assert self.dra is not None
        gi = "" if self.gpu_instance_id is None else str(self.gpu_instance_id)
        d = self.dra
        return (hostname, self.namespace, self.pod, self.container, self.uuid, str(self.gpu), gi,
                d.claim_namespace, d.claim_name, d.driver, d.pool, d.device, d.compute_domain)  # fmt: skip

    def labels(self, hostname: str) -> tuple[str, ...]:
        gi = "" if self.gpu_instance_id is None else str(self.gpu_instance_id)
        return (
            hostname,
            self.namespace,
            self.pod,
            self.container,
            self.resource,
            self.uuid,
            str(self.gpu),
            gi,
            self.mig_profile,
            self.sharing,
        )


class PodAttribution:
    """Kubelet PodResources → allocation series; one :meth:`sample` per sampling cycle."""

    def __init__(
        self,
        client,
        hostname: str,
        keep_cycles: int = 5,
        extra_resources: Iterable[str] = (),
        replicas_under_mps: bool = False,
        fractional=None,
        dra=None,
    ):
        self.client = client
        # exporter.kubernetes.dra_cache.DraCache: the node's ResourceSlices and its claims' config; None
        # without --kube-api (DRA devices then resolve from their names alone)
        self.dra = dra
        self.dra_unresolved = 0
        # exporter.kubernetes.fractional.FractionalAttribution: HAMi/gpushare grants from the pods
        self.fractional = fractional
        self.replica_sharing = contract.SHARING_MPS if replicas_under_mps else contract.SHARING_TIME_SLICING
        self.hostname = hostname
        self.keep_cycles = max(0, int(keep_cycles))
        self.extra_resources = tuple(extra_resources)
        self.up = False
        self.errors = 0
        self._last: tuple[Allocation, ...] = ()
        self._failed_cycles = 0
        self._logged_ids: set[str] = set()
        self._logged_resources: set[str] = set()
        self._first_success = True

    # --- the cycle ------------------------------------------------------------------------------
    def sample(self, devices: tuple[DeviceIdentity, ...], builder: SnapshotBuilder) -> None:
        try:
            allocations = self._query(devices)
        except Exception as exc:  # KubeletError, or a bug in resolution: attribution must never raise
            self.errors += 1
            self.up = False
            self._failed_cycles += 1
            if not isinstance(exc, KubeletError):
                log.exception("pod attribution failed")
            elif self._failed_cycles == 1:  # once per outage, not once per cycle
                log.warning(
                    "kubelet query failed; keeping the last allocations for %d cycles: %s",
                    self.keep_cycles,
                    exc,
                )
            else:
                log.debug("kubelet query failed (%d in a row): %s", self._failed_cycles, exc)
            if self._failed_cycles > self.keep_cycles and self._last:
                log.warning(
                    "dropping %d allocations kept since the last good kubelet answer", len(self._last)
                )
                self._last = ()
        else:
            if self._failed_cycles:
                log.info("kubelet answers again after %d failed queries", self._failed_cycles)
            self.up = True
            self._failed_cycles = 0
            self._last = allocations
        emitted = self._last
        if self.fractional is not None:
            emitted = self.fractional.apply(emitted, devices, builder, self.hostname)
        for allocation in emitted:
            builder.add(ALLOCATION, allocation.labels(self.hostname), allocation.share)
            if allocation.dra is not None:
                builder.add(contract.DRA_ALLOCATION_INFO, allocation.dra_labels(self.hostname), 1.0)
        builder.add(KUBELET_UP, (), 1.0 if self.up else 0.0)
        builder.add(KUBELET_ERRORS, (), float(self.errors))
        builder.add(contract.DRA_DEVICES_UNRESOLVED, (), float(self.dra_unresolved))
        if self.dra is not None:
            view = self.dra.snapshot()
            builder.add(contract.DRA_API_UP, (), 1.0 if view.up else 0.0)
            for reason, count in view.errors.items():
                builder.add(contract.DRA_API_ERRORS, (reason,), float(count))

    def _query(self, devices: tuple[DeviceIdentity, ...]) -> tuple[Allocation, ...]:
        pods = self.client.list()
        allocatable = self.client.allocatable()
        view = None
        if self.dra is not None:
            self.dra.want(
                (d.claim_namespace, d.claim_name)
                for p in pods
                for c in p.containers
                for d in c.dynamic_resources
            )
            view = self.dra.poll()
        allocations = self.allocations(pods, allocatable, devices, view)
        if self._first_success:
            self._first_success = False
            seen = sorted({d.resource_name for p in pods for c in p.containers for d in c.devices})
            log.info(
                "kubelet PodResources on %s answered: %d pods, resources %s; %d GPU allocations",
                getattr(self.client, "socket_path", "?"),
                len(pods),
                ", ".join(seen) or "(none)",
                len(allocations),
            )
        return allocations

    # --- pure part ------------------------------------------------------------------------------
    def allocations(
        self,
        pods: Iterable[PodResources],
        allocatable: AllocatableResources,
        devices: tuple[DeviceIdentity, ...],
        dra_view=None,
    ) -> tuple[Allocation, ...]:
        """Resolve one List answer against the inventory; replicas counted from ``allocatable``; DRA
        devices through ``dra_view`` (a kubernetes.dra_cache.DraView) where given."""
        inventory = Inventory.from_devices(devices)
        pods = tuple(pods)
        replicas = replica_counts(
            i for d in allocatable.devices if self._wanted(d.resource_name) for i in d.device_ids
        )
        # Replicas missing from the allocatable list (an inconsistent answer): count those seen in List.
        listed = replica_counts(
            i
            for p in pods
            for c in p.containers
            for d in c.devices
            if self._wanted(d.resource_name)
            for i in set(d.device_ids)
        )
        for base, seen in listed.items():
            if base not in replicas:
                self._log_once(
                    base,
                    "time-sliced device %s is not in GetAllocatableResources; share taken as 1/%d",
                    base,
                    seen,
                )
                replicas[base] = seen
        shares: dict[tuple, float] = {}
        for pod in pods:
            for container in pod.containers:
                seen_ids: set[str] = set()
                for entry in container.devices:
                    if not self._wanted(entry.resource_name):
                        continue
                    for raw in entry.device_ids:
                        if raw in seen_ids:
                            continue
                        seen_ids.add(raw)
                        ref = parse_device_id(raw)
                        resolved = resolve(ref, inventory, entry.resource_name) if ref is not None else None
                        if resolved is None:
                            if not devices:  # NVML is down: nothing resolves; say so when it is back
                                continue
                            self._log_once(
                                raw,
                                "cannot resolve device %s (%s) of %s/%s container %s; skipped",
                                raw,
                                entry.resource_name,
                                pod.namespace,
                                pod.name,
                                container.name,
                            )
                            continue
                        key = (
                            pod.namespace,
                            pod.name,
                            container.name,
                            entry.resource_name,
                            resolved.uuid,
                            resolved.gpu,
                            resolved.gpu_instance_id,
                            resolved.mig_profile,
                            self._sharing(ref, resolved.gpu_instance_id),
                        )
                        shares[key] = shares.get(key, 0.0) + share(ref, replicas)
        plugin = tuple(
            Allocation(*key, min(value, 1.0)) for key, value in sorted(shares.items(), key=_sort_key)
        )
        return plugin + self._dra_allocations(pods, inventory, devices, dra_view)

    def _dra_allocations(self, pods, inventory: Inventory, devices, view) -> tuple[Allocation, ...]:
        """The devices containers hold through DRA claims. Every container holding a device gets a
        share of 1/holders, so a device's shares sum to 1 at most; sharing as the claim says."""
        held = []  # (pod, container, dynamic resource, claim resource, resolved)
        unresolved = 0
        for pod in pods:
            for container in pod.containers:
                for claim in container.dynamic_resources:
                    for resource in claim.claim_resources:
                        if resource.driver != dra.DRIVER:
                            continue  # another driver's devices (a NIC, an FPGA)
                        resolved = dra.resolve(resource.pool, resource.device, inventory, view)
                        if resolved is None:
                            if devices:  # NVML is down: nothing resolves; not the claim's fault
                                unresolved += 1
                                self._log_once(
                                    f"dra/{resource.pool}/{resource.device}",
                                    "cannot map DRA device %s/%s of claim %s/%s (%s/%s container %s) to a GPU%s; "
                                    "not attributed",
                                    resource.pool,
                                    resource.device,
                                    claim.claim_namespace,
                                    claim.claim_name,
                                    pod.namespace,
                                    pod.name,
                                    container.name,
                                    "" if view is not None and view.up else " without the ResourceSlices",
                                )
                            continue
                        held.append((pod, container, claim, resource, resolved))
        self.dra_unresolved = unresolved
        holders: dict[tuple, set[tuple[str, str, str]]] = {}
        for pod, container, _, _, resolved in held:
            holders.setdefault(resolved.key, set()).add((pod.namespace, pod.name, container.name))
        out: dict[tuple, Allocation] = {}
        for pod, container, claim, resource, resolved in held:
            strategies = view.claims.get((claim.claim_namespace, claim.claim_name), {}) if view else {}
            domain = _compute_domain(container, view)
            count = len(holders[resolved.key])
            allocation = Allocation(
                pod.namespace,
                pod.name,
                container.name,
                dra.claim_resource(claim.claim_name),
                resolved.uuid,
                resolved.gpu,
                resolved.gpu_instance_id,
                resolved.mig_profile,
                dra.sharing_of(
                    strategies.get((resource.pool, resource.device), ""), count, resolved.gpu_instance_id
                ),
                1.0 / count,
                DraRef(
                    claim.claim_namespace,
                    claim.claim_name,
                    resource.driver,
                    resource.pool,
                    resource.device,
                    domain,
                ),
            )
            key = (pod.namespace, pod.name, container.name, resolved.key)
            out.setdefault(key, allocation)  # a device named twice in one container is held once
        return tuple(
            out[k] for k in sorted(out, key=lambda k: (*k[:3], k[3][0], -1 if k[3][1] is None else k[3][1]))
        )

    def _sharing(self, ref, gpu_instance_id: int | None) -> str:
        if ref.shared:
            return self.replica_sharing
        return contract.SHARING_EXCLUSIVE if gpu_instance_id is None else contract.SHARING_MIG

    def _wanted(self, resource_name: str) -> bool:
        if is_gpu_resource(resource_name, self.extra_resources):
            return True
        if resource_name not in self._logged_resources and len(self._logged_resources) < _MAX_REMEMBERED:
            self._logged_resources.add(resource_name)
            log.debug("ignoring kubelet resource %s (not an NVIDIA GPU resource)", resource_name)
        return False

    def _log_once(self, key: str, message: str, *args) -> None:
        if key in self._logged_ids or len(self._logged_ids) >= _MAX_REMEMBERED:
            return
        self._logged_ids.add(key)
        log.warning(message, *args)

    @property
    def allocations_kept(self) -> tuple[Allocation, ...]:
        """What the last sample emitted (the last good answer while it is still kept)."""
        return self._last


def _compute_domain(container, view) -> str:
    """The ComputeDomain a container joined: that of its first claim of a compute-domain channel whose
    config the API gave (dra_cache.DraView.domains)."""
    if view is None:
        return ""
    for claim in container.dynamic_resources:
        if any(r.driver == dra.COMPUTE_DOMAIN_DRIVER for r in claim.claim_resources):
            domain = view.domains.get((claim.claim_namespace, claim.claim_name), "")
            if domain:
                return domain
    return ""


def _sort_key(item: tuple[tuple, float]) -> tuple:
    key, _ = item
    return tuple(-1 if v is None else v for v in key)
