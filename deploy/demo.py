"""``gpumeter demo``: the whole stack on one machine, on the embedded default.

Six simulated GPU nodes: the 8×H100 MIG node, the mixed A100 node and the four nodes of
``shared-modes`` (time-slicing, MPS, HAMi/gpushare fractional grants, a vGPU host), so every ``sharing``
mode is on show. Each node has its exporter and, but for the vGPU host, its stand-in kubelet; each fleet
its stand-in kube-state-metrics (pods, pending GPU demand, a GPU quota). The shared-modes exporters
collect per-process use (``--enable-collectors processes`` on the simulator's /proc) and list their
pods from a stand-in Kubernetes API (``gpumeter simulate kube-api``), which carries the fractional
grants and names each process's pod. A stand-in volcano-scheduler (two GPU queues); a real Prometheus with the alerting and recording rules, holding a month of
backfilled history; a real Alertmanager routing to a local webhook log; the billing service on SQLite
caught up on that month; last month's chargeback and fleet-health reports; the dashboards' JSON. That is
cluster "east"; a second cluster, "west" (one H200 node, its own Prometheus), and the global store both
write into (VictoriaMetrics, with vmalert evaluating the rules there and alerting for both) come from
deploy/demo_clusters.py. Every process it starts is
stopped on Ctrl-C (or SIGTERM), and running it again starts from a clean slate. Every child runs in the
demo's work directory, never inside the installed package.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import httpx
import yaml

from gpumeter.deploy import demo_clusters
from gpumeter.process import stop_on_signals, wait_until_set
from gpumeter.simulator.metrics_server import StandInServer

__all__ = ["register"]

ROOT = Path(__file__).resolve().parents[1]


# How long a started process may take to answer. A busy machine can take minutes: CI once waited over
# 60 s on an exporter that is serving within a second here. A process that exits ends the wait at once.
READY_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class DemoNode:
    fleet: str
    node: str
    kubelet: bool = True  # a vGPU host has none: its VMs' vGPUs come from NVML
    shared: bool = False  # per-process collection, pods listed from the stand-in Kubernetes API


NODES = (
    DemoNode("h100-mig", "gpu-h100-mig-01"),
    DemoNode("a100-mixed", "gpu-a100-mixed-01"),
    DemoNode("shared-modes", "gpu-shared-ts-01", shared=True),
    DemoNode("shared-modes", "gpu-shared-mps-01", shared=True),
    DemoNode("shared-modes", "gpu-shared-frac-01", shared=True),
    DemoNode("shared-modes", "gpu-shared-vgpu-01", kubelet=False),
)
FLEETS = tuple(dict.fromkeys(n.fleet for n in NODES))  # each once, in NODES' order
PORTS = {
    "prometheus": 9090,
    "alertmanager": 9093,
    "webhook": 9099,
    "billing": 9840,
    **{f"exporter-{i}": 9835 + 10 * i for i in range(len(NODES))},  # 9835, 9845, ... 9885
    **{f"admin-{i}": 9836 + 10 * i for i in range(len(NODES))},
    **{f"kube-state-metrics-{j}": 9850 + j for j in range(len(FLEETS))},  # 9850..9852
    "volcano-scheduler": 9853,
    "kube-api": 9854,
    **demo_clusters.PORTS,  # west's Prometheus 9091, VictoriaMetrics 8428, vmalert 8880, ...
}
# GPU demand the fleets' running pods do not show, and a GPU quota, given to the stand-in
# kube-state-metrics of each node's fleet (as tests/dashboards/conftest.py does), so that the capacity
# dashboard's pending-demand, waiting-time and quota panels have something to show.
KUBE_STATE = {
    "h100-mig": ([], []),
    "shared-modes": ([], []),
    "a100-mixed": (
        ["ml-research/wait-3g=nvidia.com/mig-3g.20gb:1:2400", "vision/wait-2gpu=nvidia.com/gpu:2:300"],
        ["vision/gpus=requests.nvidia.com/gpu:8:6"],
    ),
}
# Volcano queues for the stand-in volcano-scheduler (in GPUs: deserved, allocated, requested, pending
# PodGroups), as tests/dashboards/conftest.py has them: one within its share with jobs waiting, one
# borrowing.
VOLCANO_QUEUES = ("research=8:6:10:2", "batch=4:6:6")


# Incidents in last month's history, for the fleet-health report (hours after the 1st, 00:00 UTC): two
# double-bit ECC XIDs on one H100 (an RMA candidate), an H100 off the bus for 2 h (XID 79), an
# application XID, 1.5 h of HW thermal slowdown, and on a whole A100 a pending row remap, then a row-remap
# failure (an RMA candidate). tests/demo/test_demo.py works the report's figures out from these.
INCIDENTS = (
    ("gpu-h100-mig-01/3:xid=48", 4 * 24 + 3),
    ("gpu-h100-mig-01/3:xid=48", 17 * 24 + 9),
    ("gpu-h100-mig-01/5:xid=79", 11 * 24),
    ("gpu-h100-mig-01/5:lost=7200", 11 * 24),
    ("gpu-h100-mig-01/1:hw_thermal=5400", 6 * 24),
    ("gpu-a100-mixed-01/4:xid=31", 8 * 24 + 15),
    ("gpu-a100-mixed-01/2:row_remap=2", 9 * 24),
    ("gpu-a100-mixed-01/2:row_remap_failure", 19 * 24),
)


def register(subparsers) -> None:
    parser = subparsers.add_parser("demo", help="run the whole stack locally on simulated GPUs")
    parser.add_argument(
        "--workdir", default="var/demo", help="where data, logs and reports go (wiped each run)"
    )
    parser.add_argument("--port-offset", type=int, default=0, help="add this to every default port")
    parser.add_argument(
        "--history-days",
        type=int,
        default=0,
        help="days of history to backfill (default: from the 1st of last month)",
    )
    parser.add_argument("--no-wait", action="store_true", help="stop right after 'stack ready' (for tests)")
    parser.set_defaults(func=run)


class DemoError(RuntimeError):
    pass


def _binary(name: str) -> str:
    path = shutil.which(name) or (f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").exists() else None)
    if path is None:
        raise DemoError(
            f"{name} is not installed: run `make tools` "
            "(Debian packages prometheus, prometheus-alertmanager, victoria-metrics)"
        )
    return path


def _gpumeter(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpumeter", *args]


class WebhookLog:
    """A webhook receiver that appends every Alertmanager notification to a JSON-lines file."""

    def __init__(self, port: int, path: Path):
        log = path

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with log.open("a") as out:
                    out.write(json.dumps(json.loads(body or b"{}")) + "\n")
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = StandInServer(("127.0.0.1", port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class Stack:
    workdir: Path
    ports: dict[str, int]
    processes: list[tuple[str, subprocess.Popen]] = field(default_factory=list)
    webhook: WebhookLog | None = None

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.ports[name]}"

    def spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        log = (self.workdir / "logs" / f"{name}.log").open("ab")
        # its own process group: a terminal's Ctrl-C signals the foreground group, which would stop
        # VictoriaMetrics at the same moment as the Prometheus servers flushing into it; the demo
        # stops each itself, in order (`stop`)
        proc = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=self.workdir,
            env=None,
            process_group=0,
        )
        log.close()
        self.processes.append((name, proc))
        return proc

    def wait_http(self, name: str, url: str, timeout: float = READY_TIMEOUT_S) -> None:
        """Wait until ``name`` answers 200 at ``url``, for as long as it runs, up to ``timeout``. A line
        every half minute says what is awaited and its last answer; giving up, the error carries that
        answer and the end of its log (all that CI's output shows of it)."""
        started = said = time.monotonic()
        proc = dict(self.processes).get(name)
        last = "no answer yet"
        # one client for the whole wait: httpx.get builds one a call, and its SSL context (certifi's
        # bundle) costs 30 ms of CPU, 15 % of a core at five polls a second on a machine already busy
        with httpx.Client(limits=httpx.Limits(max_keepalive_connections=0)) as client:
            while (waited := time.monotonic() - started) < timeout:
                if proc is not None and proc.poll() is not None:
                    raise DemoError(f"{name} exited with {proc.returncode}{self._log_tail(name)}")
                try:
                    answer = client.get(url, timeout=5)
                    if answer.status_code == 200:
                        return
                    last = f"HTTP {answer.status_code} {answer.text.strip()[:200]!r}"
                except httpx.HTTPError as exc:
                    last = f"{type(exc).__name__}: {exc}"
                if time.monotonic() - said >= 30:
                    said = time.monotonic()
                    print(
                        f"    still waiting for {name} after {waited:.0f}s; its last answer: {last}",
                        flush=True,
                    )
                time.sleep(0.2)
        raise DemoError(
            f"{name} not ready at {url} after {timeout:.0f}s; its last answer: {last}{self._log_tail(name)}"
        )

    def _log_tail(self, name: str, lines: int = 15) -> str:
        path = self.workdir / "logs" / f"{name}.log"
        try:
            tail = path.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return f"; no log at {path}"
        return f"; the end of {path}:\n" + "\n".join(f"    {line}" for line in tail)

    def stop(self) -> None:
        # one at a time, the last started first: each stops while what it feeds still runs (Prometheus
        # flushes its remote-write queue into VictoriaMetrics on the way out; stopped all at once, both
        # Prometheus servers waited on a store already gone until they were killed at 15 s)
        for name, proc in reversed(self.processes):
            if proc.poll() is None:
                proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                print(f"  {name} did not stop in 15 s: killed", file=sys.stderr)
                proc.kill()
                proc.wait()
        self.processes.clear()
        if self.webhook:
            self.webhook.stop()
            self.webhook = None


def _check_ports(ports: dict[str, int]) -> None:
    import socket

    for name, port in ports.items():
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                raise DemoError(
                    f"port {port} ({name}) is already in use: stop what holds it, or use --port-offset"
                )


RULE_FILES = [str(ROOT / "alerts" / "gpumeter-rules.yaml"), str(ROOT / "alerts" / "gpumeter-alerts.yaml")]


def _prometheus_config(stack: Stack) -> dict:
    exporters = [
        {"targets": [f"127.0.0.1:{stack.ports[f'exporter-{i}']}"], "labels": {"instance": f"{node}:9835"}}
        for i, node in enumerate(n.node for n in NODES)
    ]
    return {
        "global": {"scrape_interval": "5s", "evaluation_interval": "5s"},
        "rule_files": RULE_FILES,
        "alerting": {
            "alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{stack.ports['alertmanager']}"]}]}]
        },
        "scrape_configs": [
            {"job_name": "gpumeter-exporter", "honor_labels": True, "static_configs": exporters},
            {
                # kube-state-metrics' own namespace/pod labels are the pods', as in kube-prometheus
                "job_name": "kube-state-metrics",
                "honor_labels": True,
                "static_configs": [
                    {
                        "targets": [
                            f"127.0.0.1:{stack.ports[f'kube-state-metrics-{j}']}" for j in range(len(FLEETS))
                        ]
                    }
                ],
            },
            {
                "job_name": "volcano-scheduler",
                "static_configs": [{"targets": [f"127.0.0.1:{stack.ports['volcano-scheduler']}"]}],
            },
            {
                "job_name": "gpumeter-billing",
                "static_configs": [{"targets": [f"127.0.0.1:{stack.ports['billing']}"]}],
            },
            {
                "job_name": "prometheus",
                "static_configs": [{"targets": [f"127.0.0.1:{stack.ports['prometheus']}"]}],
            },
        ],
    }


