"""Real servers for tests: Prometheus, Alertmanager, promtool and amtool from Debian's packages.

Each server runs on a free loopback port in a temporary directory and is stopped by its context
manager. A missing binary fails the test loudly (`make test` installs them); it is never skipped.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterable, Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import httpx
import pytest
import yaml

from gpumeter.deploy.demo_clusters import import_batches
from gpumeter.simulator.metrics_server import StandInServer
from tests.support import loopback, needs

__all__ = [
    "AlertmanagerServer",
    "AnswerHandler",
    "PrometheusServer",
    "VictoriaMetricsServer",
    "answering",
    "free_port",
    "require_binary",
    "wait_http_ok",
]


def require_binary(name: str) -> str:
    needs.require_for_binary(name)  # the running test must declare it (tests/support/needs.py)
    path = shutil.which(name) or next(
        (p for p in (f"/usr/bin/{name}", f"/usr/sbin/{name}") if Path(p).exists()), None
    )
    if path is None:
        pytest.fail(
            f"{name} is not installed; run `make tools` (Debian packages) — tests never skip it",
            pytrace=False,
        )
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# How long a started server may take to answer 200: it ends as soon as it does, so it costs nothing
# when the machine is quiet, and on a busy one it is a process's start, not a failure (CI's machine once
# took over 60 s to start an exporter that serves within a second here).
READY_TIMEOUT_S = 180.0


def wait_http_ok(
    url: str, timeout: float = READY_TIMEOUT_S, proc: subprocess.Popen | None = None, interval: float = 0.1
) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | str = "no answer"
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process for {url} exited with {proc.returncode}")
        try:
            response = loopback.get(url, timeout=2)
            if response.status_code == 200:
                return
            last = f"HTTP {response.status_code}"
        except httpx.HTTPError as exc:
            last = exc
        time.sleep(interval)
    raise TimeoutError(f"{url} not ready after {timeout}s: {last}")


# A Python child started with this in its environment dumps every thread's stack on SIGABRT
# (`faulthandler`), which `stop_processes` sends to one that outstays SIGTERM.
DUMP_ON_ABORT = {"PYTHONFAULTHANDLER": "1"}


def stop_processes(processes: Iterable[tuple[subprocess.Popen, Path]], timeout: float = 20.0) -> list[str]:
    """SIGTERM every process at once and give them ``timeout`` seconds together. One still running
    then is sent SIGABRT (its threads' stacks go to its log, given `DUMP_ON_ABORT`) and killed.
    Returns, per process that did not stop on SIGTERM, its command and its log's tail: for the
    caller to fail on, once nothing it started is left running to disturb the tests after it."""
    processes = list(processes)
    for proc, _ in processes:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    stuck = []
    for proc, log in processes:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
            continue
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        tail = log.read_text(errors="replace")[-6000:] if log.exists() else "(no log)"
        stuck.append(
            f"{' '.join(map(str, proc.args))} outstayed SIGTERM by {timeout:g} s; its log ends:\n{tail}"
        )
    return stuck


# util-linux's setpriv (Essential on Debian) execs the server with PR_SET_PDEATHSIG set: SIGTERM when the
# test process that started it dies, even killed where its finalizers cannot run (an xdist worker taken
# down by its stopped controller; a SIGKILL). Not a preexec_fn: that forks a Python child beside the
# stand-in kubelets' gRPC threads, which aborted it.
_STOP_WITH_PARENT = ["setpriv", "--pdeathsig", "TERM", "--"] if shutil.which("setpriv") else []


class _Process:
    def __init__(self, argv: list[str], log: Path):
        self._log = log.open("wb")
        self.proc = subprocess.Popen([*_STOP_WITH_PARENT, *argv], stdout=self._log, stderr=subprocess.STDOUT)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


class _QueryApi:
    """The Prometheus query API, which Prometheus and VictoriaMetrics both serve at ``url``."""

    url: str
    query_timeout = 30.0

    def query(self, promql: str, time: float | None = None) -> list[dict]:
        params = {"query": promql}
        if time is not None:
            params["time"] = str(time)
        body = loopback.get(f"{self.url}/api/v1/query", params=params, timeout=self.query_timeout).json()
        if body.get("status") != "success":
            raise AssertionError(f"query {promql!r} failed: {body}")
        return body["data"]["result"]

    def wait_for(self, promql: str, timeout: float = 30.0, predicate=bool) -> list[dict]:
        """Poll ``promql`` until ``predicate(result)`` holds; return the result."""
        deadline = time.monotonic() + timeout
        result: list[dict] = []
        while time.monotonic() < deadline:
            result = self.query(promql)
            if predicate(result):
                return result
            time.sleep(0.25)
        raise AssertionError(f"{promql!r} did not satisfy the predicate within {timeout}s; last: {result}")


class PrometheusServer(_QueryApi):
    """A real Prometheus. ``scrape_targets`` maps job name to a list of host:port targets."""

    def __init__(
        self,
        workdir: Path,
        *,
        scrape_targets: dict[str, list[str]] | None = None,
        rule_files: list[Path] = (),
        scrape_interval: str = "1s",
        evaluation_interval: str = "1s",
        alertmanager: str | None = None,
        data_dir: Path | None = None,
        extra_args: list[str] = (),
        external_labels: dict[str, str] | None = None,
        remote_write: list[str | dict] = (),
    ):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.data_dir = data_dir or self.workdir / "data"
        config: dict = {
            "global": {
                "scrape_interval": scrape_interval,
                "evaluation_interval": evaluation_interval,
                "external_labels": dict(external_labels or {}),
            },
            "rule_files": [str(p) for p in rule_files],
            "scrape_configs": [
                {"job_name": job, "honor_labels": True, "static_configs": [{"targets": targets}]}
                for job, targets in (scrape_targets or {}).items()
            ],
        }
        if remote_write:
            # a URL, or a whole remote_write entry (write_relabel_configs and all)
            config["remote_write"] = [{"url": w} if isinstance(w, str) else w for w in remote_write]
        if alertmanager:
            config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]}
        self.config_path = self.workdir / "prometheus.yml"
        self.config_path.write_text(yaml.safe_dump(config))
        self._argv = [
            require_binary("prometheus"),
            f"--config.file={self.config_path}",
            f"--storage.tsdb.path={self.data_dir}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--web.enable-lifecycle",
            "--storage.tsdb.retention.time=3650d",
            *extra_args,
        ]
        self._process: _Process | None = None

    def start(self) -> PrometheusServer:
        self._process = _Process(self._argv, self.workdir / "prometheus.log")
        try:
            wait_http_ok(f"{self.url}/-/ready", proc=self._process.proc)
        except Exception:
            self.stop()
            raise RuntimeError((self.workdir / "prometheus.log").read_text()[-4000:]) from None
        return self

    def stop(self) -> None:
        if self._process:
            self._process.stop()
            self._process = None

    def __enter__(self) -> PrometheusServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class AlertmanagerServer:
    def __init__(self, workdir: Path, config: Path):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.cluster_port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._argv = [
            require_binary("prometheus-alertmanager"),
            f"--config.file={config}",
            f"--storage.path={self.workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            f"--cluster.listen-address=127.0.0.1:{self.cluster_port}",
        ]
        self._process: _Process | None = None

    def __enter__(self) -> AlertmanagerServer:
        self._process = _Process(self._argv, self.workdir / "alertmanager.log")
        try:
            wait_http_ok(f"{self.url}/-/ready", proc=self._process.proc)
        except Exception:
            self._process.stop()
            raise RuntimeError((self.workdir / "alertmanager.log").read_text()[-4000:]) from None
        return self

    def __exit__(self, *exc) -> None:
        if self._process:
            self._process.stop()

    def alerts(self) -> list[dict]:
        return loopback.get(f"{self.url}/api/v2/alerts", timeout=10).json()


@contextlib.contextmanager
def running(server) -> Iterator:
    with server as started:
        yield started


class VictoriaMetricsServer(_QueryApi):
    """A real single-node VictoriaMetrics (Debian's victoria-metrics) serving the Prometheus query API.

    History goes in through VictoriaMetrics' own import API (:meth:`import_prometheus`, the text
    exposition format with millisecond timestamps); :meth:`flush` makes it queryable at once.
    """

    query_timeout = 60.0

    def __init__(self, workdir: Path, *, extra_args: list[str] = ()):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.data_dir = self.workdir / "vmdata"
        self._argv = [
            require_binary("victoria-metrics"),
            f"-storageDataPath={self.data_dir}",
            f"-httpListenAddr=127.0.0.1:{self.port}",
            "-retentionPeriod=100y",
            *extra_args,
        ]
        self._process: _Process | None = None

    def start(self) -> VictoriaMetricsServer:
        self._process = _Process(self._argv, self.workdir / "victoria-metrics.log")
        try:
            wait_http_ok(f"{self.url}/health", proc=self._process.proc)
        except Exception:
            self.stop()
            raise RuntimeError((self.workdir / "victoria-metrics.log").read_text()[-4000:]) from None
        return self

    def stop(self) -> None:
        if self._process:
            self._process.stop()
            self._process = None

    def __enter__(self) -> VictoriaMetricsServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def import_prometheus(self, text: str) -> None:
        """Import samples in the text exposition format, each line ending in a timestamp in ms."""
        self._post_import(text.encode())
        self.flush()

    def import_openmetrics(self, lines: Iterable[str], batch_bytes: int = 8 << 20) -> None:
        """Import an OpenMetrics history (timestamps in seconds, as promtool backfills it), as the demo
        imports its own (`demo_clusters.import_batches`)."""
        for body in import_batches(lines, batch_bytes):
            self._post_import(body)
        self.flush()

    def _post_import(self, body: bytes) -> None:
        response = loopback.post(f"{self.url}/api/v1/import/prometheus", content=body, timeout=300)
        if response.status_code not in (200, 204):
            raise AssertionError(f"import failed: HTTP {response.status_code} {response.text[:500]}")

    def flush(self) -> None:
        loopback.get(f"{self.url}/internal/force_flush", timeout=60).raise_for_status()


class VmalertServer:
    """A real vmalert (Debian's victoria-metrics package): ``rule_files`` evaluated against the
    VictoriaMetrics at ``datasource``, results and ALERTS written back to it, alerts sent to
    ``alertmanager`` (a URL)."""

    def __init__(
        self,
        workdir: Path,
        *,
        datasource: str,
        rule_files: Iterable[Path],
        alertmanager: str,
        evaluation_interval: str = "1s",
    ):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._argv = [
            require_binary("vmalert"),
            *[f"-rule={path}" for path in rule_files],
            f"-datasource.url={datasource}",
            f"-remoteWrite.url={datasource}",
            f"-notifier.url={alertmanager}",
            f"-evaluationInterval={evaluation_interval}",
            f"-httpListenAddr=127.0.0.1:{self.port}",
        ]
        self._process: _Process | None = None

    def start(self) -> VmalertServer:
        self._process = _Process(self._argv, self.workdir / "vmalert.log")
        try:
            wait_http_ok(f"{self.url}/health", proc=self._process.proc)
        except Exception:
            self.stop()
            raise RuntimeError((self.workdir / "vmalert.log").read_text()[-4000:]) from None
        return self

    def stop(self) -> None:
        if self._process:
            self._process.stop()
            self._process = None


class Webhook:
    """Alertmanager's webhook receiver: every alert of every notification, with its receiver."""

    def __init__(self):
        self.alerts: list[dict] = []  # {"receiver", "status", "labels", "annotations"}
        self._lock = threading.Lock()
        received = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with received._lock:
                    received.alerts.extend(
                        {"receiver": payload["receiver"], **alert} for alert in payload["alerts"]
                    )
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = StandInServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/webhook"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Webhook:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(5)

    def received(self) -> list[dict]:
        with self._lock:
            return list(self.alerts)

    def find(self, status: str, alertname: str, **labels: str) -> dict | None:
        for alert in self.received():
            if (
                alert["status"] == status
                and alert["labels"].get("alertname") == alertname
                and all(alert["labels"].get(k) == v for k, v in labels.items())
            ):
                return alert
        return None

    def wait_for(self, expected: list[tuple], timeout: float) -> dict[tuple, dict]:
        """Wait until every (status, alertname, {labels}) has arrived; return the first of each."""
        deadline = time.monotonic() + timeout
        while True:
            found = {(s, n, tuple(sorted(lbl.items()))): self.find(s, n, **lbl) for s, n, lbl in expected}
            missing = [key for key, alert in found.items() if alert is None]
            if not missing:
                return found
            if time.monotonic() > deadline:
                got = sorted(
                    {(a["status"], a["labels"]["alertname"], a["labels"].get("gpu")) for a in self.received()}
                )
                raise AssertionError(f"not received within {timeout}s: {missing}\nreceived: {got}")
            time.sleep(0.2)


class AnswerHandler(BaseHTTPRequestHandler):
    """A loopback Prometheus stand-in's handler: reads the query (``self.form``), then `answer`
    writes the reply: the hostile answers a real Prometheus would never give."""

    form: dict[str, str]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.form = dict(httpx.QueryParams(body.decode()))
        self.answer()

    def answer(self) -> None:
        raise NotImplementedError

    def send_json(self, body: object, status: int = 200) -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


@contextlib.contextmanager
def answering(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """A real HTTP server on loopback answering with ``handler``, for as long as the block; its URL."""
    server = StandInServer(("127.0.0.1", 0), handler)  # a handler's error logged, not printed to stderr
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
