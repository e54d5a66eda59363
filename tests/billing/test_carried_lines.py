"""A GPU's lines carried from hour to hour (docs/billing.md §6.3): where a GPU-hour's lines have the
terms of an hour the ledger stored before (`PricedHour.terms`: the same kept result, teams and turn of
a tie), the SQL ledger names that hour's keys and term ids again instead of looking each line up.
What it stores must be exactly what looking every line up stores: checked against the in-memory
ledger, which keeps the lines as given, through a tie's turns, a team change and a new price version."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from decimal import Decimal

import sqlalchemy as sa

from gpumeter.billing.ingest import priced_record
from gpumeter.billing.ledger import open_ledger
from gpumeter.billing.pricer import Pricer
from gpumeter.billing.pricing import load_price_book
from tests.billing.factories import A100, HOUR0, alloc, gpu_hour, write_book
from tests.billing.test_ledger import write_with_lines_failing

HOURS = [HOUR0 + timedelta(hours=n) for n in range(8)]


def _book(tmp_path, name="prices.yaml", *, second_rate="2.00"):
    """$1.00 an hour split three ways (a cent left over: a tie), then from hour 5 another rate."""
    doc = {
        "currency": "USD",
        "versions": [
            {"effective_from": "2026-01-01T00:00:00Z", "gpus": {"A100-40GB": "1.00"}},
            {"effective_from": HOURS[5].isoformat(), "gpus": {"A100-40GB": second_rate}},
        ],
    }
    return load_price_book(write_book(tmp_path, doc, name))


def _gpu_hours(hour):
    """A whole A100 time-sliced by three pods, and a whole A100 held by one."""
    third = "0.333333333"
    shared = gpu_hour(
        "GPU-shared", A100, [], [alloc("GPU-shared", f"ns-{p}", p, share=third) for p in "abc"], hour=hour
    )
    shared.allocations[:] = [dataclasses.replace(a, sharing="time-slicing") for a in shared.allocations]
    whole = gpu_hour("GPU-whole", A100, [], [alloc("GPU-whole", "ns-a", "train")], hour=hour)
    for gh in (shared, whole):  # other readings every hour, as a real hour has
        gh.allocations[:] = [
            dataclasses.replace(a, utilization=Decimal(hour.hour) / 10) for a in gh.allocations
        ]
    return [shared, whole]


def _record(pricer, hour, teams):
    return priced_record(pricer, hour, _gpu_hours(hour), teams)[0]


def _teams(hour):
    return {"ns-a": "alpha" if hour < HOURS[3] else "beta"}  # ns-a moves to another team at hour 3


def test_carried_lines_are_the_lines_looked_up_one_by_one(sql_ledger, tmp_path):
    prices = _book(tmp_path)
    pricer, reference = Pricer(prices), open_ledger("memory://")
    records = [_record(pricer, hour, _teams(hour)) for hour in HOURS]
    # the hours do exercise the carry: kept results re-used, a tie turning, the teams changing
    shared = [record.line_groups[0][1] for record in records]
    # priced afresh: the first hour and the hour the price changes; the others re-use a kept result
    assert [n for n, terms in enumerate(shared) if terms is None] == [0, 5]
    assert len({shared[n][2] for n in (1, 2, 3, 4)}) > 1, "the tie's turn changes from hour to hour"
    assert shared[2][1] != shared[3][1], "the team changes"
    for record in records:
        sql_ledger.write_hour(record)
        reference.write_hour(record)
    end = HOURS[-1] + timedelta(hours=1)
    assert sql_ledger.lines(HOURS[0], end) == reference.lines(HOURS[0], end)
    assert {line.team for line in sql_ledger.lines(HOURS[4], HOURS[5]) if line.namespace == "ns-a"} == {
        "beta"
    }


def test_an_hour_rolled_back_carries_nothing_to_the_next(sql_ledger, tmp_path):
    """Terms stored by an hour that was rolled back are gone: the next hour with the same terms must
    store them again, not name their ids."""
    prices = _book(tmp_path)
    pricer = Pricer(prices)
    _record(pricer, HOURS[0], _teams(HOURS[0]))  # priced once: the next hours re-use it, with terms
    first, second = (_record(pricer, hour, _teams(hour)) for hour in HOURS[1:3])
    assert first.line_groups[0][1] is not None
    write_with_lines_failing(sql_ledger, first)
    assert sql_ledger.counts()["cost_line_terms"] == 0
    sql_ledger.write_hour(second)
    sql_ledger.write_hour(first)
    reference = open_ledger("memory://")
    for record in (second, first):
        reference.write_hour(record)
    assert sql_ledger.lines(HOURS[1], HOURS[3]) == reference.lines(HOURS[1], HOURS[3])


def test_lines_are_carried_only_under_the_price_version_row_that_stored_them(sql_ledger, tmp_path):
    """Two books whose versions price these GPUs alike but are other rows of price_book_versions:
    a line written under the second names the second's row, whatever the first hour carried."""
    first_book = _book(tmp_path, "first.yaml")
    second_book = _book(tmp_path, "second.yaml", second_rate="9.00")  # differs after hour 5 only
    pricer = Pricer(first_book)
    _record(pricer, HOURS[0], _teams(HOURS[0]))
    record = _record(pricer, HOURS[1], _teams(HOURS[1]))
    assert record.line_groups[0][1] is not None
    sql_ledger.write_hour(record)
    # the same lines and line groups (the same terms) an hour later, priced by the second book
    again = dataclasses.replace(
        record,
        hour=HOURS[2],
        lines=[dataclasses.replace(line, hour=HOURS[2]) for line in record.lines],
        book=second_book,
    )
    assert again.line_groups == record.line_groups
    sql_ledger.write_hour(again)
    versions = {line.price_version for line in sql_ledger.lines(HOURS[1], HOURS[3])}
    assert len(versions) == 1  # the same version id in both books...
    with sql_ledger.engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT h.hour, t.price_version_id FROM cost_lines h "
                "JOIN cost_line_terms t ON t.id = h.term_id ORDER BY h.hour"
            )
        ).all()
    by_hour = {}
    for hour, version_row in rows:
        by_hour.setdefault(str(hour)[:19], set()).add(version_row)
    assert len(by_hour) == 2 and all(len(v) == 1 for v in by_hour.values())
    first_row, second_row = (next(iter(v)) for _, v in sorted(by_hour.items()))
    assert first_row != second_row  # ...but each hour names the row of the book that priced it