ALERTMANAGER_CONFIG = ROOT / "deploy" / "alertmanager" / "alertmanager.yml"


def local_alertmanager_config(webhook: Callable[[str], str], wait: str) -> dict:
    """The shipped routing, for a local run: every receiver's webhook is ``webhook(receiver name)``
    and every group_wait/group_interval is ``wait``, so a notification comes within seconds. Routes,
    matchers and inhibitions stay as shipped. Used by the demo and by the alerting tests."""
    config = yaml.safe_load(ALERTMANAGER_CONFIG.read_text())
    for receiver in config.get("receivers", []):
        for hook in receiver.get("webhook_configs", []):
            hook["url"] = webhook(receiver["name"])

    def shorten(route: dict) -> None:
        route.update({k: wait for k in ("group_wait", "group_interval") if k in route})
        for child in route.get("routes", []):
            shorten(child)

    shorten(config["route"])
    return config


def _command_name() -> str:
    """How the user can run gpumeter from where they are (``make demo`` runs it from .venv/bin)."""
    invoked = Path(sys.argv[0])
    if invoked.name == "gpumeter" and shutil.which("gpumeter") != str(invoked.resolve()):
        with contextlib.suppress(ValueError):
            return str(invoked.resolve().relative_to(Path.cwd()))
        return str(invoked)
    return "gpumeter"


