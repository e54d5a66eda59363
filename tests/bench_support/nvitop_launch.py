"""Run nvitop-exporter over gpumeter's stand-in NVML library (for ``python -m tests.bench``).

Runs INSIDE nvitop-exporter's own virtual env (``.bench/nvitop-venv``), never gpumeter's:

    .bench/nvitop-venv/bin/python tests/bench_support/nvitop_launch.py \\
        --gpumeter-site .bench/gpumeter-site --fleet h100-mig --stats /tmp/stats.json -- \\
        --bind-address 127.0.0.1 --port 9999 --interval 1 --hostname bench

``--gpumeter-site`` is a folder holding only the installed gpumeter distribution's top-level entries
(the package, or an editable install's ``.pth`` and finder), made by ``tests.bench`` from the
interpreter it measures gpumeter with: the stand-in is the installed package's, never the checkout's
(whose root has no ``gpumeter.exporter``: the parts install under ``gpumeter`` from their own
folders). It is added *after* nvitop's own site-packages, so nvitop-exporter keeps its own
prometheus-client and nvidia-ml-py. Only ``gpumeter.simulator`` is imported from it (the
fleet file, the simulated node and the stand-in library). The launcher then points pynvml's library
object at the stand-in *before* nvitop initialises NVML, and runs nvitop-exporter's own ``main()``
with the arguments after ``--``. Nothing of nvitop-exporter is changed except that its collection loop is
wrapped so the benchmark can count cycles and their CPU time (the loop body is nvitop-exporter's own).

Every second (and on SIGTERM) it writes ``--stats``: the stand-in's call counter, the C functions
nvitop asked for that the stand-in lacks (pynvml turns those into NVMLError_FunctionNotFound), and
per-cycle CPU times.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import site
import sys
import threading
import time
from collections import Counter


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--gpumeter-site", required=True, help="folder with the installed gpumeter's top-level entries"
    )
    parser.add_argument("--fleet", default="h100-mig")
    parser.add_argument("--stats", required=True, help="JSON file the launcher keeps up to date")
    parser.add_argument(
        "--driver-cost",
        action="store_true",
        help="charge each call the driver's measured cost, as gpumeter's exporter is charged (simulator/latency.py)",
    )
    parser.add_argument("rest", nargs=argparse.REMAINDER, help="-- then nvitop-exporter's arguments")
    args = parser.parse_args()
    exporter_args = args.rest[1:] if args.rest[:1] == ["--"] else args.rest

    site.addsitedir(os.path.abspath(args.gpumeter_site))  # appended, and its .pth files run
    import pynvml

    import gpumeter.simulator
    from gpumeter.simulator.device import SimulatedNode
    from gpumeter.simulator.fleet import load_fleet
    from gpumeter.simulator.latency import CALL_LATENCY_S
    from gpumeter.simulator.nvml import SimulatedNvml

    missing: Counter[str] = Counter()

    class RecordingNvml(SimulatedNvml):
        """The stand-in, recording every C symbol asked for that it does not implement."""

        def __getattr__(self, name: str):
            try:
                return super().__getattr__(name)
            except AttributeError:
                if not name.startswith("_"):
                    missing[name] += 1
                raise

    node = SimulatedNode(load_fleet(args.fleet), clock=time.time)
    lib = RecordingNvml(node, latency=CALL_LATENCY_S if args.driver_cost else None)
    with pynvml.libLoadLock:
        pynvml.nvmlLib = lib
        pynvml._nvmlGetFunctionPointer_cache = {}

    # Only now import nvitop: NVML is initialised lazily on its first query, against ``lib``.
    from nvitop_exporter import cli
    from nvitop_exporter.exporter import PrometheusExporter

    cycles: list[float] = []  # thread CPU seconds per collection cycle

    def collect(self) -> None:  # nvitop-exporter's PrometheusExporter.collect, instrumented
        while True:
            next_update_time = time.monotonic() + self.interval
            started = time.thread_time()
            self.update_host()
            for device in self.devices:
                self.update_device(device)
            cycles.append(time.thread_time() - started)
            time.sleep(max(0.0, next_update_time - time.monotonic()))

    PrometheusExporter.collect = collect

    lock = threading.Lock()

    def write_stats() -> None:
        with lock:
            data = {
                "pid": os.getpid(),
                "simulator": gpumeter.simulator.__file__,
                "calls": dict(lib.calls),
                "missing": dict(missing),
                "cycle_cpu_seconds": list(cycles),
                "time": time.time(),
            }
            tmp = args.stats + ".tmp"
            with open(tmp, "w") as fh:
                json.dump(data, fh)
            os.replace(tmp, args.stats)

    def keep_writing() -> None:
        while True:
            time.sleep(1.0)
            try:
                write_stats()
            except Exception as exc:  # the benchmark reads what it can
                print(f"nvitop_launch: cannot write stats: {exc}", file=sys.stderr)

    def on_term(*_):
        write_stats()
        os._exit(0)

    signal.signal(signal.SIGTERM, on_term)
    threading.Thread(target=keep_writing, daemon=True).start()
    sys.argv = ["nvitop-exporter", *exporter_args]
    try:
        code = cli.main()
    finally:
        write_stats()
    if code:
        print(f"nvitop_launch: nvitop-exporter's main() returned {code}", file=sys.stderr)
        if missing:
            print(f"nvitop_launch: NVML functions the stand-in lacks: {dict(missing)}", file=sys.stderr)
    return code or 0


if __name__ == "__main__":
    sys.exit(main())
