"""Settings shared by the CLI and the service: defaults, environment, the team map file (namespaces
and the teams' monthly budgets)."""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from gpumeter.billing.ingest import IngestConfig
from gpumeter.billing.ledger import DEFAULT_URL
from gpumeter.billing.models import is_reserved_name
from gpumeter.billing.pricing.base import PriceBook
from gpumeter.billing.pricing.currency import MINOR_UNITS
from gpumeter.billing.pricing.static import DEFAULT_BOOK, load_price_book
from gpumeter.billing.pricing.yamlload import MAX_BYTES, YamlRefused, load_yaml
from gpumeter.billing.prom import MAX_ANSWER_BYTES, REQUEST_TIMEOUT, Auth


class ConfigError(ValueError):
    pass


@dataclass
class Settings:
    """Plain values only: APScheduler pickles them into its job store."""

    db: str = os.environ.get("GPUMETER_BILLING_DB", DEFAULT_URL)
    schema: str | None = None
    prometheus: str = os.environ.get("GPUMETER_PROMETHEUS_URL", "http://127.0.0.1:9090")
    prices: str = str(DEFAULT_BOOK)
    teams_file: str | None = None
    scrape_interval: float = IngestConfig.scrape_interval  # the defaults are IngestConfig's, written once
    gap_grace_intervals: int = IngestConfig.gap_grace_intervals
    catchup_hours: int = IngestConfig.catchup_hours
    workers: int = IngestConfig.workers
    # report | price: whether the book's utilization tiers only score lines or price them (§3.7)
    utilization_tiers: str = "report"
    prometheus_timeout: float = REQUEST_TIMEOUT  # seconds for one request's whole answer
    deadline: float = IngestConfig.deadline  # seconds for a whole ingest run (0: none)
    max_answer_mib: int = MAX_ANSWER_BYTES >> 20  # MiB one answer may hold; a larger one is refused
    # the label naming each series' cluster in a global store (docs/billing.md §2.3)
    cluster_label: str = os.environ.get("GPUMETER_CLUSTER_LABEL", IngestConfig.cluster_label)
    # `billing ingest --drop-missing-clusters`: replace an hour even where a cluster billed in it is gone
    drop_missing_clusters: bool = IngestConfig.drop_missing_clusters
    # Prometheus authentication (docs/security.md): paths of files holding the secrets, never the
    # secrets themselves, so neither the job store nor a log line ever holds one
    prometheus_bearer_token_file: str | None = os.environ.get("GPUMETER_PROMETHEUS_BEARER_TOKEN_FILE")
    prometheus_basic_auth_user: str | None = os.environ.get("GPUMETER_PROMETHEUS_BASIC_AUTH_USER")
    prometheus_basic_auth_password_file: str | None = os.environ.get(
        "GPUMETER_PROMETHEUS_BASIC_AUTH_PASSWORD_FILE"
    )
    prometheus_cert_file: str | None = os.environ.get("GPUMETER_PROMETHEUS_CERT_FILE")
    prometheus_key_file: str | None = os.environ.get("GPUMETER_PROMETHEUS_KEY_FILE")
    prometheus_ca_file: str | None = os.environ.get("GPUMETER_PROMETHEUS_CA_FILE")

    def as_dict(self) -> dict:
        return asdict(self)

    def price_book(self) -> PriceBook:
        """The price book, its tiers used as ``utilization_tiers`` says; PriceBookError if unusable."""
        return load_price_book(self.prices).with_utilization_tiers(self.utilization_tiers)

    def ingest_config(self) -> IngestConfig:
        return IngestConfig(
            scrape_interval=self.scrape_interval,
            gap_grace_intervals=self.gap_grace_intervals,
            catchup_hours=self.catchup_hours,
            workers=self.workers,
            deadline=self.deadline,
            teams=load_team_map(self.teams_file) if self.teams_file else {},
            cluster_label=self.cluster_label,
            drop_missing_clusters=self.drop_missing_clusters,
        )

    def auth(self) -> Auth:
        return Auth(
            bearer_token_file=self.prometheus_bearer_token_file,
            basic_auth_user=self.prometheus_basic_auth_user,
            basic_auth_password_file=self.prometheus_basic_auth_password_file,
            cert_file=self.prometheus_cert_file,
            key_file=self.prometheus_key_file,
            ca_file=self.prometheus_ca_file,
        )

    def client_options(self) -> dict:
        """`open_client`'s keywords for these settings."""
        return {
            "timeout": self.prometheus_timeout,
            "auth": self.auth(),
            "max_answer_bytes": self.max_answer_mib << 20,
        }


