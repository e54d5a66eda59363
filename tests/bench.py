"""The exporter benchmark behind ``make bench`` (``python -m tests.bench``).

Measures the exporter's targets (docs/architecture.md) on the simulated 8×H100 node with 7 MIG 1g.10gb instances per
GPU (fleet ``h100-mig``), prints a table with PASS/MISS beside each target and writes everything it
measured to ``.bench/exporter.json``. It asserts nothing: it is a measurement, not a test.

1. NVML calls per sampling cycle (the stand-in library's own counter, by C function) and CPU time per
   cycle (``time.process_time`` around ``Sampler.sample_once``; a manual clock steps 5 s per cycle).
2. Scrape render: (a) uncached ``generate_latest`` of a fresh snapshot, in process; (b) real HTTP
   scrapes of ``Exporter.start()`` with httpx, text and OpenMetrics, a new snapshot every N scrapes.
3. Resident memory of ``gpumeter exporter --simulate h100-mig`` in a subprocess over 10,000 scrapes.
4. The same with the stand-in kubelet attributing the node's 56 pods.
5. nvitop-exporter, in its own virtual env, over the same stand-in library and node, side by side.

   Three runs, each printed as gpumeter / nvitop-exporter on every axis of the goal: RSS
   after the scrapes, CPU per sampling cycle, scrape p99.

Options: ``--scrapes N`` (default 10000), ``--cycles N`` (200), ``--skip-nvitop``, ``--only-nvitop``,
``--nvitop-runs N`` (3), ``--out FILE``; ``--help`` lists the rest.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx
from prometheus_client import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_latest_openmetrics

from gpumeter.exporter.app import build_exporter
from gpumeter.exporter.config import ExporterConfig
from gpumeter.simulator.device import SimulatedNode
from gpumeter.simulator.fleet import load_fleet
from gpumeter.simulator.kubeapi import StandInKubeApi
from gpumeter.simulator.latency import CALL_LATENCY_S
from gpumeter.simulator.nvml import SimulatedNvml
from tests.support import loopback

REPO = Path(__file__).resolve().parent.parent
BENCH_DIR = REPO / ".bench"
NVITOP_VENV = BENCH_DIR / "nvitop-venv"
LAUNCHER = REPO / "tests" / "bench_support" / "nvitop_launch.py"
FLEET = "h100-mig"
T0 = 1_790_000_000.0  # the test suite's fixed start time
MIB = 1024 * 1024

# docs/architecture.md, "Targets"
TARGET_RSS_MIB = 80.0
TARGET_RSS_FLAT = 0.05
TARGET_RENDER_P99_MS = 10.0
TARGET_CYCLE_CPU_MS = 50.0

ACCEPT_TEXT = "text/plain;version=0.0.4"
ACCEPT_OPENMETRICS = (  # what Prometheus 2.x sends
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)
# A background thread of the exporter (the XID event watcher) blocks in this call, one call per wait
# slice (exporter/xid.py WAIT_MS); it is not part of a sampling cycle.
BACKGROUND_CALLS = frozenset({"nvmlEventSetWait_v2"})
# The stand-in kubelet serves the node at this offset into the fleet's schedule: 8.5 h in, the
# always-on inference pods (GPUs 0-3), the 8h-18h notebooks (4-5) and the 0h-6h-every-8h fine-tuning
# jobs (6-7) all run, so all 56 MIG instances are held.
KUBELET_OFFSET_S = 8.5 * 3600
# Cycles at the driver's per-call cost: before driver 555 (PCIe throughput read beside the sampler) and
# after (byte counters in the batched read).
DRIVER_COST_FLEETS = ("h100-mig", "h200", "h200-vm")  # h200-vm: the real board's twin (docs/real-gpu.md)


class ManualClock:
    def __init__(self, now: float = T0):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


# --- small helpers -------------------------------------------------------------------------------
def pct(values, q: float) -> float:
    """Nearest-rank percentile (q in 0..100); NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def summary_ms(seconds) -> dict:
    ms = [s * 1000 for s in seconds]
    if not ms:
        return {"n": 0}
    return {
        "n": len(ms),
        "p50_ms": round(pct(ms, 50), 3),
        "p90_ms": round(pct(ms, 90), 3),
        "p99_ms": round(pct(ms, 99), 3),
        "max_ms": round(max(ms), 3),
        "mean_ms": round(statistics.fmean(ms), 3),
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rss_mib(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of a process in MiB, from /proc/PID/status."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0]) / 1024
    return values.get("VmRSS", float("nan")), values.get("VmHWM", float("nan"))


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("PASS" if ok else "MISS")


def machine() -> dict:
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.partition(":")[2].strip()
                break
    from importlib.metadata import version

    return {
        "nproc": os.cpu_count(),
        "cpu_model": model,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "prometheus_client": version("prometheus-client"),
        "nvidia_ml_py": version("nvidia-ml-py"),
        "grpcio": version("grpcio"),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "loadavg_at_start": loadavg(),
    }


def loadavg() -> str:
    """Other work on the machine shows up in the tails (p99); the load average says how much."""
    with contextlib.suppress(OSError):
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    return "?"


class GcWatch:
    """Records the garbage collector's pauses while measuring: they explain most tail latency."""

    def __init__(self):
        self.pauses: list[tuple[int, float]] = []
        self._started = 0.0

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.pauses.append((info["generation"], time.perf_counter() - self._started))

    def __enter__(self) -> GcWatch:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc) -> None:
        gc.callbacks.remove(self._callback)

    def summary(self) -> dict:
        gen2 = [p for g, p in self.pauses if g == 2]
        return {
            "collections": len(self.pauses),
            "gen2_collections": len(gen2),
            "max_pause_ms": round(max((p for _, p in self.pauses), default=0.0) * 1000, 2),
            "max_gen2_pause_ms": round(max(gen2, default=0.0) * 1000, 2),
        }


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# --- the in-process exporter ----------------------------------------------------------------------
class InProcess:
    """A simulated exporter on a manual clock, as tests/exporter/conftest.py builds one."""

    def __init__(
        self,
        kubelet_socket: str | None = None,
        interval: float = 5.0,
        fleet: str = FLEET,
        latency=None,
        kube_api: str | None = None,
        offset_s: float = 0.0,
        counter_interval: float = ExporterConfig.counter_interval,
    ):
        self.clock = ManualClock()
        # offset_s: this far into the fleet's schedule, as the stand-in kubelet and API are
        self.node = SimulatedNode(load_fleet(fleet), clock=self.clock, start=self.clock() - offset_s)
        self.lib = SimulatedNvml(self.node, latency=latency)
        config = ExporterConfig(
            listen="127.0.0.1:0",
            kubelet_socket=kubelet_socket,
            hostname=self.node.spec.name,
            interval=interval,
            kube_api=kube_api,  # with it, the processes collector names each GPU process's pod
            enable_collectors=("processes",) if kube_api else (),
            counter_interval=counter_interval,
        )
        self.exporter = build_exporter(config, clock=self.clock, library=self.lib, node=self.node)
        self.sampler = self.exporter.sampler
        if self.exporter.pod_list is not None:
            self.exporter.pod_list.start()  # on its own thread, as Exporter.start() runs it

    def sample(self, advance: float = 5.0):
        self.clock.advance(advance)
        return self.sampler.sample_once()

    def cycle_calls(self) -> Counter:
        return Counter({k: v for k, v in self.lib.calls.items() if k not in BACKGROUND_CALLS})

    def close(self) -> None:
        if self.exporter.servers:
            self.exporter.stop()
        else:
            self.sampler.stop()
            if self.exporter.pod_list is not None:
                self.exporter.pod_list.stop()
            for cleanup in self.exporter.cleanups:
                cleanup()


def measure_cycles(sim: InProcess, cycles: int) -> dict:
    """NVML calls and CPU per sampling cycle, steady state (after 3 warm-up cycles)."""
    for _ in range(3):
        sim.sample()
    rows = []
    watch = GcWatch().__enter__()
    for _ in range(cycles):
        sim.clock.advance(5.0)
        rediscovers = sim.clock.now - sim.sampler._discovered_at >= sim.sampler.rediscover_seconds
        before = sim.cycle_calls()
        wall0, cpu0, thread0 = time.perf_counter(), time.process_time(), time.thread_time()
        snapshot = sim.sampler.sample_once()
        thread = time.thread_time() - thread0
        cpu = time.process_time() - cpu0
        wall = time.perf_counter() - wall0
        delta = sim.cycle_calls() - before
        self_count = snapshot.samples("gpumeter_exporter_nvml_calls")
        rows.append(
            {
                "rediscovery": rediscovers,
                "calls": sum(delta.values()),
                "by_function": delta,
                "self_reported": self_count[0][1] if self_count else None,
                "cpu": cpu,
                "thread_cpu": thread,
                "wall": wall,
            }
        )
    watch.__exit__()
    steady = [r for r in rows if not r["rediscovery"]]
    rediscovery = [r for r in rows if r["rediscovery"]]
    steady_calls = Counter(r["calls"] for r in steady).most_common(1)[0][0] if steady else 0
    example = next((r for r in steady if r["calls"] == steady_calls), None)
    example_re = rediscovery[0] if rediscovery else None
    return {
        "cycles": len(rows),
        "advance_seconds": 5.0,
        "rediscover_every_seconds": sim.sampler.rediscover_seconds,
        "nvml_calls_steady": steady_calls,
        "nvml_calls_steady_range": [min(r["calls"] for r in steady), max(r["calls"] for r in steady)]
        if steady
        else None,
        "nvml_calls_self_reported_steady": example["self_reported"] if example else None,
        "nvml_calls_by_function_steady": dict(example["by_function"].most_common()) if example else {},
        "nvml_calls_rediscovery_cycle": example_re["calls"] if example_re else None,
        "nvml_calls_self_reported_rediscovery": example_re["self_reported"] if example_re else None,
        "nvml_calls_by_function_rediscovery_extra": dict(
            (example_re["by_function"] - example["by_function"]).most_common()
        )
        if example_re and example
        else {},
        "rediscovery_cycles": len(rediscovery),
        "cpu_all": summary_ms([r["cpu"] for r in rows]),
        "cpu_steady": summary_ms([r["cpu"] for r in steady]),
        "cpu_rediscovery": summary_ms([r["cpu"] for r in rediscovery]),
        "thread_cpu_all": summary_ms([r["thread_cpu"] for r in rows]),
        "wall_steady": summary_ms([r["wall"] for r in steady]),
        "wall_rediscovery": summary_ms([r["wall"] for r in rediscovery]),
        "gc": watch.summary(),
    }


def measure_cycles_at_driver_cost(
    fleet: str, cycles: int, pause: float = 0.25, counter_interval: float = ExporterConfig.counter_interval
) -> dict:
    """Wall and CPU time per cycle when every stand-in call takes what the driver's does
    (simulator/latency.py: measured on a real H200, and spent on the CPU as the driver spends it). A real
    pause separates cycles, as the interval does: what runs beside the sampler (PCIe throughput reads on
    drivers before 555) gets the time it has on a node. ``counter_interval`` 0: the dear counters and GPM
    metric every cycle, as before they had their own cadence."""
    sim = InProcess(fleet=fleet, latency=CALL_LATENCY_S, counter_interval=counter_interval)
    try:
        for _ in range(3):
            time.sleep(pause)
            sim.sample()
        walls, cpus = [], []
        for _ in range(cycles):
            time.sleep(pause)
            sim.clock.advance(5.0)
            wall0, cpu0 = time.perf_counter(), time.process_time()
            sim.sampler.sample_once()
            cpus.append(time.process_time() - cpu0)
            walls.append(time.perf_counter() - wall0)
        return {
            "fleet": fleet,
            "driver": sim.node.spec.driver_version,
            "counter_interval": counter_interval,
            "cycles": cycles,
            "wall": summary_ms(walls),
            "cpu": summary_ms(cpus),
            "pcie_throughput_calls": sim.lib.calls["nvmlDeviceGetPcieThroughput"],
        }
    finally:
        sim.close()


def measure_render(sim: InProcess, iterations: int) -> dict:
    """Uncached rendering of fresh snapshots, in process (no HTTP)."""
    exposition = sim.exporter.exposition
    text, openmetrics, miss_gzip, hit = [], [], [], []
    size_text = size_om = size_gzip = 0
    samples = 0
    watch = GcWatch().__enter__()
    for _ in range(iterations):
        sim.sample()
        t = time.perf_counter()
        body = generate_latest(sim.exporter.registry)
        text.append(time.perf_counter() - t)
        t = time.perf_counter()
        body_om = generate_latest_openmetrics(sim.exporter.registry)
        openmetrics.append(time.perf_counter() - t)
        t = time.perf_counter()
        gz, _ = exposition.render(ACCEPT_OPENMETRICS, True)  # fresh snapshot: render + gzip
        miss_gzip.append(time.perf_counter() - t)
        t = time.perf_counter()
        exposition.render(ACCEPT_OPENMETRICS, True)  # same snapshot: the cache answers
        hit.append(time.perf_counter() - t)
        size_text, size_om, size_gzip = len(body), len(body_om), len(gz)
        samples = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
    watch.__exit__()
    return {
        "iterations": iterations,
        "series": samples,
        "bytes_text": size_text,
        "bytes_openmetrics": size_om,
        "bytes_gzip": size_gzip,
        "generate_latest_text": summary_ms(text),
        "generate_latest_openmetrics": summary_ms(openmetrics),
        "exposition_cache_miss_gzip": summary_ms(miss_gzip),
        "exposition_cache_hit": summary_ms(hit),
        "gc": watch.summary(),
    }


def measure_http_inprocess(sim: InProcess, scrapes: int, every: int) -> dict:
    """Real HTTP scrapes of Exporter.start() (the client shares the process and its GIL)."""
    sim.exporter.start()
    url = f"http://127.0.0.1:{sim.exporter.port}/metrics"
    all_, miss, hit = [], [], []
    seen: set = set()
    with httpx.Client(timeout=10) as client:
        for accept in (ACCEPT_TEXT, ACCEPT_OPENMETRICS):  # warm-up
            client.get(url, headers={"Accept": accept}).raise_for_status()
        for i in range(scrapes):
            if i % every == 0:
                sim.sample()  # a new snapshot: the next scrape of each format renders it
            accept = ACCEPT_TEXT if i % 2 == 0 else ACCEPT_OPENMETRICS
            key = (id(sim.sampler.snapshot()), accept)
            t = time.perf_counter()
            response = client.get(url, headers={"Accept": accept})
            elapsed = time.perf_counter() - t
            response.raise_for_status()
            all_.append(elapsed)
            (hit if key in seen else miss).append(elapsed)
            seen.add(key)
    return {
        "scrapes": scrapes,
        "new_snapshot_every": every,
        "accept": "alternating text 0.0.4 / OpenMetrics (Prometheus 2.x header), gzip",
        "all": summary_ms(all_),
        "cache_miss": summary_ms(miss),
        "cache_hit": summary_ms(hit),
    }


# --- subprocess exporters -------------------------------------------------------------------------
class Process:
    """A server in a subprocess; stderr goes to a log file under .bench/."""

    def __init__(self, name: str, argv: list[str], port: int, env: dict | None = None):
        self.name, self.port = name, port
        self.log_path = BENCH_DIR / f"{name}.log"
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            argv, stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=BENCH_DIR, start_new_session=True
        )  # outside the checkout's root: ``python -m gpumeter`` imports the installed package
        self.url = f"http://127.0.0.1:{port}/metrics"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        last = "no answer"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}: {self.tail()}")
            try:
                if loopback.get(self.url, timeout=5).status_code == 200:
                    return
            except httpx.HTTPError as exc:
                last = repr(exc)
            time.sleep(0.2)
        raise RuntimeError(f"{self.name} not ready after {timeout:.0f}s ({last}): {self.tail()}")

    def tail(self, lines: int = 15) -> str:
        self._log.flush()
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def stop(self) -> None:
        _terminate(self.proc)
        self._log.close()


