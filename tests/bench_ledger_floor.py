"""The ledger's own floor: what writing a month costs with everything upstream of the write free.

    python -m tests.bench_ledger_floor [--gpus 1000] [--days 30]

Issue 49 holds the 1,000-GPU month's ingest to 1.3x the store's time answering it. This bench asks
whether the ledger's schema allows that at all, apart from the queries, the facts and the pricing:

1. **Today's rows.** A GPU-hour is a row of `gpu_hours` and a row of `cost_line_groups`, each with its
   readings as JSON text of exact decimals (docs/billing.md §6.3). The readings of the synthetic
   fleet of tests/reports/synthetic.py (the reports bench's, priced by `price_gpu_hour`) are in hand
   as ingest holds them after pricing (Decimals), the layout and set ids known; each hour's rows are
   made with the ledger's own functions (`layouts.readings_text`, `terms.readings_text`) and written
   by the ledger's own `_bulk_insert` into a migrated SQLite ledger, one transaction an hour.
2. **A GPU's day as one row.** The same GPUs, one row per GPU and day naming its layout and set, its
   hours' readings as JSON arrays of integers of 10⁻⁹ (exact, like `Exact(12, 9)`; JSON so that SQL
   reads them, as `json_each` and `jsonb_array_elements` do) made column-wise with numpy from the
   floats a store answers (orjson writes numpy arrays itself), in a scratch table beside it, inserted
   by the same `_bulk_insert`, one transaction a day.

It prints both beside the store's own time answering the month's ingest, from the billing bench's
last run on this machine (.bench/billing-victoriametrics.json), and writes .bench/ledger-floor.json.
"""

from __future__ import annotations

import argparse
import json
import random
import sqlite3
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import orjson
from sqlalchemy import Column, Integer, MetaData, PrimaryKeyConstraint, Table, Text, create_engine
from sqlalchemy.orm import Session

from gpumeter.billing.allocate import price_gpu_hour
from gpumeter.billing.ledger import layouts, open_ledger, terms
from gpumeter.billing.ledger.orm import CostLineGroup, GpuHourRow
from gpumeter.billing.ledger.sqlalchemy.rows import SqlHourRows
from gpumeter.billing.pricing import load_price_book
from tests.bench_billing import python_loop_seconds
from tests.billing.factories import write_book
from tests.reports import synthetic

BENCH = Path(".bench")
START = datetime(2026, 10, 1, tzinfo=UTC)
TARGET_STORE_RATIO = 1.3  # issue 49: the month's ingest against the store's time answering it


def _fleet_hours(gpus: int, book) -> list[tuple]:
    """Per GPU: (device values, its facts' readings, its lines' efficiencies and utilizations, lines)."""
    rng = random.Random(7)
    out = []
    for gpu in synthetic.fleet(gpus):
        gpu_hour = synthetic._day_hour(gpu, 0, START, rng)
        priced = price_gpu_hour(gpu_hour, book, synthetic.NAMESPACE_TEAMS)
        efficiencies, utilizations = priced.readings()
        out.append(
            (
                SqlHourRows._device_values(gpu_hour.device),
                gpu_hour.readings(),
                efficiencies,
                utilizations,
                len(priced.lines),
            )
        )
    return out


def todays_rows(ledger, fleet: list[tuple], hours: int) -> dict:
    """Each hour's rows made and written as `SqlWrites.write_hour` makes and writes them."""
    facts_text, lines_text = layouts.readings_text, terms.readings_text
    cpu, wall, rows = time.process_time(), time.perf_counter(), 0
    for h in range(hours):
        hour, exact = ledger._driver_values(START + timedelta(hours=h))  # as `write_hour` converts them
        facts, groups, seq = [], [], 0
        for layout_id, (device, readings, efficiencies, utilizations, lines) in enumerate(fleet):
            facts.append(
                [
                    hour,
                    *device[:-1],
                    exact(device[-1]),  # the GPU's utilization
                    layout_id,
                    facts_text(readings),
                ]
            )
            groups.append((hour, seq, layout_id, lines_text(efficiencies, utilizations)))
            seq += lines
        with Session(ledger.engine) as session, session.begin():
            SqlHourRows._bulk_insert(session, GpuHourRow.__table__, SqlHourRows.GPU_HOUR_COLUMNS, facts)
            SqlHourRows._bulk_insert(session, CostLineGroup.__table__, SqlHourRows.GROUP_COLUMNS, groups)
        rows += len(facts) + len(groups)
    return {"cpu_s": time.process_time() - cpu, "wall_s": time.perf_counter() - wall, "rows": rows}


# a GPU's day: its layout and set of terms, and per hour (arrays) presence and readings
DAY_COLUMNS = (
    "day",
    "cluster",
    "uuid",
    "first_hour",
    "hours",
    "layout_id",
    "set_id",
    "present",
    "utilization",
    "readings",
    "line_readings",
)
GPU_DAYS = Table(
    "gpu_days",
    MetaData(),
    *(
        Column(name, Integer if name in ("first_hour", "hours", "layout_id", "set_id") else Text)
        for name in DAY_COLUMNS
    ),
    PrimaryKeyConstraint("day", "cluster", "uuid", "first_hour"),
    sqlite_with_rowid=False,
)