# `--prometheus-config`: Prometheus' own http_config keys (its scrape and remote-read configs), the
# ones billing supports -> the Settings field each sets
HTTP_CONFIG_KEYS = {
    ("bearer_token_file",): "prometheus_bearer_token_file",
    ("basic_auth", "username"): "prometheus_basic_auth_user",
    ("basic_auth", "password_file"): "prometheus_basic_auth_password_file",
    ("tls_config", "cert_file"): "prometheus_cert_file",
    ("tls_config", "key_file"): "prometheus_key_file",
    ("tls_config", "ca_file"): "prometheus_ca_file",
}


def load_http_config(path: str | Path) -> dict[str, str]:
    """A Prometheus ``http_config`` YAML file (bearer_token_file, basic_auth.username/password_file,
    tls_config.cert_file/key_file/ca_file) → Settings fields. Inline secrets (``bearer_token``,
    ``basic_auth.password``) are refused: a secret is read from its own file (docs/security.md)."""
    path = Path(path)
    try:
        with path.open("rb") as file:
            doc = load_yaml(file.read(MAX_BYTES + 1))
    except OSError as exc:
        raise ConfigError(f"{path}: (file): cannot load the Prometheus http_config: {exc.strerror}") from None
    except YamlRefused as exc:
        raise ConfigError(f"{path}: {exc.field}: {exc.problem} (value {exc.value!r})") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: (file): expected a mapping of http_config keys (value {doc!r})")
    out: dict[str, str] = {}
    known = {keys[0] for keys in HTTP_CONFIG_KEYS}
    for key, value in doc.items():
        if key not in known:
            hint = "; write the secret to a file and name it in *_file" if key in ("bearer_token",) else ""
            raise ConfigError(f"{path}: {key}: not a supported http_config key{hint} (value {key!r})")
        if isinstance(value, dict):
            for sub in value:
                if (key, sub) not in HTTP_CONFIG_KEYS:
                    hint = "; name a password_file instead" if sub == "password" else ""
                    raise ConfigError(
                        f"{path}: {key}.{sub}: not a supported http_config key{hint} (value {sub!r})"
                    )
    for keys, field_name in HTTP_CONFIG_KEYS.items():
        found: Any = doc
        for key in keys:
            found = found.get(key) if isinstance(found, dict) else None
        if found is None:
            continue
        if not isinstance(found, str) or not found:
            raise ConfigError(f"{path}: {'.'.join(keys)}: expected a path or a name (value {found!r})")
        out[field_name] = found
    return out


# The most a team's monthly budget can be, in any currency's major unit: what a month of 100,000 GPUs
# at the price book's highest rate stays below (docs/billing.md §3.4), so a budget never overflows
# the sums it is compared with.
MAX_BUDGET = Decimal(10) ** 15
TEAM_FILE_KEYS = ("namespaces", "vms", "budgets")
# a namespace's name: an RFC 1123 DNS label (kubernetes.io/docs/concepts/overview/working-with-objects/names)
# a cluster's name as a team map writes it before a namespace (`east/ml-training`): no '/', so the
# namespace is never ambiguous
CLUSTER_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
NAMESPACE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


@dataclass(frozen=True)
class Budget:
    """A team's budget for each calendar month in UTC (docs/billing.md §4.4)."""

    team: str
    amount: Decimal  # in the currency's major unit, at most its minor unit's decimals
    currency: str


@dataclass(frozen=True)
class TeamFile:
    namespaces: dict[str, str]
    budgets: dict[str, Budget]


def load_team_map(path: str | Path) -> dict[str, str]:
    """``namespaces: {namespace: team}`` and ``vms: {vm_id: team}`` → one dict (a VM's vGPU is billed
    under its VM ID as its namespace, docs/billing.md §4.3); errors name the file, the field and the
    value."""
    return load_team_file(path).namespaces


def load_budgets(path: str | Path) -> dict[str, Budget]:
    """``budgets: {team: {amount, currency}}`` → {team: Budget} (empty when the file has none)."""
    return load_team_file(path).budgets


