"""Exporter settings from a config file, the environment and flags (flags win, then environment,
then file, then defaults). One declarative list of options drives all three."""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import dataclass, fields
from pathlib import Path

from gpumeter.web import ListenError, parse_listen

__all__ = ["OPTIONS", "ConfigError", "ExporterConfig", "add_arguments", "resolve"]


MIN_INTERVAL_S = 0.1
# The values GPU Feature Discovery gives the node label nvidia.com/gpu.sharing-strategy (NVIDIA
# k8s-device-plugin, gpu-feature-discovery's sharing labeler): replicas are time-sliced or run under MPS.
SHARING_STRATEGIES = ("none", "time-slicing", "mps")


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class ExporterConfig:
    listen: str = ":9835"
    interval: float = 5.0
    counter_interval: float = 30.0
    simulate: str | None = None
    simulate_node: str | None = None
    admin_listen: str | None = None
    kubelet_socket: str | None = "/var/lib/kubelet/pod-resources/kubelet.sock"
    kubelet_timeout: float = 2.0
    kubelet_keep_cycles: int = 5
    extra_resources: tuple[str, ...] = ()
    kube_api: str | None = None  # "in-cluster" or a URL: list this node's pods (fractional grants)
    kube_api_token_file: str | None = None
    kube_api_refresh: float = 30.0
    proc_root: str | None = None  # the host's /proc (hostPID: /proc itself); None: /proc, or a simulated one
    gpu_sharing_strategy: str | None = None  # SHARING_STRATEGIES; None: time-slicing (a fleet node's own)
    naming: str = "native"
    web_config: str | None = None
    hostname: str | None = None
    enable_collectors: tuple[str, ...] = ()
    disable_collectors: tuple[str, ...] = ()
    collectors: str | None = None
    dcgm_hostname_label: str = "Hostname"


# (option, help) — the flag is --<option with dashes>, the env var GPUMETER_<OPTION UPPER>
OPTIONS = {
    "listen": "address to serve /metrics and /healthz on, host:port (default :9835)",
    "interval": "seconds between NVML samples, at least 0.1 (default 5)",
    "counter_interval": "seconds between reads of the counters the driver is slow to read: energy and "
    "HW thermal / power-brake time, 4.2 of a GPU's 4.4 ms of field reads on a real H200 (default 30, "
    "as dcgm-exporter's collection interval; 0: every sample)",
    "simulate": "fleet file (or example name: h100-mig, a100-mixed, h200, workstation) to simulate instead of NVML",
    "simulate_node": "which node of the fleet file this exporter is (default: the first)",
    "admin_listen": "with --simulate: address of the fault-injection endpoint, e.g. 127.0.0.1:9836",
    "kubelet_socket": "kubelet PodResources socket; empty to turn pod attribution off",
    "kubelet_timeout": "seconds before a kubelet query is abandoned (default 2)",
    "kubelet_keep_cycles": "sampling cycles the last good allocations survive a kubelet outage (default 5)",
    "extra_resources": "comma-separated extra resource names that are GPUs (e.g. nvidia.com/a100)",
    "kube_api": "list this node's pods from the Kubernetes API for HAMi/gpushare fractional grants and the "
    "processes collector's pods, and its DRA ResourceSlices and claims (resource.k8s.io/v1): "
    "in-cluster (service account) or an API server URL (default: off)",
    "kube_api_token_file": "bearer token file for --kube-api URL (in-cluster: the service account's)",
    "kube_api_refresh": "seconds between pod lists (and ResourceSlice lists) from the Kubernetes API (default 30)",
    "proc_root": "where the host's /proc is, for the processes collector's /proc/<pid>/cgroup (default /proc, "
    "which with hostPID is the host's; with --simulate a temporary directory the simulator fills)",
    "gpu_sharing_strategy": "how the device plugin shares replicas on this node: time-slicing (default) or mps "
    "(the node's GPU Feature Discovery label nvidia.com/gpu.sharing-strategy)",
    "naming": "metric names: native (default) or dcgm (dcgm-exporter's names, labels and units)",
    "web_config": "exporter-toolkit web config file (TLS, basic auth)",
    "hostname": "hostname label (default: $NODE_NAME, else the OS hostname)",
    "enable_collectors": "comma-separated collectors to enable in addition to the defaults",
    "disable_collectors": "comma-separated collectors to disable",
    "collectors": "dcgm-exporter collectors CSV (-f): export exactly the DCGM fields it lists; implies --naming dcgm",
    "dcgm_hostname_label": "dcgm naming: spelling of the hostname label, Hostname (dcgm-exporter <= 4.8.2, "
    "default) or hostname (4.8.3 and later)",
}


# exporter-toolkit's flag name, which operators of other exporters type by habit
# and dcgm-exporter's flags (pkg/cmd/app.go), so its DaemonSet arguments work unchanged
ALIASES = {
    "web_config": ("--web.config.file",),
    "listen": ("-a", "--address"),
    "collectors": ("-f",),
}
# dcgm-exporter's environment variables (pkg/cmd/app.go); GPUMETER_* ones win over them
DCGM_EXPORTER_ENV = {"collectors": "DCGM_EXPORTER_COLLECTORS", "listen": "DCGM_EXPORTER_LISTEN"}
LISTEN_OPTIONS = ("listen", "admin_listen")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", help="YAML config file with any of the options below (env GPUMETER_CONFIG)"
    )
    for name, help_text in OPTIONS.items():
        parser.add_argument(
            f"--{name.replace('_', '-')}",
            *ALIASES.get(name, ()),
            dest=name,
            default=None,
            help=f"{help_text} [env GPUMETER_{name.upper()}]",
        )


