"""Resident memory of the exporter with the Kubernetes pod lister on and off (docs/performance.md,
"The pod lister"). Not a test: run it by hand,

    .venv/bin/python -m tests.bench_support.kube_api_rss [--seconds 120]

For each case a fresh ``gpumeter exporter --simulate`` subprocess (interval 1 s) with the stand-in
kubelet, and for "on" the stand-in Kubernetes API listing the node's pods every second
(``--kube-api-refresh 1``: 30× the default, to make any leak show); VmRSS from /proc before the first
scrape and every tenth of the run (scraped back to back, 20 ms apart), and the number of lists the
stand-in answered.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from gpumeter.simulator.fleet import load_fleet
from gpumeter.simulator.kubeapi import StandInKubeApi
from gpumeter.simulator.kubelet import StandInKubelet
from tests.support.servers import free_port, wait_http_ok

OFFSET_S = 8.5 * 3600  # as tests/bench.py: every scheduled pod of h100-mig runs


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def run(fleet_name: str, node: str, kube_api: bool, seconds: float) -> dict:
    fleet = load_fleet(fleet_name)
    start = time.time() - OFFSET_S
    directory = tempfile.mkdtemp(prefix="gpm-", dir="/tmp")
    sock = os.path.join(directory, "kubelet.sock")
    kubelet = StandInKubelet(fleet, node, sock, start=start).start()
    api = StandInKubeApi(fleet, start=start).start() if kube_api else None
    port = free_port()
    argv = [
        str(Path(sys.executable).parent / "gpumeter"), "exporter", f"--simulate={fleet_name}",
        f"--simulate-node={node}", f"--kubelet-socket={sock}", f"--listen=127.0.0.1:{port}", "--interval=1",
    ]  # fmt: skip
    if api is not None:
        argv += [f"--kube-api={api.base_url}", "--kube-api-refresh=1"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUMETER_")}
    process = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_http_ok(f"http://127.0.0.1:{port}/metrics", proc=process)
        time.sleep(3)  # a few cycles: the first lists are in
        samples = [(0, 0, round(rss_mib(process.pid), 1))]  # (seconds, scrapes, MiB)
        allocations = scrapes = 0
        t0 = time.monotonic()
        with httpx.Client() as client:
            while (elapsed := time.monotonic() - t0) < seconds:
                text = client.get(f"http://127.0.0.1:{port}/metrics").text
                scrapes += 1
                time.sleep(0.02)
                if elapsed >= len(samples) * seconds / 10:
                    samples.append((round(elapsed), scrapes, round(rss_mib(process.pid), 1)))
                    allocations = sum(
                        1 for line in text.splitlines() if line.startswith("nvidia_gpu_allocation{")
                    )
        return {
            "fleet": fleet_name,
            "node": node,
            "kube_api": kube_api,
            "allocations": allocations,
            "lists_answered": api.requests if api else 0,
            "rss_mib": samples,
        }
    finally:
        process.terminate()
        process.wait(10)
        kubelet.stop()
        if api is not None:
            api.stop()
        shutil.rmtree(directory, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=120.0)
    args = parser.parse_args()
    cases = [("h100-mig", "gpu-h100-mig-01"), ("shared-modes", "gpu-shared-frac-01")]
    for fleet, node in cases:
        for on in (False, True):
            print(json.dumps(run(fleet, node, on, args.seconds)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
