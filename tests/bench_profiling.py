"""What the profiling collectors (GPM, NVLink traffic, video engines) and dcgm naming cost on the 8xH100
MIG node: NVML calls, CPU per sampling cycle and series, with the new collectors off and on, and under
--naming dcgm (docs/performance.md, "Figures not re-measured"; the full table in its log). A measurement, not a test.

    .venv/bin/python -m tests.bench_profiling
"""

import json
import time
from pathlib import Path

from prometheus_client import generate_latest

from gpumeter.exporter.app import build_exporter
from gpumeter.exporter.config import ExporterConfig
from gpumeter.simulator.device import SimulatedNode
from gpumeter.simulator.fleet import load_fleet
from gpumeter.simulator.nvml import SimulatedNvml
from tests import bench as B

NEW_COLLECTORS = ("profiling", "nvlink_traffic", "video")
DCP_CSV = Path(__file__).parent / "data" / "dcgm-exporter" / "dcp-metrics-included.csv"


def make(**cfg):
    sim = B.InProcess.__new__(B.InProcess)
    sim.clock = B.ManualClock()
    sim.node = SimulatedNode(load_fleet(B.FLEET), clock=sim.clock)
    sim.lib = SimulatedNvml(sim.node)
    sim.exporter = build_exporter(
        ExporterConfig(listen="127.0.0.1:0", kubelet_socket=None, hostname="n", **cfg),
        clock=sim.clock,
        library=sim.lib,
        node=sim.node,
    )
    sim.sampler = sim.exporter.sampler
    return sim


def main() -> None:
    out: dict = {"loadavg": B.loadavg()}
    for name, cfg in [
        ("without new collectors", {"disable_collectors": NEW_COLLECTORS}),
        ("full", {}),
        ("dcgm naming", {"naming": "dcgm"}),
        ("dcgm naming, -f dcp-metrics-included.csv", {"naming": "dcgm", "collectors": str(DCP_CSV)}),
    ]:
        sim = make(**cfg)
        c = B.measure_cycles(sim, 100)
        spent: dict[str, float] = {}
        for _ in range(
            20
        ):  # the sampler's own per-collector timing (gpumeter_exporter_collector_duration_seconds)
            snapshot = sim.sample()
            for labels, seconds in snapshot.samples("gpumeter_exporter_collector_duration_seconds"):
                spent[labels[0]] = spent.get(labels[0], 0.0) + seconds / 20
        text = generate_latest(sim.exporter.registry).decode()
        t0 = time.process_time()
        n = 20
        for _ in range(n):
            generate_latest(sim.exporter.registry)
        render_ms = (time.process_time() - t0) / n * 1000
        # what the exporter does once per snapshot: OpenMetrics, as Prometheus negotiates it, through the
        # exposition cache (each snapshot is new, so every render writes the body; line prefixes are reused)
        exposition = sim.exporter.exposition
        exposition.render(B.ACCEPT_OPENMETRICS, False)
        cached = []
        for _ in range(n):
            sim.sample()
            t1 = time.process_time()
            exposition.render(B.ACCEPT_OPENMETRICS, False)
            cached.append(time.process_time() - t1)
        out[name] = {
            "calls": c["nvml_calls_steady"],
            "by_function": c["nvml_calls_by_function_steady"],
            "cpu_p50_ms": c["cpu_steady"]["p50_ms"],
            "cpu_p99_ms": c["cpu_steady"]["p99_ms"],
            "series": sum(1 for line in text.splitlines() if line and not line.startswith("#")),
            "render_text_cpu_ms": round(render_ms, 1),
            "render_exposition_cache_cpu_ms_p50": round(sorted(cached)[n // 2] * 1000, 1),
            "collector_ms": {k: round(v * 1000, 2) for k, v in spent.items() if k in NEW_COLLECTORS},
        }
        sim.close()
    base, full = out["without new collectors"]["by_function"], out["full"]["by_function"]
    out["calls_added"] = {
        k: full.get(k, 0) - base.get(k, 0) for k in set(full) | set(base) if full.get(k, 0) != base.get(k, 0)
    }
    for v in out.values():
        if isinstance(v, dict):
            v.pop("by_function", None)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
