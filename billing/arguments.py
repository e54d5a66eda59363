"""The arguments of `gpumeter billing`'s commands: the flags they share (`common_arguments`), the
checks of each value, and the `Settings` they make (`settings_from`). The composition root's `serve`
takes the same flags."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime, timedelta

from gpumeter.billing.ingest import IngestConfig
from gpumeter.billing.pricing.base import UTILIZATION_TIERS_USES
from gpumeter.process import usable_cpus

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
        # `billing ingest --workers`' default: 2, or 1 where one CPU is usable (read only here)
        workers=getattr(args, "workers", IngestConfig.workers) or min(2, usable_cpus()),
        utilization_tiers=getattr(args, "utilization_tiers", "report"),
        cluster_label=getattr(args, "cluster_label", defaults.cluster_label),
        drop_missing_clusters=getattr(args, "drop_missing_clusters", False),
    )
