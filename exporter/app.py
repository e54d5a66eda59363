"""Assembling a running exporter from its settings: NVML (real or simulated), collectors, sampler,
pod attribution, the HTTP server and, when simulating, the fault-injection endpoint."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry

from gpumeter.web import is_loopback, load_web_config, parse_listen, serve

from . import collectors as collector_registry
from .config import ConfigError, ExporterConfig
from .nvml import NvmlSession, process_is_privileged
from .render import ExpositionCache, SnapshotCollector
from .sampler import Sampler
from .server import make_app
from .xid import WAIT_MS as XID_WAIT_MS
from .xid import XidWatcher

__all__ = ["Exporter", "build_exporter"]

log = logging.getLogger(__name__)


@dataclass
class Exporter:
    config: ExporterConfig
    sampler: Sampler
    registry: CollectorRegistry
    exposition: ExpositionCache
    node: object | None = None  # the SimulatedNode when simulating
    library: object | None = None  # the stand-in NVML library when simulating
    servers: list = field(default_factory=list)
    pod_list: object | None = None  # kubernetes.pods.PodListCache: the node's pods, on their own thread
    dra_cache: object | None = None  # kubernetes.dra_cache.DraCache: ResourceSlices and claims, likewise
    cleanups: list = field(default_factory=list)  # run at stop (a simulated /proc's directory)

    def health(self) -> tuple[bool, str]:
        if not self.sampler.running:
            return False, "the sampler is not running"
        snapshot = self.sampler.snapshot()
        age = self.sampler.clock() - snapshot.timestamp
        if not age <= 3 * self.config.interval + 5:  # a few intervals; also false for a nan age
            return False, f"last sample is {age:.0f}s old"
        return True, f"ok: sampled {age:.1f}s ago, nvml {'up' if snapshot.nvml_up else 'down'}"

    def start(self) -> Exporter:
        """Sample and serve. A bad web config or a busy port stops the start with nothing left running."""
        web = load_web_config(self.config.web_config) if self.config.web_config else None
        if self.pod_list is not None:
            self.pod_list.start()  # a slow API server delays this thread, never a sampling cycle
        if self.dra_cache is not None:
            self.dra_cache.start()
        self.sampler.start()
        try:
            app = make_app(self.exposition, self.health)
            self.servers.append(serve(app, self.config.listen, web, name="metrics", answers_from_memory=True))
            if self.node is not None and self.config.admin_listen:
                from gpumeter.simulator.admin import make_admin_app

                listen_host = parse_listen(self.config.admin_listen)[0]
                admin = serve(make_admin_app(self.node, listen_host), self.config.admin_listen, name="faults")
                self.servers.append(admin)
                if not is_loopback(admin.server_address[0]):
                    log.warning(
                        "the simulator's fault-injection endpoint on %s takes unauthenticated requests "
                        "from the network; bind it to 127.0.0.1 unless that is meant",
                        admin.address,
                    )
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for server in self.servers:
            server.close()
        self.servers.clear()
        self.sampler.stop()
        if self.pod_list is not None:
            self.pod_list.stop()
        if self.dra_cache is not None:
            self.dra_cache.stop()
        while self.cleanups:
            self.cleanups.pop()()

    @property
    def port(self) -> int:
        return self.servers[0].server_address[1]


def build_exporter(
    config: ExporterConfig,
    *,
    clock: Callable[[], float] = time.time,
    library: object | None = None,
    node=None,
    kubelet_client=None,
    privileged: bool | None = None,
    xid_wait_ms: int = XID_WAIT_MS,
) -> Exporter:
    """Wire an exporter. Tests inject ``library``/``node``/``clock``/``kubelet_client`` directly, and a
    shorter ``xid_wait_ms`` (the XID thread's wait slice, which stopping the exporter waits out)."""
    hostname = config.hostname or socket.gethostname()
    if config.simulate and library is None:
        from gpumeter.simulator.device import SimulatedNode
        from gpumeter.simulator.fleet import load_fleet
        from gpumeter.simulator.latency import CALL_LATENCY_S
        from gpumeter.simulator.nvml import SimulatedNvml

        fleet = load_fleet(config.simulate)
        names = [n.name for n in fleet.nodes]
        if config.simulate_node is not None and config.simulate_node not in names:
            raise ConfigError(
                f"simulate_node: no node {config.simulate_node!r} in {fleet.source}; "
                f"its nodes: {', '.join(names)}"
            )
        node = SimulatedNode(fleet, config.simulate_node, clock=clock)
        library = SimulatedNvml(node, latency=CALL_LATENCY_S)  # each call takes the driver's time
        hostname = config.hostname or node.spec.name
    watcher = XidWatcher(clock=clock, wait_ms=xid_wait_ms)
    if privileged is None:  # a simulated node says what its driver grants; a real one asks the kernel
        privileged = node.privileged if node is not None else process_is_privileged()
    pod_list = _pod_list(config, hostname)
    attribution = dra_cache = None
    if kubelet_client is not None or config.kubelet_socket:
        from .kubelet.attribution import PodAttribution
        from .kubelet.client import PodResourcesClient

        client = kubelet_client or PodResourcesClient(config.kubelet_socket, timeout=config.kubelet_timeout)
        fractional = None
        if pod_list is not None:
            from .kubernetes.dra_cache import DraCache
            from .kubernetes.fractional import FractionalAttribution

            fractional = FractionalAttribution(None, hostname, pods=pod_list)
            dra_cache = DraCache(pod_list.lister, hostname, refresh_s=config.kube_api_refresh)
        strategy = config.gpu_sharing_strategy or (node.spec.sharing_strategy if node is not None else None)
        attribution = PodAttribution(
            client,
            hostname,
            keep_cycles=config.kubelet_keep_cycles,
            extra_resources=config.extra_resources,
            replicas_under_mps=strategy == "mps",
            fractional=fractional,
            dra=dra_cache,
        )
    cleanups = []
    proc_root = config.proc_root
    if node is not None and "processes" in config.enable_collectors:
        if proc_root is None:  # the simulator's processes need a /proc of their own
            import shutil
            import tempfile

            proc_root = tempfile.mkdtemp(prefix="gpumeter-proc-")
            cleanups.append(lambda: shutil.rmtree(proc_root, ignore_errors=True))
        node.proc_root = proc_root
    chosen = collector_registry.build(
        config.enable_collectors,
        config.disable_collectors,
        xid_watcher=watcher,
        privileged=privileged,
        clock=clock,
        counter_interval=config.counter_interval,
        proc_root=proc_root,
        pod_list=pod_list,
        hostname=hostname,  # the vgpu collector labels the VMs' allocations with it
    )
    sampler = Sampler(
        NvmlSession(library),
        chosen,
        hostname=hostname,
        interval=config.interval,
        counter_interval=config.counter_interval,
        clock=clock,
        attribution=attribution,
        xid_watcher=watcher,
    )
    registry = CollectorRegistry(auto_describe=True)
    dcgm_options = None
    if config.naming == "dcgm":
        from .dcgm import options_from_collectors
        from .dcgm_csv import read_collectors

        collectors = read_collectors(config.collectors) if config.collectors else None
        dcgm_options = options_from_collectors(collectors, config.dcgm_hostname_label)
    registry.register(SnapshotCollector(sampler.snapshot, naming=config.naming, dcgm_options=dcgm_options))
    exposition = ExpositionCache(registry, sampler.snapshot)
    sampler.listeners.append(exposition.prepare)
    return Exporter(
        config,
        sampler,
        registry,
        exposition,
        node,
        library,
        pod_list=pod_list,
        dra_cache=dra_cache,
        cleanups=cleanups,
    )


def _pod_list(config: ExporterConfig, hostname: str):
    """The node's pod list from the Kubernetes API (``--kube-api``), or None when that is off."""
    if not config.kube_api:
        return None
    from .kubernetes.api import KubeApiError, PodLister
    from .kubernetes.pods import PodListCache

    try:
        lister = (
            PodLister.in_cluster(timeout=config.kubelet_timeout)
            if config.kube_api == "in-cluster"
            else PodLister(
                config.kube_api, token_path=config.kube_api_token_file, timeout=config.kubelet_timeout
            )
        )
    except KubeApiError as exc:
        raise ConfigError(f"kube_api: {exc}") from None
    return PodListCache(lister, hostname, refresh_s=config.kube_api_refresh)