def test_groups_that_are_not_their_gpus_lines_are_neither_used_nor_learned(sql_ledger, tmp_path):
    """Two idle GPUs have equal terms apart from the GPU (one kept result, no teams, no tie). A record
    whose groups name the wrong GPU (a caller's mistake) is stored line by line, and teaches the
    ledger nothing that a later, right record would take for the other GPU's lines."""
    pricer, reference = Pricer(_book(tmp_path)), open_ledger("memory://")
    records = []
    for hour in HOURS[:4]:
        idle = [gpu_hour(uuid, A100, hour=hour) for uuid in ("GPU-idle-a", "GPU-idle-b")]
        records.append(priced_record(pricer, hour, idle, {})[0])
    a, b = records[2].line_groups
    assert a[1] is not None and a[1] == b[1], "the two GPUs' lines have equal terms"
    records[2] = dataclasses.replace(records[2], line_groups=((b[0], *a[1:]), (a[0], *b[1:])))
    for record in records:
        sql_ledger.write_hour(record)
        reference.write_hour(record)
    assert sql_ledger.lines(HOURS[0], HOURS[4]) == reference.lines(HOURS[0], HOURS[4])


def test_lines_whose_terms_are_carried_are_stored_without_being_made(sql_ledger, tmp_path):
    """Ingest's record makes its lines only when read (`PricedLines`). A GPU-hour priced from a kept
    result whose terms the ledger carries is stored from its priced hour's readings: its lines are
    never made, and what is stored is still every line with its own hour's utilization."""
    pricer, reference = Pricer(_book(tmp_path)), open_ledger("memory://")
    records = [priced_record(pricer, hour, _gpu_hours(hour)[1:], {"ns-a": "alpha"})[0] for hour in HOURS[:4]]
    for record in records:
        sql_ledger.write_hour(record)
    # per hour, whether its GPU-hour's lines exist (a `_ReusedHour` makes them when read)
    made = [getattr(record.lines.hours[0], "_lines", True) is not None for record in records]
    # hour 0 priced afresh, hour 1 re-used but looked up (nothing carried yet), hours 2-3 named again
    assert made == [True, True, False, False]
    for record in records:
        reference.write_hour(record)  # the in-memory ledger keeps the lines themselves: made now
    lines = sql_ledger.lines(HOURS[0], HOURS[4])
    assert lines == reference.lines(HOURS[0], HOURS[4])
    held = [line for line in lines if line.pod == "train"]
    assert [line.utilization for line in held] == [Decimal(n) / 10 for n in range(4)]
