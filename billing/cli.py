"""`gpumeter billing {prices check, ingest, price}`; `serve` is added by the composition root, gpumeter/service.py."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from gpumeter.billing.ingest import IngestConfig
from gpumeter.billing.models import hour_floor, hours_between
from gpumeter.billing.pricing.base import UTILIZATION_TIERS_USES

log = logging.getLogger(__name__)


# The span a ledger's hours can plausibly lie in (docs/billing.md §6.5): nothing was billed per GPU-hour
# from Prometheus before 2000 (Prometheus itself dates from 2012), and one command covers at most a
# leap year of hours: `--from 1970-01-01` wrote 48,747 empty runs before it was stopped (issue 42).
EARLIEST_HOUR = datetime(2000, 1, 1, tzinfo=UTC)
MAX_RANGE_HOURS = 366 * 24


def _when(text: str) -> datetime:
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
        moment = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
    except (ValueError, OverflowError):
        raise argparse.ArgumentTypeError(
            f"expected an ISO 8601 time such as 2026-11-01T00:00Z (value {text!r})"
        ) from None
    if not EARLIEST_HOUR <= moment <= datetime.now(UTC) + timedelta(days=MAX_RANGE_HOURS // 24):
        raise argparse.ArgumentTypeError(
            f"expected a time from {EARLIEST_HOUR.date().isoformat()} to a year from now (value {text!r})"
        )
    return moment


def _range_error(start: datetime | None, end: datetime | None) -> str | None:
    """Why --from/--to cannot be ingested or re-priced (one line), or None."""
    if start and end and start >= end:
        return f"--from must be before --to (value --from {start.isoformat()} --to {end.isoformat()})"
    if start and end and end - start > timedelta(hours=MAX_RANGE_HOURS):
        return (
            f"--from .. --to spans more than {MAX_RANGE_HOURS} hours; split it "
            f"(value --from {start.isoformat()} --to {end.isoformat()})"
        )
    return None


def _seconds(minimum: float, maximum: float, *, zero: bool = False):
    """Seconds in [minimum, maximum] (0 too, meaning none, where ``zero``)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected seconds (value {text!r})") from None
        if not (minimum <= value <= maximum or (zero and value == 0)):  # also refuses nan and inf
            raise argparse.ArgumentTypeError(
                f"expected seconds in [{minimum:g}, {maximum:g}]{' or 0 for none' if zero else ''} (value {text!r})"
            )
        return value

    return parse


# Seconds per sample a billing interval can be: Prometheus scrapes at 1 s at the finest, and one
# sample an hour is the billing window itself.
MIN_SCRAPE_INTERVAL, MAX_SCRAPE_INTERVAL = 1.0, 3600.0


