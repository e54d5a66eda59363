"""The `gpumeter` command: one entry point, subcommands contributed by each part of the stack.

Each part owns its subcommands in its own `cli.py` with a `register(subparsers)` function, so this
file only lists the parts.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

__version__ = "0.1.0"

# (module, ...) each exposing register(subparsers); imported lazily so a subcommand's heavy
# dependencies load only when it runs.
PARTS = ("exporter.cli", "billing.cli", "reports.cli", "dashboards.cli", "alerts.cli", "deploy.demo")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpumeter", description="GPU and MIG monitoring, alerting and chargeback."
    )
    parser.add_argument("--version", action="version", version=f"gpumeter {__version__}")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in PARTS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # that part is not built yet
                continue
            raise
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    for chatty in ("httpx", "httpcore"):  # one line per request drowns what matters
        logging.getLogger(chatty).setLevel(max(logging.WARNING, logging.getLogger().level))
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
