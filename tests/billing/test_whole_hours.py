"""Billing's unit is the UTC hour: a mid-hour --from or --to is widened to the hours it touches, the
same way by every command, and said so (docs/billing.md §6.5).

Before, `billing ingest` and `billing price` took a `--from 00:30` as the hour from 00:00, the price's
read of the teams each hour was billed to did not, and `report --to 01:30` ended at 01:00 where the
billing commands ended at 02:00. So a re-price from 00:30 re-billed 00:00's namespace that had moved
teams to no team at all.

By hand: one A100 at 3.00 an hour held the whole hour by ml/trainer, billed to team `vision` at
00:00 and to team `speech` at 01:00 (the team map changed between them); no team map at re-price,
no team label. Re-priced at 4.00 from 00:30 to 01:30, both hours: ml's 4.00 line at 00:00 stays
vision's, at 01:00 speech's."""

from __future__ import annotations

import csv
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import gpumeter
from gpumeter.billing.allocate import price_gpu_hour
from gpumeter.billing.ingest import reprice
from gpumeter.billing.ledger import open_ledger
from gpumeter.billing.ledger.base import HourRecord
from gpumeter.billing.models import whole_hours
from tests.billing.factories import A100, HOUR0, alloc, book, gpu_hour, write_book

H1 = HOUR0 + timedelta(hours=1)
TEAMS = {HOUR0: "vision", H1: "speech"}


def _bill_two_hours(ledger, prices) -> None:
    for hour, team in TEAMS.items():
        held = gpu_hour("GPU-1", A100, allocations=[alloc("GPU-1", "ml", "trainer")], hour=hour)
        ledger.write_hour(HourRecord(hour, [held], price_gpu_hour(held, prices, {"ml": team}).lines, prices))


def _ml_lines(ledger) -> list[tuple[datetime, str, Decimal]]:
    return [
        (line.hour, line.team, line.amount)
        for line in ledger.lines(HOUR0, H1 + timedelta(hours=1))
        if line.namespace == "ml"
    ]


def test_whole_hours_widens_a_mid_hour_bound_and_says_so():
    at = datetime(2026, 11, 1, 10, 30, tzinfo=UTC)
    ten, eleven = at.replace(minute=0), at.replace(hour=11, minute=0)
    assert whole_hours(ten, eleven) == (ten, eleven, [])
    assert whole_hours(None, None) == (None, None, [])
    start, end, notes = whole_hours(at, at)
    assert (start, end) == (ten, eleven)
    assert notes == [
        "note: billing counts whole hours: --from 2026-11-01T10:30:00+00:00 starts at 2026-11-01T10:00:00+00:00",
        "note: billing counts whole hours: --to 2026-11-01T10:30:00+00:00 ends at 2026-11-01T11:00:00+00:00",
    ]


def test_a_re_price_from_mid_hour_keeps_each_hours_billed_team(ledger, tmp_path):
    three = book(tmp_path, {"A100-40GB": {"hourly_rate": "3.00"}})
    (tmp_path / "four").mkdir()
    four = book(tmp_path / "four", {"A100-40GB": {"hourly_rate": "4.00"}})
    _bill_two_hours(ledger, three)
    assert _ml_lines(ledger) == [(HOUR0, "vision", Decimal("3.00")), (H1, "speech", Decimal("3.00"))]

    assert reprice(ledger, four, HOUR0 + timedelta(minutes=30), H1 + timedelta(minutes=30), {}) == 2
    assert _ml_lines(ledger) == [(HOUR0, "vision", Decimal("4.00")), (H1, "speech", Decimal("4.00"))]


def test_the_commands_say_which_hours_a_mid_hour_bound_names(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    three = book(tmp_path, {"A100-40GB": {"hourly_rate": "3.00"}})
    ledger = open_ledger(url)
    try:
        _bill_two_hours(ledger, three)
    finally:
        ledger.close()
    four = write_book(
        tmp_path,
        {
            "currency": "USD",
            "versions": [
                {"effective_from": "2026-01-01T00:00:00Z", "gpus": {"A100-40GB": {"hourly_rate": "4.00"}}}
            ],
        },
        "four.yaml",
    )
    argv = ["billing", "price", "--db", url, "--prices", str(four)]
    assert gpumeter.main([*argv, "--from", "2026-11-01T00:30Z", "--to", "2026-11-01T01:30Z"]) == 0
    out, err = capsys.readouterr()
    assert "re-priced 2 hour(s)" in out
    assert "--from 2026-11-01T00:30:00+00:00 starts at 2026-11-01T00:00:00+00:00" in err
    assert "--to 2026-11-01T01:30:00+00:00 ends at 2026-11-01T02:00:00+00:00" in err
    assert "2 already-billed hour(s) changed from 6.00 to 8.00 USD" in err

    # the report of the same bounds is the same two hours: ml's 8.00
    out_dir = tmp_path / "report"
    report = ["report", "--db", url, "--from", "2026-11-01T00:30Z", "--to", "2026-11-01T01:30Z"]
    assert gpumeter.main([*report, "--by", "namespace", "--format", "csv", "--out", str(out_dir)]) == 0
    assert "ends at 2026-11-01T02:00:00+00:00" in capsys.readouterr().err
    (by_namespace,) = out_dir.glob("*-by-namespace.csv")
    rows = list(csv.DictReader(by_namespace.read_text().splitlines()))
    assert [(r["period_start"], r["period_end"], r["group"], r["cost"]) for r in rows] == [
        ("2026-11-01T00:00:00Z", "2026-11-01T02:00:00Z", "ml", "8.00"),
        ("2026-11-01T00:00:00Z", "2026-11-01T02:00:00Z", "__total__", "8.00"),
    ]