def _terminate(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL after 15 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


KUBELET_SCRIPT = """
import signal, sys, threading, time
from gpumeter.simulator.fleet import load_fleet
from gpumeter.simulator.kubelet import StandInKubelet
fleet = load_fleet(sys.argv[1])
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
kubelet = StandInKubelet(fleet, fleet.nodes[0].name, sys.argv[2], start=time.time() - float(sys.argv[3])).start()
print("ready", flush=True)
stop.wait()
kubelet.stop()
"""


class KubeletProcess:
    """The stand-in kubelet for FLEET's first node, KUBELET_OFFSET_S into its schedule, in a subprocess."""

    def __init__(self, sock: str):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", KUBELET_SCRIPT, FLEET, sock, str(KUBELET_OFFSET_S)],
            stdout=subprocess.PIPE,
            cwd=BENCH_DIR,  # outside the checkout: the installed package
            start_new_session=True,
        )
        line = self.proc.stdout.readline() if self.proc.stdout else b""
        if line.strip() != b"ready":
            self.stop()
            raise RuntimeError(f"the stand-in kubelet did not start (exit {self.proc.returncode})")

    def stop(self) -> None:
        _terminate(self.proc)


def gpumeter_exporter(
    name: str, kubelet_socket: str = "", interval: float = 1, extra: tuple[str, ...] = ()
) -> Process:
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "gpumeter",
        "exporter",
        "--simulate",
        FLEET,
        "--listen",
        f"127.0.0.1:{port}",
        "--interval",
        f"{interval:g}",
        "--kubelet-socket",
        kubelet_socket,
        *extra,
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUMETER_")}
    env.pop("NODE_NAME", None)
    process = Process(name, argv, port, env)
    process.wait_ready()
    return process


