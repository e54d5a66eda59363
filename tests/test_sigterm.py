"""A test run stopped by SIGTERM leaves none of the servers its fixtures started.

A CI job's timeout or a `kill PID` sends SIGTERM to pytest alone; by default it killed pytest and left
its Prometheus, Alertmanager and VictoriaMetrics servers running on the machine, with their ports and
data directories, beside the next run. tests/conftest.py turns SIGTERM into KeyboardInterrupt, so the
finalizers run; and an xdist worker that its stopped controller takes down without them takes its
servers with it (`tests.support.servers`: each is asked to get SIGTERM when its parent dies)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
INNER = """
import time

import pytest

from tests.support.servers import PrometheusServer


@pytest.fixture
def prometheus(tmp_path):
    server = PrometheusServer(tmp_path / "prometheus").start()
    yield server
    server.stop()


@pytest.mark.prometheus
def test_waits_for_the_signal(prometheus):
    ready = {ready!r}
    with open(ready + ".part", "w") as out:
        out.write(str(prometheus._process.proc.pid))
    import os
    os.rename(ready + ".part", ready)
    time.sleep(300)
"""


def _running(pid: int) -> bool:
    """Whether the process runs (a zombie, killed and not yet reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


@pytest.mark.prometheus
@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["serial", "xdist"])
def test_sigterm_to_pytest_alone_stops_the_servers_its_fixtures_started(tmp_path, workers):
    ready = tmp_path / "ready"
    inner = tmp_path / "test_inner.py"
    inner.write_text(INNER.format(ready=str(ready)))
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest", *workers]
    run = subprocess.Popen(
        [*argv, str(inner)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own group: the signal below reaches pytest's process alone
    )
    server = None
    try:
        deadline = time.monotonic() + 90
        while not ready.exists():
            assert run.poll() is None, run.stdout.read().decode()
            assert time.monotonic() < deadline, "the inner test never started its Prometheus"
            time.sleep(0.2)
        server = int(ready.read_text())
        assert _running(server)
        run.send_signal(signal.SIGTERM)
        output = run.communicate(timeout=60)[0].decode()
        deadline = time.monotonic() + 15
        while _running(server) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _running(server), f"Prometheus {server} outlived pytest:\n{output}"
        assert run.returncode != 0  # interrupted, not passed
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
        if server is not None and _running(server):
            os.kill(server, signal.SIGKILL)
