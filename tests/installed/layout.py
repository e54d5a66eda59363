"""Every user-facing command's main path, run as the image runs gpumeter.

    python layout.py --prometheus URL --day YYYY-MM-DD --work DIR [--gpumeter PATH] [--with-demo]

Run it as a user who cannot write the installed package (the image's UID 10001, or any non-root user
over a root-owned virtual environment), with ``HOME`` unwritable and ``--work`` an empty folder of
its own: each command runs in an empty working directory under it, never in the checkout or in
site-packages. ``--prometheus`` holds ``--day`` of ``gpumeter simulate history --fleet h100-mig``
(backfilled by the caller, who has promtool). Standard library only, so it runs inside the image as
it is. Prints one line per step; exits 1 with one line per failure.

tests/installed/test_layout.py runs it over the installed wheel; tests/deploy runs it inside the
image that ``make image`` builds.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import site
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.request
from collections.abc import Callable, Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

FLEET = "h100-mig"


class StepFailed(Exception):
    pass


class Layout:
    def __init__(self, args: argparse.Namespace):
        self.gpumeter = args.gpumeter
        self.prometheus = args.prometheus
        self.day = date.fromisoformat(args.day)
        self.work = Path(args.work)
        self.cwd = self.work / "cwd"  # every command's working directory: empty, the user's own
        self.cwd.mkdir(parents=True, exist_ok=True)
        self.ledger = f"sqlite:///{self.work / 'ledger.db'}"
        self.failures: list[str] = []

    # --- running commands ----------------------------------------------------------------------------
    def run(self, *argv: str, timeout: float = 300, env: dict[str, str] | None = None) -> str:
        """``gpumeter *argv`` to its end; its standard output. Fails the step on a non-zero exit."""
        proc = subprocess.run(
            [self.gpumeter, *argv],
            cwd=self.cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, **(env or {})},
        )
        if proc.returncode != 0:
            tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise StepFailed(f"`gpumeter {' '.join(argv)}` exited {proc.returncode}: {tail}")
        return proc.stdout

    @contextlib.contextmanager
    def serving(self, *argv: str, env: dict[str, str] | None = None) -> Iterator[subprocess.Popen]:
        """``gpumeter *argv`` in the background; stopped with SIGTERM, and it must exit 0."""
        log = (self.work / f"{argv[0]}-{len(os.listdir(self.work))}.log").open("w+")
        proc = subprocess.Popen(
            [self.gpumeter, *argv],
            cwd=self.cwd,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            log.seek(0)
            output = log.read()
            log.close()
        if proc.returncode != 0:
            tail = (output.strip().splitlines() or ["(no output)"])[-1]
            raise StepFailed(f"`gpumeter {' '.join(argv)}` exited {proc.returncode}: {tail}")

    def step(self, name: str, check: Callable[[], str]) -> None:
        started = time.monotonic()
        try:
            said = check()
        except (StepFailed, AssertionError, OSError, subprocess.TimeoutExpired) as exc:
            self.failures.append(f"{name}: {exc}")
            print(f"FAIL {name}: {exc}", flush=True)
        else:
            print(
                f"ok   {name} ({time.monotonic() - started:.1f} s){': ' + said if said else ''}", flush=True
            )

    # --- the steps -------------------------------------------------------------------------------------
    def version(self) -> str:
        return self.run("--version").strip()

    def doctor(self) -> str:
        report = json.loads(self.run("doctor", "--simulate", FLEET, "--json"))
        assert report, "doctor --json printed nothing"
        return f"{len(report)} sections"

    def exporter(self) -> str:
        port, admin = free_port(), free_port()
        with self.serving(
            "simulate", "kubelet", "--fleet", FLEET, "--socket", str(self.work / "kubelet.sock")
        ):
            wait_for(lambda: (self.work / "kubelet.sock").exists(), "the stand-in kubelet's socket")
            with self.serving(
                "exporter",
                "--simulate",
                FLEET,
                "--listen",
                f"127.0.0.1:{port}",
                "--admin-listen",
                f"127.0.0.1:{admin}",
                "--kubelet-socket",
                str(self.work / "kubelet.sock"),
                "--interval",
                "1",
            ):
                url = f"http://127.0.0.1:{port}/metrics"
                text = wait_for(lambda: _has(url, "nvidia_gpu_allocation{"), "allocations on /metrics")
                assert "nvidia_gpu_info{" in text and "nvidia_gpu_mig_info{" in text
                self.run(
                    "simulate",
                    "inject",
                    "--admin",
                    f"127.0.0.1:{admin}",
                    "xid",
                    "--gpu",
                    "0",
                    "--set",
                    "code=79",
                )
                wait_for(lambda: _xid_counted(url, "79"), "the injected XID 79 counted")
                self.run("simulate", "inject", "--admin", f"127.0.0.1:{admin}", "clear")
        return "scraped with pods, an XID injected and seen"

    def stand_ins(self) -> str:
        ksm, volcano, kube_api, dcgm = free_port(), free_port(), free_port(), free_port()
        with (
            self.serving("simulate", "kube-state-metrics", "--fleet", FLEET, "--listen", f"127.0.0.1:{ksm}"),
            self.serving(
                "simulate", "volcano", "--listen", f"127.0.0.1:{volcano}", "--queue", "research=8:6:10:2"
            ),
            self.serving(
                "simulate", "kube-api", "--fleet", "shared-modes", "--listen", f"127.0.0.1:{kube_api}"
            ),
            self.serving(
                "simulate", "dcgm-exporter", "--fleet", "a100-mixed", "--listen", f"127.0.0.1:{dcgm}"
            ),
        ):
            wait_for(
                lambda: _has(f"http://127.0.0.1:{ksm}/metrics", "kube_pod_"), "kube-state-metrics series"
            )
            wait_for(lambda: _has(f"http://127.0.0.1:{volcano}/metrics", "volcano_queue_"), "volcano series")
            node_pods = (
                f"http://127.0.0.1:{kube_api}/api/v1/pods?fieldSelector=spec.nodeName=gpu-shared-frac-01"
            )
            pods = wait_for(lambda: _has(node_pods, '"PodList"'), "a node's PodList")
            assert '"uid"' in pods and "containerID" in pods, "pods without UIDs or container IDs"
            wait_for(
                lambda: _has(f"http://127.0.0.1:{dcgm}/metrics", "DCGM_FI_PROF_"), "DCGM profiling series"
            )
        return "kube-state-metrics, volcano, kube-api, dcgm-exporter"

    def history(self) -> str:
        start = datetime.combine(self.day, datetime.min.time(), UTC)
        out = self.work / "hour.om"
        self.run(
            "simulate",
            "history",
            "--fleet",
            FLEET,
            "--from",
            start.isoformat(),
            "--to",
            (start + timedelta(hours=1)).isoformat(),
            "--out",
            str(out),
        )
        assert out.read_text().rstrip().endswith("# EOF"), "not OpenMetrics"
        return f"{out.stat().st_size:,} bytes for an hour"

    def prices(self) -> str:
        book = self.work / "prices.yaml"
        book.write_text(self.run("billing", "prices", "default"))
        said = self.run("billing", "prices", "check", str(book))
        assert ": OK," in said, said
        return said.splitlines()[0]

    def ingest(self) -> str:
        start = datetime.combine(self.day, datetime.min.time(), UTC)
        common = (
            "--db",
            self.ledger,
            "--from",
            start.isoformat(),
            "--to",
            (start + timedelta(days=1)).isoformat(),
        )
        self.run("billing", "ingest", *common, "--prometheus", self.prometheus, "--no-progress", timeout=600)
        self.run("billing", "price", *common, "--prices", str(self.work / "prices.yaml"), timeout=600)
        return "a day ingested and re-priced"

    def reports(self) -> str:
        period = self.day.strftime("%Y-%m")
        out = self.work / "reports"
        self.run("report", "--db", self.ledger, "--period", period, "--out", str(out))  # --format all
        self.run(
            "report",
            "--kind",
            "health",
            "--db",
            self.ledger,
            "--prometheus",
            self.prometheus,
            "--period",
            period,
            "--out",
            str(out),
        )
        names = sorted(p.name for p in out.iterdir())
        for wanted in (f"gpumeter-{period}-by-team.html", f"gpumeter-health-{period}.html"):
            assert wanted in names, f"{wanted} missing from {names}"
            assert "<html" in (out / wanted).read_text()[:1000].lower(), f"{wanted} is not HTML"
        for suffix in (".csv", ".json", "focus"):
            assert any(suffix in name for name in names), f"no {suffix} file in {names}"
        return f"{len(names)} files"

    def serve(self) -> str:
        """`billing serve` with a report every minute renders last month's report into its folder;
        with the folder unwritable it refuses to start in one line."""
        port = free_port()
        reports = self.work / "served-reports"
        env = {
            "GPUMETER_REPORT_DIR": str(reports),
            "GPUMETER_REPORT_CRON": "* * * * *",
            "GPUMETER_REPORT_KINDS": "chargeback",
        }
        period = (datetime.now(UTC).replace(day=1) - timedelta(days=1)).strftime("%Y-%m")
        argv = (
            "billing",
            "serve",
            "--db",
            self.ledger,
            "--prometheus",
            self.prometheus,
            "--listen",
            f"127.0.0.1:{port}",
        )
        with self.serving(*argv, env=env):
            wait_for(lambda: _has(f"http://127.0.0.1:{port}/healthz", "ok"), "/healthz ok", timeout=60)
            html = reports / period / f"gpumeter-{period}-by-team.html"
            wait_for(html.exists, f"{html} from the scheduled job", timeout=130)
            metrics = _get(f"http://127.0.0.1:{port}/metrics")
            assert 'gpumeter_billing_job_failures_total{task="chargeback_report"} 0.0' in metrics, (
                "a failure counted"
            )
        blocked = self.work / "not-a-folder"
        blocked.write_text("")
        proc = subprocess.run(
            [self.gpumeter, *argv],
            cwd=self.cwd,
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, **env, "GPUMETER_REPORT_DIR": str(blocked / "out")},
        )
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and "GPUMETER_REPORT_DIR: not writable" in lines[0], (
            proc.returncode,
            lines,
        )
        return f"report rendered on schedule; refused an unwritable folder: {lines[0]}"

    def generators(self) -> str:
        out = self.work / "dashboards"
        self.run("dashboards", "build", "--out", str(out), "--configmaps", str(out / "configmaps"))
        self.run("dashboards", "build", "--check", "--out", str(out), "--configmaps", str(out / "configmaps"))
        models = sorted(p.name for p in out.glob("*.json"))
        assert len(models) >= 6, models
        rule = self.run("alerts", "prometheusrule")
        assert "kind: PrometheusRule" in rule
        self.run("alerts", "prometheusrule", "--out", str(self.work / "prometheusrule.yaml"))
        return f"{len(models)} dashboards, the PrometheusRule"

    def demo(self) -> str:
        offset = free_offset()
        said = self.run(
            "demo",
            "--workdir",
            str(self.work / "demo"),
            "--port-offset",
            str(offset),
            "--history-days",
            "1",
            "--no-wait",
            timeout=900,
        )
        assert "stack ready" in said, said[-500:]
        return f"stack ready (port offset {offset})"

    def nothing_in_the_package(self) -> str:
        """Nothing above wrote into the installed package or the working directory."""
        package = Path(_package_folder(self.gpumeter))
        writable = os.access(package, os.W_OK)
        assert not writable, f"{package} is writable by this user: run as the image does (non-root)"
        leftovers = sorted(str(p.relative_to(self.cwd)) for p in self.cwd.rglob("*"))
        assert not leftovers, f"commands wrote into their working directory: {leftovers[:5]}"
        return f"{package} read-only, working directory still empty"


def _package_folder(gpumeter: str) -> str:
    python = Path(gpumeter).resolve().parent / "python"
    return subprocess.run(
        [
            str(python) if python.exists() else sys.executable,
            "-c",
            "import gpumeter, os; print(os.path.dirname(gpumeter.__file__))",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd="/",
    ).stdout.strip()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def free_offset(start: int = 21000) -> int:
    """A --port-offset for the demo whose every port is free: clear of a developer's own running demo,
    and of another demo started beside it (tests/demo starts its search at 20000, this one at 21000)."""
    from gpumeter.deploy.demo import PORTS  # the demo runs on this interpreter's gpumeter

    for offset in range(start, 50000, 1000):
        with contextlib.ExitStack() as stack:
            socks = [stack.enter_context(socket.socket()) for _ in PORTS]
            if all(
                s.connect_ex(("127.0.0.1", p + offset)) != 0
                for s, p in zip(socks, PORTS.values(), strict=True)
            ):
                return offset
    raise StepFailed("no free port offset for the demo")


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as answer:
        return answer.read().decode()


def _has(url: str, text: str) -> str | None:
    try:
        body = _get(url)
    except OSError:
        return None
    return body if text in body else None


def _xid_counted(url: str, code: str) -> bool:
    """An XID counter (of the GPU, or of its MIG instances) with ``xid=code`` on /metrics."""
    body = _has(url, f'xid="{code}"') or ""
    return any(
        line.startswith(("nvidia_gpu_xid_errors_total{", "nvidia_gpu_mig_xid_errors_total{"))
        and f'xid="{code}"' in line
        for line in body.splitlines()
    )


def wait_for(probe: Callable[[], object], what: str, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := probe():
            return result
        time.sleep(0.25)
    raise StepFailed(f"no {what} within {timeout:.0f} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--prometheus", required=True, help="a Prometheus holding --day of the h100-mig fleet"
    )
    parser.add_argument("--day", required=True, help="the backfilled day, YYYY-MM-DD")
    parser.add_argument("--work", required=True, help="an empty folder of this user's")
    parser.add_argument("--gpumeter", default="gpumeter", help="the command (default: gpumeter on PATH)")
    parser.add_argument(
        "--with-demo", action="store_true", help="also `gpumeter demo --no-wait` (needs Prometheus)"
    )
    args = parser.parse_args(argv)
    layout = Layout(args)
    print(
        f"as uid {os.getuid()}, HOME={os.environ.get('HOME')}, site-packages {site.getsitepackages() or sysconfig.get_path('purelib')}",
        flush=True,
    )
    steps = [
        ("gpumeter --version", layout.version),
        ("doctor", layout.doctor),
        ("exporter with the stand-in kubelet, scraped; simulate inject", layout.exporter),
        ("simulate kube-state-metrics, volcano, kube-api, dcgm-exporter", layout.stand_ins),
        ("simulate history", layout.history),
        ("billing prices default and check", layout.prices),
        ("billing ingest and price", layout.ingest),
        ("report, both kinds, every format", layout.reports),
        ("billing serve with a scheduled report", layout.serve),
        ("dashboards build --out, alerts prometheusrule", layout.generators),
    ]
    if args.with_demo:
        steps.append(("demo --no-wait", layout.demo))
    steps.append(("nothing written into the package", layout.nothing_in_the_package))
    for name, check in steps:
        layout.step(name, check)
    for failure in layout.failures:
        print(f"FAILED {failure}", file=sys.stderr)
    return 1 if layout.failures else 0


if __name__ == "__main__":
    sys.exit(main())