def scrape_run(process: Process, scrapes: int, rss_every: int) -> dict:
    """``scrapes`` HTTP scrapes, alternating text/OpenMetrics with gzip as Prometheus asks; RSS sampled."""
    rss = [{"scrapes": 0, "rss_mib": round(rss_mib(process.pid)[0], 2)}]
    latencies = []
    body_bytes = 0
    cpu0, wall0 = cpu_seconds(process.pid), time.perf_counter()
    with httpx.Client(timeout=10) as client:
        for i in range(1, scrapes + 1):
            accept = ACCEPT_TEXT if i % 2 else ACCEPT_OPENMETRICS
            t = time.perf_counter()
            response = client.get(process.url, headers={"Accept": accept})
            latencies.append(time.perf_counter() - t)
            response.raise_for_status()
            body_bytes = response.num_bytes_downloaded  # on the wire (gzip)
            if i % rss_every == 0:
                rss.append({"scrapes": i, "rss_mib": round(rss_mib(process.pid)[0], 2)})
        last = client.get(process.url, headers={"Accept": ACCEPT_TEXT}).text
    wall = time.perf_counter() - wall0
    cpu = cpu_seconds(process.pid) - cpu0
    peak = rss_mib(process.pid)[1]
    measured = [r["rss_mib"] for r in rss if r["scrapes"] >= rss_every]
    reference = measured[0] if measured else float("nan")
    spread = max(abs(v - reference) / reference for v in measured) if measured else float("nan")
    final = rss[-1]["rss_mib"]
    return {
        "scrapes": scrapes,
        "latency": summary_ms(latencies),
        "wall_seconds": round(wall, 2),
        "scrapes_per_second": round(scrapes / wall, 1),
        "process_cpu_seconds": round(cpu, 2),
        "process_cpu_ms_per_scrape": round(cpu / scrapes * 1000, 3),
        "rss_samples": rss,
        "rss_final_mib": final,
        "rss_max_mib": max(r["rss_mib"] for r in rss),
        "rss_peak_vmhwm_mib": round(peak, 2),
        "rss_reference_mib": reference,
        "rss_max_deviation_ratio": round(spread, 4),
        "rss_growth_ratio": round((final - reference) / reference, 4) if measured else None,
        "flat": spread <= TARGET_RSS_FLAT,
        "under_target": max(r["rss_mib"] for r in rss) < TARGET_RSS_MIB,
        "body_bytes_gzip": body_bytes,
        "last_text": last,
    }


def count_series(text: str, name: str) -> int:
    return sum(1 for line in text.splitlines() if line.startswith(name + "{") or line.startswith(name + " "))


def idle_cpu(process: Process, seconds: float) -> dict:
    """Process CPU over a window with no scrapes: what sampling costs (interval 1 s => per cycle)."""
    cpu0, t0 = cpu_seconds(process.pid), time.perf_counter()
    time.sleep(seconds)
    cpu, wall = cpu_seconds(process.pid) - cpu0, time.perf_counter() - t0
    return {
        "window_seconds": round(wall, 2),
        "cpu_seconds": round(cpu, 3),
        "cpu_ms_per_second": round(cpu / wall * 1000, 2),
    }


IMPORT_PROBE = r"""
import importlib, json, sys
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
steps, last, scope = [], rss(), {}
interpreter = last
for step in json.loads(sys.argv[1]):
    before = set(sys.modules)
    for statement in step:
        exec(statement, scope)
    now = rss()
    new = sorted({m.split(".")[0] for m in set(sys.modules) - before if not m.startswith("_")})
    steps.append({"step": "; ".join(step), "mib": round(now - last, 1), "modules": ", ".join(new[:12])
                  + (f" +{len(new) - 12}" if len(new) > 12 else "")})
    last = now
print(json.dumps({"interpreter_mib": round(interpreter, 1), "steps": steps, "total_mib": round(last, 1),
                  "loaded": sorted({m.split(".")[0] for m in sys.modules} | {m for m in sys.modules if m.startswith("gpumeter.")})}))
"""
# What `gpumeter exporter --simulate h100-mig --kubelet-socket ''` loads, in the order it does (each
# step measured on top of the ones before), then what each configuration adds on top of all of them.
IMPORT_BASE = (
    ("import prometheus_client",),
    ("import pynvml",),
    ("import gpumeter.web",),
    ("import gpumeter.cli", "gpumeter.cli.build_parser(['exporter'])", "import gpumeter.exporter.app"),
    ("import gpumeter.simulator.nvml", "import gpumeter.simulator.fleet"),
)
IMPORT_OPTIONAL = (
    ("--kubelet-socket (gRPC, protobuf)", ("import gpumeter.exporter.kubelet.attribution",)),
    ("--kube-api (httpx)", ("import gpumeter.exporter.kubernetes.api",)),
    ("TLS in --web.config.file (pyOpenSSL)", ("import OpenSSL.SSL",)),
    ("basic_auth_users in --web.config.file (bcrypt)", ("import bcrypt",)),
    ("--naming dcgm", ("import gpumeter.exporter.dcgm", "import gpumeter.exporter.dcgm_csv")),
)
# Loaded by other commands, never by the exporter's process (its resident memory is the goal).
NOT_IN_EXPORTER = (
    "grpc",
    "google",
    "httpx",
    "OpenSSL",
    "bcrypt",
    "sqlalchemy",
    "alembic",
    "jinja2",
    "plotly",
    "apscheduler",
    "psycopg",
    "grafana_foundation_sdk",
    "gpumeter.billing",
    "gpumeter.reports",
    "gpumeter.dashboards",
)


def _probe(steps) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", IMPORT_PROBE, json.dumps(steps)], capture_output=True, text=True, cwd=BENCH_DIR
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip()[-500:])
    return json.loads(done.stdout)


def import_probe() -> dict:
    """Where the exporter's resident memory comes from: each module group's imports, in a fresh process."""
    try:
        base = _probe(list(IMPORT_BASE))
        optional = []
        for name, step in IMPORT_OPTIONAL:
            extra = _probe([*IMPORT_BASE, step])
            optional.append({**extra["steps"][-1], "step": name})
    except RuntimeError as exc:
        return {"error": str(exc)}
    return {
        "interpreter_mib": base["interpreter_mib"],
        "base": base["steps"],
        "base_total_mib": base["total_mib"],
        "optional": optional,
        "absent": [m for m in NOT_IN_EXPORTER if m not in base["loaded"]],
        "unexpected": [m for m in NOT_IN_EXPORTER if m in base["loaded"]],
    }


