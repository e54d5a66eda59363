"""Where the exporter's CPU goes, by thread: the exporter in this process at its default 5 s interval,
unscraped, and each thread's CPU seconds read from /proc/self/task/<tid>/stat over a window.
``threads.py OUT SECONDS [FLEET]``: on a GPU node with real NVML; with FLEET, on the stand-in."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def cpu(tid: int) -> float:
    fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def main(out: Path, seconds: float, fleet: str | None) -> int:
    from gpumeter.exporter.app import build_exporter
    from gpumeter.exporter.config import ExporterConfig

    config = ExporterConfig(listen="127.0.0.1:9835", kubelet_socket=None, simulate=fleet, hostname="x")
    exporter = build_exporter(config).start()
    time.sleep(6)
    threads = {t.native_id: t.name for t in threading.enumerate() if t.native_id}
    before = {tid: cpu(tid) for tid in threads}
    whole = time.process_time()
    time.sleep(seconds)
    after = {tid: cpu(tid) for tid in threads}
    whole = time.process_time() - whole
    cycles = seconds / config.interval
    result = {
        "fleet": fleet or "real NVML",
        "seconds": seconds,
        "process_cpu_ms_per_cycle": round(whole / cycles * 1e3, 2),
        "threads_cpu_ms_per_cycle": {
            f"{name} ({tid})": round((after[tid] - before[tid]) / cycles * 1e3, 2)
            for tid, name in threads.items()
        },
    }
    exporter.stop()
    (out / ("threads-" + (fleet or "real") + ".json")).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), float(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else None))