def _label_name(text: str) -> str:
    import re

    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", text):
        raise argparse.ArgumentTypeError(f"expected a Prometheus label name (value {text!r})")
    return text


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
    parser.add_argument(
        "--teams",
        default=None,
        help="team map YAML: namespaces: {namespace: team}, or {cluster/namespace: team} for one cluster's",
    )
    parser.add_argument(
        "--utilization-tiers",
        choices=UTILIZATION_TIERS_USES,
        default=defaults.utilization_tiers,
        help="what the price book's utilization tiers do: report (a score on each tenant line, the "
        "default) or price (the tenant pays its tier's efficiency, the platform the rest; docs/billing.md §3.7)",
    )
    if prometheus:
        parser.add_argument(
            "--prometheus",
            default=defaults.prometheus,
            help="Prometheus (or Thanos, Mimir, VictoriaMetrics) query base URL; comma-separated URLs: the replicas of an HA pair, merged (docs/billing.md §6.2)",
        )
        parser.add_argument(
            "--prometheus-timeout",
            type=_seconds(1, 3600),
            default=defaults.prometheus_timeout,
            help=f"seconds for one query's whole answer (default {defaults.prometheus_timeout:g})",
        )
        parser.add_argument(
            "--deadline",
            type=_seconds(1, 7 * 24 * 3600, zero=True),
            default=defaults.deadline,
            help=f"seconds for the whole ingest; later hours are left to the next run (default {defaults.deadline:g}; 0: none)",
        )
        parser.add_argument(
            "--max-answer-mib",
            type=_count(1),
            default=defaults.max_answer_mib,
            help="MiB one Prometheus answer may hold; a larger one is refused as it streams in "
            f"(default {defaults.max_answer_mib})",
        )
        for flag, what in (
            (
                "--prometheus-bearer-token-file",
                "file holding the bearer token (env GPUMETER_PROMETHEUS_BEARER_TOKEN_FILE)",
            ),
            ("--prometheus-basic-auth-user", "basic-auth user (env GPUMETER_PROMETHEUS_BASIC_AUTH_USER)"),
            (
                "--prometheus-basic-auth-password-file",
                "file holding the basic-auth password (env GPUMETER_PROMETHEUS_BASIC_AUTH_PASSWORD_FILE)",
            ),
            ("--prometheus-cert-file", "TLS client certificate (env GPUMETER_PROMETHEUS_CERT_FILE)"),
            ("--prometheus-key-file", "its key (env GPUMETER_PROMETHEUS_KEY_FILE)"),
            (
                "--prometheus-ca-file",
                "CA certificates that sign Prometheus' (env GPUMETER_PROMETHEUS_CA_FILE)",
            ),
        ):
            parser.add_argument(flag, default=None, help=what)
        parser.add_argument(
            "--prometheus-config",
            default=None,
            help="Prometheus http_config YAML: bearer_token_file, basic_auth {username, password_file}, "
            "tls_config {cert_file, key_file, ca_file}; flags win over it (docs/security.md)",
        )
        parser.add_argument(
            "--scrape-interval",
            type=_interval,
            default=IngestConfig.scrape_interval,
            help="seconds per sample; hours whose samples show another interval are refused "
            "(default: auto, derived per exporter and hour from the samples, docs/billing.md §2.1)",
        )
        parser.add_argument(
            "--cluster-label",
            type=_label_name,
            default=defaults.cluster_label,
            help="the label a global store (VictoriaMetrics, Thanos, Mimir) names each series' cluster by; "
            "series without it are one cluster, billed as before (default: cluster, env "
            "GPUMETER_CLUSTER_LABEL; docs/billing.md §2.3)",
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


AUTH_FIELDS = (
    "prometheus_bearer_token_file",
    "prometheus_basic_auth_user",
    "prometheus_basic_auth_password_file",
    "prometheus_cert_file",
    "prometheus_key_file",
    "prometheus_ca_file",
)


def settings_from(args):
    """The Settings of the command line: its flags, then its --prometheus-config file, then the
    environment (Settings' defaults). ConfigError for an http_config file that cannot be used."""
    from gpumeter.billing.config import Settings, load_http_config

    defaults = Settings()
    from_file = load_http_config(args.prometheus_config) if getattr(args, "prometheus_config", None) else {}
    auth = {
        name: getattr(args, name, None) or from_file.get(name) or getattr(defaults, name)
        for name in AUTH_FIELDS
    }
    return Settings(
        prometheus_timeout=getattr(args, "prometheus_timeout", defaults.prometheus_timeout),
        deadline=getattr(args, "deadline", defaults.deadline),
        max_answer_mib=getattr(args, "max_answer_mib", defaults.max_answer_mib),
        **auth,
        db=args.db,
        schema=args.db_schema,
        prometheus=getattr(args, "prometheus", Settings().prometheus),
        prices=args.prices,
        teams_file=args.teams,
        scrape_interval=getattr(args, "scrape_interval", IngestConfig.scrape_interval),
        gap_grace_intervals=getattr(args, "gap_grace_intervals", IngestConfig.gap_grace_intervals),
        catchup_hours=getattr(args, "catchup_hours", IngestConfig.catchup_hours),
        workers=getattr(args, "workers", IngestConfig.workers),
        utilization_tiers=getattr(args, "utilization_tiers", "report"),
        cluster_label=getattr(args, "cluster_label", defaults.cluster_label),
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

    ingest.add_argument("--reason", default="", help="why, kept in the audit of any billed hour this changes")

    price = sub.add_parser("price", help="re-price stored hours with the current price book")
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


def actor_of(command: str, reason: str = ""):
    """Who runs this command: named in the audit records it writes (docs/billing.md §6.6)."""
    import getpass
    import uuid

    from gpumeter.billing.ledger.base import Actor

    try:
        operator = getpass.getuser()
    except (KeyError, OSError):  # no login name (a container's arbitrary uid)
        operator = f"uid {os.getuid()}"
    return Actor(command, operator, reason, uuid.uuid4().hex)


def _months(start: datetime, end: datetime) -> tuple[datetime, datetime]:
    """The calendar months (UTC) that [start, end) touches, as one span."""
    first = start.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    last = (end - timedelta(microseconds=1)).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    after = (
        last.replace(year=last.year + 1, month=1) if last.month == 12 else last.replace(month=last.month + 1)
    )
    return first, after


def currency_error(ledger, book, path: str, start: datetime, end: datetime) -> str | None:
    """Why ``book`` cannot price [start, end): the ledger bills those months in another currency,
    and a month's lines in two currencies cannot be summed by any report (one line), or None."""
    first, after = _months(start, end)
    others = ledger.currencies(first, after) - {book.currency}
    if not others:
        return None
    return (
        f"{path}: currency: the ledger bills {first.date().isoformat()}..{after.date().isoformat()} in "
        f"{', '.join(sorted(others))}, not this book's currency (value {book.currency!r})"
    )


def _money(amount: Decimal, currency: str) -> str:
    """An amount at its currency's minor unit (the ledger keeps 4 decimals)."""
    from gpumeter.billing.pricing.currency import MINOR_UNITS

    return str(amount.quantize(Decimal(1).scaleb(-MINOR_UNITS.get(currency, 2))))


def _changed(ledger, run: str) -> str | None:
    """What this run did to hours billed before it (its audit records), in one line, or None."""
    records = [r for r in ledger.audit_records() if r.run == run]
    if not records:
        return None
    old = sum((r.old_total for r in records), Decimal(0))
    new = sum((r.new_total for r in records), Decimal(0))
    currency = records[0].currency
    return (
        f"{len(records)} already-billed hour(s) changed from {_money(old, currency)} to "
        f"{_money(new, currency)} {currency} "
        f"({records[0].hour.isoformat()}..{records[-1].hour.isoformat()}); `gpumeter billing audit` lists them"
    )


def load_inputs(args):
    """Price book and team map, validated before any database is opened (errors write nothing)."""
    from gpumeter.billing.config import ConfigError, load_team_file
    from gpumeter.billing.pricing import PriceBookError

    try:
        book = settings_from(args).price_book()
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

    from gpumeter.billing.config import ConfigError
    from gpumeter.billing.ingest import FAILURES_LOGGER, catch_up, ingest_hours
    from gpumeter.billing.ledger import open_ledger
    from gpumeter.billing.ledger.base import LedgerError
    from gpumeter.billing.prom import PrometheusError, open_client

    logging.getLogger(FAILURES_LOGGER).setLevel(logging.CRITICAL + 1)  # printed below, one line each

    wrong = _range_error(args.start, args.end)
    if wrong:
        print(f"error: {wrong}", file=sys.stderr)
        return 2
    book, _ = load_inputs(args)  # the team map is re-read into the ingest config below
    if book is None:
        return 2
    try:
        settings = settings_from(args)
        config = settings.ingest_config()
        client = open_client(settings.prometheus, **settings.client_options())
    except (ConfigError, PrometheusError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    now = datetime.now(UTC)
    try:
        ledger = open_ledger(settings.db, schema=settings.schema)
    except LedgerError as exc:
        client.close()
        print(f"error: {exc}", file=sys.stderr)
        return 1

    def progress(hours):
        return tqdm(hours, unit="h", desc="ingest", disable=args.no_progress, file=sys.stderr)

    ledger.actor = actor_of("ingest", args.reason)
    closed = hour_floor(now - config.settle)  # the open hour and the future are not billable yet
    if args.start or args.end:
        end = min(args.end or closed, closed)
        start = min(args.start or end, end)
    else:
        start, end = closed - timedelta(hours=config.catchup_hours), closed
    try:
        with client:
            wrong = currency_error(ledger, book, args.prices, start, max(end, start + timedelta(hours=1)))
            if wrong:
                print(f"error: {wrong}", file=sys.stderr)
                return 2
            with ledger.serialised(shared=True) as waited:
                if waited:
                    print("note: waited for a re-price of this ledger to finish", file=sys.stderr)
                if args.start or args.end:
                    if args.end and args.end > closed:
                        print(
                            f"note: --to {args.end.isoformat()} is past the last closed hour; ingesting up to "
                            f"{closed.isoformat()} (later hours are caught up once they close)",
                            file=sys.stderr,
                        )
                    result = ingest_hours(client, ledger, book, hours_between(start, end), config, progress)
                else:
                    result = catch_up(client, ledger, book, now, config, progress)
            changed = _changed(ledger, ledger.actor.run)
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
    if changed:
        print(f"note: {changed}", file=sys.stderr)
    for hour, error in result.failed:
        print(f"error: hour {hour.isoformat()} not ingested: {error}", file=sys.stderr)
    for hour, why in result.refused:  # the hour's other GPU-hours are billed; `billing status` lists these
        print(f"error: hour {hour.isoformat()}: {why}", file=sys.stderr)
    return 1 if result.failed or result.refused else 0


def cmd_price(args) -> int:
    from gpumeter.billing.ingest import reprice
    from gpumeter.billing.ledger import open_ledger
    from gpumeter.billing.ledger.base import LedgerError

    wrong = _range_error(args.start, args.end)
    if wrong:
        print(f"error: {wrong}", file=sys.stderr)
        return 2
    book, teams = load_inputs(args)
    if book is None:
        return 2
    try:
        ledger = open_ledger(args.db, schema=args.db_schema)
        ledger.actor = actor_of("price", args.reason)
        try:
            wrong = currency_error(ledger, book, args.prices, args.start, args.end)
            if wrong:
                print(f"error: {wrong}", file=sys.stderr)
                return 2
            with ledger.serialised(shared=False) as waited:
                if waited:
                    print("note: waited for the ingests running on this ledger to finish", file=sys.stderr)
                count = reprice(ledger, book, args.start, args.end, teams)
            changed = _changed(ledger, ledger.actor.run)
        finally:
            ledger.close()
    except LedgerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"re-priced {count} hour(s)")
    if changed:
        print(f"note: {changed}", file=sys.stderr)
    return 0


def _print_refused(refused) -> None:
    """The GPU-hours left unbilled for a refused reading, one line each, then a count (or nothing)."""
    if not refused:
        return
    print("refused\thour\tuuid\treason")
    for r in refused:
        gpu = f"{r.cluster}/{r.uuid}" if r.cluster else r.uuid
        print(f"{r.refused_at.isoformat(timespec='seconds')}\t{r.hour.isoformat()}\t{gpu}\t{r.reason}")
    print(
        f"{len(refused)} GPU-hour(s) refused and not billed; catch-up retries their hours "
        "(docs/billing.md §6.5)"
    )


def _read_ledger(args, read):
    """``read(ledger)`` over the ledger --db names, opened and closed here; None (the error printed) when
    the ledger cannot be opened or read."""
    from gpumeter.billing.config import Settings
    from gpumeter.billing.ledger import open_ledger
    from gpumeter.billing.ledger.base import LedgerError

    try:
        ledger = open_ledger(args.db or Settings().db, schema=args.db_schema)
        try:
            return read(ledger)
        finally:
            ledger.close()
    except LedgerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None


def cmd_status(args) -> int:
    """The newest hour billed, the runs by status, and the refused GPU-hours still outstanding."""
    read = _read_ledger(
        args, lambda ledger: (ledger.summary(), ledger.refused_gpu_hours(args.start, args.end))
    )
    if read is None:
        return 1
    summary, refused = read
    last = summary.last_success
    print(f"last hour billed: {last.isoformat() if last is not None else 'none'}")
    print("ingest runs: " + (", ".join(f"{s} {n}" for s, n in sorted(summary.runs.items())) or "none"))
    if refused:
        _print_refused(refused)
    else:
        print("refused GPU-hours: none")
    return 0


def cmd_audit(args) -> int:
    """One line per changed hour, then one per run: when, which command, who, why, which book."""
    read = _read_ledger(
        args,
        lambda ledger: (
            ledger.audit_records(args.start, args.end),
            ledger.refused_gpu_hours(args.start, args.end),
        ),
    )
    if read is None:
        return 1
    records, refused = read
    _print_refused(refused)
    if not records:
        print("no billed hour was changed")
        return 0
    print("at\tcommand\toperator\treason\tbook\thour\told\tnew\tcurrency")
    for r in records:
        print(
            f"{r.at.isoformat(timespec='seconds')}\t{r.command}\t{r.operator!r}\t{r.reason!r}\t"
            f"{r.book_digest[:12]}\t{r.hour.isoformat()}\t{_money(r.old_total, r.currency)}\t"
            f"{_money(r.new_total, r.currency)}\t{r.currency}"
        )
    runs: dict[str, list] = {}
    for r in records:
        runs.setdefault(r.run, []).append(r)
    for rows in runs.values():
        old = sum((r.old_total for r in rows), Decimal(0))
        new = sum((r.new_total for r in rows), Decimal(0))
        first = rows[0]
        print(
            f"{first.at.isoformat(timespec='seconds')} {first.command} by {first.operator!r}: {len(rows)} hour(s), "
            f"total {_money(old, first.currency)} -> {_money(new, first.currency)} {first.currency}"
            + (f" ({first.reason!r})" if first.reason else "")
        )
    return 0
