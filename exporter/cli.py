"""``gpumeter exporter``, ``gpumeter doctor`` and ``gpumeter docs``."""

from __future__ import annotations

import argparse
import gc
import sys
import threading

from gpumeter.process import stop_on_signals, wait_until_set

from . import config as exporter_config

__all__ = ["register", "register_doctor"]


def register(subparsers) -> None:
    """``exporter`` and ``docs``. The doctor's commands register apart (gpumeter/cli.py PARTS), as the
    simulator's do in gpumeter.simulator.cli: their modules carry gRPC, which the exporter loads only with a
    kubelet socket."""
    exporter = subparsers.add_parser("exporter", help="serve NVML (or simulated) GPU metrics for Prometheus")
    exporter_config.add_arguments(exporter)
    exporter.set_defaults(func=run_exporter)

    docs = subparsers.add_parser("docs", help="generated documentation")
    docs_sub = docs.add_subparsers(dest="docs_command", required=True, metavar="WHAT")
    docs_sub.add_parser("metrics", help="print docs/metrics.md from the catalog").set_defaults(func=run_docs)
    docs_sub.add_parser(
        "models", help="print the simulated GPU models' capability tables (docs/simulator.md)"
    ).set_defaults(func=run_docs_models)


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
        # the scheme the listener speaks: an on-call engineer copies this line into curl
        f"gpumeter exporter: serving {exporter.servers[0].scheme}://{config.listen}/metrics"
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


def run_docs_models(args: argparse.Namespace) -> int:
    from gpumeter.simulator.models import render_capabilities_markdown

    sys.stdout.write(render_capabilities_markdown())
    return 0


def run_docs(args: argparse.Namespace) -> int:
    from .catalog import render_markdown

    sys.stdout.write(render_markdown())
    return 0
