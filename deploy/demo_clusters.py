"""The demo's second cluster and the global store both clusters write into (docs/kubernetes.md, "Many
clusters"): what ``gpumeter demo`` adds to its first cluster so that the dashboards' cluster variable,
the rules and the alerts are seen across clusters.

* east is the demo's first cluster (deploy/demo.py); west is one H200 node with its stand-in kubelet and
  kube-state-metrics, scraped by its own Prometheus.
* Each cluster's Prometheus adds ``cluster`` through ``external_labels`` and remote-writes what it
  scrapes into one VictoriaMetrics; it keeps its rule results and ALERTS to itself, since in a global
  store the rules are evaluated once, there.
* vmalert evaluates the same rule files against VictoriaMetrics, writes the results back to it and
  sends every alert, named with its cluster, to the demo's Alertmanager.
* The dashboards are built with the cluster variable shown (``--multi-cluster``) into the work folder.
* Billing reads VictoriaMetrics: both clusters' histories are imported there (:func:`import_history`,
  the cluster added as the external label would), so its lines and reports name their cluster.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

__all__ = [
    "EAST",
    "PORTS",
    "WEST",
    "WEST_NODE",
    "for_global_store",
    "import_batches",
    "import_history",
    "start_victoria_metrics",
    "start_vmalert",
    "start_west",
    "west_prometheus_config",
]

EAST, WEST = "east", "west"
WEST_FLEET, WEST_NODE = "h200", "gpu-h200-01"
PORTS = {
    "prometheus-west": 9091,
    "victoria-metrics": 8428,
    "vmalert": 8880,
    "west-exporter": 9895,
    "west-admin": 9896,
    "west-kube-state-metrics": 9857,
}
# Recorded series (level:metric:operation) and the alerts' own series stay in the cluster's Prometheus.
KEEP_RULE_RESULTS_LOCAL = {
    "source_labels": ["__name__"],
    "regex": "ALERTS|ALERTS_FOR_STATE|.+:.+",
    "action": "drop",
}


def for_global_store(config: dict[str, Any], cluster: str, store: str) -> dict[str, Any]:
    """A cluster's Prometheus ``config`` as one of many behind the global ``store`` (a URL): its
    ``cluster`` external label, remote write of what it scrapes, and no Alertmanager of its own (vmalert
    alerts for every cluster, so each alert is sent once)."""
    config = dict(config)
    config["global"] = {**config.get("global", {}), "external_labels": {"cluster": cluster}}
    config["remote_write"] = [
        {"url": f"{store}/api/v1/write", "write_relabel_configs": [KEEP_RULE_RESULTS_LOCAL]}
    ]
    config.pop("alerting", None)
    return config


def west_prometheus_config(url: Callable[[str], str], rule_files: list[str]) -> dict[str, Any]:
    def target(name: str) -> str:
        return url(name).removeprefix("http://")

    return {
        "global": {"scrape_interval": "5s", "evaluation_interval": "5s"},
        "rule_files": rule_files,
        "scrape_configs": [
            {
                "job_name": "gpumeter-exporter",
                "honor_labels": True,
                "static_configs": [
                    {"targets": [target("west-exporter")], "labels": {"instance": f"{WEST_NODE}:9835"}}
                ],
            },
            {
                "job_name": "kube-state-metrics",
                "honor_labels": True,
                "static_configs": [{"targets": [target("west-kube-state-metrics")]}],
            },
            {"job_name": "prometheus", "static_configs": [{"targets": [target("prometheus-west")]}]},
        ],
    }


def start_victoria_metrics(stack, binary: Callable[[str], str]) -> None:
    """VictoriaMetrics, keeping whatever history it is given (its default retention is one month)."""
    (stack.workdir / "victoria-metrics").mkdir(parents=True, exist_ok=True)
    stack.spawn(
        "victoria-metrics",
        [
            binary("victoria-metrics"),
            f"-storageDataPath={stack.workdir / 'victoria-metrics'}",
            f"-httpListenAddr=127.0.0.1:{stack.ports['victoria-metrics']}",
            # answer up to 5 s ago, not the default 30 s: a live demo's alerts should not lag
            "-search.latencyOffset=5s",
            "-retentionPeriod=100y",
        ],
    )
    stack.wait_http("victoria-metrics", f"{stack.url('victoria-metrics')}/health")


def import_batches(lines: Iterable[str], batch_bytes: int = 16 << 20) -> Iterator[bytes]:
    """OpenMetrics samples (timestamps in seconds, as promtool backfills them) as VictoriaMetrics'
    Prometheus-text import takes them, in batches of about ``batch_bytes``: comment and blank lines
    dropped, each timestamp in milliseconds."""
    batch: list[str] = []
    size = 0
    for line in lines:
        if line.startswith("#") or not line.strip():
            continue
        head, _, stamp = line.rstrip("\n").rpartition(" ")
        batch.append(f"{head} {round(float(stamp) * 1000)}\n")
        size += len(line)
        if size >= batch_bytes:
            yield "".join(batch).encode()
            batch, size = [], 0
    if batch:
        yield "".join(batch).encode()


def import_history(store: str, history: Path, cluster: str) -> None:
    """A ``gpumeter simulate history`` file into VictoriaMetrics, every series labelled with ``cluster``
    as its Prometheus's external label would have done."""
    import httpx

    with history.open(encoding="utf-8") as lines:
        for body in import_batches(lines):
            httpx.post(
                f"{store}/api/v1/import/prometheus",
                params={"extra_label": f"cluster={cluster}"},
                content=body,
                timeout=600,
            ).raise_for_status()
    httpx.get(f"{store}/internal/force_flush", timeout=120).raise_for_status()