def day_rows(path: Path, fleet: list[tuple], days: int) -> dict:
    """Each GPU's day as one row, its hours' readings as arrays made column-wise."""
    engine = create_engine(f"sqlite:///{path}")
    GPU_DAYS.metadata.create_all(engine)
    # per GPU, the width of its facts' and lines' readings: what a store's answers fill each hour
    fact_width = [len(r[0]) + 3 * len(r[1]) + 1 for _, r, *_ in fleet]
    line_width = [2 * lines for *_, lines in fleet]
    width = max(fact_width) + max(line_width)
    rng = np.random.default_rng(7)
    dumps, NUMPY = orjson.dumps, orjson.OPT_SERIALIZE_NUMPY
    cpu, wall, rows = time.process_time(), time.perf_counter(), 0
    for d in range(days):
        # the day's readings as floats from the store, each reading's hours in a row (a series' values)
        answers = rng.random((len(fleet), width, 24))
        scaled = np.rint(answers * 1e9).astype(np.int64)  # exact integers of 10⁻⁹
        present = np.full((len(fleet), 24), 3600, dtype=np.int32)
        day = (START + timedelta(days=d)).date().isoformat()
        made = [
            (
                day,
                device[0],
                device[1],
                0,
                24,
                i,
                i,
                dumps(present[i], option=NUMPY).decode(),
                dumps(scaled[i, 0], option=NUMPY).decode(),
                dumps(scaled[i, 1 : fact_width[i]], option=NUMPY).decode(),
                dumps(scaled[i, fact_width[i] : fact_width[i] + line_width[i]], option=NUMPY).decode(),
            )
            for i, (device, *_) in enumerate(fleet)
        ]
        with Session(engine) as session, session.begin():  # as today's rows: the ledger's own insert
            SqlHourRows._bulk_insert(session, GPU_DAYS, DAY_COLUMNS, made)
        rows += len(made)
    engine.dispose()
    return {"cpu_s": time.process_time() - cpu, "wall_s": time.perf_counter() - wall, "rows": rows}


# every line reading of the month (efficiency and utilization) counted and summed by SQLite, as a
# report's line sums read them: per GPU-hour from each group's JSON, or per GPU-day from its arrays
READ_TODAYS = (
    "SELECT count(v.value), sum(CAST(v.value AS REAL)) FROM cost_line_groups AS g, json_each(g.readings) AS l,"
    " json_each(l.value) AS v WHERE v.value IS NOT NULL"
)
READ_DAYS = "SELECT count(v.value), sum(v.value) FROM gpu_days AS d, json_each(d.line_readings) AS l, json_each(l.value) AS v"


def read_back(path: Path, query: str) -> dict:
    """A query's time over a written ledger, the page cache warmed by a first run (as a report after an
    ingest finds it): (its wall time, the readings it met)."""
    with sqlite3.connect(path) as connection:
        connection.execute(query).fetchone()
        wall = time.perf_counter()
        (values, _) = connection.execute(query).fetchone()
    return {"read_s": time.perf_counter() - wall, "readings": values}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.bench_ledger_floor", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--gpus", type=int, default=1000)
    parser.add_argument("--days", type=int, default=30)
    args = parser.parse_args(argv)
    BENCH.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=BENCH, prefix="ledger-floor-") as scratch:
        book = load_price_book(write_book(Path(scratch), synthetic.BOOK))
        fleet = _fleet_hours(args.gpus, book)
        ledger = open_ledger(f"sqlite:///{scratch}/ledger.db")
        try:
            today = todays_rows(ledger, fleet, 24 * args.days)
        finally:
            ledger.close()
        today["bytes"] = Path(scratch, "ledger.db").stat().st_size
        today.update(read_back(Path(scratch, "ledger.db"), READ_TODAYS))
        days = day_rows(Path(scratch, "days.db"), fleet, args.days)
        days["bytes"] = Path(scratch, "days.db").stat().st_size
        days.update(read_back(Path(scratch, "days.db"), READ_DAYS))
    gpu_months = args.gpus * args.days / 30
    billing = BENCH / "billing-victoriametrics.json"
    store = json.loads(billing.read_text()) if billing.exists() else {}
    busy = store.get("store_busy_seconds") if store.get("workers") == 1 else None
    lines = sum(f[-1] for f in fleet) / len(fleet)
    loop = python_loop_seconds()
    print(
        f"ledger floor: {args.gpus:,} GPUs x {24 * args.days} hours (tests/reports/synthetic.py,"
        f" {lines:.1f} lines a GPU-hour); a 10M-step Python loop {loop:.2f} s"
    )
    print(f"{'what':52} {'CPU':>7} {'wall':>7} {'rows':>10} {'KiB/GPU-month':>14} {'read back':>10}")
    for name, run in (
        ("today's rows: 2 a GPU-hour, readings as JSON text", today),
        ("a GPU's day as one row, readings as arrays", days),
    ):
        print(
            f"{name:52} {run['cpu_s']:6.2f}s {run['wall_s']:6.2f}s {run['rows']:10,}"
            f" {run['bytes'] / 1024 / gpu_months:14.1f} {run['read_s']:9.2f}s"
        )
    print(
        f"(read back: every line reading of the month summed by SQLite; {today['readings']:,} and"
        f" {days['readings']:,} readings)"
    )
    if busy and args.gpus == 1000 and args.days == 30:
        print(
            f"the store answering the month's ingest ({billing}, {store.get('when')}): {busy:.1f} s;"
            f" today's rows alone are {today['wall_s'] / busy:.2f}x of it, a day a row"
            f" {days['wall_s'] / busy:.2f}x (the target: the whole ingest <= {TARGET_STORE_RATIO}x)"
        )
    else:
        print(
            "(no 1,000-GPU month of `tests.bench_billing --store victoriametrics` on record to compare with)"
        )
    out = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "gpus": args.gpus,
        "days": args.days,
        "lines_per_gpu_hour": lines,
        "todays_rows": today,
        "day_rows": days,
        "store_busy_seconds": busy,
        "python_loop_seconds": loop,
    }
    (BENCH / "ledger-floor.json").write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
