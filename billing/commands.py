"""What `gpumeter billing`'s commands do, once their arguments are parsed (billing/arguments.py):
each validates its inputs before it opens the ledger, and prints one line per error."""

from __future__ import annotations

import logging
import os
import sys
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import TYPE_CHECKING

from gpumeter.billing.arguments import _range_error, settings_from
from gpumeter.billing.models import HOUR, hours_between, whole_hours

if TYPE_CHECKING:  # the ledger is opened only by the commands that use it
    from gpumeter.billing.ledger.base import ReportLedger

log = logging.getLogger(__name__)


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


def currency_error(ledger: ReportLedger, book, path: str, start: datetime, end: datetime) -> str | None:
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


# how the audit names a record written before revision 0015, whose totals are the hour's over every
# cluster and team, and lines billed to no team (the platform's, a namespace without one)
AUDIT_EVERY_CLUSTER, AUDIT_EVERY_TEAM, AUDIT_NO_TEAM = "(every cluster)", "(every team)", "(no team)"


def _money(amount: Decimal, currency: str) -> str:
    """An amount at its currency's minor unit (the ledger keeps 4 decimals)."""
    from gpumeter.billing.pricing.currency import MINOR_UNITS

    return str(amount.quantize(Decimal(1).scaleb(-MINOR_UNITS.get(currency, 2))))


def _changed(ledger: ReportLedger, run: str) -> str | None:
    """What this run did to hours billed before it (its audit records), in one line, or None."""
    records = [r for r in ledger.audit_records() if r.run == run]
    if not records:
        return None
    old = sum((r.old_total for r in records), Decimal(0))
    new = sum((r.new_total for r in records), Decimal(0))
    currency = records[0].currency
    hours = sorted({r.hour for r in records})  # a record per cluster whose total changed
    return (
        f"{len(hours)} already-billed hour(s) changed from {_money(old, currency)} to "
        f"{_money(new, currency)} {currency} "
        f"({hours[0].isoformat()}..{hours[-1].isoformat()}); `gpumeter billing audit` lists them"
    )


def _say_whole_hours(args) -> None:
    """--from/--to as the whole hours billing counts (`whole_hours`), saying so where one moved."""
    args.start, args.end, notes = whole_hours(args.start, args.end)
    for note in notes:
        print(note, file=sys.stderr)


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

    _say_whole_hours(args)
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
    window = config.catchup_window(now)
    closed = window[1]  # the open hour and the future are not billable yet
    if args.start or args.end:
        end = min(args.end or closed, closed)
        start = min(args.start or end, end)
    else:
        start, end = window
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

    _say_whole_hours(args)
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
    _say_whole_hours(args)
    read = _read_ledger(
        args, lambda ledger: (ledger.summary(), ledger.refused_gpu_hours(args.start, args.end))
    )
    if read is None:
        return 1
    summary, refused = read
    # the summary holds the END of the newest hour billed (when billing was done to); an hour is
    # named by its start everywhere else (the refused rows below, reports, --from), so it is here
    last = summary.last_success
    print(
        "last hour billed: "
        + (f"the hour starting {(last - HOUR).isoformat()}" if last is not None else "none")
    )
    print("ingest runs: " + (", ".join(f"{s} {n}" for s, n in sorted(summary.runs.items())) or "none"))
    if refused:
        _print_refused(refused)
    else:
        print("refused GPU-hours: none")
    return 0


def cmd_audit(args) -> int:
    """One line per changed hour, cluster and team, then one per run: when, which command, who, why,
    which book."""
    _say_whole_hours(args)
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
    # a cluster column only where the store labels clusters: a single cluster's audit needs none
    clustered = any(r.cluster != "" for r in records)
    print(
        "at\tcommand\toperator\treason\tbook\thour\t"
        + ("cluster\t" if clustered else "")
        + "team\told\tnew\tcurrency"
    )
    for r in records:
        cluster = f"{AUDIT_EVERY_CLUSTER if r.cluster is None else r.cluster}\t" if clustered else ""
        team = AUDIT_EVERY_TEAM if r.team is None else r.team or AUDIT_NO_TEAM
        print(
            f"{r.at.isoformat(timespec='seconds')}\t{r.command}\t{r.operator!r}\t{r.reason!r}\t"
            f"{r.book_digest[:12]}\t{r.hour.isoformat()}\t{cluster}{team}\t"
            f"{_money(r.old_total, r.currency)}\t{_money(r.new_total, r.currency)}\t{r.currency}"
        )
    runs: dict[str, list] = {}
    for r in records:
        runs.setdefault(r.run, []).append(r)
    for rows in runs.values():
        old = sum((r.old_total for r in rows), Decimal(0))
        new = sum((r.new_total for r in rows), Decimal(0))
        first = rows[0]
        hours = len({r.hour for r in rows})
        print(
            f"{first.at.isoformat(timespec='seconds')} {first.command} by {first.operator!r}: {hours} hour(s), "
            f"total {_money(old, first.currency)} -> {_money(new, first.currency)} {first.currency}"
            + (f" ({first.reason!r})" if first.reason else "")
        )
    return 0
