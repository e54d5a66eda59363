"""Billing benchmark: one month of a 1,000-GPU mixed-MIG cluster, ingested and priced end to end.

    python -m tests.bench_billing [--step 300] [--db URL] [--keep]

1. Builds the bench fleet (125 nodes × 8 GPUs, see `bench_fleet`) as a temporary fleet YAML.
2. Writes its month of history with the simulator (`exporter.simulator.history`, the code behind
   `gpumeter simulate history`) at ``--step`` seconds, and backfills it with
   `promtool tsdb create-blocks-from openmetrics --max-block-duration=768h`. The TSDB is kept under
   .bench/ keyed by the fleet and step, so later runs start at step 3.
3. Starts a real Prometheus on it and times, in a child process (so its peak RSS is billing's
   alone), `ingest_hours` of the 720 hours into an empty ledger: queries, pricing, ledger writes.
4. Times Prometheus answering the month's totals in ONE query over HTTP, for comparison.

Prints a table against its target (docs/architecture.md: < 120 s, < 1 GiB peak) and writes .bench/billing.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import yaml

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / ".bench"
START = datetime(2026, 10, 1, tzinfo=UTC)
DAYS = 30
TARGET_SECONDS = 120.0
TARGET_BYTES = 1 << 30


def bench_fleet() -> dict:
    """125 nodes × 8 GPUs = 1,000 GPUs, 3,360 MIG instances, ~4,300 pods on schedules.

    * 40 nodes of H100 in MIG 1g.10gb×7 (h100-mig's pattern: GPUs 0-3 always held, 4-5 ten hours a
      day, 6-7 six hours of every eight);
    * 35 nodes of A100-40GB in MIG 3g.20gb + 2g.10gb + 1g.5gb×2 (3g and one 1g always held, the 2g
      twelve hours a day, the last 1g held on GPUs 0-3 only, from 6h to 18h);
    * 25 nodes of whole A100-40GB (GPUs 0-5 held 20 hours a day, 6-7 idle);
    * 25 nodes of H100 time-sliced four ways (replicas 0-1 always, 2-3 on a 9h-17h schedule).
    """
    nodes, pods = [], []

    def node(name: str, gpus: list[dict]) -> None:
        nodes.append({"name": name, "kubelet": {"device_ids": "uuid", "mig_strategy": "mixed"}, "gpus": gpus})

    def pod(namespace: str, name: str, where: str, devices: dict, **schedule) -> None:
        pods.append({"namespace": namespace, "name": name, "node": where, "devices": [devices], **schedule})

    for i in range(40):
        name = f"h100-mig-{i:03d}"
        node(name, [{"model": "H100-SXM5-80GB", "count": 8, "mig": ["1g.10gb*7"]}])
        team = f"inference-{i % 5}"
        pod(team, "ranker-{gpu}-{gi}", name, {"gpu": "0-3", "gpu_instance_id": "7-13"})
        pod(
            f"research-{i % 4}",
            "notebook-{gpu}-{gi}",
            name,
            {"gpu": "4-5", "gpu_instance_id": "7-13"},
            start="8h",
            end="18h",
            every="24h",
        )
        pod(
            f"training-{i % 3}",
            "finetune-{gpu}-{gi}",
            name,
            {"gpu": "6-7", "gpu_instance_id": "7-13"},
            start="0h",
            end="6h",
            every="8h",
        )
    for i in range(35):
        name = f"a100-mig-{i:03d}"
        node(name, [{"model": "A100-SXM4-40GB", "count": 8, "mig": ["3g.20gb", "2g.10gb", "1g.5gb*2"]}])
        pod(f"vision-{i % 4}", "detector-{gpu}", name, {"gpu": "0-7", "gpu_instance_id": 1})
        pod(
            f"nlp-{i % 4}",
            "tokenizer-{gpu}",
            name,
            {"gpu": "0-7", "gpu_instance_id": 3},
            start="6h",
            end="18h",
            every="24h",
        )
        pod(f"nlp-{i % 4}", "embedder-{gpu}", name, {"gpu": "0-7", "gpu_instance_id": 7})
        pod(
            f"data-{i % 2}",
            "sampler-{gpu}",
            name,
            {"gpu": "0-3", "gpu_instance_id": 8},
            start="6h",
            end="18h",
            every="24h",
        )
    for i in range(25):
        name = f"a100-whole-{i:03d}"
        node(name, [{"model": "A100-SXM4-40GB", "count": 8}])
        pod(f"training-{i % 3}", "pretrain-{gpu}", name, {"gpu": "0-5"}, start="0h", end="20h", every="24h")
    for i in range(25):
        name = f"h100-shared-{i:03d}"
        node(name, [{"model": "H100-SXM5-80GB", "count": 8, "time_slicing": 4}])
        pod(f"analytics-{i % 3}", "etl-{gpu}-{replica}", name, {"gpu": "0-7", "replica": "0-1"})
        pod(
            f"notebooks-{i % 2}",
            "nb-{gpu}-{replica}",
            name,
            {"gpu": "0-7", "replica": "2-3"},
            start="9h",
            end="17h",
            every="24h",
        )
    return {"seed": 7, "nodes": nodes, "pods": pods}


def _run(argv: list[str]) -> None:
    subprocess.run(argv, check=True, capture_output=True)


def build_tsdb(step: int, log=print) -> Path:
    """The bench fleet's month of history, backfilled; cached under .bench/ by fleet and step."""
    from gpumeter.exporter.simulator.fleet import parse_fleet
    from gpumeter.exporter.simulator.history import write_history
    from tests.support.servers import require_binary

    doc = bench_fleet()
    digest = hashlib.sha256(json.dumps([doc, step, START.isoformat(), DAYS]).encode()).hexdigest()[:12]
    data = BENCH / f"billing-tsdb-{digest}"
    if (data / "done").exists():
        return data
    shutil.rmtree(data, ignore_errors=True)
    BENCH.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=BENCH) as tmp:
        fleet_file = Path(tmp) / "fleet.yaml"
        fleet_file.write_text(yaml.safe_dump(doc, sort_keys=False))
        fleet = parse_fleet(yaml.safe_load(fleet_file.read_text()), str(fleet_file))
        history = Path(tmp) / "history.om"
        started = time.monotonic()
        start = START.timestamp()
        with history.open("w") as out:
            samples = write_history([fleet], start, start + DAYS * 86400, step, out)
        log(
            f"history: {samples:,} samples, {history.stat().st_size / 1e9:.1f} GB in {time.monotonic() - started:.0f} s"
        )
        started = time.monotonic()
        _run(
            [
                require_binary("promtool"),
                "tsdb",
                "create-blocks-from",
                "openmetrics",
                "--max-block-duration=768h",
                str(history),
                str(data),
            ]
        )
        log(f"backfill: {time.monotonic() - started:.0f} s")
    (data / "done").write_text(digest)
    return data


