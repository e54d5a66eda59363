"""``gpumeter exporter``, ``gpumeter simulate …`` and ``gpumeter docs metrics``."""

from __future__ import annotations

import argparse
import gc
import sys
import threading

from gpumeter.process import stop_on_signals, wait_until_set

from . import config as exporter_config

__all__ = ["register", "register_doctor", "register_simulate"]


def register(subparsers) -> None:
    """``exporter`` and ``docs``. The simulator's and the doctor's commands register apart
    (gpumeter/cli.py PARTS): their modules carry gRPC, which the exporter loads only with a kubelet socket."""
    exporter = subparsers.add_parser("exporter", help="serve NVML (or simulated) GPU metrics for Prometheus")
    exporter_config.add_arguments(exporter)
    exporter.set_defaults(func=run_exporter)

    docs = subparsers.add_parser("docs", help="generated documentation")
    docs_sub = docs.add_subparsers(dest="docs_command", required=True, metavar="WHAT")
    docs_sub.add_parser("metrics", help="print docs/metrics.md from the catalog").set_defaults(func=run_docs)
    docs_sub.add_parser(
        "models", help="print the simulated GPU models' capability tables (docs/simulator.md)"
    ).set_defaults(func=run_docs_models)


def register_simulate(subparsers) -> None:
    simulate = subparsers.add_parser(
        "simulate",
        help="the simulator: inject faults, stand-ins (kubelet, Kubernetes API, kube-state-metrics, volcano-scheduler), history",
    )
    sim = simulate.add_subparsers(dest="simulate_command", required=True, metavar="WHAT")
    inject = sim.add_parser("inject", help="inject a fault into a running simulated exporter")
    from .simulator.device import FAULTS

    inject.add_argument("fault", help=", ".join((*FAULTS, "clear")))
    inject.add_argument(
        "--admin",
        default="127.0.0.1:9836",
        metavar="HOST:PORT",
        help="the exporter's --admin-listen address (an http:// URL works too; default %(default)s)",
    )
    inject.add_argument("--gpu", type=int, help="GPU index")
    inject.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="fault parameter, e.g. code=79, reason=hw_thermal, link=3, count=500, celsius=30, "
        "layout=3g.40gb,3g.40gb; nvml_error: code=999 (any NVML return code), function=nvmlDeviceGetFieldValues "
        "(default: every call on the GPU)",
    )
    inject.set_defaults(func=run_inject)
    try:
        from .simulator import kubelet as stand_in_kubelet
    except ImportError:
        stand_in_kubelet = None
    if stand_in_kubelet is not None and hasattr(stand_in_kubelet, "add_parser"):
        stand_in_kubelet.add_parser(sim)
    try:
        from .simulator import history
    except ImportError:
        history = None
    if history is not None:
        history.add_parser(sim)
    from .simulator import dcgm_exporter, kube_state_metrics, kubeapi, volcano

    kubeapi.add_parser(sim)
    kube_state_metrics.add_parser(sim)
    volcano.add_parser(sim)
    dcgm_exporter.add_parser(sim)


def register_doctor(subparsers) -> None:
    from .doctor import add_parser as add_doctor

    add_doctor(subparsers)


def run_exporter(args: argparse.Namespace) -> int:
    from . import malloc
    from .app import build_exporter

    malloc.one_arena()  # before any thread starts (exporter/malloc.py)
    try:
        config = exporter_config.resolve(args)
        exporter = build_exporter(config).start()
    except (ValueError, OSError) as exc:  # ConfigError, FleetError, WebConfigError, ListenError: one line
        print(f"gpumeter exporter: {exc}", file=sys.stderr)
        return 2
    gc.freeze()  # start-up objects live forever: keep them out of every later full collection
    malloc.release_free_pages()
    stopped = threading.Event()
    stop_on_signals(stopped)
    print(
        f"gpumeter exporter: serving http://{config.listen}/metrics"
        + (
            f", faults at http://{config.admin_listen}/faults"
            if exporter.node and config.admin_listen
            else ""
        ),
        file=sys.stderr,
        flush=True,
    )
    wait_until_set(stopped)  # in slices: the signal may land on a gRPC thread (gpumeter/process.py)
    exporter.stop()
    return 0


def _parameter(text: str):
    key, _, value = text.partition("=")
    if key == "layout":
        return key, [v for v in value.split(",") if v]
    for kind in (int, float):
        try:
            return key, kind(value)
        except ValueError:
            pass
    return key, value


def run_inject(args: argparse.Namespace) -> int:
    import httpx

    base = args.admin if "://" in args.admin else f"http://{args.admin}"  # HOST:PORT, as its help says
    url = base.rstrip("/") + "/faults"
    try:
        if args.fault == "clear":
            response = httpx.delete(url, params={} if args.gpu is None else {"gpu": args.gpu}, timeout=10)
        else:
            body = {"fault": args.fault, "gpu": args.gpu, **dict(_parameter(p) for p in args.set)}
            response = httpx.post(url, json=body, timeout=10)
    except httpx.HTTPError as exc:
        print(f"gpumeter simulate inject: cannot reach {url}: {exc}", file=sys.stderr)
        return 1
    answer = response.json()
    if response.status_code != 200:
        print(f"gpumeter simulate inject: {answer.get('error')}", file=sys.stderr)
        return 2
    print(answer["done"])
    return 0


def run_docs_models(args: argparse.Namespace) -> int:
    from .simulator.models import render_capabilities_markdown

    sys.stdout.write(render_capabilities_markdown())
    return 0


def run_docs(args: argparse.Namespace) -> int:
    from .catalog import render_markdown

    sys.stdout.write(render_markdown())
    return 0
