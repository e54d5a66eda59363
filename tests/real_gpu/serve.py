"""The exporter as a user runs it, on a real GPU node: ``gpumeter exporter`` in its own process at the
default 5 s interval, scraped back to back; CPU seconds per sampling cycle, resident memory and scrape
latency (docs/performance.md's targets, measured here on real NVML instead of the stand-in)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")
SCRAPES = 5_000


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main(out: Path, seconds: float) -> int:
    exporter = subprocess.Popen(
        [sys.executable, "-m", "gpumeter", "exporter", "--listen", "127.0.0.1:9835", "--kubelet-socket", ""],
        stderr=subprocess.PIPE,
        text=True,
        cwd="/",
    )
    url = "http://127.0.0.1:9835/metrics"
    for _ in range(100):
        try:
            urllib.request.urlopen(url, timeout=2).read()
            break
        except OSError:
            time.sleep(0.1)
    time.sleep(6)  # past the first cycle and its render
    cpu0, started = cpu_seconds(exporter.pid), time.monotonic()
    time.sleep(seconds)  # sampling alone, unscraped: CPU per cycle
    cycle_cpu, wall = cpu_seconds(exporter.pid) - cpu0, time.monotonic() - started
    latencies = []
    for _ in range(SCRAPES):  # then scrapes back to back: latency, and memory after them
        t = time.perf_counter()
        body = urllib.request.urlopen(url, timeout=5).read()
        latencies.append(time.perf_counter() - t)
    rss = rss_mib(exporter.pid)
    exporter.send_signal(2)
    try:
        exporter.wait(timeout=10)
        stopped = f"exit {exporter.returncode}"
    except subprocess.TimeoutExpired:
        exporter.kill()
        stopped = "did not stop within 10 s of SIGINT"
    latencies.sort()
    result = {
        "interval_s": 5.0,
        "unscraped_s": round(wall, 1),
        "exporter_cpu_ms_per_cycle": round(cycle_cpu / (wall / 5.0) * 1e3, 2),
        "scrapes": len(latencies),
        "scrape_p50_ms": round(latencies[len(latencies) // 2] * 1e3, 3),
        "scrape_p99_ms": round(latencies[int(len(latencies) * 0.99)] * 1e3, 3),
        "exposition_bytes": len(body),
        "rss_mib_after_scrapes": round(rss, 1),
        "stop": stopped,
        "stderr_tail": exporter.stderr.read()[-2000:],
    }
    (out / "serve.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), float(sys.argv[2])))
