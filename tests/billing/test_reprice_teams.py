"""docs/billing.md §6.1: a re-price changes prices, not who pays. Each hour's namespaces keep the teams
their lines were billed to (the ingest's team map and that hour's labels), a team map given to the
re-price wins where it names a namespace, and a namespace billed to no team takes the kept labels'.
Before, a re-price without `--teams` billed every tenant line of the demo month to no team."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta
from decimal import Decimal

from gpumeter.billing.allocate import price_gpu_hour
from gpumeter.billing.ingest import reprice
from gpumeter.billing.ledger.base import HourRecord
from gpumeter.billing.models import LineKind, teams_in_cluster
from tests.billing.factories import H100, HOUR0, alloc, book, gpu_hour

D = Decimal
HOUR1 = HOUR0 + timedelta(hours=1)
END = HOUR0 + timedelta(hours=2)


def _facts(hour: datetime):
    """Three H100s, each held whole by one pod: train and batch in no named cluster, train in east."""
    plain = [
        gpu_hour(f"GPU-{ns}", H100, allocations=[alloc(f"GPU-{ns}", ns, f"{ns}-0")], hour=hour)
        for ns in ("train", "batch")
    ]
    east = gpu_hour("GPU-east", H100, allocations=[alloc("GPU-east", "train", "train-0")], hour=hour)
    east = dataclasses.replace(east, device=dataclasses.replace(east.device, cluster="east"))
    return [*plain, east]


def _ingested(ledger, prices) -> None:
    """Two hours as an ingest bills them: train's team relabelled between them, east's train mapped
    per cluster, batch under no team, then under one."""
    maps = {
        HOUR0: {"train": "ml", "east/train": "east-ml"},
        HOUR1: {"train": "research", "east/train": "east-ml", "batch": "batch-team"},
    }
    for hour, teams in maps.items():
        facts = _facts(hour)
        lines = [
            line
            for gh in facts
            for line in price_gpu_hour(gh, prices, teams_in_cluster(teams, gh.device.cluster)).lines
        ]
        ledger.write_hour(HourRecord(hour, facts, lines, prices))


def _book(tmp_path, name: str, rate: str):
    (tmp_path / name).mkdir()
    return book(tmp_path / name, {"H100-80GB": {"hourly_rate": rate}})


def _tenant_teams(ledger) -> dict[tuple, tuple[str, Decimal]]:
    return {
        (line.hour, line.cluster, line.namespace): (line.team, line.amount)
        for line in ledger.lines(HOUR0, END)
        if line.kind is LineKind.TENANT
    }


def test_a_reprice_keeps_each_hours_billed_teams_and_changes_only_the_price(ledger, tmp_path):
    _ingested(ledger, _book(tmp_path, "old", "6.88"))
    ledger.set_namespace_teams({"train": "label-now", "batch": "data"}, "kube", HOUR0)
    assert ledger.billed_teams(HOUR0, END) == {
        HOUR0: {"train": "ml", "east/train": "east-ml"},
        HOUR1: {"train": "research", "east/train": "east-ml", "batch": "batch-team"},
    }
    new = _book(tmp_path, "new", "10.00")
    assert reprice(ledger, new, HOUR0, END, {}) == 2
    # each held whole for the hour: the tenant line is the GPU's 10.00
    assert _tenant_teams(ledger) == {
        (HOUR0, "", "train"): ("ml", D("10.00")),
        (HOUR1, "", "train"): ("research", D("10.00")),
        (HOUR0, "east", "train"): ("east-ml", D("10.00")),
        (HOUR1, "east", "train"): ("east-ml", D("10.00")),
        # billed to no team: the label kept since; then to one, which it keeps
        (HOUR0, "", "batch"): ("data", D("10.00")),
        (HOUR1, "", "batch"): ("batch-team", D("10.00")),
    }


def test_a_team_map_given_to_the_reprice_wins_where_it_names_a_namespace(ledger, tmp_path):
    prices = book(tmp_path, {"H100-80GB": {"hourly_rate": "6.88"}})
    _ingested(ledger, prices)
    assert reprice(ledger, prices, HOUR0, END, {"east/train": "platform"}) == 2
    teams = {key: team for key, (team, _) in _tenant_teams(ledger).items()}
    assert teams == {
        (HOUR0, "", "train"): "ml",
        (HOUR1, "", "train"): "research",
        (HOUR0, "east", "train"): "platform",
        (HOUR1, "east", "train"): "platform",
        (HOUR0, "", "batch"): "",
        (HOUR1, "", "batch"): "batch-team",
    }
    # a namespace named in every cluster wins over what each cluster's lines were billed to
    assert reprice(ledger, prices, HOUR0, END, {"train": "everyone"}) == 2
    assert {team for (_, _, ns), (team, _) in _tenant_teams(ledger).items() if ns == "train"} == {"everyone"}
