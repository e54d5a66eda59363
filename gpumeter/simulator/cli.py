"""``gpumeter simulate …``: inject faults into a running simulated exporter, run the stand-ins (kubelet,
Kubernetes API, kube-state-metrics, volcano-scheduler, dcgm-exporter) and write histories."""

from __future__ import annotations

import argparse
import math
import sys

__all__ = ["register"]


def register(subparsers) -> None:
    simulate = subparsers.add_parser(
        "simulate",
        help="the simulator: inject faults, stand-ins (kubelet, Kubernetes API, kube-state-metrics, volcano-scheduler), history",
    )
    sim = simulate.add_subparsers(dest="simulate_command", required=True, metavar="WHAT")
    inject = sim.add_parser("inject", help="inject a fault into a running simulated exporter")
    from .device import FAULTS

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
        from . import kubelet as stand_in_kubelet
    except ImportError:
        stand_in_kubelet = None
    if stand_in_kubelet is not None and hasattr(stand_in_kubelet, "add_parser"):
        stand_in_kubelet.add_parser(sim)
    try:
        from . import history
    except ImportError:
        history = None
    if history is not None:
        history.add_parser(sim)
    from . import dcgm_exporter, kube_state_metrics, kubeapi, volcano

    kubeapi.add_parser(sim)
    kube_state_metrics.add_parser(sim)
    volcano.add_parser(sim)
    dcgm_exporter.add_parser(sim)


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
            params = dict(_parameter(p) for p in args.set)
            # JSON has no NaN or infinity: refused here, naming the value, not a traceback from the encoder
            for key, value in params.items():
                if isinstance(value, float) and not math.isfinite(value):
                    print(
                        f"gpumeter simulate inject: --set {key}: not a finite number (value {value!r})",
                        file=sys.stderr,
                    )
                    return 2
            response = httpx.post(url, json={"fault": args.fault, "gpu": args.gpu, **params}, timeout=10)
    except httpx.HTTPError as exc:
        print(f"gpumeter simulate inject: cannot reach {url}: {exc}", file=sys.stderr)
        return 1
    answer = response.json()
    if response.status_code != 200:
        print(f"gpumeter simulate inject: {answer.get('error')}", file=sys.stderr)
        return 2
    print(answer["done"])
    return 0