def _tree_rss(pid: int) -> int:
    """Resident bytes of a process and all its descendants (from /proc)."""
    total, stack = 0, [pid]
    while stack:
        current = stack.pop()
        try:
            with open(f"/proc/{current}/status") as status:
                for line in status:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
                        break
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children") as children:
                    stack += [int(c) for c in children.read().split()]
        except (FileNotFoundError, ProcessLookupError, ValueError):
            continue
    return total


def child(args: argparse.Namespace) -> None:
    """The measured process: ingest + price the month into an empty ledger, print JSON."""
    from gpumeter.billing.ingest import IngestConfig, ingest_hours
    from gpumeter.billing.ledger.sqlalchemy import open_ledger
    from gpumeter.billing.models import hours_between
    from gpumeter.billing.pricing import load_price_book
    from gpumeter.billing.prom import PrometheusClient

    book = load_price_book(ROOT / "billing" / "pricebooks" / "default.yaml")
    ledger = open_ledger(args.db, schema=args.schema)
    hours = hours_between(START, START + timedelta(days=DAYS))
    config = IngestConfig(scrape_interval=float(args.step), workers=args.workers)
    wall, cpu = time.perf_counter(), time.process_time()
    with PrometheusClient(args.prometheus) as client:
        if args.profile:  # cProfile of the main thread (building, pricing, waiting on the other two)
            import cProfile
            import pstats

            hours = hours[: args.profile]
            profile = cProfile.Profile()
            result = profile.runcall(ingest_hours, client, ledger, book, hours, config)
            with (BENCH / "billing-profile.txt").open("w") as out:
                stats = pstats.Stats(profile, stream=out)
                stats.sort_stats("tottime").print_stats(30)
                stats.sort_stats("cumulative").print_stats(30)
        else:
            result = ingest_hours(client, ledger, book, hours, config)
    wall = time.perf_counter() - wall
    cpu = time.process_time() - cpu
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    counts = ledger.counts()
    ledger.close()
    print(
        json.dumps(
            {
                "hours": len(result.ingested),
                "failed": [(h.isoformat(), e) for h, e in result.failed],
                "wall_s": wall,
                "cpu_s": cpu + children.ru_utime + children.ru_stime,
                "maxrss_self": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                "maxrss_largest_worker": children.ru_maxrss * 1024,
                "rows": counts,
            }
        )
    )


