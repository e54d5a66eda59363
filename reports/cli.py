"""`gpumeter report --period 2026-10 --by team --format html,csv,focus --out DIR` (docs/reports.md)."""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from pathlib import Path

from gpumeter.reports.files import ReportWriteError


def _when(flag: str, text: str | None) -> datetime | None:
    """An ISO 8601 moment in UTC; a bad one is the command's one-line error (argparse's would add
    its usage), so --from/--to are read as text and parsed here."""
    from gpumeter.reports.model import ReportError

    if text is None:
        return None
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ReportError(f"period: {flag} is not an ISO 8601 date or time (value {text!r})") from None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _formats(text: str) -> tuple[str, ...]:
    from gpumeter.reports.render import FORMATS

    formats = tuple(dict.fromkeys(f.strip() for f in text.split(",") if f.strip()))
    if text.strip() == "all":
        return FORMATS
    bad = [f for f in formats if f not in FORMATS]
    if bad or not formats:
        raise argparse.ArgumentTypeError(
            f"expected a comma list of {', '.join(FORMATS)} or 'all' (value {text!r})"
        )
    return formats


# the FOCUS identity flags: each names a column FOCUS requires (BillingAccountId, ProviderName,
# InvoiceIssuerName, ServiceName ...; InvoiceId is `<account>-<period>`), which must not be null
FOCUS_IDENTITY = (("--account", "account"), ("--service-name", "service_name"))


def _focus_identity(args) -> None:
    """Refuses an empty or whitespace-only FOCUS identity flag: the FOCUS file would fail its own
    checker (`focus_check`) on every row; caught before anything is opened or written."""
    from gpumeter.reports.model import ReportError

    for flag, dest in FOCUS_IDENTITY:
        value = getattr(args, dest)
        if not value.strip():
            raise ReportError(f"focus: {flag} must name something, not be empty (value {value!r})")


def register(subparsers) -> None:
    import os

    from gpumeter.billing.ledger import DEFAULT_URL
    from gpumeter.reports.focus_columns import FOCUS_VERSION, VERSIONS

    parser = subparsers.add_parser(
        "report",
        help="render chargeback reports from the ledger (HTML, CSV, JSON, FOCUS 1.3, 1.4 or 1.2), or the "
        "fleet-health report",
    )
    parser.add_argument(
        "--kind",
        choices=["chargeback", "health", "allocations"],
        default="chargeback",
        help="chargeback (default); health: utilization and maturity, incidents, MTBF, RMA candidates, waste; "
        "allocations: who held which GPU, MIG instance or share from when to when (csv, html)",
    )
    parser.add_argument(
        "--prometheus",
        default=os.environ.get("GPUMETER_PROMETHEUS_URL", "http://127.0.0.1:9090"),
        help="Prometheus the health report reads (comma-separated: an HA pair); default $GPUMETER_PROMETHEUS_URL",
    )
    parser.add_argument("--db", default=os.environ.get("GPUMETER_BILLING_DB", DEFAULT_URL), help="ledger URL")
    parser.add_argument("--db-schema", default=None, help="PostgreSQL schema (search_path) of the ledger")
    parser.add_argument("--period", help="a month, YYYY-MM (default: last month)")
    parser.add_argument("--from", dest="start", help="start (ISO 8601, UTC), instead of --period")
    parser.add_argument("--to", dest="end", help="end, exclusive (ISO 8601, UTC)")
    parser.add_argument(
        "--by",
        default="team",
        help="team, namespace, model, mig_profile, cluster or label:KEY (default team)",
    )
    parser.add_argument(
        "--cluster",
        dest="clusters",
        action="append",
        default=[],
        metavar="NAME",
        help="only the lines of cluster NAME (repeatable), where the ledger's lines name their cluster",
    )
    parser.add_argument("--labels", help="namespace labels YAML for --by label:KEY: namespaces: {ns: {k: v}}")
    parser.add_argument(
        "--teams",
        help="billing's team map YAML: its budgets: {team: {amount, currency}} add budget against actual per team (months only)",
    )
    parser.add_argument(
        "--format",
        dest="formats",
        type=_formats,
        default=None,
        help="comma list of html, csv, json, focus, or 'all' (default all; the health report has html, csv, "
        "json; the allocations report csv, html)",
    )
    parser.add_argument("--out", default="reports-out", help="output directory (default reports-out)")
    parser.add_argument("--grain", choices=["day", "hour"], default="day", help="FOCUS/detail row grain")
    parser.add_argument("--account", default="gpumeter", help="FOCUS BillingAccountId/ProviderName")
    parser.add_argument("--service-name", default="Kubernetes GPU", help="FOCUS ServiceName")
    parser.add_argument(
        "--focus-version",
        choices=list(VERSIONS),
        default=FOCUS_VERSION,
        help="FOCUS version of the focus file: 1.3 (default: split cost allocation), 1.4 (1.3 less "
        "ProviderName and PublisherName) or 1.2",
    )
    parser.add_argument(
        "--keep-formulas",
        action="store_true",
        help="write CSV and FOCUS text cells exactly, those starting with = + - @ too (default: prefixed with ')",
    )
    parser.add_argument(
        "--spare-policy",
        type=_share,
        default=None,
        help="health report: the share of each pool's GPUs to keep spare, 0..1 (default 0.10, seed 002)",
    )
    parser.add_argument(
        "--cluster-label",
        type=_label_name,
        default=os.environ.get("GPUMETER_CLUSTER_LABEL", "cluster"),
        help="health report: the label a global store names each series' cluster by (default cluster, "
        "env GPUMETER_CLUSTER_LABEL); its GPUs are then (cluster, uuid), grouped by cluster",
    )
    parser.add_argument("--no-record", action="store_true", help="do not record the run in report_runs")
    parser.set_defaults(func=cmd_report)


