"""One simulated node in its own process: a stand-in kubelet and an exporter built with
``exporter.app.build_exporter``, with faults injected through ``exporter.node.inject``.

pynvml keeps its library in a module global (exporter/nvml.py: one NVML session per process), so the
dashboard tests run each simulated fleet in a child process:

    python -m tests.dashboards.run_exporter FLEET NODE SOCKET_OR_EMPTY FAULTS_JSON [KUBE_API_URL]

It prints ``port <N>`` once the exporter serves, and runs until stdin closes.
"""

from __future__ import annotations

import json
import sys

from gpumeter.exporter.app import build_exporter
from gpumeter.exporter.config import ExporterConfig
from gpumeter.exporter.simulator.fleet import load_fleet
from gpumeter.exporter.simulator.kubelet import StandInKubelet


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
        sys.stdin.read()  # until the parent closes our stdin
    finally:
        exporter.stop()
        if kubelet is not None:
            kubelet.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