def load_team_file(path: str | Path) -> TeamFile:
    """The whole team map file, validated; errors name the file, the field and the value. Its
    ``namespaces`` holds the ``vms:`` section's VM IDs too."""
    path = Path(path)
    try:
        with path.open("rb") as file:
            doc = load_yaml(file.read(MAX_BYTES + 1))  # no aliases, no duplicate namespaces, bounded
    except OSError as exc:
        raise ConfigError(f"{path}: (file): cannot load team map: {exc.strerror}") from None
    except YamlRefused as exc:
        raise ConfigError(f"{path}: {exc.field}: {exc.problem} (value {exc.value!r})") from None
    if isinstance(doc, dict):
        # a misspelt `budget:` would otherwise leave every team without one, silently
        for key in doc:
            if key not in TEAM_FILE_KEYS:
                raise ConfigError(
                    f"{path}: {key}: unknown key, expected {' or '.join(TEAM_FILE_KEYS)} (value {key!r})"
                )
    namespaces = doc.get("namespaces") if isinstance(doc, dict) else None
    vms = doc.get("vms", {}) if isinstance(doc, dict) else {}
    if not isinstance(vms, dict):
        raise ConfigError(f"{path}: vms: expected a mapping of VM ID to team (value {vms!r})")
    if namespaces is None and vms:
        namespaces = {}  # a map of VMs alone (a vGPU-only fleet)
    if not isinstance(namespaces, dict):
        raise ConfigError(
            f"{path}: namespaces: expected a mapping of namespace to team (value {namespaces!r})"
        )
    for section, entries in (("namespaces", namespaces), ("vms", vms)):
        for name, team in entries.items():
            if not isinstance(name, str) or not isinstance(team, str) or not team:
                raise ConfigError(f"{path}: {section}.{name}: expected a team name (value {team!r})")
            for what, value in (("namespace", name), ("team", team)):
                if is_reserved_name(value):
                    raise ConfigError(
                        f"{path}: {section}.{name}: {value} is a name the reports use for their own "
                        f"rows, not a {what} name (value {value!r})"
                    )
    for name in namespaces:
        # `ml-training` names the namespace in every cluster, `east/ml-training` in cluster east alone
        cluster, slash, namespace = name.rpartition("/")
        if slash and not CLUSTER_NAME.fullmatch(cluster):
            raise ConfigError(
                f"{path}: namespaces.{ascii(name)[1:-1]}: ambiguous: expected namespace or cluster/namespace, "
                f"the cluster of letters, digits and _.:- (value {name!r})"
            )
        if not NAMESPACE_NAME.fullmatch(namespace):
            raise ConfigError(
                f"{path}: namespaces.{ascii(name)[1:-1]}: not a Kubernetes namespace name (lower-case "
                f"letters, digits and '-', at most 63, RFC 1123) (value {name!r})"
            )
    for vm_id, team in vms.items():
        if namespaces.get(vm_id, team) != team:
            raise ConfigError(
                f"{path}: vms.{vm_id}: also a namespace of team {namespaces[vm_id]!r} (value {team!r})"
            )
    namespaces = {**namespaces, **vms}
    budgets = doc.get("budgets")
    if budgets is None:
        return TeamFile(dict(namespaces), {})
    if not isinstance(budgets, dict):
        raise ConfigError(
            f"{path}: budgets: expected a mapping of team to {{amount, currency}} (value {budgets!r})"
        )
    return TeamFile(dict(namespaces), {team: _budget(path, team, spec) for team, spec in budgets.items()})


def _budget(path: Path, team: Any, spec: Any) -> Budget:
    where = f"budgets.{team}"
    if not isinstance(team, str) or not team or is_reserved_name(team):
        raise ConfigError(f"{path}: {where}: expected a team name (value {team!r})")
    if not isinstance(spec, dict):
        raise ConfigError(f"{path}: {where}: expected {{amount, currency}} (value {spec!r})")
    for key in spec:
        if key not in ("amount", "currency"):
            raise ConfigError(
                f"{path}: {where}.{key}: unknown key, expected amount and currency (value {key!r})"
            )
    currency = spec.get("currency")
    if not isinstance(currency, str) or currency not in MINOR_UNITS:
        raise ConfigError(
            f"{path}: {where}.currency: unknown currency (expected an ISO 4217 code such as USD) (value {currency!r})"
        )
    value = spec.get("amount")

    def refuse(problem: str, shown: Any = value) -> ConfigError:
        return ConfigError(f"{path}: {where}.amount: {problem} (value {shown!r})")

    # read as the price book reads its numbers (a YAML float by its shortest text: 0.1 is "0.1")
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise refuse("expected a number of currency units, e.g. 25000 or '25000.50'")
    text = str(value).strip()
    if len(text) > 64:  # Decimal would parse a megabyte of digits
        raise refuse("not a number", f"{text[:20]}... ({len(text)} characters)")
    try:
        amount = Decimal(text)
    except InvalidOperation:
        raise refuse("not a number") from None
    if not amount.is_finite():
        raise refuse("not a finite number")
    if amount <= 0:
        raise refuse("must be greater than 0 (leave the team out for no budget)")
    if amount > MAX_BUDGET:
        raise refuse(f"larger than {MAX_BUDGET:,} (docs/billing.md §4.4)")
    exponent = amount.normalize().as_tuple().exponent
    if isinstance(exponent, int) and -exponent > MINOR_UNITS[currency]:
        raise refuse(f"more decimal places than {currency}'s minor unit ({MINOR_UNITS[currency]})")
    return Budget(team, amount, currency)