# --- nvitop-exporter ----------------------------------------------------------------------------
def ensure_nvitop_venv() -> Path:
    python = NVITOP_VENV / "bin" / "python"
    probe = [str(python), "-c", "import nvitop_exporter, yaml, pynvml"]
    if python.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return python
    base = shutil.which("python3") or sys.executable
    log(f"creating {NVITOP_VENV} and installing nvitop-exporter + PyYAML (first run only)")
    subprocess.run([base, "-m", "venv", str(NVITOP_VENV)], check=True, capture_output=True, text=True)
    result = subprocess.run(
        [str(NVITOP_VENV / "bin" / "pip"), "install", "-q", "nvitop-exporter", "PyYAML"],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        raise RuntimeError("pip install nvitop-exporter PyYAML failed: " + result.stderr.strip()[-800:])
    check = subprocess.run(probe, capture_output=True, text=True)
    if check.returncode != 0:
        raise RuntimeError("nvitop venv unusable: " + check.stderr.strip()[-800:])
    return python


def installed_gpumeter_site() -> Path:
    """A folder with only the installed gpumeter's top-level entries, linked from where this interpreter
    has them: the package itself (a wheel) or an editable install's ``.pth`` and finder. nvitop's launcher
    adds it to nvitop-exporter's path, so the stand-in there is the package measured here."""
    from importlib.metadata import distributions

    # not the checkout's own gpumeter.egg-info, which `pip install -e` leaves in the root (on sys.path
    # under `python -m tests.bench`)
    installed = [p for p in sys.path if p and Path(p).resolve() != REPO]
    dist = next(iter(distributions(name="gpumeter", path=installed)), None)
    if dist is None:
        raise RuntimeError("gpumeter is not installed in this interpreter (pip install the project first)")
    base = Path(dist.locate_file(""))
    tops = {Path(str(f)).parts[0] for f in dist.files or ()}
    tops = {
        t
        for t in tops
        if not t.endswith(".dist-info") and t not in ("..", "__pycache__") and (base / t).exists()
    }
    if not tops:
        raise RuntimeError(f"no installed gpumeter files under {base} (pip install the project first)")
    folder = BENCH_DIR / "gpumeter-site"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for top in sorted(tops):
        (folder / top).symlink_to(base / top)
    return folder


def nvitop_version(python: Path) -> str:
    code = (
        "from importlib.metadata import version as v; "
        "print('nvitop-exporter', v('nvitop-exporter'), 'nvitop', v('nvitop'), 'nvidia-ml-py', v('nvidia-ml-py'), "
        "'prometheus-client', v('prometheus-client'))"
    )
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True)
    return out.stdout.strip() or out.stderr.strip()[-200:]


def read_stats(path: Path) -> dict:
    for _ in range(20):
        with contextlib.suppress(OSError, ValueError):
            return json.loads(path.read_text())
        time.sleep(0.1)
    return {}


# The axes of the goal against nvitop-exporter, each as gpumeter / nvitop-exporter in the same run, with its bound.
NVITOP_AXES = (
    ("rss", "RSS after the scrapes", 1.0),  # below nvitop-exporter's
    ("cpu_per_cycle", "CPU per sampling cycle (idle, interval 1 s; gpumeter's whole process)", 0.5),
    ("scrape_p99", "scrape p99", 0.5),
)


def nvitop_process(python: Path, stats_path: Path, driver_cost: bool = True) -> Process:
    with contextlib.suppress(FileNotFoundError):
        stats_path.unlink()
    port = free_port()
    process = Process(
        "nvitop-exporter",
        [
            str(python),
            str(LAUNCHER),
            "--gpumeter-site",
            str(installed_gpumeter_site()),
            "--fleet",
            FLEET,
            "--stats",
            str(stats_path),
            *(["--driver-cost"] if driver_cost else []),
            "--",
            "--bind-address",
            "127.0.0.1",
            "--port",
            str(port),
            "--interval",
            "1",
            "--hostname",
            "bench",
        ],
        port,
    )
    process.wait_ready()
    return process


def sampled_cycles(process: Process, seconds: float) -> tuple[int, float]:
    """(cycles completed, process CPU seconds) over ``seconds`` of no scraping but a poll of
    ``gpumeter_exporter_last_sample_timestamp_seconds`` every 0.5 s (each poll ~0.3 ms of the
    exporter's CPU, counted against it): distinct timestamps are completed cycles."""
    seen: set[str] = set()
    cpu0 = cpu_seconds(process.pid)
    deadline = time.monotonic() + seconds
    with httpx.Client(timeout=10) as client:
        while time.monotonic() < deadline:
            for line in client.get(process.url).text.splitlines():
                if line.startswith("gpumeter_exporter_last_sample_timestamp_seconds"):
                    seen.add(line.rsplit(" ", 1)[1])
            time.sleep(0.5)
    return max(0, len(seen) - 1), cpu_seconds(process.pid) - cpu0


