"""The `gpumeter` command: one entry point, subcommands contributed by each part of the stack.

Each part owns its subcommands in its own `cli.py` with a `register(subparsers)` function, so this
file only lists the parts.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from gpumeter import __version__

# Each part's module (``module:function`` where the function is not ``register``), by the commands it
# registers. A command loads only its own part, so the exporter does not carry billing's SQLAlchemy
# and Alembic, nor the simulator's and the doctor's gRPC, in its resident memory.
PARTS = {
    "gpumeter.exporter.cli": ("exporter", "docs"),
    "gpumeter.simulator.cli": ("simulate",),
    "gpumeter.exporter.cli:register_doctor": ("doctor",),
    "gpumeter.billing.cli": ("billing",),
    "gpumeter.reports.cli": ("report",),
    "gpumeter.dashboards.cli": ("dashboards",),
    "gpumeter.alerts.cli": ("alerts",),
    "gpumeter.deploy.demo": ("demo",),
}


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpumeter", description="GPU and MIG monitoring, alerting and chargeback."
    )
    parser.add_argument("--version", action="version", version=f"gpumeter {__version__}")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    words = set(sys.argv[1:] if argv is None else argv)
    wanted = [name for name, commands in PARTS.items() if words & set(commands)]
    registered = {}
    for name in wanted or PARTS:  # no known command given: all of them, for --help
        module_name, _, function = name.partition(":")
        registered[name] = getattr(importlib.import_module(module_name), function or "register")(subparsers)
    if "gpumeter.billing.cli" in registered:
        # `billing serve` runs the composition root, which sits above billing and reports
        from gpumeter import service

        service.register(registered["gpumeter.billing.cli"])
    return parser


def escaped(text: str) -> str:
    """``text`` with every control and invisible character (a newline, an ESC that would drive the
    terminal, a zero-width space) written as its Python escape: one log line stays one line and
    shows what came (label values and Prometheus' error text are anyone's: a terminal must not obey them)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


class EscapingFormatter(logging.Formatter):
    """Every log line's message escaped (`escaped`); a traceback keeps its own lines, each escaped."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return escaped(super().formatMessage(record))

    def formatException(self, ei) -> str:
        return "\n".join(map(escaped, super().formatException(ei).split("\n")))


def main(argv: list[str] | None = None) -> int:
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(EscapingFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=args.log_level.upper(), handlers=[handler])
    # one line per request, or alembic's "setup plugin ..." on every start, drowns what matters
    for chatty in ("httpx", "httpcore", "alembic"):
        logging.getLogger(chatty).setLevel(max(logging.WARNING, logging.getLogger().level))
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:  # Ctrl-C in a command that does not stop on it itself: no traceback
        print("gpumeter: interrupted", file=sys.stderr)
        return 130  # 128 + SIGINT, as a shell reports it


if __name__ == "__main__":
    sys.exit(main())
