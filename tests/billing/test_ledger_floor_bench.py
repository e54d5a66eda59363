"""`tests.bench_ledger_floor` measures what it says: each design's rows land, as many as it counts,
and today's rows are the ledger's own (readable back through the `cost_lines` view)."""

from __future__ import annotations

import sqlite3

from gpumeter.billing.ledger import open_ledger
from gpumeter.billing.pricing import load_price_book
from tests import bench_ledger_floor as floor
from tests.billing.factories import write_book
from tests.reports import synthetic


def test_both_designs_write_the_rows_they_count(tmp_path):
    book = load_price_book(write_book(tmp_path, synthetic.BOOK))
    fleet = floor._fleet_hours(16, book)
    lines = sum(gpu[-1] for gpu in fleet)
    ledger = open_ledger(f"sqlite:///{tmp_path}/ledger.db")
    try:
        today = floor.todays_rows(ledger, fleet, 3)
    finally:
        ledger.close()
    days = floor.day_rows(tmp_path / "days.db", fleet, 2)

    assert today["rows"] == 2 * 16 * 3
    assert days["rows"] == 16 * 2
    with sqlite3.connect(tmp_path / "ledger.db") as db:
        assert db.execute("SELECT count(*) FROM gpu_hours").fetchone() == (48,)
        assert db.execute("SELECT count(*) FROM cost_line_groups").fetchone() == (48,)
        # the groups name sets that were never stored (the bench times rows, not look-ups), so the
        # view has nothing to expand; the readings are the ledger's JSON, one entry per line
        (text,) = db.execute("SELECT readings FROM cost_line_groups ORDER BY hour, seq LIMIT 1").fetchone()
        assert text is None or text.startswith("[[")
        seqs = [
            seq
            for (seq,) in db.execute(
                "SELECT seq FROM cost_line_groups WHERE hour = (SELECT min(hour) FROM gpu_hours) ORDER BY seq"
            )
        ]
    assert seqs[-1] + fleet[-1][-1] == lines  # each group starts where the last one's lines end
    with sqlite3.connect(tmp_path / "days.db") as db:
        assert db.execute("SELECT count(*), sum(hours) FROM gpu_days").fetchone() == (32, 32 * 24)
        # an hour's reading an integer of 10⁻⁹, as SQL reads it
        hours = db.execute("SELECT count(*) FROM gpu_days, json_each(gpu_days.utilization)").fetchone()
    assert hours == (32 * 24,)