def compare_run(python: Path, scrapes: int, nvitop_scrapes: int, idle_seconds: float) -> dict:
    """One side-by-side run: gpumeter, then nvitop-exporter, each a fresh process at interval 1 s over the
    same stand-in node and library, each call charged the driver's measured CPU (simulator/latency.py),
    measured the same way. gpumeter takes ``scrapes`` (10,000: the memory target's
    count), nvitop-exporter ``nvitop_scrapes`` (its scrapes take ~0.1-0.3 s each, 10,000 would be most of
    an hour); its resident memory grows with them, so the RSS ratio is gpumeter's upper bound."""
    result: dict = {"loadavg_at_start": loadavg()}
    ours = gpumeter_exporter("gpumeter-compare")  # no kubelet, as nvitop-exporter has none
    try:
        time.sleep(3)
        ours_idle = idle_cpu(ours, idle_seconds)
        cycles, cpu = sampled_cycles(ours, idle_seconds)
        ours_idle.update(cycles=cycles, cpu_ms_per_cycle=round(cpu * 1000 / cycles, 2) if cycles else None)
        ours_run = scrape_run(ours, scrapes, max(1, scrapes // 10))
        ours_run.pop("last_text", None)
        result["gpumeter"] = {"idle": ours_idle, "scrapes": ours_run}
    finally:
        ours.stop()
    stats_path = BENCH_DIR / "nvitop-stats.json"
    theirs = nvitop_process(python, stats_path)
    try:
        time.sleep(3)
        stats0 = read_stats(stats_path)
        nvitop_idle = idle_cpu(theirs, idle_seconds)
        stats1 = read_stats(stats_path)
        nvitop_run = scrape_run(theirs, nvitop_scrapes, max(1, nvitop_scrapes // 10))
        text = nvitop_run.pop("last_text", "")
        stats = read_stats(stats_path)
    except Exception:
        result["stderr_tail"] = theirs.tail(25)
        raise
    finally:
        theirs.stop()
    calls0, calls1 = sum(stats0.get("calls", {}).values()), sum(stats1.get("calls", {}).values())
    missing0 = sum(stats0.get("missing", {}).values())
    missing1 = sum(stats1.get("missing", {}).values())
    cycles0, cycles1 = len(stats0.get("cycle_cpu_seconds", [])), len(stats1.get("cycle_cpu_seconds", []))
    cycles = cycles1 - cycles0
    result["nvitop"] = {
        "idle": nvitop_idle,
        "scrapes": nvitop_run,
        "simulator": stats.get("simulator"),
        "series": sum(1 for line in text.splitlines() if line and not line.startswith("#")),
        "nvml_calls_per_cycle": round((calls1 - calls0) / cycles, 1) if cycles > 0 else None,
        "missing_function_lookups_per_cycle": round((missing1 - missing0) / cycles, 1)
        if cycles > 0
        else None,
        "missing_functions": stats.get("missing", {}),
        "calls_by_function": dict(Counter(stats.get("calls", {})).most_common()),
        "cycle_thread_cpu": summary_ms(stats.get("cycle_cpu_seconds", [])[2:]),  # the first warm caches
    }
    g, n = result["gpumeter"], result["nvitop"]
    # gpumeter: its whole process's CPU per completed cycle; nvitop-exporter: its collection thread's
    # CPU per cycle, as the launcher times it (its other threads idle): gpumeter's side is the larger.
    values = {
        "rss": (g["scrapes"]["rss_final_mib"], n["scrapes"]["rss_final_mib"]),
        "cpu_per_cycle": (g["idle"]["cpu_ms_per_cycle"], n["cycle_thread_cpu"].get("mean_ms")),
        "scrape_p99": (g["scrapes"]["latency"]["p99_ms"], n["scrapes"]["latency"]["p99_ms"]),
    }
    result["axes"] = {
        axis: {
            "gpumeter": a,
            "nvitop": b,
            "ratio": round(a / b, 3) if a is not None and b else None,
            "bound": bound,
        }
        for (axis, _, bound), (a, b) in ((spec, values[spec[0]]) for spec in NVITOP_AXES)
    }
    result["loadavg_at_end"] = loadavg()
    return result


def compare_nvitop(scrapes: int, nvitop_scrapes: int, idle_seconds: float, runs: int = 3) -> dict:
    """``runs`` side-by-side runs; an axis holds when its ratio is under its bound in every run."""
    result: dict = {"ran": False, "scrapes": scrapes, "nvitop_scrapes": nvitop_scrapes, "runs": []}
    try:
        python = ensure_nvitop_venv()
        result["versions"] = nvitop_version(python)
        for i in range(max(1, runs)):
            log(
                f"[5/5] nvitop-exporter side by side, run {i + 1} of {runs} "
                f"({scrapes} scrapes of gpumeter, {nvitop_scrapes} of nvitop-exporter)"
            )
            result["runs"].append(compare_run(python, scrapes, nvitop_scrapes, idle_seconds))
        result["ran"] = True
    except Exception as exc:  # report why, finish the rest of the benchmark
        result["error"] = f"{type(exc).__name__}: {exc}"
        stats = read_stats(BENCH_DIR / "nvitop-stats.json")
        result["missing_functions"] = stats.get("missing", {})
        with contextlib.suppress(OSError):
            result["stderr_tail"] = "\n".join(
                (BENCH_DIR / "nvitop-exporter.log").read_text(errors="replace").splitlines()[-25:]
            )
    return result


def nvitop_rows(n: dict) -> list[tuple[str, str, str, str]]:
    """One row per axis: gpumeter/nvitop-exporter in each run; PASS when every run is under the bound."""
    rows = []
    for axis, label, bound in NVITOP_AXES:
        runs = [r["axes"][axis] for r in n["runs"]]
        ratios = [r["ratio"] for r in runs]
        unit = " MiB" if axis == "rss" else " ms"
        value = "; ".join(
            f"{fmt(r['gpumeter'], unit)} / {fmt(r['nvitop'], unit)} = {fmt(r['ratio'])}×" for r in runs
        )
        ok = all(
            r is not None and r < bound if axis == "rss" else r is not None and r <= bound for r in ratios
        )
        target = f"< {bound:g}× nvitop" if axis == "rss" else f"≤ {bound:g}× nvitop"
        rows.append((f"vs nvitop-exporter: {label}", value, target, verdict(ok)))
    flat = [r["gpumeter"]["scrapes"]["rss_max_deviation_ratio"] for r in n["runs"]]
    rows.append(
        (
            "vs nvitop-exporter: gpumeter RSS max deviation in each run",
            "; ".join(fmt(v * 100, " %", 1) for v in flat),
            f"±{TARGET_RSS_FLAT * 100:.0f} %",
            verdict(all(v <= TARGET_RSS_FLAT for v in flat)),
        )
    )
    return rows


# --- 50 concurrent scrapers (docs/security.md) --------------------------------------------------
CONCURRENT_CLIENTS = 50
DEFAULT_INTERVAL = ExporterConfig().interval  # what a deployed exporter samples at unless told otherwise
_WRK_UNITS = {"us": 0.001, "ms": 1.0, "s": 1000.0}


def _wrk_ms(text: str) -> float:
    number, unit = re.fullmatch(r"([\d.]+)(us|ms|s)", text).groups()
    return float(number) * _WRK_UNITS[unit]


def parse_wrk(output: str) -> dict:
    """wrk --latency's report: percentiles, requests, and every error it counts."""
    percentiles = {
        f"p{q}_ms": _wrk_ms(value) for q, value in re.findall(r"^\s+(\d+)%\s+(\S+)$", output, re.MULTILINE)
    }
    requests = re.search(r"(\d+) requests in ([\d.]+)(\w+)", output)
    sockets = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", output)
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", output)
    errors = (
        dict(zip(("connect", "read", "write", "timeout"), map(int, sockets.groups()), strict=True))
        if sockets
        else {}
    )
    errors["non_2xx"] = int(non2xx.group(1)) if non2xx else 0
    return {
        **percentiles,
        "requests": int(requests.group(1)) if requests else 0,
        "requests_per_second": float(re.search(r"Requests/sec:\s+([\d.]+)", output).group(1)),
        "errors": errors,
        "error_count": sum(errors.values()),
    }


def measure_concurrent_scrapes(
    seconds: float, clients: int = CONCURRENT_CLIENTS, interval: float = 1
) -> dict:
    """wrk with ``clients`` connections for ``seconds`` against ``gpumeter exporter --simulate
    h100-mig`` in its own process, asking as Prometheus does (OpenMetrics, gzip). wrk is closed-loop:
    each connection sends its next scrape when the last is answered, so this is the exporter at
    saturation, and latency is about ``clients`` / throughput. ``interval`` 3600 keeps the sampler (and
    the re-render after each cycle) out of the run: the reference for what sampling adds to the tail."""
    wrk = shutil.which("wrk")
    if wrk is None:
        return {"ran": False, "error": "wrk is not installed (make tools installs the Debian package)"}
    process = gpumeter_exporter("gpumeter-exporter-concurrent", interval=interval)
    try:
        time.sleep(2)
        argv = [wrk, "-t2", f"-c{clients}", f"-d{seconds:.0f}s", "--latency", "--timeout", "5s"]
        argv += ["-H", f"Accept: {ACCEPT_OPENMETRICS}", "-H", "Accept-Encoding: gzip", process.url]
        cpu0 = cpu_seconds(process.pid)
        done = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 60)
        cpu = cpu_seconds(process.pid) - cpu0
    finally:
        process.stop()
    if done.returncode != 0:
        return {"ran": False, "error": f"wrk exited {done.returncode}: {done.stderr.strip()[-300:]}"}
    result = {
        "ran": True,
        "clients": clients,
        "interval": interval,
        "loadavg": loadavg(),
        "seconds": seconds,
        "wrk": done.stdout,
        **parse_wrk(done.stdout),
    }
    result["exporter_cpu_ms_per_request"] = round(cpu * 1000 / max(1, result["requests"]), 3)
    return result


# --- the report ---------------------------------------------------------------------------------
def fmt(value, unit: str = "", digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "—"
    if isinstance(value, float):
        return f"{value:.{digits}f}{unit}"
    return f"{value}{unit}"


def table(rows: list[tuple[str, str, str, str]]) -> str:
    header = ("measure", "value", "target", "verdict")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(4)]
    line = "  ".join("-" * w for w in widths)
    out = ["  ".join(str(h).ljust(w) for h, w in zip(header, widths, strict=True)), line]
    out += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(out)


def ratio(a, b) -> str:
    try:
        return f"{a / b:.2f}×"
    except (TypeError, ZeroDivisionError):
        return "—"


def concurrent_row(run: dict, variant: str = "") -> tuple[str, str, str, str]:
    """The verdict row: for the runs with sampling, the worst of them (every run must meet the target)."""
    name = (
        f"{CONCURRENT_CLIENTS} concurrent scrapers p99, errors "
        f"(wrk, subprocess, sampling every {run.get('interval', DEFAULT_INTERVAL):g} s)"
    )
    if variant:
        name = f"{CONCURRENT_CLIENTS} concurrent scrapers, sampling {variant} (reference)"
    if not run.get("ran"):
        return (name, "—", f"< {TARGET_RENDER_P99_MS:.0f} ms, 0 errors", run.get("error", "not run"))
    ok = run["p99_ms"] < TARGET_RENDER_P99_MS and run["error_count"] == 0
    value = f"{fmt(run['p99_ms'])} ms, {run['error_count']} errors ({run['requests_per_second']:.0f} req/s)"
    if run.get("p99_runs_ms") and len(run["p99_runs_ms"]) > 1:
        value += "; each run: " + ", ".join(
            f"{fmt(v)} ms/{e} errors" for v, e in zip(run["p99_runs_ms"], run["errors_runs"], strict=True)
        )
    return (name, value, f"< {TARGET_RENDER_P99_MS:.0f} ms, 0 errors", "" if variant else verdict(ok))


def concurrent_step(report: dict, args) -> None:
    """Step 3b: ``--concurrent-runs`` wrk runs with the exporter sampling at its default interval (the
    verdict is the worst run), then two references, each with the load average it ran under: sampling
    every second (five times the default: each cycle's render holds the GIL for ~10 ms, and at 1 s that
    is what the tail is made of) and sampling paused (the server alone)."""
    runs = []
    for i in range(max(1, args.concurrent_runs)):
        log(
            f"[3b/5] {CONCURRENT_CLIENTS} concurrent scrapers (wrk, {args.concurrent_seconds:.0f} s, "
            f"sampling every {DEFAULT_INTERVAL:g} s), run {i + 1}"
        )
        runs.append(measure_concurrent_scrapes(args.concurrent_seconds, interval=DEFAULT_INTERVAL))
    log(f"[3b/5] {CONCURRENT_CLIENTS} concurrent scrapers, sampling every 1 s")
    report["concurrent_every_second"] = measure_concurrent_scrapes(args.concurrent_seconds, interval=1)
    log(f"[3b/5] {CONCURRENT_CLIENTS} concurrent scrapers, sampling paused (--interval 3600)")
    report["concurrent_paused"] = measure_concurrent_scrapes(args.concurrent_seconds, interval=3600)
    report["concurrent_runs"] = runs
    ran = [r for r in runs if r.get("ran")]
    worst = dict(max(ran, key=lambda r: r["p99_ms"])) if ran else runs[0]
    if ran:
        worst["error_count"] = sum(r["error_count"] for r in ran)
        worst["p99_runs_ms"] = [r["p99_ms"] for r in ran]
        worst["errors_runs"] = [r["error_count"] for r in ran]
    report["concurrent"] = worst


def processes_step(report: dict, args) -> None:
    """4b: step 4 with the processes collector on: NVML's process lists of every GPU, each process's
    /proc/<pid>/cgroup (the simulator's) and the node's pods from the stand-in Kubernetes API (in this
    process, on loopback; the exporter lists them on its own thread). In process the node is
    KUBELET_OFFSET_S into its schedule (all 56 pods run); the subprocess starts at its schedule's 0 h."""
    log("[4b/5] with per-process collection (56 pods in process, stand-in Kubernetes API)")
    fleet = load_fleet(FLEET)
    sockdir = tempfile.mkdtemp(prefix="gpm-bench-", dir="/tmp")
    sock = os.path.join(sockdir, "kubelet.sock")
    kubelet = KubeletProcess(sock)
    api = StandInKubeApi(fleet, start=time.time() - KUBELET_OFFSET_S).start()
    try:
        sim = InProcess(kubelet_socket=sock, kube_api=api.base_url, offset_s=KUBELET_OFFSET_S)
        try:
            deadline = time.monotonic() + 10
            while not sim.exporter.pod_list.snapshot().up and time.monotonic() < deadline:
                time.sleep(0.05)
            cycle = measure_cycles(sim, max(20, args.cycles // 2))
            snapshot = sim.sampler.snapshot()
            memory_series = snapshot.samples("nvidia_gpu_process_memory_used_bytes")
            attributed = sum(1 for labels, _ in memory_series if labels[4])
            render = measure_render(sim, max(50, args.render // 3))
        finally:
            sim.close()
        process = gpumeter_exporter(
            "gpumeter-exporter-processes",
            kubelet_socket=sock,
            extra=("--enable-collectors", "processes", "--kube-api", api.base_url),
        )
        try:
            time.sleep(2)
            run = scrape_run(process, args.scrapes, max(1, args.scrapes // 10))
            text = run.pop("last_text")
            run["series"] = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
            run["process_memory_series"] = count_series(text, "nvidia_gpu_process_memory_used_bytes")
        finally:
            process.stop()
        report["processes"] = {
            "process_memory_series_inprocess": len(memory_series),
            "attributed_to_pods_inprocess": attributed,
            "cycle": cycle,
            "render": render,
            "memory": run,
        }
    finally:
        api.stop()
        kubelet.stop()
        shutil.rmtree(sockdir, ignore_errors=True)


def processes_rows(p: dict) -> list[tuple[str, str, str, str]]:
    c, r, m = p["cycle"], p["render"], p["memory"]
    return [
        ("processes: NVML calls / cycle (steady)", fmt(c["nvml_calls_steady"]), "counted, minimised", "n/a"),
        (
            "processes: CPU / cycle p99",
            fmt(c["cpu_all"]["p99_ms"], " ms"),
            f"< {TARGET_CYCLE_CPU_MS:.0f} ms",
            verdict(c["cpu_all"]["p99_ms"] < TARGET_CYCLE_CPU_MS),
        ),
        (
            "processes: scrape p99 (exporter in its own process)",
            fmt(m["latency"]["p99_ms"], " ms"),
            "< 10 ms",
            verdict(m["latency"]["p99_ms"] < 10),
        ),
        (
            "processes: pre-render per snapshot p99 (sampler thread)",
            fmt(r["exposition_cache_miss_gzip"]["p99_ms"], " ms"),
            "not on the scrape path",
            "",
        ),
        (
            f"processes: RSS max over {m['scrapes']} scrapes",
            fmt(m["rss_max_mib"], " MiB"),
            f"< {TARGET_RSS_MIB:.0f} MiB, flat",
            verdict(m["under_target"] and m["flat"]),
        ),
        (
            "processes: series (attributed / in process)",
            f"{p['attributed_to_pods_inprocess']} / {p['process_memory_series_inprocess']}",
            "",
            "",
        ),
    ]


def print_imports(imports: dict) -> None:
    if "error" in imports:
        print(f"import costs: the probe failed: {imports['error']}")
        return
    print(
        f"Resident memory of the imports alone (MiB; interpreter {imports['interpreter_mib']}; each step on "
        "top of the ones above it, so a module shared by two is counted at the first):"
    )
    for step in imports["base"]:
        print(f"  {step['mib']:+6.1f}  {step['step']}  ({step['modules']})")
    print(
        f"  = {imports['base_total_mib']:.1f} MiB for `gpumeter exporter --simulate {FLEET} --kubelet-socket ''`"
    )
    print("  loaded only when configured, each on top of that:")
    for step in imports["optional"]:
        print(f"  {step['mib']:+6.1f}  {step['step']}  ({step['modules']})")
    print(
        f"  never loaded by the exporter: {', '.join(imports['absent']) or '—'}; loaded though: "
        f"{', '.join(imports['unexpected']) or 'nothing'}"
    )


def print_nvitop(n: dict, imports: dict, cycle: dict | None = None) -> None:
    print()
    if imports:
        print_imports(imports)
        print()
    if not n.get("ran"):
        print(f"nvitop-exporter comparison did not run: {n.get('error')}")
        if n.get("missing_functions"):
            print(
                "  NVML functions it asked for that the stand-in lacks:",
                ", ".join(sorted(n["missing_functions"])),
            )
        if n.get("stderr_tail"):
            print("  last output:\n    " + n["stderr_tail"].replace("\n", "\n    "))
        return
    print(
        f"{n.get('versions', 'nvitop-exporter')}: {len(n['runs'])} side-by-side runs over the same stand-in "
        f"node and library (each call charged the driver's CPU), interval 1 s, {n['scrapes']} scrapes of "
        f"gpumeter and {n['nvitop_scrapes']} of nvitop-exporter; gpumeter / nvitop-exporter = ratio:"
    )
    print(table(nvitop_rows(n)))
    for i, run in enumerate(n["runs"], 1):
        print(f"  run {i}: load average {run['loadavg_at_start']} at start, {run['loadavg_at_end']} at end")
    theirs = n["runs"][-1]["nvitop"]
    ours = n["runs"][-1]["gpumeter"]
    print(f"  last run in detail{' (gpumeter NVML calls per cycle from step 1)' if cycle else ''}:")
    cmp_rows = [
        ("scrape p50", ours["scrapes"]["latency"]["p50_ms"], theirs["scrapes"]["latency"]["p50_ms"], " ms"),
        (
            "CPU per scrape",
            ours["scrapes"]["process_cpu_ms_per_scrape"],
            theirs["scrapes"]["process_cpu_ms_per_scrape"],
            " ms",
        ),
        (
            "RSS peak (VmHWM)",
            ours["scrapes"]["rss_peak_vmhwm_mib"],
            theirs["scrapes"]["rss_peak_vmhwm_mib"],
            " MiB",
        ),
        (
            "NVML calls per cycle",
            cycle["nvml_calls_steady"] if cycle else None,
            theirs["nvml_calls_per_cycle"],
            "",
        ),
        ("  + missing-function lookups", 0, theirs["missing_function_lookups_per_cycle"], ""),
        ("body bytes (gzip)", ours["scrapes"]["body_bytes_gzip"], theirs["scrapes"]["body_bytes_gzip"], ""),
    ]
    width = max(len(row[0]) for row in cmp_rows)
    print(f"    {'':{width}}  {'gpumeter':>12}  {'nvitop':>12}  gpumeter/nvitop")
    for label, a, b, unit in cmp_rows:
        print(f"    {label:{width}}  {fmt(a, unit):>12}  {fmt(b, unit):>12}  {ratio(a, b)}")
    print(
        f"    nvitop cycle thread CPU p50/p99: {theirs['cycle_thread_cpu'].get('p50_ms')}/"
        f"{theirs['cycle_thread_cpu'].get('p99_ms')} ms; its stand-in: {theirs.get('simulator')}"
    )
    if theirs["missing_functions"]:
        print(
            "    NVML functions nvitop asked for that the stand-in lacks (NVMLError_FunctionNotFound, "
            "tolerated): " + ", ".join(sorted(theirs["missing_functions"]))
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--scrapes", type=int, default=10_000, help="scrapes for the memory runs")
    parser.add_argument("--cycles", type=int, default=200, help="sampling cycles measured")
    parser.add_argument("--render", type=int, default=300, help="uncached renders measured")
    parser.add_argument("--http", type=int, default=2000, help="in-process HTTP scrapes measured")
    parser.add_argument("--every", type=int, default=10, help="in-process HTTP: new snapshot every N scrapes")
    parser.add_argument(
        "--nvitop-scrapes", type=int, default=500, help="scrapes of nvitop-exporter in a side-by-side run"
    )
    parser.add_argument("--nvitop-runs", type=int, default=3, help="side-by-side runs")
    parser.add_argument(
        "--only-nvitop", action="store_true", help="run step 5 alone: the ratios to nvitop-exporter"
    )
    parser.add_argument("--idle", type=float, default=10.0, help="seconds of idle CPU measurement")
    parser.add_argument("--skip-nvitop", action="store_true")
    parser.add_argument("--concurrent-seconds", type=float, default=20.0, help="the 50-client wrk run")
    parser.add_argument(
        "--concurrent-runs", type=int, default=3, help="50-client runs with sampling every 1 s"
    )
    parser.add_argument(
        "--only-concurrent",
        action="store_true",
        help="run step 3b alone (repeat it when the machine is quiet)",
    )
    parser.add_argument(
        "--only-processes",
        action="store_true",
        help="run step 4b alone: per-process collection on (docs/pod-attribution.md §9)",
    )
    parser.add_argument("--out", default=str(BENCH_DIR / "exporter.json"))
    args = parser.parse_args(argv)

    BENCH_DIR.mkdir(exist_ok=True)
    started = time.perf_counter()
    report: dict = {"machine": machine(), "fleet": FLEET, "args": vars(args)}
    log(f"gpumeter exporter benchmark on {report['machine']['cpu_model']} ×{report['machine']['nproc']}")

    if args.only_processes:
        processes_step(report, args)
        report["bench_seconds"] = round(time.perf_counter() - started, 1)
        report["machine"]["loadavg_at_end"] = loadavg()
        print(table(processes_rows(report["processes"])))
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=2, default=str) + "\n")
        return 0

    if args.only_nvitop:
        report["nvitop"] = compare_nvitop(args.scrapes, args.nvitop_scrapes, args.idle, args.nvitop_runs)
        report["bench_seconds"] = round(time.perf_counter() - started, 1)
        report["machine"]["loadavg_at_end"] = loadavg()
        print_nvitop(report["nvitop"], report["memory"]["imports"] if "memory" in report else import_probe())
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=2, default=str) + "\n")
        return 0

    if args.only_concurrent:
        concurrent_step(report, args)
        report["bench_seconds"] = round(time.perf_counter() - started, 1)
        report["machine"]["loadavg_at_end"] = loadavg()
        print(
            table(
                [
                    concurrent_row(report["concurrent"]),
                    concurrent_row(report["concurrent_every_second"], "every 1 s"),
                    concurrent_row(report["concurrent_paused"], "paused"),
                ]
            )
        )
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=2, default=str) + "\n")
        return 0

    # 1 + 2: in process, manual clock
    log(f"[1/5] {args.cycles} sampling cycles (manual clock, +5 s per cycle)")
    sim = InProcess()
    try:
        report["cycle"] = measure_cycles(sim, args.cycles)
        log("[1b/5] sampling cycles at the driver's per-call cost (simulator/latency.py)")
        report["driver_cost"] = {
            f"{fleet}/{every}": measure_cycles_at_driver_cost(
                fleet, max(30, args.cycles // 10), counter_interval=every
            )
            for fleet in DRIVER_COST_FLEETS
            for every in (ExporterConfig.counter_interval, 0.0)
        }
        log(f"[2/5] {args.render} uncached renders, {args.http} in-process HTTP scrapes")
        gc.collect()
        report["render"] = measure_render(sim, args.render)
    finally:
        sim.close()
    sim = InProcess(interval=3600.0)  # the sampler thread stays idle; the benchmark makes snapshots
    try:
        report["http_inprocess"] = measure_http_inprocess(sim, args.http, args.every)
    finally:
        sim.close()

    # 3: subprocess, no pods
    log(f"[3/5] subprocess exporter, {args.scrapes} scrapes, RSS every {max(1, args.scrapes // 10)}")
    process = gpumeter_exporter("gpumeter-exporter")
    try:
        time.sleep(2)
        run = scrape_run(process, args.scrapes, max(1, args.scrapes // 10))
        run["series"] = sum(
            1 for line in run.pop("last_text").splitlines() if line and not line.startswith("#")
        )
        report["memory"] = run
    finally:
        process.stop()

    report["memory"]["imports"] = import_probe()

    concurrent_step(report, args)

    # 4: with the stand-in kubelet and 56 pods
    log("[4/5] with the stand-in kubelet (56 pods)")
    sockdir = tempfile.mkdtemp(prefix="gpm-bench-", dir="/tmp")
    sock = os.path.join(sockdir, "kubelet.sock")
    # The stand-in kubelet runs in its own process, as the kubelet does on a node: in the benchmark's
    # process its gRPC server's threads were counted in the exporter's CPU per cycle.
    kubelet = KubeletProcess(sock)
    try:
        sim = InProcess(kubelet_socket=sock)
        try:
            pods_cycle = measure_cycles(sim, max(20, args.cycles // 2))
            pods_render = measure_render(sim, max(50, args.render // 3))
            allocations = len(sim.sampler.snapshot().samples("nvidia_gpu_allocation"))
        finally:
            sim.close()
        process = gpumeter_exporter("gpumeter-exporter-pods", kubelet_socket=sock)
        try:
            time.sleep(2)
            run = scrape_run(process, args.scrapes, max(1, args.scrapes // 10))
            text = run.pop("last_text")
            run["series"] = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
            run["allocation_series"] = count_series(text, "nvidia_gpu_allocation")
            run["kubelet_up"] = "gpumeter_exporter_kubelet_up 1.0" in text
        finally:
            process.stop()
        report["pods"] = {
            "kubelet_offset_hours": KUBELET_OFFSET_S / 3600,
            "allocation_series_inprocess": allocations,
            "cycle": pods_cycle,
            "render": pods_render,
            "memory": run,
        }
    finally:
        kubelet.stop()
        shutil.rmtree(sockdir, ignore_errors=True)

    processes_step(report, args)

    # 5: nvitop-exporter side by side
    if args.skip_nvitop:
        report["nvitop"] = {"ran": False, "error": "skipped (--skip-nvitop)"}
    else:
        report["nvitop"] = compare_nvitop(args.scrapes, args.nvitop_scrapes, args.idle, args.nvitop_runs)
    report["bench_seconds"] = round(time.perf_counter() - started, 1)
    report["machine"]["loadavg_at_end"] = loadavg()

    # --- print --------------------------------------------------------------------------------
    c, r, h, m, p = (
        report["cycle"],
        report["render"],
        report["http_inprocess"],
        report["memory"],
        report["pods"],
    )
    rows = [
        ("NVML calls / cycle (steady state)", fmt(c["nvml_calls_steady"]), "counted, minimised", "n/a"),
        (
            f"NVML calls / rediscovery cycle (every {c['rediscover_every_seconds']:.0f} s)",
            fmt(c["nvml_calls_rediscovery_cycle"]),
            "",
            "",
        ),
        (
            "CPU / cycle p50 (process_time)",
            fmt(c["cpu_all"]["p50_ms"], " ms"),
            f"< {TARGET_CYCLE_CPU_MS:.0f} ms",
            verdict(c["cpu_all"]["p50_ms"] < TARGET_CYCLE_CPU_MS),
        ),
        (
            "CPU / cycle p99 (process_time)",
            fmt(c["cpu_all"]["p99_ms"], " ms"),
            f"< {TARGET_CYCLE_CPU_MS:.0f} ms",
            verdict(c["cpu_all"]["p99_ms"] < TARGET_CYCLE_CPU_MS),
        ),
        ("wall / rediscovery cycle max", fmt(c["wall_rediscovery"].get("max_ms"), " ms"), "", ""),
        *(
            (
                f"wall / cycle p50/p99 at driver cost ({d['fleet']}, driver {d['driver']}, "
                f"counters every {d['counter_interval']:g} s)",
                f"{fmt(d['wall']['p50_ms'])}/{fmt(d['wall']['p99_ms'])} ms",
                f"CPU p50/p99/mean {fmt(d['cpu']['p50_ms'])}/{fmt(d['cpu']['p99_ms'])}/{fmt(d['cpu']['mean_ms'])} ms",
                "",
            )
            for d in report["driver_cost"].values()
        ),
        (
            "pre-render per snapshot p50/p99 (OpenMetrics + gzip, exposition cache)",
            f"{fmt(r['exposition_cache_miss_gzip']['p50_ms'])}/{fmt(r['exposition_cache_miss_gzip']['p99_ms'])} ms",
            "once per snapshot, in the sampler thread (holds the GIL)",
            "",
        ),
        (
            "the same by prometheus-client, p50/p99 (text; OpenMetrics)",
            f"{fmt(r['generate_latest_text']['p50_ms'])}/{fmt(r['generate_latest_text']['p99_ms'])}; "
            f"{fmt(r['generate_latest_openmetrics']['p50_ms'])}/{fmt(r['generate_latest_openmetrics']['p99_ms'])} ms",
            "reference: the bytes the exposition cache must equal",
            "",
        ),
        ("render cache hit p99", fmt(r["exposition_cache_hit"]["p99_ms"], " ms", 4), "", ""),
        ("HTTP scrape p50 (in-process, all)", fmt(h["all"]["p50_ms"], " ms"), "", ""),
        (
            "HTTP scrape p99 (client inside the exporter process)",
            fmt(h["all"]["p99_ms"], " ms"),
            "client shares the GIL: the subprocess row is the scrape",
            "",
        ),
        (
            "HTTP scrape p99 (same, snapshot not pre-rendered)",
            fmt(h["cache_miss"]["p99_ms"], " ms"),
            "client shares the GIL: the subprocess row is the scrape",
            "",
        ),
        ("HTTP scrape p99 (in-process, cache hit)", fmt(h["cache_hit"]["p99_ms"], " ms"), "", ""),
        (
            f"HTTP scrape p50/p99 (subprocess, {m['scrapes']})",
            f"{fmt(m['latency']['p50_ms'])}/{fmt(m['latency']['p99_ms'])} ms",
            f"< {TARGET_RENDER_P99_MS:.0f} ms",
            verdict(m["latency"]["p99_ms"] < TARGET_RENDER_P99_MS),
        ),
        (
            f"RSS after {m['scrapes']} scrapes",
            fmt(m["rss_final_mib"], " MiB", 1),
            f"< {TARGET_RSS_MIB:.0f} MiB",
            verdict(m["under_target"]),
        ),
        (
            "RSS max deviation (from 1st sample)",
            fmt(m["rss_max_deviation_ratio"] * 100, " %", 1),
            f"±{TARGET_RSS_FLAT * 100:.0f} %",
            verdict(m["flat"]),
        ),
        concurrent_row(report["concurrent"]),
        concurrent_row(report["concurrent_every_second"], "every 1 s"),
        concurrent_row(report["concurrent_paused"], "paused"),
        (
            "pods: allocation series",
            fmt(p["memory"]["allocation_series"]),
            "56",
            verdict(p["memory"]["allocation_series"] == 56),
        ),
        (
            "pods: CPU / cycle p99 (kubelet in its own process)",
            fmt(p["cycle"]["cpu_all"]["p99_ms"], " ms"),
            f"< {TARGET_CYCLE_CPU_MS:.0f} ms",
            verdict(p["cycle"]["cpu_all"]["p99_ms"] < TARGET_CYCLE_CPU_MS),
        ),
        (
            "pods: pre-render per snapshot p99 (OpenMetrics + gzip, exposition cache)",
            fmt(p["render"]["exposition_cache_miss_gzip"]["p99_ms"], " ms"),
            "once per snapshot, in the sampler thread",
            "",
        ),
        (
            "pods: HTTP scrape p99 (subprocess)",
            fmt(p["memory"]["latency"]["p99_ms"], " ms"),
            f"< {TARGET_RENDER_P99_MS:.0f} ms",
            verdict(p["memory"]["latency"]["p99_ms"] < TARGET_RENDER_P99_MS),
        ),
        (
            f"pods: RSS after {p['memory']['scrapes']} scrapes",
            fmt(p["memory"]["rss_final_mib"], " MiB", 1),
            f"< {TARGET_RSS_MIB:.0f} MiB",
            verdict(p["memory"]["under_target"]),
        ),
        (
            "pods: RSS max deviation",
            fmt(p["memory"]["rss_max_deviation_ratio"] * 100, " %", 1),
            f"±{TARGET_RSS_FLAT * 100:.0f} %",
            verdict(p["memory"]["flat"]),
        ),
    ]
    print()
    print(
        f"gpumeter exporter — {FLEET}: 8×H100, 56 MIG 1g.10gb; {r['series']} series, "
        f"{r['bytes_text'] / 1024:.0f} KiB text, {r['bytes_gzip'] / 1024:.0f} KiB gzip"
    )
    print(table(rows))
    print()
    print("NVML calls per steady-state cycle, by C function:")
    for name, count in c["nvml_calls_by_function_steady"].items():
        print(f"  {count:5d}  {name}")
    print(f"  (the exporter's own gpumeter_exporter_nvml_calls says {c['nvml_calls_self_reported_steady']})")
    if c["nvml_calls_by_function_rediscovery_extra"]:
        extra = ", ".join(f"{k} {v}" for k, v in c["nvml_calls_by_function_rediscovery_extra"].items())
        print(f"  rediscovery cycle adds: {extra}")
    print()
    print("RSS (MiB) every", max(1, args.scrapes // 10), "scrapes:")
    print("  no pods:  ", " ".join(f"{s['rss_mib']:.1f}" for s in m["rss_samples"]))
    print("  56 pods:  ", " ".join(f"{s['rss_mib']:.1f}" for s in p["memory"]["rss_samples"]))
    imports = m.get("imports", {})

    print()
    print(
        f"Garbage collector while measuring (in process): {c['gc']['collections']} collections in "
        f"{c['cycles']} cycles, {c['gc']['gen2_collections']} full (longest {c['gc']['max_gen2_pause_ms']} ms); "
        f"{r['gc']['collections']} in {r['iterations']} renders, {r['gc']['gen2_collections']} full "
        f"(longest {r['gc']['max_gen2_pause_ms']} ms)"
    )

    print_nvitop(report["nvitop"], imports, c)
    print()
    print(
        f"bench took {report['bench_seconds']:.0f} s on {report['machine']['nproc']} CPUs "
        f"(load average {report['machine']['loadavg_at_start']} at start, "
        f"{report['machine']['loadavg_at_end']} at end); JSON: {args.out}"
    )

    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
