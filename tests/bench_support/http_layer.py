"""The HTTP-layer evaluation of docs/security.md §5.1: one listener answering a 300 KB body from
memory, served by gpumeter/web/ or by uvicorn (h11 or httptools), measured from outside.

    python -m tests.bench_support.http_layer gpumeter
    python -m tests.bench_support.http_layer h11 --python /tmp/libvenv/bin/python   # a venv with uvicorn

Prints one JSON line: resident memory after 2,000 kept-alive scrapes, scrape p50/p99, and how long a
slowloris (one header byte every 0.5 s) and a connection that never sends are held (None: still open
at the end of the probe). A measurement, not a test; uvicorn is not a dependency of the project.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.support import loopback

SERVER = r"""
import sys, time
kind, port = sys.argv[1], int(sys.argv[2])
import prometheus_client  # the exporter loads it whatever serves
BODY = b"x" * 300_000
if kind == "gpumeter":
    from gpumeter.web import serve
    def app(environ, start_response):
        start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(BODY)))])
        return [BODY]
    serve(app, f"127.0.0.1:{port}", answers_from_memory=True)
    while True:
        time.sleep(3600)
import uvicorn
async def app(scope, receive, send):
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/plain"), (b"content-length", str(len(BODY)).encode())]})
        await send({"type": "http.response.body", "body": BODY})
uvicorn.run(app, host="127.0.0.1", port=port, http=kind, loop="asyncio", lifespan="off",
            log_level="warning", timeout_keep_alive=10)
"""


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def held_seconds(port: int, trickle: bool, limit: float) -> float | None:
    """Seconds until the server closes a connection that trickles a header (or sends nothing)."""
    sock = socket.create_connection(("127.0.0.1", port))
    start = time.monotonic()
    try:
        if trickle:
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        sock.settimeout(0.5)
        while time.monotonic() - start < limit:
            try:
                if trickle:
                    sock.send(b"a")
                if sock.recv(1) == b"":
                    return round(time.monotonic() - start, 1)
            except TimeoutError:
                continue
            except OSError:
                return round(time.monotonic() - start, 1)
        return None
    finally:
        sock.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("server", choices=["gpumeter", "h11", "httptools"])
    parser.add_argument("--python", default=sys.executable, help="the interpreter that serves")
    parser.add_argument("--scrapes", type=int, default=2000)
    args = parser.parse_args()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([args.python, "-c", SERVER, args.server, str(port)], cwd="/")
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        for _ in range(300):
            try:
                loopback.get(url)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        latencies = []
        with httpx.Client() as client:
            for _ in range(args.scrapes):
                started = time.perf_counter()
                client.get(url).raise_for_status()
                latencies.append(time.perf_counter() - started)
        latencies.sort()
        result = {
            "server": args.server,
            "rss_mib": round(rss_mib(server.pid), 1),
            "p50_ms": round(latencies[len(latencies) // 2] * 1000, 2),
            "p99_ms": round(latencies[int(len(latencies) * 0.99)] * 1000, 2),
            "slowloris_closed_after_s": held_seconds(port, trickle=True, limit=15),
            "silent_closed_after_s": held_seconds(port, trickle=False, limit=20),
        }
    finally:
        server.terminate()
        server.wait()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
