"""`gpumeter billing {prices check, ingest, price}`; `serve` is added by the composition root, gpumeter/service.py."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from datetime import UTC, datetime

from gpumeter.billing.ingest import IngestConfig
from gpumeter.billing.models import hour_floor, hours_between

log = logging.getLogger(__name__)


def _when(text: str) -> datetime:
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an ISO 8601 time such as 2026-11-01T00:00Z (value {text!r})"
        ) from None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


# Seconds per sample a billing interval can be: Prometheus scrapes at 1 s at the finest, and one
# sample an hour is the billing window itself.
MIN_SCRAPE_INTERVAL, MAX_SCRAPE_INTERVAL = 1.0, 3600.0


def _interval(text: str) -> float:
    if text == "auto":
        return 0.0
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds or 'auto' (value {text!r})") from None
    if not (MIN_SCRAPE_INTERVAL <= value <= MAX_SCRAPE_INTERVAL):  # also refuses nan and inf
        raise argparse.ArgumentTypeError(
            f"expected seconds in [{MIN_SCRAPE_INTERVAL:g}, {MAX_SCRAPE_INTERVAL:g}] or 'auto' (value {text!r})"
        )
    return value


def _count(minimum: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number (value {text!r})") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected at least {minimum} (value {text!r})")
        return value

    return parse


def common_arguments(parser: argparse.ArgumentParser, *, prometheus: bool = True) -> None:
    from gpumeter.billing.config import Settings

    defaults = Settings()
    parser.add_argument(
        "--db", default=defaults.db, help="SQLAlchemy URL of the ledger (env GPUMETER_BILLING_DB)"
    )
    parser.add_argument("--db-schema", default=None, help="PostgreSQL schema (search_path) for the ledger")
    parser.add_argument(
        "--prices", default=defaults.prices, help="price book YAML (default: the shipped book)"
    )
    parser.add_argument("--teams", default=None, help="team map YAML: namespaces: {namespace: team}")
    if prometheus:
        parser.add_argument(
            "--prometheus",
            default=defaults.prometheus,
            help="Prometheus (or Thanos, Mimir, VictoriaMetrics) query base URL; comma-separated URLs: the replicas of an HA pair, merged (docs/billing.md §6.2)",
        )
        parser.add_argument(
            "--scrape-interval",
            type=_interval,
            default=IngestConfig.scrape_interval,
            help="seconds per sample; hours whose samples show another interval are refused "
            "(default: auto, derived per exporter and hour from the samples, docs/billing.md §2.1)",
        )
        parser.add_argument(
            "--gap-grace-intervals",
            type=_count(0),
            default=IngestConfig.gap_grace_intervals,
            help=f"missed scrapes bridged (default {IngestConfig.gap_grace_intervals})",
        )
        parser.add_argument(
            "--catchup-hours",
            type=_count(1),
            default=IngestConfig.catchup_hours,
            help=f"catch-up window in hours (default {IngestConfig.catchup_hours})",
        )


def settings_from(args):
    from gpumeter.billing.config import Settings

    return Settings(
        db=args.db,
        schema=args.db_schema,
        prometheus=getattr(args, "prometheus", Settings().prometheus),
        prices=args.prices,
        teams_file=args.teams,
        scrape_interval=getattr(args, "scrape_interval", IngestConfig.scrape_interval),
        gap_grace_intervals=getattr(args, "gap_grace_intervals", IngestConfig.gap_grace_intervals),
        catchup_hours=getattr(args, "catchup_hours", IngestConfig.catchup_hours),
        workers=getattr(args, "workers", IngestConfig.workers),
    )


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
        default=min(2, os.cpu_count() or 1),
        help="processes ingesting runs of hours side by side (default: 2, or 1 on a single CPU)",
    )
    ingest.set_defaults(func=cmd_ingest)

    price = sub.add_parser("price", help="re-price stored hours with the current price book")
    common_arguments(price, prometheus=False)
    price.add_argument("--from", dest="start", type=_when, required=True)
    price.add_argument("--to", dest="end", type=_when, required=True)
    price.set_defaults(func=cmd_price)
    return sub


def load_inputs(args):
    """Price book and team map, validated before any database is opened (errors write nothing)."""
    from gpumeter.billing.config import ConfigError, load_team_file
    from gpumeter.billing.pricing import PriceBookError, load_price_book

    try:
        book = load_price_book(args.prices)
        team_file = load_team_file(args.teams) if args.teams else None
        # a budget in another currency would never be compared with the costs (the alerts join on it)
        for team, budget in (team_file.budgets if team_file else {}).items():
            if budget.currency != book.currency:
                raise ConfigError(
                    f"{args.teams}: budgets.{team}.currency: not the price book's currency {book.currency} "
                    f"(value {budget.currency!r})"
                )
    except (PriceBookError, ConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None, None
    return book, team_file.namespaces if team_file else {}


def cmd_prices_default(args) -> int:
    from gpumeter.billing.pricing.static import DEFAULT_BOOK

    sys.stdout.write(DEFAULT_BOOK.read_text(encoding="utf-8"))
    return 0


def cmd_prices_check(args) -> int:
    from gpumeter.billing.pricing import PriceBookError, load_price_book

    try:
        book = load_price_book(args.file)
    except PriceBookError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{args.file}: OK, currency {book.currency}, {len(book.versions)} version(s)")
    for version in book.versions:
        until = version.effective_to.isoformat() if version.effective_to else "open"
        print(
            f"  {version.effective_from.isoformat()} .. {until}  slice_weight={version.slice_weight} "
            f"idle={version.idle} sharing={ {k: str(v) for k, v in version.sharing_efficiency.items()} }"
        )
        for model, price in sorted(version.gpus.items()):
            print(
                f"    {model:<12} {price.hourly_rate} {book.currency}/h{' (derived)' if price.derived else ''}"
            )
    return 0


def cmd_ingest(args) -> int:
    from tqdm import tqdm

    from gpumeter.billing.ingest import FAILURES_LOGGER, catch_up, ingest_hours
    from gpumeter.billing.ledger import open_ledger
    from gpumeter.billing.ledger.base import LedgerError
    from gpumeter.billing.prom import open_client

    logging.getLogger(FAILURES_LOGGER).setLevel(logging.CRITICAL + 1)  # printed below, one line each

    if args.start and args.end and args.start >= args.end:
        print(
            f"error: --from must be before --to (value --from {args.start.isoformat()} --to {args.end.isoformat()})",
            file=sys.stderr,
        )
        return 2
    book, _ = load_inputs(args)  # the team map is re-read into the ingest config below
    if book is None:
        return 2
    settings = settings_from(args)
    config = settings.ingest_config()
    now = datetime.now(UTC)
    try:
        ledger = open_ledger(settings.db, schema=settings.schema)
    except LedgerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1

    def progress(hours):
        return tqdm(hours, unit="h", desc="ingest", disable=args.no_progress, file=sys.stderr)

    try:
        with open_client(settings.prometheus) as client:
            if args.start or args.end:
                closed = hour_floor(now - config.settle)  # the open hour and the future are not billable yet
                end = min(args.end or closed, closed)
                if args.end and args.end > closed:
                    print(
                        f"note: --to {args.end.isoformat()} is past the last closed hour; ingesting up to "
                        f"{closed.isoformat()} (later hours are caught up once they close)",
                        file=sys.stderr,
                    )
                start = args.start or end
                result = ingest_hours(client, ledger, book, hours_between(start, end), config, progress)
            else:
                result = catch_up(client, ledger, book, now, config, progress)
    except LedgerError as exc:  # the ledger was lost past its retries before any hour could be recorded
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        ledger.close()
    print(f"ingested {len(result.ingested)} hour(s); unpriced GPU-hours: {result.unpriced_gpu_hours}")
    if result.empty:
        print(
            f"note: {len(result.empty)} hour(s) from {result.empty[0].isoformat()} had no series in Prometheus; "
            "nothing was written for them and catch-up retries them",
            file=sys.stderr,
        )
    for hour, why in result.suspect:
        print(f"warning: hour {hour.isoformat()} ingested but suspect: {why}", file=sys.stderr)
    for hour, error in result.failed:
        print(f"error: hour {hour.isoformat()} not ingested: {error}", file=sys.stderr)
    return 1 if result.failed else 0


def cmd_price(args) -> int:
    from gpumeter.billing.ingest import reprice
    from gpumeter.billing.ledger import open_ledger
    from gpumeter.billing.ledger.base import LedgerError

    book, teams = load_inputs(args)
    if book is None:
        return 2
    try:
        ledger = open_ledger(args.db, schema=args.db_schema)
        try:
            count = reprice(ledger, book, args.start, args.end, teams)
        finally:
            ledger.close()
    except LedgerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"re-priced {count} hour(s)")
    return 0
