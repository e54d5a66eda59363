"""One simulated node in its own process: a stand-in kubelet and an exporter built with
``exporter.app.build_exporter``, with faults injected through ``exporter.node.inject``.

pynvml keeps its library in a module global (exporter/nvml.py: one NVML session per process), so
tests that run several nodes (the dashboards' stack) or stop one mid-test (the live HA pair) run each
in a child process, `ExporterProcess`:

    python -m tests.support.exporter_process FLEET NODE SOCKET_OR_EMPTY FAULTS_JSON [KUBE_API_URL]

It prints ``port <N>`` once the exporter serves, and runs until stdin closes. Each line written to its
stdin before then is one more fault (JSON, as in FAULTS_JSON's list), injected at once and answered with a
line ``ok <description>`` or ``error <message>`` (`ExporterProcess.inject`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from gpumeter.exporter.app import build_exporter
from gpumeter.exporter.config import ExporterConfig
from gpumeter.simulator.fleet import load_fleet
from gpumeter.simulator.kubelet import StandInKubelet

ROOT = Path(__file__).resolve().parents[2]


class ExporterProcess:
    """This module in a child process, serving on 127.0.0.1:`port` until `stop`."""

    def __init__(
        self,
        fleet: str,
        node: str,
        socket: str,
        workdir: Path,
        kube_api: str = "",
        faults: list[dict] = (),
    ):
        self.node = node
        self._log = (workdir / f"{node}.log").open("wb")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.support.exporter_process",
                fleet,
                node,
                socket,
                json.dumps(list(faults)),
                *([kube_api] if kube_api else []),
            ],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )
        line = self.proc.stdout.readline()
        if not line.startswith("port "):
            self.stop()
            raise RuntimeError(
                f"exporter for {node} did not start: {(workdir / f'{node}.log').read_text()[-3000:]}"
            )
        self.port = int(line.split()[1])

    def inject(self, fault: dict) -> str:
        """Inject one more fault into the running node; its description. RuntimeError if refused."""
        self.proc.stdin.write(json.dumps(fault) + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline().rstrip("\n")
        if not answer.startswith("ok "):
            raise RuntimeError(f"{self.node}: fault {fault} not injected: {answer}")
        return answer[3:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()
        self._log.close()


def main(argv: list[str]) -> int:
    fleet, node, socket, faults, *kube_api = argv
    kubelet = StandInKubelet(load_fleet(fleet), node, socket).start() if socket else None
    exporter = build_exporter(
        ExporterConfig(
            listen="127.0.0.1:0",
            simulate=fleet,
            simulate_node=node,
            kubelet_socket=socket or None,
            interval=1,
            hostname=node,
            kube_api=kube_api[0] if kube_api else None,  # fractional grants from the pods' annotations
            # per-process use on the nodes whose pods the API lists (a simulated /proc holds their PIDs)
            enable_collectors=("processes",) if kube_api else (),
        )
    ).start()
    try:
        for fault in json.loads(faults):
            exporter.node.inject(fault.pop("fault"), fault.pop("gpu", None), **fault)
        print(f"port {exporter.port}", flush=True)
        for line in sys.stdin:  # until the parent closes our stdin: one fault a line
            if not line.strip():
                continue
            fault = json.loads(line)
            try:
                done = exporter.node.inject(fault.pop("fault"), fault.pop("gpu", None), **fault)
            except ValueError as exc:
                print(f"error {exc}", flush=True)
            else:
                print(f"ok {done}", flush=True)
    finally:
        exporter.stop()
        if kubelet is not None:
            kubelet.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
