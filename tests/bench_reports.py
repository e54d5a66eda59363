"""`python -m tests.bench_reports`: render every format of the monthly report for a simulated month of
a 1,000-GPU fleet (docs/architecture.md target: all teams, all formats, < 15 s); `--gpus 10000`: the
10,000-GPU month against its own target (< 60 s, < 2 GiB peak). Prints the wall time and peak RSS
against the targets, with a plain 10M-step Python loop's time and the load average, since figures on
a shared machine move with it.

The ledger is built synthetically through billing's APIs (tests/reports/synthetic.py: seeded fleet,
`price_gpu_hour` + `Ledger.write_hour`), once, and kept in .bench/ (keyed by its parameters) so that
re-runs time the report alone. It holds November and October: a monthly report compares with the
month before, and reads it (until 2026-12-07 the bench's ledger held November alone, so the figures
left that read out). Prints the figure and writes .bench/reports-<gpus>gpu.json.
"""

from __future__ import annotations

import argparse
import atexit
import json
import logging
import os
import platform
import resource
import shutil
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

from gpumeter.billing.ledger import open_ledger
from gpumeter.billing.pricing import load_price_book
from gpumeter.reports.model import month_period
from gpumeter.reports.render import FORMATS
from gpumeter.reports.run import generate
from tests.bench_billing import python_loop_seconds
from tests.billing.factories import write_book
from tests.reports import synthetic

BENCH = Path(".bench")
# (seconds, peak MiB) by fleet size: docs/architecture.md's targets; other sizes take the nearest below
TARGETS = {1000: (15.0, 2048.0), 10_000: (60.0, 2048.0)}
SYNTHETIC_VERSION = 1  # bump when synthetic.py changes what it writes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gpus", type=int, default=1000)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--db", help="ledger URL (default: a cached SQLite file in .bench/)")
    parser.add_argument("--rebuild", action="store_true", help="rebuild the cached ledger")
    args = parser.parse_args(argv)
    target_s, target_mib = TARGETS[max([n for n in TARGETS if n <= args.gpus] or [min(TARGETS)])]
    loop_s = python_loop_seconds()
    logging.disable(logging.WARNING)  # the unpriced VR200 warns once per hour
    BENCH.mkdir(exist_ok=True)
    period = month_period("2026-11")
    if args.days > 30:
        parser.error("--days: at most 30 (November)")
    # the book and the report's files in one scratch folder, removed at exit (10,000 GPUs: 1.7 GB)
    scratch = Path(tempfile.mkdtemp(prefix="bench-reports-"))
    atexit.register(shutil.rmtree, scratch, ignore_errors=True)
    book = load_price_book(write_book(scratch, synthetic.BOOK))

    db_file = BENCH / f"reports-ledger-v{SYNTHETIC_VERSION}-{args.gpus}gpu-{args.days}d.db"
    url = args.db or f"sqlite:///{db_file}"
    build_s = None
    if args.rebuild and db_file.exists() and not args.db:
        db_file.unlink()
    ledger = open_ledger(url)
    try:
        # the month and the one before, which every monthly report compares with (a ledger of an
        # earlier bench, November alone, gets its October added)
        previous = period.previous()
        for month, days in (
            (previous, min(args.days, (previous.end - previous.start).days)),
            (period, args.days),
        ):
            # a month whose build was cut short is written again whole (each hour replaces its own)
            if len(ledger.ingested_hours(month.start, month.end)) >= days * 24:
                continue
            print(
                f"building the ledger: {args.gpus} GPUs x {days * 24} hours of {month.label} into {url} ...",
                flush=True,
            )
            started = time.perf_counter()
            lines = synthetic.fill(ledger, book, month.start, days, args.gpus)
            build_s = (build_s or 0.0) + time.perf_counter() - started
            print(f"  {lines:,} lines in {time.perf_counter() - started:.1f} s", flush=True)
        counts = ledger.counts()
        out = scratch / "out"
        started = time.perf_counter()
        with TreeMemory() as together:
            result = generate(ledger, period, "team", FORMATS, out, trigger="bench", record=False)
        seconds = time.perf_counter() - started
    finally:
        ledger.close()
    sizes = {name: (out / name).stat().st_size for name in result.files}
    own_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    worker_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    # the report and its line sums' process at once (sampled), never less than the report's own peak
    peak_mib = max(own_mib, together.peak_mib)
    figure = {
        "what": "monthly report, all teams, all formats (html, csv, json, focus)",
        "gpus": args.gpus,
        "hours": args.days * 24,
        "ledger_lines": counts["cost_lines"],
        "ledger": "sqlite" if url.startswith("sqlite") else url.split(":", 1)[0],
        "charge_rows": len(result.report.charges),
        "teams": len(result.report.groups),
        "seconds": round(seconds, 2),
        "target_seconds": target_s,
        "peak_rss_mib": round(peak_mib),
        "peak_rss_own_mib": round(own_mib),
        "peak_rss_sums_process_mib": round(worker_mib),
        "target_peak_rss_mib": target_mib,
        "met": seconds < target_s and peak_mib < target_mib,
        "python_10m_loop_seconds": round(loop_s, 3),
        "load_average": os.getloadavg(),
        "files": sizes,
        "ledger_build_seconds": None if build_s is None else round(build_s, 1),
        "python": sys.version.split()[0],
        "machine": platform.machine(),
        "measured_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    (BENCH / f"reports-{args.gpus}gpu.json").write_text(json.dumps(figure, indent=1) + "\n")
    print(
        f"reports: {args.gpus} GPUs x {args.days * 24} h, {counts['cost_lines']:,} ledger lines (the month and the one before) -> "
        f"{len(result.report.charges):,} charge rows, {len(result.report.groups)} teams: "
        f"all formats in {seconds:.2f} s (target < {target_s:.0f} s: {'met' if seconds < target_s else 'NOT met'}), "
        f"peak RSS {peak_mib:.0f} MiB with its line sums' process (target < {target_mib:.0f} MiB: "
        f"{'met' if peak_mib < target_mib else 'NOT met'}; its own {own_mib:.0f}, the sums' "
        f"{worker_mib:.0f}); a 10M-step Python loop {loop_s:.2f} s, "
        f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}"
    )
    for name, size in sizes.items():
        print(f"  {name}: {size / 1e6:.1f} MB")
    return 0 if figure["met"] else 1


class TreeMemory:
    """The largest resident memory of this process and its children together, sampled every 50 ms
    while the block runs (the report's line sums may run in a process of its own: its memory counts)."""

    def __init__(self) -> None:
        self.peak_mib = 0.0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> TreeMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()

    def _sample(self) -> None:
        while not self._done.wait(0.05):
            pids = [os.getpid()]
            for task in Path("/proc/self/task").iterdir():
                try:
                    pids += [int(p) for p in (task / "children").read_text().split()]
                except OSError:
                    pass
            self.peak_mib = max(self.peak_mib, sum(_rss_kib(pid) for pid in pids) / 1024)


def _rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:  # exited meanwhile
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
