"""`gpumeter billing {prices check, ingest, price}`; `serve` is added by the composition root, gpumeter/service.py."""

from __future__ import annotations

from gpumeter.billing.arguments import _count, _when, common_arguments

# the composition root's `serve` and reports' commands take these from here
from gpumeter.billing.arguments import _label_name as _label_name
from gpumeter.billing.arguments import settings_from as settings_from

# the handlers are looked up here when the parsers are built, so one put in their place is the one run
from gpumeter.billing.commands import (
    cmd_audit,
    cmd_ingest,
    cmd_price,
    cmd_prices_check,
    cmd_prices_default,
    cmd_status,
)
from gpumeter.billing.commands import load_inputs as load_inputs


def register(subparsers):
    """Add `gpumeter billing ...`; returns its sub-command action, so the composition root
    (gpumeter/service.py) can add `serve` without billing importing it."""
    billing = subparsers.add_parser("billing", help="chargeback: price book, hourly ingest, ledger, service")
    sub = billing.add_subparsers(dest="billing_command", required=True, metavar="SUBCOMMAND")

    prices = sub.add_parser("prices", help="price books")
    prices_sub = prices.add_subparsers(dest="prices_command", required=True, metavar="ACTION")
    check = prices_sub.add_parser("check", help="validate a price book and print its rates")
    check.add_argument("file")
    check.set_defaults(func=cmd_prices_check)
    default = prices_sub.add_parser(
        "default",
        help="print the price book gpumeter ships (the one used without --prices), to copy and edit",
    )
    default.set_defaults(func=cmd_prices_default)

    ingest = sub.add_parser(
        "ingest", help="ingest closed hours from Prometheus (default: catch up missed hours)"
    )
    common_arguments(ingest)
    ingest.add_argument("--from", dest="start", type=_when, help="first hour (ISO 8601, UTC)")
    ingest.add_argument("--to", dest="end", type=_when, help="end, exclusive (ISO 8601, UTC)")
    ingest.add_argument("--no-progress", action="store_true", help="no progress bar")
    ingest.add_argument(
        "--workers",
        type=_count(1),
        default=None,  # min(2, usable_cpus()), worked out by the ingest that needs it (`settings_from`)
        help="processes ingesting runs of hours side by side (default: 2, or 1 where one CPU is usable, a container's CPU limit included)",
    )
    ingest.set_defaults(func=cmd_ingest)

    ingest.add_argument("--reason", default="", help="why, kept in the audit of any billed hour this changes")
    ingest.add_argument(
        "--drop-missing-clusters",
        action="store_true",
        help="replace an already-billed hour even where a cluster billed in it has no series now, its lines "
        "going (a renamed cluster label); by default such an hour is kept as billed and the run fails",
    )

    price = sub.add_parser(
        "price",
        help="re-price stored hours with the current price book",
        description="Re-price stored hours with the current price book. Each hour's namespaces keep the "
        "teams their lines were billed to, but where --teams names them (docs/billing.md §6.1).",
    )
    common_arguments(price, prometheus=False)
    price.add_argument("--from", dest="start", type=_when, required=True)
    price.add_argument("--to", dest="end", type=_when, required=True)
    price.add_argument("--reason", default="", help="why, kept in the audit of every hour this changes")
    price.set_defaults(func=cmd_price)

    audit = sub.add_parser("audit", help="list the changes to already-billed hours (re-price, re-ingest)")
    audit.add_argument("--db", default=None, help="SQLAlchemy URL of the ledger (env GPUMETER_BILLING_DB)")
    audit.add_argument("--db-schema", default=None, help="PostgreSQL schema (search_path) for the ledger")
    audit.add_argument("--from", dest="start", type=_when, help="first hour (ISO 8601, UTC)")
    audit.add_argument("--to", dest="end", type=_when, help="end, exclusive")
    audit.set_defaults(func=cmd_audit)

    status = sub.add_parser(
        "status", help="the ledger's ingest state: last hour billed, runs, refused GPU-hours"
    )
    status.add_argument("--db", default=None, help="SQLAlchemy URL of the ledger (env GPUMETER_BILLING_DB)")
    status.add_argument("--db-schema", default=None, help="PostgreSQL schema (search_path) for the ledger")
    status.add_argument("--from", dest="start", type=_when, help="first hour (ISO 8601, UTC)")
    status.add_argument("--to", dest="end", type=_when, help="end, exclusive")
    status.set_defaults(func=cmd_status)
    return sub