def _measure_child(argv: list[str]) -> tuple[dict, int]:
    """Run the child, sampling its process tree's RSS every 50 ms; (its JSON, peak tree bytes)."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, cwd=ROOT)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, _tree_rss(proc.pid))
        time.sleep(0.05)
    out = proc.stdout.read().decode()
    if proc.returncode:
        raise SystemExit(f"billing child failed ({proc.returncode}): {out[-2000:]}")
    return json.loads(out.strip().splitlines()[-1]), peak


def _promql_seconds(url: str, promql: str, at: float) -> tuple[float, int]:
    started = time.perf_counter()
    response = httpx.post(f"{url}/api/v1/query", data={"query": promql, "time": f"{at:.3f}"}, timeout=600)
    elapsed = time.perf_counter() - started
    body = response.json()
    if body.get("status") != "success":
        raise SystemExit(f"{promql}: {body}")
    return elapsed, len(body["data"]["result"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.bench_billing", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--step", type=int, default=900, help="seconds between simulated samples (default 900)"
    )
    parser.add_argument("--workers", type=int, default=2, help="ingest worker processes (default 2)")
    parser.add_argument("--db", default=None, help="ledger URL (default: a fresh SQLite file)")
    parser.add_argument("--schema", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--prometheus", default=None, help=argparse.SUPPRESS)
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="HOURS",
        help="profile (cProfile) the first HOURS hours in one process into .bench/billing-profile.txt; no table",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args)
        return 0

    from tests.support.servers import PrometheusServer

    data = build_tsdb(args.step)
    with tempfile.TemporaryDirectory(dir=BENCH, prefix="billing-run-") as tmp:
        db, schema, drop = args.db or f"sqlite:///{Path(tmp) / 'ledger.db'}", None, None
        if db.startswith("postgresql"):
            import psycopg

            schema = f"bench_{os.getpid()}"
            dsn = db.replace("postgresql+psycopg://", "postgresql://")
            with psycopg.connect(dsn, autocommit=True) as admin:
                admin.execute(f'CREATE SCHEMA "{schema}"')
            drop = (dsn, schema)
        server = PrometheusServer(Path(tmp) / "prom", data_dir=data).start()
        try:
            end = (START + timedelta(days=DAYS)).timestamp() - 0.001
            totals = "sum by (namespace) (count_over_time(nvidia_gpu_allocation[30d]))"
            _promql_seconds(server.url, "count(nvidia_gpu_info)", end)  # Prometheus is up and answering
            argv = [sys.executable, "-m", "tests.bench_billing", "--child", "--step", str(args.step)]
            argv += ["--workers", str(args.workers), "--db", db, "--prometheus", server.url]
            argv += ["--profile", str(args.profile)] if args.profile else []
            argv += ["--schema", schema] if schema else []
            load = os.getloadavg()
            run, peak = _measure_child(argv)
            promql = [_promql_seconds(server.url, totals, end) for _ in range(3)]
        finally:
            server.stop()
            if drop:
                import psycopg

                with psycopg.connect(drop[0], autocommit=True) as admin:
                    admin.execute(f'DROP SCHEMA "{drop[1]}" CASCADE')
    if args.profile:
        print(f"profiled {run['hours']} hours in {run['wall_s']:.1f} s: {BENCH / 'billing-profile.txt'}")
        return 0
    if run["failed"] or run["hours"] != DAYS * 24:
        raise SystemExit(f"ingest failed: {run['failed'][:1]} ({run['hours']} hours ingested)")
    rows = sum(v for k, v in run["rows"].items() if k not in ("ingest_runs", "price_book_versions"))
    report = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "load_average_before": [round(x, 2) for x in load],
        "fleet": "125 nodes x 8 GPUs = 1,000 GPUs, 3,360 MIG instances (tests/bench_billing.py)",
        "period": f"{START.isoformat()} + {DAYS} days = {DAYS * 24} hours, samples every {args.step} s",
        "ledger": db.split(":", 1)[0],
        "workers": args.workers,
        "ingest_price_seconds": round(run["wall_s"], 1),
        "ingest_price_cpu_seconds": round(run["cpu_s"], 1),
        "peak_rss_bytes_all_billing_processes": peak,
        "maxrss_bytes_parent": run["maxrss_self"],
        "maxrss_bytes_largest_worker": run["maxrss_largest_worker"],
        "rows_written": run["rows"],
        "promql_month_totals_seconds": [round(s, 2) for s, _ in promql],
        "promql_month_totals_series": promql[0][1],
        "target_seconds": TARGET_SECONDS,
        "target_bytes": TARGET_BYTES,
    }
    (BENCH / "billing.json").write_text(json.dumps(report, indent=2) + "\n")
    ok_time = run["wall_s"] < TARGET_SECONDS
    ok_mem = peak < TARGET_BYTES
    print(f"billing bench: {report['fleet']}; {report['period']}; ledger {report['ledger']}")
    print(f"{'what':<58} {'measured':>14} {'target':>10}")
    print(
        f"{'ingest + price, 720 hours (wall)':<58} {run['wall_s']:>12.1f} s {'< 120 s':>10} {'ok' if ok_time else 'MISSED'}"
    )
    print(f"{'  CPU seconds, all billing processes':<58} {run['cpu_s']:>12.1f} s")
    print(
        f"{'peak RSS, billing process tree (sum)':<58} {peak / 2**20:>10.0f} MiB {'< 1 GiB':>10} {'ok' if ok_mem else 'MISSED'}"
    )
    print(
        f"{'  largest single process (maxrss)':<58} {max(run['maxrss_self'], run['maxrss_largest_worker']) / 2**20:>10.0f} MiB"
    )
    print(f"{'rows written (facts + lines)':<58} {rows:>14,}")
    best = min(s for s, _ in promql)
    print(f"{'Prometheus: ' + totals[:44] + '…, one query':<58} {best:>12.2f} s")
    print(f"wrote {BENCH / 'billing.json'}")
    return 0 if ok_time and ok_mem else 1


if __name__ == "__main__":
    sys.exit(main())