def _convert(name: str, value, source: str):
    kind = {f.name: f.type for f in fields(ExporterConfig)}[name]
    try:
        if "tuple" in str(kind):
            if isinstance(value, str):
                return tuple(v.strip() for v in value.split(",") if v.strip())
            return tuple(str(v) for v in value)
        if "float" in str(kind):
            return float(value)
        if "int" in str(kind):
            return int(value)
        text = None if value in ("", None) else str(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{source}: {name}: cannot use {value!r}") from None
    if text is not None and name in LISTEN_OPTIONS:
        try:
            parse_listen(text)
        except ListenError as exc:
            raise ConfigError(f"{source}: {name}: {exc}") from None
    return text


def resolve(args: argparse.Namespace, environ: dict[str, str] | None = None) -> ExporterConfig:
    environ = os.environ if environ is None else environ
    values: dict = {}
    config_path = args.config or environ.get("GPUMETER_CONFIG")
    if config_path:
        import yaml  # only with a config file: an exporter started by flags never loads it

        try:
            data = yaml.safe_load(Path(config_path).read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"{config_path}: cannot read config: {exc}") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{config_path}: not UTF-8 text (byte at offset {exc.start})") from None
        except (ValueError, OverflowError) as exc:  # PyYAML's readers raise these bare: a date 2026-13-01
            raise ConfigError(f"{config_path}: a value YAML cannot read: {exc}") from None
        data = {} if data is None else data
        if not isinstance(data, dict):
            raise ConfigError(
                f"{config_path}: expected a mapping of option: value, got a {type(data).__name__} ({data!r:.60})"
            )
        unknown = set(data) - set(OPTIONS)
        if unknown:
            raise ConfigError(f"{config_path}: unknown option(s): {', '.join(sorted(map(str, unknown)))}")
        values.update({k: _convert(k, v, config_path) for k, v in data.items()})
    for name in OPTIONS:
        dcgm_env = DCGM_EXPORTER_ENV.get(name)
        if dcgm_env and environ.get(dcgm_env) is not None:
            values[name] = _convert(name, environ[dcgm_env], dcgm_env)
        env = environ.get(f"GPUMETER_{name.upper()}")
        if env is not None:
            values[name] = _convert(name, env, f"GPUMETER_{name.upper()}")
        flag = getattr(args, name, None)
        if flag is not None:
            values[name] = _convert(name, flag, f"--{name.replace('_', '-')}")
    if values.get("hostname") is None and environ.get("NODE_NAME"):
        values["hostname"] = environ["NODE_NAME"]
    if values.get("collectors"):  # a dcgm-exporter collectors file only makes sense with its names
        if values.get("naming", "dcgm") != "dcgm":
            raise ConfigError(
                f"collectors: {values['collectors']} lists DCGM fields, which only --naming dcgm exports "
                f"(got naming {values['naming']!r})"
            )
        values["naming"] = "dcgm"
    config = ExporterConfig(**values)
    if config.gpu_sharing_strategy not in (None, *SHARING_STRATEGIES):
        raise ConfigError(
            f"gpu_sharing_strategy: must be one of {', '.join(SHARING_STRATEGIES)} "
            f"(got {config.gpu_sharing_strategy!r})"
        )
    if config.naming not in ("native", "dcgm"):
        raise ConfigError(f"naming: must be native or dcgm (got {config.naming!r})")
    if config.dcgm_hostname_label not in ("Hostname", "hostname"):
        raise ConfigError(
            f"dcgm_hostname_label: must be Hostname or hostname (got {config.dcgm_hostname_label!r:.40})"
        )
    if config.collectors:
        from .dcgm_csv import CollectorsFileError, read_collectors

        try:
            read_collectors(config.collectors)  # a bad file stops the start here, in one line
        except CollectorsFileError as exc:
            raise ConfigError(str(exc)) from None
    # GPM needs samples more than 100 ms apart (nvml.h, nvmlGpmSampleGet); inf would stop the sampler
    # for good and nan would spin it (math.isfinite guards both, comparisons with nan are all False).
    if not math.isfinite(config.interval) or config.interval < MIN_INTERVAL_S:
        raise ConfigError(
            f"interval: must be a finite number of seconds >= {MIN_INTERVAL_S} (got {str(config.interval)!r})"
        )
    if not math.isfinite(config.counter_interval) or config.counter_interval < 0:
        raise ConfigError(
            f"counter_interval: must be a finite number of seconds >= 0 (got {str(config.counter_interval)!r})"
        )
    for name, (low, high) in RANGES.items():
        value = getattr(config, name)
        if not low <= value <= high:  # also refuses nan
            raise ConfigError(f"{name}: must be from {low:g} to {high:g} (got {str(value)!r})")
    return config


# The numeric options' bounds past the checks above (--kubelet-keep-cycles -3 was once taken):
# a kubelet answers in milliseconds and the sampler waits on it; a cycle is one sample
RANGES: dict[str, tuple[float, float]] = {
    "kubelet_timeout": (0.01, 60.0),
    "kubelet_keep_cycles": (0, 10_000),
    "kube_api_refresh": (0.0, 86_400.0),  # 0: list every cycle
}
