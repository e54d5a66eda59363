"""The audit holds per cluster and team (docs/billing.md §2.3, §6.6): a re-ingest or re-price that
moves money between clusters or teams within an hour, the hour's total unchanged, is recorded, once
per cluster and team it changed; a `--cluster` report shows its own clusters' changes only. On every
ledger.

By hand: one A100 at 3.00 an hour in each of east and west, of one UUID (two clusters may hold one),
idle, so their lines are the platform's (no team). First billed: east's present the whole hour
(3.00), west's half of it (1.50): 4.50. Re-ingested: east's half (1.50), west's whole (3.00): still
4.50, so an audit of the hour's total saw nothing. Per cluster: east 3.00 -> 1.50 and west 1.50 ->
3.00. Re-priced at 4.00 an hour: east 1.50 -> 2.00, west 3.00 -> 4.00. Written again as it stands:
nothing.

Teams: an A100 at 3.00 held the whole hour by analytics/notebook, billed with no team map: 3.00 to no
team. Re-priced with the same book and a map naming analytics' team cv: no team 3.00 -> 0, cv 0 ->
3.00, the hour's 3.00 unchanged (before, `billing audit` said "no billed hour was changed")."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from decimal import Decimal

import gpumeter
from gpumeter.billing.allocate import price_gpu_hour
from gpumeter.billing.ingest import reprice
from gpumeter.billing.ledger import open_ledger
from gpumeter.billing.ledger.base import Actor, HourRecord
from gpumeter.billing.ledger.orm import BillingAudit
from gpumeter.billing.ledger.sqlalchemy import make_engine
from gpumeter.reports.model import build_report
from gpumeter.reports.period import month_period
from tests.billing.factories import A100, HOUR0, alloc, book, gpu_hour

D = Decimal


def _gpu(cluster: str, seconds: int):
    held = gpu_hour("GPU-1", A100, seconds=seconds)
    return dataclasses.replace(held, device=dataclasses.replace(held.device, cluster=cluster))


def _write(ledger, prices, east_seconds: int, west_seconds: int, command: str = "ingest") -> None:
    ledger.actor = Actor(command=command, operator="ops", reason="test", run=f"run-{east_seconds}")
    gpus = [_gpu("east", east_seconds), _gpu("west", west_seconds)]
    lines = [line for held in gpus for line in price_gpu_hour(held, prices).lines]
    ledger.write_hour(HourRecord(HOUR0, gpus, lines, prices))


def _changes(ledger) -> list[tuple[str | None, Decimal, Decimal]]:
    return [(r.cluster, r.old_total, r.new_total) for r in ledger.audit_records()]


def test_money_moved_between_clusters_is_audited_per_cluster(ledger, tmp_path):
    three = book(tmp_path, {"A100-40GB": {"hourly_rate": "3.00"}})
    (tmp_path / "four").mkdir()
    four = book(tmp_path / "four", {"A100-40GB": {"hourly_rate": "4.00"}})

    _write(ledger, three, 3600, 1800)
    assert _changes(ledger) == []  # billed for the first time
    _write(ledger, three, 1800, 3600)
    assert _changes(ledger) == [("east", D("3.00"), D("1.50")), ("west", D("1.50"), D("3.00"))]
    moved = ledger.audit_records()
    assert {r.hour for r in moved} == {HOUR0} and {r.command for r in moved} == {"ingest"}

    _write(ledger, three, 1800, 3600)  # the same lines again: nothing
    assert len(ledger.audit_records()) == 2

    gpus = ledger.facts(HOUR0)
    ledger.actor = Actor(command="price", operator="ops", reason="new rates", run="reprice")
    ledger.replace_lines(HOUR0, [x for held in gpus for x in price_gpu_hour(held, four).lines], four)
    repriced = [r for r in ledger.audit_records() if r.run == "reprice"]
    assert [(r.cluster, r.old_total, r.new_total) for r in repriced] == [
        ("east", D("1.50"), D("2.00")),
        ("west", D("3.00"), D("4.00")),
    ]
    assert {r.book_digest for r in repriced} == {four.digest}


def test_one_cluster_gone_from_a_billed_hour_is_audited_at_zero(ledger, tmp_path):
    """West's GPU-hour dropped by a re-ingest (its series gone): west 1.50 -> 0, east unchanged."""
    three = book(tmp_path, {"A100-40GB": {"hourly_rate": "3.00"}})
    _write(ledger, three, 3600, 1800)
    # what an ingest reads before replacing an hour (tests/billing/test_cluster_gaps.py)
    assert ledger.billed_clusters(HOUR0, HOUR0 + timedelta(hours=2)) == {HOUR0: {"east", "west"}}
    gpus = [_gpu("east", 3600)]
    ledger.write_hour(HourRecord(HOUR0, gpus, price_gpu_hour(gpus[0], three).lines, three))
    assert _changes(ledger) == [("west", D("1.50"), D("0"))]


