"""Settings shared by the CLI and the service: defaults, environment, the team map file."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path

from gpumeter.billing.ingest import IngestConfig
from gpumeter.billing.ledger import DEFAULT_URL
from gpumeter.billing.pricing.static import DEFAULT_BOOK
from gpumeter.billing.pricing.yamlload import MAX_BYTES, YamlRefused, load_yaml


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

    def as_dict(self) -> dict:
        return asdict(self)

    def ingest_config(self) -> IngestConfig:
        return IngestConfig(
            scrape_interval=self.scrape_interval,
            gap_grace_intervals=self.gap_grace_intervals,
            catchup_hours=self.catchup_hours,
            workers=self.workers,
            teams=load_team_map(self.teams_file) if self.teams_file else {},
        )


def load_team_map(path: str | Path) -> dict[str, str]:
    """``namespaces: {namespace: team}`` and ``vms: {vm_id: team}`` → one dict (a VM's vGPU is billed
    under its VM ID as its namespace, docs/billing.md §4.3); errors name the file, the field and the
    value."""
    path = Path(path)
    try:
        with path.open("rb") as file:
            doc = load_yaml(file.read(MAX_BYTES + 1))  # no aliases, no duplicate namespaces, bounded
    except OSError as exc:
        raise ConfigError(f"{path}: (file): cannot load team map: {exc.strerror}") from None
    except YamlRefused as exc:
        raise ConfigError(f"{path}: {exc.field}: {exc.problem} (value {exc.value!r})") from None
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
    for vm_id, team in vms.items():
        if namespaces.get(vm_id, team) != team:
            raise ConfigError(
                f"{path}: vms.{vm_id}: also a namespace of team {namespaces[vm_id]!r} (value {team!r})"
            )
    return {**namespaces, **vms}
