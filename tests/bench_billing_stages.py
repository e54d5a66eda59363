"""Billing's stages one at a time: CPU per hour of building facts, pricing and writing day 2 of the
billing bench, the answers queried once, min over several runs.

    python -m tests.bench_billing_stages [--runs 5] [--db postgresql+psycopg://…]

`tests.bench_billing` times the month with its three threads overlapping, which hides which stage a
change moved, and one run on a shared machine varies by ±10 %. Here each stage of each hour is timed
alone with `time.process_time()` in one thread (day 1 warms the pricer's memo and the ledger's
layouts and terms, as the month's first day does), each run on a fresh SQLite ledger, and the least
of the runs is kept. Uses the bench's cached history (`.bench/`, built by `tests.bench_billing`).
With ``--db`` each run writes into a fresh schema of that PostgreSQL database, and the write's wall
time is printed beside its CPU: there the server's work is the client's wait.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from tests.bench_billing import ROOT, START, build_stores, create_schema, drop_schema


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.bench_billing_stages", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--runs", type=int, default=5, help="runs of day 2, the least kept (default 5)")
    parser.add_argument("--db", default=None, help="a PostgreSQL URL (default: a fresh SQLite file per run)")
    args = parser.parse_args(argv)

    from gpumeter.billing.ingest import (
        CarriedLayouts,
        IngestConfig,
        priced_record,
        query_intervals,
        query_run,
    )
    from gpumeter.billing.ledger.sqlalchemy import open_ledger
    from gpumeter.billing.models import hours_between
    from gpumeter.billing.pricer import Pricer
    from gpumeter.billing.pricing import load_price_book
    from gpumeter.billing.prom import PrometheusClient
    from gpumeter.process import no_collections
    from tests.support.servers import PrometheusServer

    data, _ = build_stores(900, stores=("prometheus",))
    book = load_price_book(ROOT / "billing" / "pricebooks" / "default.yaml")
    hours = hours_between(START, START + timedelta(days=2))
    config = IngestConfig(scrape_interval=900.0)
    with tempfile.TemporaryDirectory() as tmp:
        server = PrometheusServer(Path(tmp) / "prom", data_dir=data).start()
        # the collector paused, as the ingest pauses it, for every stage: with the default
        # thresholds, decoding a day's answers alone took twice the CPU
        with no_collections():
            try:
                with PrometheusClient(server.url) as client:
                    started = time.process_time()
                    days = [
                        (
                            query_run(client, hours[at : at + 24]),
                            query_intervals(client, hours[at : at + 24], config),
                        )
                        for at in (0, 24)
                    ]
                    reading = (time.process_time() - started) / len(hours)
            finally:
                server.stop()
            best = {
                "build": float("inf"),
                "price": float("inf"),
                "write": float("inf"),
                "write (wall)": float("inf"),
            }
            for run in range(args.runs):
                schema = f"bench_stages_{os.getpid()}_{run}" if args.db else None
                if schema is not None:
                    create_schema(args.db, schema)
                ledger, pricer, layouts = (
                    open_ledger(args.db or f"sqlite:///{tmp}/ledger-{run}.db", schema=schema),
                    Pricer(book),
                    CarriedLayouts(),
                )
                spent = dict.fromkeys(best, 0.0)
                for day, (answers, intervals) in enumerate(days):
                    answers.layouts = layouts  # carried from run to run, as the serial ingest does
                    for index, hour in enumerate(answers.hours):
                        started = time.process_time()
                        gpu_hours, teams = answers.build(index, config, intervals[hour], [])
                        built = time.process_time()
                        record, _ = priced_record(pricer, hour, gpu_hours, teams)
                        priced, wall = time.process_time(), time.perf_counter()
                        ledger.write_hour(record, source="bench")
                        written, wall = time.process_time(), time.perf_counter() - wall
                        if day == 1:
                            spent["build"] += built - started
                            spent["price"] += priced - built
                            spent["write"] += written - priced
                            spent["write (wall)"] += wall
                ledger.close()
                if schema is not None:
                    drop_schema(args.db, schema)
                for stage, seconds in spent.items():
                    best[stage] = min(best[stage], seconds / 24)
    print(f"ms of CPU an hour, day 2 of the billing bench, least of {args.runs} runs, one thread:")
    print(f"  {'reading answers (once, both days)':<36} {1000 * reading:8.1f}")
    for stage, seconds in best.items():
        print(f"  {stage:<36} {1000 * seconds:8.1f}")
    print(
        f"  {'build + price + write (CPU)':<36} {1000 * (best['build'] + best['price'] + best['write']):8.1f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