def _label_name(text: str) -> str:
    from gpumeter.billing.cli import _label_name as label_name

    return label_name(text)


def _share(text: str) -> float:
    from gpumeter.reports.health import spare_policy

    try:
        return spare_policy(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def missing_sqlite_file(url: str) -> str | None:
    """The path of a SQLite ledger ``url`` names that does not exist (None: it exists, or the URL
    is not a SQLite file). A report reads a ledger; it never creates one."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except ArgumentError:
        return None  # open_ledger names the bad URL
    if not parsed.drivername.startswith("sqlite") or parsed.database in (None, "", ":memory:"):
        return None
    return None if Path(parsed.database).is_file() else parsed.database


def cmd_report(args) -> int:
    from gpumeter.billing.config import ConfigError, load_budgets
    from gpumeter.billing.ledger import open_ledger
    from gpumeter.billing.ledger.base import LedgerError
    from gpumeter.billing.models import whole_hours
    from gpumeter.reports.model import Grouping, ReportError, last_month, month_period, range_period
    from gpumeter.reports.render import FORMATS, RenderOptions
    from gpumeter.reports.run import generate, load_labels
    from gpumeter.reports.sums_worker import SumsLost

    now = datetime.now(UTC)
    try:
        _focus_identity(args)
        args.start, args.end = _when("--from", args.start), _when("--to", args.end)
        if args.start or args.end:
            if args.period:
                raise ReportError("period: give --period or --from/--to, not both (value --period)")
            if not (args.start and args.end):
                raise ReportError("period: --from and --to go together (value missing)")
            args.start, args.end, notes = whole_hours(args.start, args.end)
            for note in notes:
                print(note, file=sys.stderr)
            period = range_period(args.start, args.end)
        else:
            period = month_period(args.period) if args.period else last_month(now)
        grouping = Grouping.parse(args.by, load_labels(args.labels))
        budgets = load_budgets(args.teams) if args.teams else {}
        if args.kind == "health":
            from gpumeter.reports import health_render

            if args.formats is None or args.formats == FORMATS:
                args.formats = health_render.FORMATS
            bad = [f for f in args.formats if f not in health_render.FORMATS]
            if bad:
                raise ReportError(
                    f"format: the health report has {', '.join(health_render.FORMATS)} (value {','.join(bad)!r})"
                )
        elif args.kind == "allocations":
            from gpumeter.reports import allocations

            if args.formats is None or args.formats == FORMATS:
                args.formats = allocations.FORMATS
            bad = [f for f in args.formats if f not in allocations.FORMATS]
            if bad:
                raise ReportError(
                    f"format: the allocations report has {', '.join(allocations.FORMATS)} (value {','.join(bad)!r})"
                )
        elif args.formats is None:
            args.formats = FORMATS
    except (ReportError, ConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    missing = missing_sqlite_file(args.db)
    if missing:  # opening it would create an empty ledger and report $0
        print(f"error: db: no such SQLite file {missing} (value {args.db!r})", file=sys.stderr)
        return 2
    try:
        ledger = open_ledger(args.db, schema=args.db_schema)
    except LedgerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.kind == "health":
        return _health(args, ledger, period, now)
    if args.kind == "allocations":
        return _allocations(args, ledger, period, now)
    try:
        result = generate(
            ledger,
            period,
            grouping,
            args.formats,
            args.out,
            grain=args.grain,
            options=RenderOptions(
                account=args.account,
                service=args.service_name,
                generated_at=now,
                keep_formulas=args.keep_formulas,
                focus_version=args.focus_version,
            ),
            now=now,
            record=not args.no_record,
            budgets=budgets,
            clusters=tuple(dict.fromkeys(args.clusters)),
        )
    except ReportError as exc:
        where = f"{args.teams}: " if str(exc).startswith("budgets.") else ""  # name the budgets' file
        print(f"error: {where}{exc}", file=sys.stderr)
        return 2
    # the database lost past its retries; a full disk; the sums' process killed
    except (LedgerError, ReportWriteError, SumsLost) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        ledger.close()
    report = result.report
    print(
        f"report {period.label} by {grouping.name}: total {report.money(report.total.cost)} {report.currency}, "
        f"{len(report.groups)} group(s), {report.ingest.hours_ingested}/{report.ingest.hours_in_period} hours ingested"
    )
    for name, digest in result.files.items():
        print(f"  {result.out_dir / name}  sha256:{digest[:16]}")
    return 0


def _health(args, ledger, period, now: datetime) -> int:
    from gpumeter.billing.ledger.base import LedgerError
    from gpumeter.billing.prom import PrometheusError, open_client
    from gpumeter.reports import health_render
    from gpumeter.reports.model import ReportError

    try:
        with open_client(args.prometheus) as client:
            report, files, _ = health_render.generate(
                client,
                ledger,
                period,
                args.formats,
                args.out,
                now=now,
                record=not args.no_record,
                spare_policy=args.spare_policy,
                cluster_label=args.cluster_label,
            )
    except ReportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (PrometheusError, LedgerError, ReportWriteError) as exc:  # one line naming the source or file
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        ledger.close()
    fleet = report.fleet
    print(
        f"health {period.label}: {fleet.gpus} GPU(s), {fleet.failures} failure(s), {len(report.rma)} RMA "
        f"candidate(s), idle {report.money(report.waste[1])} {report.currency}"
    )
    for name, digest in files.items():
        print(f"  {Path(args.out) / name}  sha256:{digest[:16]}")
    return 0


def _allocations(args, ledger, period, now: datetime) -> int:
    from gpumeter.billing.ledger.base import LedgerError
    from gpumeter.reports import allocations
    from gpumeter.reports.model import ReportError
    from gpumeter.reports.run import output_directory

    try:
        out = output_directory(args.out)
        report = allocations.build_allocations(ledger, period)
        files = allocations.render(report, out, args.formats, generated_at=now)
    except ReportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (LedgerError, ReportWriteError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        ledger.close()
    print(
        f"allocations {period.label}: {len(report.holdings)} allocation(s), facts of {report.hours_read}/"
        f"{period.hours} hours"
    )
    for name, digest in files.items():
        print(f"  {out / name}  sha256:{digest[:16]}")
    return 0
