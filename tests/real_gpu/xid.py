"""Application faults on a real GPU: which XIDs the driver reports for them, whether the exporter counts
each one, and whether the GPU is healthy after (no reset). Run on the GPU node (``tests/real_gpu/xid.sh``);
writes into the folder given.

Each fault runs in a child process of its own, the way a user's job faults: a kernel that writes to an
address nobody mapped, one that executes ``trap``, one that writes a misaligned word, and PyTorch's
device-side assert on an index out of range (the commonest of all). The exporter (native naming,
in this process, every NVML call wrapped) and a ``--naming dcgm`` exporter beside it (its own process)
watch; after each fault both are scraped and the kernel log's new lines kept. Nothing here changes a
setting of the GPU or resets it: a fault ends the faulting process's context and nothing else.

Not a test: its output, committed under ``tests/data/real-gpu/<board>/``, is what the tests hold the
stand-in and the alert rules to (tests/exporter/test_real_xid.py, tests/alerts/test_real_boards.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pynvml as N
from probe import start_exporter  # beside this script: run as `python3 tests/real_gpu/xid.py`

# A kernel per fault, built by CuPy's NVRTC on the node. The address 0xdead00000000 is in no allocation.
KERNELS = r"""
extern "C" __global__ void illegal_address(int* unused) { *(volatile int*)0xdead00000000ULL = 1; }
extern "C" __global__ void trap(int* unused) { asm volatile("trap;"); }
extern "C" __global__ void misaligned(int* p) { *(volatile int*)((char*)p + 1) = 1; }
"""
CUPY_CHILD = """
import sys, cupy as cp
kernel = cp.RawModule(code={src!r}).get_function(sys.argv[1])
p = cp.zeros(16, dtype=cp.int32)
kernel((1,), (1,), (p,))
try:
    cp.cuda.runtime.deviceSynchronize()
except Exception as exc:
    print(type(exc).__name__, exc, flush=True)
    sys.exit(3)
print("no fault", flush=True)
"""
TORCH_CHILD = """
import sys, torch
x = torch.zeros(4, device="cuda")
try:
    x[torch.tensor([1000], device="cuda")] += 1
    torch.cuda.synchronize()
except Exception as exc:
    print(type(exc).__name__, str(exc).splitlines()[0], flush=True)
    sys.exit(3)
print("no fault", flush=True)
"""
HEALTHY_CHILD = """
import cupy as cp
a = cp.ones((4096, 4096), dtype=cp.float32)
print("matmul after the faults:", float((a @ a)[0, 0]), flush=True)
"""
FAULTS = {
    "illegal_address": [sys.executable, "-c", CUPY_CHILD.format(src=KERNELS), "illegal_address"],
    "trap": [sys.executable, "-c", CUPY_CHILD.format(src=KERNELS), "trap"],
    "misaligned": [sys.executable, "-c", CUPY_CHILD.format(src=KERNELS), "misaligned"],
    "torch_index_assert": [sys.executable, "-c", TORCH_CHILD],
}

NATIVE = "http://127.0.0.1:9835/metrics"
DCGM = "http://127.0.0.1:9400/metrics"

# Every nvml* call of this process, with the error it raised: a call refused as UNINITIALIZED means
# something asked NVML after the exporter gave it back (docs/nvml.md §12).
CALLS: list[tuple[float, str, str]] = []
_lock = threading.Lock()


def wrap_every_call() -> None:
    for name, fn in list(vars(N).items()):
        if name.startswith("nvml") and callable(fn):

            def call(*args, _fn=fn, _name=name, **kwargs):
                try:
                    return _fn(*args, **kwargs)
                except N.NVMLError as exc:
                    with _lock:
                        CALLS.append((time.monotonic(), _name, str(exc)))
                    raise

            setattr(N, name, call)


def scrape(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.read().decode()
    except OSError as exc:
        return f"# scrape failed: {exc}\n"


def xid_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if "xid" in line.lower() and not line.startswith("#")]


def kernel_log() -> list[str]:
    done = subprocess.run(["dmesg"], capture_output=True, text=True)
    return (done.stdout or done.stderr).splitlines()


def main(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    wrap_every_call()
    dcgm_log = open(out / "exporter-dcgm.log", "w")  # noqa: SIM115 -- open as long as the child runs
    dcgm = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpumeter",
            "exporter",
            "--naming",
            "dcgm",
            "--listen",
            "127.0.0.1:9400",
            "--interval",
            "1",
            "--kubelet-socket",
            "",
        ],
        stdout=dcgm_log,
        stderr=subprocess.STDOUT,
        cwd="/",
    )
    exporter = start_exporter()
    time.sleep(6)
    log_before = kernel_log()
    result: dict = {"kernel_log_lines_before": len(log_before), "faults": {}}
    (out / "metrics-before-faults.prom").write_text(scrape(NATIVE))
    for name, argv in FAULTS.items():
        seen = len(kernel_log())
        started = time.time()
        child = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd="/")
        time.sleep(3)  # three cycles: the event is counted by the XID thread, rendered by the next cycle
        log = kernel_log()
        result["faults"][name] = {
            "exit": child.returncode,
            "child_seconds": round(time.time() - started, 1),
            "child_output": (child.stdout + child.stderr)[-1500:],
            "kernel_log": log[seen:],
            "native_xid": xid_lines(scrape(NATIVE)),
            "dcgm_xid": xid_lines(scrape(DCGM)),
        }
        print(name, json.dumps(result["faults"][name], indent=1), flush=True)
    healthy = subprocess.run(
        [sys.executable, "-c", HEALTHY_CHILD], capture_output=True, text=True, timeout=120
    )
    result["after"] = {"exit": healthy.returncode, "output": (healthy.stdout + healthy.stderr)[-800:]}
    time.sleep(2)
    (out / "metrics-after-faults.prom").write_text(scrape(NATIVE))
    (out / "metrics-after-faults-dcgm.prom").write_text(scrape(DCGM))
    stopping = time.monotonic()
    exporter.stop()
    result["stop_seconds"] = round(time.monotonic() - stopping, 3)
    time.sleep(0.5)  # anything still running would call now
    with _lock:
        result["nvml_errors_after_stop"] = [(n, e) for t, n, e in CALLS if t >= stopping]
        result["nvml_errors_while_running"] = sorted({f"{n}: {e}" for t, n, e in CALLS if t < stopping})
    dcgm.send_signal(2)
    try:
        dcgm.wait(timeout=10)
        result["dcgm_stop"] = f"exit {dcgm.returncode}"
    except subprocess.TimeoutExpired:
        dcgm.kill()
        result["dcgm_stop"] = "did not stop within 10 s of SIGINT"
    (out / "xid.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "faults"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