def _progress(message: str) -> None:
    print(f"==> {message}", flush=True)


def run(args: argparse.Namespace) -> int:
    stack = Stack(Path(args.workdir).resolve(), {k: v + args.port_offset for k, v in PORTS.items()})
    stopping = threading.Event()
    stop_on_signals(stopping)
    try:
        _start(stack, args, stopping)
        if not args.no_wait:
            wait_until_set(stopping)  # in slices: the signal may land on the webhook's thread
        return 0
    except DemoError as exc:
        print(f"gpumeter demo: {exc}", file=sys.stderr)
        return 1
    except subprocess.CalledProcessError as exc:
        if stopping.is_set():  # Ctrl-C reached the step's own process too: a terminal signals the group
            print("gpumeter demo: interrupted while starting", file=sys.stderr)
            return 130
        print(f"gpumeter demo: {Path(exc.cmd[0]).name} exited with {exc.returncode}", file=sys.stderr)
        return 1
    finally:
        _progress("stopping every process the demo started")
        stack.stop()
        _progress("stopped")


def _start(stack: Stack, args: argparse.Namespace, stopping: threading.Event) -> None:
    prometheus, promtool = _binary("prometheus"), _binary("promtool")
    alertmanager = _binary("prometheus-alertmanager")
    _check_ports(stack.ports)
    if stack.workdir.exists():
        shutil.rmtree(stack.workdir)
    for sub in ("logs", "prometheus", "alertmanager", "reports", "kubelet"):
        (stack.workdir / sub).mkdir(parents=True, exist_ok=True)

    now = datetime.now(UTC)
    hour = now.replace(minute=0, second=0, microsecond=0)
    first_of_month = hour.replace(day=1, hour=0)
    last_month = (first_of_month - timedelta(days=1)).replace(day=1)
    start = hour - timedelta(days=args.history_days) if args.history_days else last_month

    _progress(
        f"simulating history {start:%Y-%m-%d %H:%M} .. {hour:%Y-%m-%d %H:%M} UTC for "
        f"{', '.join(n.node for n in NODES)}"
    )
    history = stack.workdir / "history.om"
    subprocess.run(
        _gpumeter(
            "simulate",
            "history",
            *(a for f in FLEETS for a in ("--fleet", f)),
            "--from",
            start.isoformat(),
            "--to",
            hour.isoformat(),
            "--step",
            "300",
            "--out",
            str(history),
            *(
                a
                for what, hours in INCIDENTS
                for a in ("--incident", f"{what}@{(last_month + timedelta(hours=hours)).isoformat()}")
            ),
        ),
        check=True,
        cwd=stack.workdir,
    )
    # promtool (Go) backfills Prometheus while this process feeds VictoriaMetrics: side by side, the two
    # take the time of the longer (~11 s each in turn on two cores, 2026-12-06)
    _progress("backfilling it into Prometheus (promtool tsdb create-blocks-from openmetrics)")
    backfill = subprocess.Popen(
        [
            promtool,
            "tsdb",
            "create-blocks-from",
            "openmetrics",
            "--max-block-duration=768h",
            "-q",
            str(history),
            str(stack.workdir / "prometheus"),
        ],
        stdout=subprocess.DEVNULL,
    )
    try:
        _progress(
            "and into VictoriaMetrics, the global store, as cluster east; cluster west's month beside it"
        )
        demo_clusters.start_victoria_metrics(stack, _binary)
        store = stack.url("victoria-metrics")
        demo_clusters.import_history(store, history, demo_clusters.EAST)
        west_history = stack.workdir / "history-west.om"
        subprocess.run(
            _gpumeter(
                "simulate",
                "history",
                *("--fleet", demo_clusters.WEST_FLEET, "--from", start.isoformat(), "--to", hour.isoformat()),
                *("--step", "300", "--out", str(west_history)),
            ),
            check=True,
            cwd=stack.workdir,
            stdout=subprocess.DEVNULL,
        )
        demo_clusters.import_history(store, west_history, demo_clusters.WEST)
        west_history.unlink()
    except BaseException:
        backfill.kill()  # no promtool outlives a failed or interrupted start
        raise
    finally:
        backfilled = backfill.wait()
    if backfilled:
        raise subprocess.CalledProcessError(backfilled, backfill.args)
    history.unlink()

    _progress("starting stand-in kubelets, kube-state-metrics, volcano-scheduler and exporters")
    stack.spawn(
        "volcano-scheduler",
        _gpumeter(
            "simulate",
            "volcano",
            "--listen",
            f"127.0.0.1:{stack.ports['volcano-scheduler']}",
            *(a for q in VOLCANO_QUEUES for a in ("--queue", q)),
        ),
    )
    for j, fleet in enumerate(FLEETS):
        pending, quotas = KUBE_STATE[fleet]
        stack.spawn(
            f"kube-state-metrics-{j}",
            _gpumeter(
                "simulate",
                "kube-state-metrics",
                "--fleet",
                fleet,
                "--listen",
                f"127.0.0.1:{stack.ports[f'kube-state-metrics-{j}']}",
                *(a for p in pending for a in ("--pending", p)),
                *(a for q in quotas for a in ("--quota", q)),
            ),
        )
    # the shared-modes nodes' pods (fractional grants, the pods their GPU processes belong to)
    stack.spawn(
        "kube-api",
        _gpumeter(
            "simulate",
            "kube-api",
            "--fleet",
            "shared-modes",
            "--listen",
            f"127.0.0.1:{stack.ports['kube-api']}",
        ),
    )
    for i, demo_node in enumerate(NODES):
        node_args = ["--simulate", demo_node.fleet, "--simulate-node", demo_node.node]
        if demo_node.kubelet:
            socket_path = stack.workdir / "kubelet" / f"{i}.sock"
            stack.spawn(
                f"kubelet-{i}",
                _gpumeter(
                    "simulate",
                    "kubelet",
                    *("--fleet", demo_node.fleet, "--node", demo_node.node, "--socket", str(socket_path)),
                ),
            )
            node_args += ["--kubelet-socket", str(socket_path)]
        if demo_node.shared:
            node_args += [
                *("--enable-collectors", "processes"),
                *("--kube-api", stack.url("kube-api"), "--kube-api-refresh", "10"),
            ]
        stack.spawn(
            f"exporter-{i}",
            _gpumeter(
                "exporter",
                *node_args,
                "--listen",
                f"127.0.0.1:{stack.ports[f'exporter-{i}']}",
                "--admin-listen",
                f"127.0.0.1:{stack.ports[f'admin-{i}']}",
                "--interval",
                "5",
            ),
        )
    stack.webhook = WebhookLog(stack.ports["webhook"], stack.workdir / "alerts.jsonl")
    am_config = stack.workdir / "alertmanager.yml"
    am_config.write_text(
        yaml.safe_dump(local_alertmanager_config(lambda name: f"{stack.url('webhook')}/{name}", "5s"))
    )
    stack.spawn(
        "alertmanager",
        [
            alertmanager,
            f"--config.file={am_config}",
            f"--storage.path={stack.workdir / 'alertmanager'}",
            f"--web.listen-address=127.0.0.1:{stack.ports['alertmanager']}",
            "--cluster.listen-address=",
        ],
    )
    _progress("starting vmalert: the rules evaluated in the global store, for both clusters")
    demo_clusters.start_vmalert(stack, _binary, RULE_FILES)
    prom_config = stack.workdir / "prometheus.yml"
    east = demo_clusters.for_global_store(
        _prometheus_config(stack), demo_clusters.EAST, stack.url("victoria-metrics")
    )
    prom_config.write_text(yaml.safe_dump(east))
    stack.spawn(
        "prometheus",
        [
            prometheus,
            f"--config.file={prom_config}",
            f"--storage.tsdb.path={stack.workdir / 'prometheus'}",
            f"--web.listen-address=127.0.0.1:{stack.ports['prometheus']}",
            "--storage.tsdb.retention.time=120d",
            "--web.enable-lifecycle",
        ],
    )
    for i in range(len(NODES)):
        stack.wait_http(f"exporter-{i}", f"{stack.url(f'exporter-{i}')}/healthz")
    for j in range(len(FLEETS)):
        stack.wait_http(f"kube-state-metrics-{j}", f"{stack.url(f'kube-state-metrics-{j}')}/metrics")
    stack.wait_http("volcano-scheduler", f"{stack.url('volcano-scheduler')}/metrics")
    stack.wait_http("alertmanager", f"{stack.url('alertmanager')}/-/ready")
    stack.wait_http("prometheus", f"{stack.url('prometheus')}/-/ready")
    _progress(f"starting cluster {demo_clusters.WEST}: {demo_clusters.WEST_NODE} and its own Prometheus")
    demo_clusters.start_west(stack, _binary, _gpumeter, RULE_FILES)

    database = f"sqlite:///{stack.workdir / 'billing.sqlite'}"
    teams = str(ROOT / "deploy" / "demo-teams.yaml")
    _progress("billing: catching up on the backfilled history")
    subprocess.run(
        _gpumeter(
            "billing",
            "ingest",
            "--db",
            database,
            "--prometheus",
            store,  # the global store: both clusters, each line named with its cluster
            "--scrape-interval",
            "auto",
            "--teams",
            teams,
            "--from",
            start.isoformat(),
            "--to",
            hour.isoformat(),
        ),
        check=True,
        cwd=stack.workdir,
    )
    stack.spawn(
        "billing",
        _gpumeter(
            "billing",
            "serve",
            "--db",
            database,
            "--prometheus",
            store,  # the global store: both clusters, each line named with its cluster
            "--scrape-interval",
            "auto",
            "--teams",
            teams,
            "--listen",
            f"127.0.0.1:{stack.ports['billing']}",
        ),
    )
    stack.wait_http("billing", f"{stack.url('billing')}/healthz")

    reports = stack.workdir / "reports"
    period = f"{last_month:%Y-%m}"
    if (ROOT / "reports" / "cli.py").exists():
        _progress(f"rendering the {period} chargeback report")
        subprocess.run(
            _gpumeter(
                "report",
                "--db",
                database,
                "--period",
                period,
                "--by",
                "team",
                "--teams",
                teams,  # budget against actual per team
                "--format",
                "html,csv,focus",
                "--out",
                str(reports),
            ),
            check=True,
            cwd=stack.workdir,
        )
        _progress(f"rendering the {period} cost per cluster (east and west, from the global store)")
        subprocess.run(
            _gpumeter(
                "report",
                *("--db", database, "--period", period, "--by", "cluster", "--teams", teams),
                *("--format", "html,csv", "--out", str(reports)),
            ),
            check=True,
            cwd=stack.workdir,
        )
        _progress(f"rendering the {period} fleet-health report")
        subprocess.run(
            _gpumeter(
                "report",
                "--kind",
                "health",
                "--db",
                database,
                "--prometheus",
                stack.url("prometheus"),
                "--period",
                period,
                "--out",
                str(reports),
            ),
            check=True,
            cwd=stack.workdir,
        )

    if stopping.is_set():
        return
    dashboards = demo_clusters.write_dashboards(stack.workdir / "dashboards")
    gpumeter = _command_name()
    exporters = "\n                  ".join(
        f"{stack.url(f'exporter-{i}')}/metrics  ({n.node})" for i, n in enumerate(NODES)
    )
    print(
        f"""
gpumeter demo: stack ready

  Prometheus      {stack.url("prometheus")}   (cluster east; its rules: {stack.url("prometheus")}/alerts)
  Prometheus      {stack.url("prometheus-west")}   (cluster west: {demo_clusters.WEST_NODE})
  VictoriaMetrics {stack.url("victoria-metrics")}   (both clusters, label `cluster`; Grafana's datasource)
  vmalert         {stack.url("vmalert")}   (the rules over both clusters; it alerts, the Prometheus servers do not)
  Alertmanager    {stack.url("alertmanager")}   (notifications logged to {stack.workdir / "alerts.jsonl"})
  Exporters       {exporters}
  Billing         {stack.url("billing")}/metrics   (ledger {stack.workdir / "billing.sqlite"})
  Reports         {reports}  (chargeback and fleet health, {period})
  kube-state-metrics (stand-in)  {"  ".join(f"{stack.url(f'kube-state-metrics-{j}')}/metrics" for j in range(len(FLEETS)))}
  Kubernetes API (stand-in)      {stack.url("kube-api")}/api/v1/pods?fieldSelector=spec.nodeName=gpu-shared-frac-01
  volcano-scheduler (stand-in)   {stack.url("volcano-scheduler")}/metrics
  Dashboards      {dashboards}  (cluster variable shown: point Grafana's Prometheus datasource at VictoriaMetrics)
  Logs            {stack.workdir / "logs"}

  Try a fault and watch the alert arrive (about a minute):
    {gpumeter} simulate inject --admin {stack.url("admin-0")} xid --gpu 3 --set code=79
    {gpumeter} simulate inject --admin {stack.url("admin-0")} overheat --gpu 1 --set celsius=40
    {gpumeter} simulate inject --admin {stack.url("admin-0")} clear

  Ctrl-C stops everything.
""",
        flush=True,
    )