def test_money_moved_between_teams_is_audited_per_team(ledger, tmp_path):
    three = book(tmp_path, {"A100-40GB": {"hourly_rate": "3.00"}})
    held = gpu_hour("GPU-1", A100, allocations=[alloc("GPU-1", "analytics", "notebook")])
    ledger.write_hour(HourRecord(HOUR0, [held], price_gpu_hour(held, three).lines, three))
    ledger.actor = Actor(command="price", operator="ops", reason="analytics moved to cv", run="teams")
    assert reprice(ledger, three, HOUR0, HOUR0 + timedelta(hours=1), {"analytics": "cv"}) == 1
    assert [(r.cluster, r.team, r.old_total, r.new_total) for r in ledger.audit_records()] == [
        ("", "", D("3.00"), D("0")),
        ("", "cv", D("0"), D("3.00")),
    ]


def test_the_audit_command_and_a_cluster_report_name_the_cluster(db, tmp_path, capsys):
    """`billing audit` gains a cluster column where the audit names clusters, a record from before
    revision 0015 showing as every cluster's; `--cluster east` reports east's change and that one."""
    url, schema = db
    three = book(tmp_path, {"A100-40GB": {"hourly_rate": "3.00"}})
    ledger = open_ledger(url, schema=schema)
    try:
        _write(ledger, three, 3600, 1800)
        _write(ledger, three, 1800, 3600)
    finally:
        ledger.close()
    engine = make_engine(url, schema=schema)
    try:
        with engine.begin() as connection:  # as revision 0011 wrote it: the hour over every cluster
            connection.execute(
                BillingAudit.__table__.insert(),
                [
                    dict(
                        at=HOUR0,
                        run="old",
                        command="price",
                        operator="ops",
                        reason="",
                        book_digest="d" * 64,
                        hour=HOUR0,
                        currency="USD",
                        old_total=D("9.00"),
                        new_total=D("4.50"),
                        cluster=None,
                        team=None,
                    )
                ],
            )
    finally:
        engine.dispose()

    argv = ["billing", "audit", "--db", url] + (["--db-schema", schema] if schema else [])
    assert gpumeter.main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    header = out.index("at\tcommand\toperator\treason\tbook\thour\tcluster\tteam\told\tnew\tcurrency")
    rows = [line.split("\t")[5:] for line in out[header + 1 : header + 4]]
    hour = HOUR0.isoformat()
    assert rows == [  # the idle GPUs' lines are the platform's: billed to no team
        [hour, "east", "(no team)", "3.00", "1.50", "USD"],
        [hour, "west", "(no team)", "1.50", "3.00", "USD"],
        [hour, "(every cluster)", "(every team)", "9.00", "4.50", "USD"],
    ]
    assert any("ingest by 'ops': 1 hour(s), total 4.50 -> 4.50 USD" in line for line in out)

    ledger = open_ledger(url, schema=schema)
    try:
        report = build_report(ledger, month_period("2026-11"), clusters=("east",), splits=False)
    finally:
        ledger.close()
    assert [(c.hours, c.old_total, c.new_total) for c in report.billed_changes] == [
        (1, D("3.00"), D("1.50")),  # east's part of the move, not west's
        (1, D("9.00"), D("4.50")),  # the old record: the hour's totals, as before
    ]
