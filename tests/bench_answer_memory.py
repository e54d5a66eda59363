"""`python -m tests.bench_answer_memory [--mib 100]`: the memory one range answer costs billing, per MiB.

A loopback HTTP server answers `count_over_time(nvidia_gpu_allocation[1h])` for a day (24 steps) with
as many series as make ``--mib`` MiB of JSON (allocation labels as a live exporter writes them). A
fresh process fetches it with billing's client and reduces it to billing's columns (the same path as
`FetchedRun.answers`); its peak RSS less its RSS before the request, over the answer's MiB, is the
figure (docs/performance.md, "Memory per MiB of answer").
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

STEPS = 24
FIRST = 1_793_523_600  # 2026-11-01T01:00Z - 1 ms, as billing asks


def answer(mib: int) -> bytes:
    points = ",".join(f'[{FIRST + 3600 * i - 0.001:.3f},"120"]' for i in range(STEPS))
    parts, size, n = [], 0, 0
    head = b'{"status":"success","data":{"resultType":"matrix","result":['
    while size < mib << 20:
        metric = {
            "container": "main",
            "gpu": str(n % 8),
            "gpu_instance_id": "",
            "hostname": f"gpu-node-{n // 8:05d}",
            "mig_profile": "",
            "namespace": f"team-{n % 97}",
            "pod": f"job-{n:07d}-worker",
            "resource": "nvidia.com/gpu",
            "sharing": "exclusive",
            "uuid": f"GPU-{n:08x}-0000-0000-0000-000000000000",
        }
        part = (
            b'{"metric":'
            + json.dumps(metric, separators=(",", ":")).encode()
            + b',"values":['
            + points.encode()
            + b"]}"
        )
        parts.append(part)
        size += len(part) + 1
        n += 1
    return head + b",".join(parts) + b"]}}"


def _status(field: str) -> int:
    """A /proc/self/status figure in KiB (VmRSS now, VmHWM: the peak)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def measure(url: str) -> None:
    """In a fresh process: fetch, reduce to columns, print {rss_before, peak, bytes}."""
    from datetime import UTC, datetime

    from gpumeter.billing.ingest.columns import KEEP, QUERIES, _query_columns
    from gpumeter.billing.prom import PrometheusClient

    before = _status("VmRSS")
    with PrometheusClient(url, max_answer_bytes=4 << 30, timeout=600) as client:
        start = datetime.fromtimestamp(FIRST, UTC)
        fetched = client.fetch_range(QUERIES["alloc_count"], start, start, 3600)
        columns = _query_columns("alloc_count", fetched(), FIRST, STEPS, [{} for _ in range(STEPS)])
    peak = _status("VmHWM")  # this process image's own peak (ru_maxrss keeps the forking parent's)
    print(json.dumps({"before_kib": before, "peak_kib": peak, "series": len(columns), "keep": len(KEEP)}))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=100)
    parser.add_argument("--measure", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        measure(args.measure)
        return 0
    body = answer(args.mib)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "tests.bench_answer_memory",
                "--measure",
                f"http://127.0.0.1:{server.server_port}",
            ],
            capture_output=True,
            text=True,
            check=True,
        )
    finally:
        server.shutdown()
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    answer_mib = len(body) / (1 << 20)
    grown_mib = (figures["peak_kib"] - figures["before_kib"]) / 1024
    print(
        f"answer {answer_mib:.1f} MiB ({figures['series']} series x {STEPS} steps): peak RSS grew "
        f"{grown_mib:.0f} MiB = {grown_mib / answer_mib:.2f} MiB per MiB of answer"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
