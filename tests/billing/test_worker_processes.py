"""Worker processes of `billing ingest --workers N` die with the ingest that started them.

A killed ingest used to leave its busy workers running (and writing hours) for as long as their task
took. The parent here starts the real worker pool, gives a worker an hour-long task, reports the
worker's pid and is killed with SIGKILL; the worker must be gone long before its task would end (the
test waits for it, bounded by the suite's timeout, not by a clock of its own).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.support.pids import alive

PARENT = """
import os, sys, time
from gpumeter.billing.ingest import worker_pool
pool = worker_pool(1)
worker = pool.submit(os.getpid).result()
pool.submit(time.sleep, 3600)
time.sleep(0.5)  # the worker is now inside its hour-long task
print(worker, flush=True)
time.sleep(3600)
"""


@pytest.mark.spawns
def test_a_killed_ingest_takes_its_busy_workers_with_it():
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    worker = 0
    try:
        worker = int(parent.stdout.readline())
        assert alive(worker)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        while alive(worker):  # the kernel kills it at once; one that outlived it would meet the timeout
            time.sleep(0.05)
    finally:
        parent.kill()
        parent.stdout.close()
        if worker and alive(worker):  # the failure case: do not leave it sleeping
            os.kill(worker, signal.SIGKILL)