def start_vmalert(stack, binary: Callable[[str], str], rule_files: list[str]) -> None:
    """vmalert over VictoriaMetrics, sending to the stack's Alertmanager."""
    store = stack.url("victoria-metrics")
    stack.spawn(
        "vmalert",
        [
            binary("vmalert"),
            *[f"-rule={path}" for path in rule_files],
            f"-datasource.url={store}",
            f"-remoteWrite.url={store}",
            f"-notifier.url={stack.url('alertmanager')}",
            "-evaluationInterval=5s",
            f"-httpListenAddr=127.0.0.1:{stack.ports['vmalert']}",
        ],
    )
    stack.wait_http("vmalert", f"{stack.url('vmalert')}/health")


def start_west(
    stack, binary: Callable[[str], str], gpumeter: Callable[..., list[str]], rule_files: list[str]
) -> None:
    """West's stand-ins, exporter and Prometheus (its history is not backfilled: it starts now)."""
    import yaml

    socket_path = stack.workdir / "kubelet" / "west-0.sock"
    stack.spawn(
        "west-kubelet",
        gpumeter(
            "simulate", "kubelet", "--fleet", WEST_FLEET, "--node", WEST_NODE, "--socket", str(socket_path)
        ),
    )
    stack.spawn(
        "west-kube-state-metrics",
        gpumeter(
            "simulate",
            "kube-state-metrics",
            "--fleet",
            WEST_FLEET,
            "--listen",
            f"127.0.0.1:{stack.ports['west-kube-state-metrics']}",
        ),
    )
    stack.spawn(
        "west-exporter",
        gpumeter(
            "exporter",
            *("--simulate", WEST_FLEET, "--simulate-node", WEST_NODE, "--kubelet-socket", str(socket_path)),
            *("--listen", f"127.0.0.1:{stack.ports['west-exporter']}"),
            *("--admin-listen", f"127.0.0.1:{stack.ports['west-admin']}"),
            *("--interval", "5"),
        ),
    )
    data = stack.workdir / "prometheus-west"
    data.mkdir(parents=True, exist_ok=True)
    config_path = stack.workdir / "prometheus-west.yml"
    config = for_global_store(
        west_prometheus_config(stack.url, rule_files), WEST, stack.url("victoria-metrics")
    )
    config_path.write_text(yaml.safe_dump(config))
    stack.spawn(
        "prometheus-west",
        [
            binary("prometheus"),
            f"--config.file={config_path}",
            f"--storage.tsdb.path={data}",
            f"--web.listen-address=127.0.0.1:{stack.ports['prometheus-west']}",
            "--web.enable-lifecycle",
        ],
    )
    stack.wait_http("west-exporter", f"{stack.url('west-exporter')}/healthz")
    stack.wait_http("west-kube-state-metrics", f"{stack.url('west-kube-state-metrics')}/metrics")
    stack.wait_http("prometheus-west", f"{stack.url('prometheus-west')}/-/ready")


def write_dashboards(out: Path) -> Path:
    """The dashboards with the cluster variable shown, for Grafana over the global store."""
    from gpumeter.dashboards.build import write

    write(out, multi_cluster=True)
    return out
