"""Billing benchmark: one month of a 1,000-GPU mixed-MIG cluster, ingested and priced end to end.

    python -m tests.bench_billing [--workers 1] [--scale 10] [--days 30] [--db URL] [--hours N]
                                  [--store prometheus|victoriametrics] [--reprice]
                                  [--without line-rows|pricing|writes ...]

1. Builds the bench fleet (125 nodes × 8 GPUs, × ``--scale``, see `bench_fleet`) as a temporary
   fleet YAML.
2. Writes its history with the simulator (`gpumeter.simulator.history`, the code behind
   `gpumeter simulate history`) at ``--step`` seconds, streamed straight into a VictoriaMetrics data
   directory and, unless ``--store victoriametrics``, as a file backfilled with
   `promtool tsdb create-blocks-from openmetrics --max-block-duration=768h` (`build_stores`). Both
   are kept under .bench/ keyed by the fleet, step and days, so later runs start at step 3.
3. Starts a real Prometheus (``--store victoriametrics``: VictoriaMetrics) on it and times, in a
   child process (so its peak RSS is billing's alone), `ingest_hours` of every hour into an empty
   ledger: queries, pricing, ledger writes. The child's client times every request it sends
   (tests/bench_support/store_time.py): the store's own time in the same run, which the ingest's
   wall time is held to (``TARGET_STORE_RATIO``). ``--reprice`` then re-prices the stored month.
4. Times Prometheus and VictoriaMetrics answering the period's totals in ONE query over HTTP, for
   comparison.

Prints a table against the targets (a 1,000-GPU month in < 45 s in one process, < 1 GiB
peak; a 10,000-GPU month: time and memory recorded) and writes .bench/billing[-scale].json.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / ".bench"
START = datetime(2026, 10, 1, tzinfo=UTC)
DAYS = 30
TARGET_SECONDS = 45.0  # the 1,000-GPU month, one process (docs/performance.md, "Status")
TARGET_BYTES = 1 << 30
# the ingest's wall time against the store's time answering it in the same run (docs/performance.md)
TARGET_STORE_RATIO = 1.3
TARGET_REPRICE_SECONDS = 60.0  # re-pricing a stored month (`--reprice`; a shorter period scaled to 30 days)
STORES = ("prometheus", "victoriametrics")
# A query may select at most 300,000 series in VictoriaMetrics by default; billing's allocation query
# selects a series per pod and device held (417,000 at 100,000 GPUs), so a store that size is run with
# the limit raised (docs/billing.md §6.4), as here
VM_QUERY_LIMITS = ("-search.maxUniqueTimeseries=5000000",)
TOTALS = "sum by (namespace) (count_over_time(nvidia_gpu_allocation[{days}d]))"


def bench_fleet(scale: int = 1) -> dict:
    """125 nodes × 8 GPUs = 1,000 GPUs, 3,360 MIG instances, ~4,300 pods on schedules (× ``scale``:
    the same mix on ``scale`` times as many nodes).

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

    for i in range(40 * scale):
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
    for i in range(35 * scale):
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
    for i in range(25 * scale):
        name = f"a100-whole-{i:03d}"
        node(name, [{"model": "A100-SXM4-40GB", "count": 8}])
        pod(f"training-{i % 3}", "pretrain-{gpu}", name, {"gpu": "0-5"}, start="0h", end="20h", every="24h")
    for i in range(25 * scale):
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


def build_stores(
    step: int, log=print, scale: int = 1, days: int = DAYS, stores: tuple[str, ...] = STORES
) -> tuple[Path | None, Path | None]:
    """The bench fleet's history in the stores asked for: backfilled into a Prometheus TSDB, and
    streamed straight into a VictoriaMetrics data directory; each cached under .bench/ by fleet, step
    and days (None for a store not asked for). Only Prometheus's backfill needs the history as a file:
    a 100,000-GPU day is tens of GB of text, so with VictoriaMetrics alone nothing touches the disk
    but the store's own compressed data."""
    from gpumeter.simulator.fleet import parse_fleet
    from gpumeter.simulator.history import write_history
    from tests.support.servers import VictoriaMetricsServer, require_binary

    doc = bench_fleet(scale)
    digest = hashlib.sha256(json.dumps([doc, step, START.isoformat(), days]).encode()).hexdigest()[:12]
    data, vm_data = BENCH / f"billing-tsdb-{digest}", BENCH / f"billing-vm-{digest}"
    wanted = {"prometheus": data, "victoriametrics": vm_data}
    missing = [store for store in stores if not (wanted[store] / "done").exists()]
    if missing:
        BENCH.mkdir(exist_ok=True)
        with tempfile.TemporaryDirectory(dir=BENCH) as tmp, contextlib.ExitStack() as stack:
            fleet_file = Path(tmp) / "fleet.yaml"
            fleet_file.write_text(yaml.safe_dump(doc, sort_keys=False))
            fleet = parse_fleet(yaml.safe_load(fleet_file.read_text()), str(fleet_file))
            sinks: list[Any] = []
            history = Path(tmp) / "history.om"
            if "prometheus" in missing:
                shutil.rmtree(data, ignore_errors=True)
                sinks.append(stack.enter_context(history.open("w")))
            if "victoriametrics" in missing:
                shutil.rmtree(vm_data, ignore_errors=True)
                vm = VictoriaMetricsServer(Path(tmp) / "vm", extra_args=[f"-storageDataPath={vm_data}"])
                stack.callback(vm.stop)
                sinks.append(stack.enter_context(VictoriaMetricsImport(vm.start().url)))
            started = time.monotonic()
            start = START.timestamp()
            samples = write_history([fleet], start, start + days * 86400, step, _Tee(sinks))  # type: ignore[arg-type]
            stack.close()  # the file closed; the import finished, VictoriaMetrics stopped and flushed
            log(
                f"history: {samples:,} samples into {', '.join(missing)} in {time.monotonic() - started:.0f} s"
            )
            if "victoriametrics" in missing:
                (vm_data / "done").write_text(digest)
            if "prometheus" in missing:
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
                log(
                    f"backfill: {time.monotonic() - started:.0f} s ({history.stat().st_size / 1e9:.1f} GB of text)"
                )
                (data / "done").write_text(digest)
    return (data if "prometheus" in stores else None, vm_data if "victoriametrics" in stores else None)


class _Tee:
    """One text sink writing to several."""

    def __init__(self, sinks: list):
        self.sinks = sinks

    def write(self, text: str) -> None:
        for sink in self.sinks:
            sink.write(text)


_COMMENT = re.compile(rb"^#[^\n]*\n", re.M)
_SECONDS = re.compile(rb" (\d+)\n")


class VictoriaMetricsImport:
    """A text sink for OpenMetrics lines that posts them to VictoriaMetrics' text import API in
    blocks of whole lines (`write_history` writes one line per call), from a thread of its own so
    VictoriaMetrics parses one block while the next is generated. Its timestamps are milliseconds:
    the history's whole seconds get three zeros; comments go."""

    def __init__(self, url: str, block: int = 32 << 20):
        self.url, self.block = url, block
        self._parts: list[str] = []
        self._size = 0
        self._sender = ThreadPoolExecutor(1)
        self._pending: Future[None] | None = None
        self._client = httpx.Client(timeout=600)

    def __enter__(self) -> VictoriaMetricsImport:
        return self

    def __exit__(self, *exc) -> None:
        try:
            if exc[0] is None:
                self.flush()
                self._client.get(f"{self.url}/internal/force_flush").raise_for_status()
        finally:
            self._sender.shutdown()
            self._client.close()

    def write(self, text: str) -> None:
        self._parts.append(text)
        self._size += len(text)
        if self._size >= self.block:
            self._send()

    def flush(self) -> None:
        if self._parts:
            self._send()
        if self._pending is not None:
            self._pending.result()
            self._pending = None

    def _send(self) -> None:
        body = "".join(self._parts).encode()
        self._parts, self._size = [], 0
        if self._pending is not None:
            self._pending.result()  # one block in flight: memory stays two blocks
        self._pending = self._sender.submit(self._post, body)

    def _post(self, body: bytes) -> None:
        body = _SECONDS.sub(rb" \g<1>000\n", _COMMENT.sub(b"", body))
        self._client.post(f"{self.url}/api/v1/import/prometheus", content=body).raise_for_status()


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
    from tests.bench_support.store_time import TimedTransport

    book = load_price_book(ROOT / "billing" / "pricebooks" / "default.yaml")
    ledger = open_ledger(args.db, schema=args.schema)
    ledger, pricer = _without(args.without, ledger, book)
    hours = hours_between(START, START + timedelta(days=args.days))[: args.hours or None]
    # no deadline: the hourly job's 20 minutes bound a catch-up, not the throughput measured here
    config = IngestConfig(scrape_interval=float(args.step), workers=args.workers, deadline=0)
    # workers open their own clients, which the store's time cannot be read from
    transport = TimedTransport() if args.workers == 1 else None
    wall, cpu = time.perf_counter(), time.process_time()
    with PrometheusClient(args.prometheus, transport=transport) as client:
        if args.profile:  # cProfile of the main thread (building, pricing, waiting on the other two)
            import cProfile
            import pstats

            hours = hours[: args.profile]
            profile = cProfile.Profile()
            result = profile.runcall(ingest_hours, client, ledger, book, hours, config, pricer=pricer)
            with (BENCH / "billing-profile.txt").open("w") as out:
                stats = pstats.Stats(profile, stream=out)
                stats.sort_stats("tottime").print_stats(30)
                stats.sort_stats("cumulative").print_stats(30)
        else:
            result = ingest_hours(client, ledger, book, hours, config, pricer=pricer)
    wall = time.perf_counter() - wall
    cpu = time.process_time() - cpu
    repriced = None
    if args.reprice:  # the month's stored facts priced again, as after a price-book change
        from gpumeter.billing.ingest import reprice

        started = time.perf_counter()
        count = reprice(ledger, book, hours[0], hours[-1] + timedelta(hours=1), {})
        repriced = {"hours": count, "wall_s": time.perf_counter() - started}
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    counts = _stored_rows(ledger.engine)
    ledger.close()
    print(
        json.dumps(
            {
                "hours": len(result.ingested),
                "failed": [(h.isoformat(), e) for h, e in result.failed],
                "wall_s": wall,
                "cpu_s": cpu + children.ru_utime + children.ru_stime,
                "maxrss_self": _own_peak_rss(),
                "store_busy_s": None if transport is None else transport.busy_s,
                "store_requests": None if transport is None else transport.requests,
                "reprice": repriced,
                "maxrss_largest_worker": children.ru_maxrss * 1024,
                "rows": counts,
            }
        )
    )


def _stored_rows(engine) -> dict[str, int]:
    """Rows per table of the ledger's schema as stored (not `Ledger.counts`, which counts lines, not
    the rows that hold them), Alembic's own table left out."""
    import sqlalchemy as sa

    names = [name for name in sa.inspect(engine).get_table_names() if name != "alembic_version"]
    with engine.connect() as conn:
        return {name: conn.execute(sa.text(f'SELECT count(*) FROM "{name}"')).scalar_one() for name in names}


# What `--without` switches off, to bound what a change to one stage could save (docs/performance.md,
# what 45 s would take): the ingest's own code runs, with its ledger or pricer in part replaced.
WITHOUT = ("line-rows", "pricing", "writes")


def _without(parts: list[str], ledger, book):
    """(the ledger, the pricer: None for the ingest's own) with ``parts`` switched off."""
    import dataclasses

    from gpumeter.billing.allocate import PricedHour
    from gpumeter.billing.ledger.sqlalchemy import SqlLedger
    from gpumeter.billing.pricer import Pricer

    class PartLedger(SqlLedger):
        def write_hour(self, record, **kwargs) -> None:
            if "writes" in parts:
                return
            if "line-rows" in parts:  # the GPU-hours and their readings stored, no line group row
                record = dataclasses.replace(record, lines=[], line_groups=())
            super().write_hour(record, **kwargs)

        def set_namespace_teams(self, *args, **kwargs) -> None:
            if "writes" not in parts:
                super().set_namespace_teams(*args, **kwargs)

    class NoPricing(Pricer):
        def price(self, gpu_hour, teams=None) -> PricedHour:  # no lines, counted as unpriced
            return PricedHour([], None, gpu_hour.device.model, None)

    if not parts:
        return ledger, None
    return PartLedger(ledger.engine), NoPricing(book) if "pricing" in parts else None


def _own_peak_rss() -> int:
    """This process's peak resident bytes since its exec (VmHWM). Not ``getrusage``'s ru_maxrss: Linux
    carries the parent's high-water mark into it across fork and exec (2.4 GiB here when the same run had
    just built the month's history), which would make every child look as big as its parent."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


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
    # the client made before the clock starts: making one (its TLS context, even for plain HTTP) took
    # 15-25 ms, which `httpx.post` paid inside every timed request
    with httpx.Client(timeout=600) as client:
        started = time.perf_counter()
        response = client.post(f"{url}/api/v1/query", data={"query": promql, "time": f"{at:.3f}"})
        elapsed = time.perf_counter() - started
    body = response.json()
    if body.get("status") != "success":
        raise SystemExit(f"{promql}: {body}")
    return elapsed, len(body["data"]["result"])


def _ingest_queries_seconds(url: str, days: int, aggregated: bool = False) -> float:
    """Seconds Prometheus takes to answer the range queries billing makes for one day (the second,
    or the only one), over HTTP, min of two: its own share of the ingest, on whatever core it gets.
    Times the number of days, a floor under the month's wall time that no billing code lowers.
    ``aggregated``: the same queries with their ``max by`` in the engine (`HourQuery.aggregated`),
    as billing sent them before it applied the max itself (docs/billing.md §2.2)."""
    from gpumeter.billing import queries
    from gpumeter.billing.ingest.columns import QUERIES, _at

    day = 1 if days > 1 else 0
    first, last = _at(START + timedelta(days=day)), _at(START + timedelta(days=day + 1, hours=-1))
    best = []
    sent = {name: q.aggregated() for name, q in queries.BILLING_QUERIES.items()} if aggregated else QUERIES
    with httpx.Client(timeout=600) as client:  # made once, outside the clock (`_promql_seconds`)
        for promql in sent.values():
            times = []
            for _ in range(2):
                started = time.perf_counter()
                response = client.post(
                    f"{url}/api/v1/query_range",
                    data={"query": promql, "start": first.timestamp(), "end": last.timestamp(), "step": 3600},
                )
                response.raise_for_status()
                times.append(time.perf_counter() - started)
            best.append(min(times))
    return sum(best)


def python_loop_seconds() -> float:
    """This machine's speed at plain Python: a 10-million-step loop, min of 3. Billing's ingest is
    Python-bound, so figures from two machines compare through it (0.51 s on the 2-vCPU machine of
    a slower machine looked like slower code)."""
    best = float("inf")
    for _ in range(3):
        started, total = time.process_time(), 0
        for i in range(10_000_000):
            total += i
        best = min(best, time.process_time() - started)
    return best


def pg_admin(url: str):
    """An autocommit connection to the PostgreSQL database of a ledger URL (SQLAlchemy's form)."""
    import psycopg

    return psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True)


def create_schema(url: str, schema: str) -> None:
    with pg_admin(url) as admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')


def drop_schema(url: str, schema: str) -> None:
    with pg_admin(url) as admin:
        admin.execute(f'DROP SCHEMA "{schema}" CASCADE')


def _ledger_bytes(db: str, schema: str | None, path: Path | None) -> int:
    """The ledger's size on disk: the SQLite file, or the PostgreSQL schema's tables and indexes."""
    if path is not None:
        return path.stat().st_size
    with pg_admin(db) as conn:
        row = conn.execute(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relkind = 'r'",
            (schema,),
        ).fetchone()
    return int(row[0])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.bench_billing", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--step", type=int, default=900, help="seconds between simulated samples (default 900)"
    )
    parser.add_argument("--workers", type=int, default=1, help="ingest worker processes (default 1)")
    parser.add_argument(
        "--scale", type=int, default=1, help="fleet size in thousands of GPUs (default 1: 1,000 GPUs)"
    )
    parser.add_argument("--days", type=int, default=DAYS, help=f"days of history (default {DAYS})")
    parser.add_argument("--db", default=None, help="ledger URL (default: a fresh SQLite file)")
    parser.add_argument(
        "--store",
        choices=("prometheus", "victoriametrics"),
        default="prometheus",
        help="the store billing asks (default prometheus)",
    )
    parser.add_argument("--schema", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--prometheus", default=None, help=argparse.SUPPRESS)
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="HOURS",
        help="profile (cProfile) the first HOURS hours in one process into .bench/billing-profile.txt; no table",
    )
    parser.add_argument(
        "--hours", type=int, default=0, help="ingest only the first HOURS hours (a quick look; no table)"
    )
    parser.add_argument(
        "--without",
        action="append",
        choices=WITHOUT,
        default=[],
        help="switch a part of the ingest off, to bound what changing it could save (repeatable; no table)",
    )
    parser.add_argument(
        "--reprice", action="store_true", help="then re-price the stored month, timed on its own"
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args)
        return 0

    from tests.support.servers import PrometheusServer, VictoriaMetricsServer

    # --store victoriametrics needs no Prometheus: its totals are compared on the same store
    stores = STORES if args.store == "prometheus" else ("victoriametrics",)
    data, vm_data = build_stores(args.step, scale=args.scale, days=args.days, stores=stores)
    gpus = 1000 * args.scale
    end = (START + timedelta(days=args.days)).timestamp() - 0.001
    totals = TOTALS.format(days=args.days)
    with tempfile.TemporaryDirectory(dir=BENCH, prefix="billing-run-") as tmp:
        sqlite_file = Path(tmp) / "ledger.db" if not args.db else None
        db, schema = args.db or f"sqlite:///{sqlite_file}", None
        if db.startswith("postgresql"):
            schema = f"bench_{os.getpid()}"
            create_schema(db, schema)
        server: PrometheusServer | VictoriaMetricsServer
        if args.store == "victoriametrics":
            server = VictoriaMetricsServer(
                Path(tmp) / "vm-ingest", extra_args=[f"-storageDataPath={vm_data}", *VM_QUERY_LIMITS]
            )
        else:
            server = PrometheusServer(Path(tmp) / "prom", data_dir=data)
        server.start()
        try:
            _promql_seconds(server.url, "count(nvidia_gpu_info)", end)  # the store is up and answering
            argv = [sys.executable, "-m", "tests.bench_billing", "--child", "--step", str(args.step)]
            argv += ["--workers", str(args.workers), "--db", db, "--prometheus", server.url]
            argv += ["--days", str(args.days)]
            argv += ["--reprice"] if args.reprice else []
            argv += ["--profile", str(args.profile)] if args.profile else []
            argv += ["--hours", str(args.hours)] if args.hours else []
            argv += ["--schema", schema] if schema else []
            argv += [f"--without={part}" for part in args.without]
            load = os.getloadavg()
            run, peak = _measure_child(argv)
            ledger_bytes = _ledger_bytes(db, schema, sqlite_file)
            promql = [_promql_seconds(server.url, totals, end) for _ in range(3)]
            answering = _ingest_queries_seconds(server.url, args.days)
            aggregating = _ingest_queries_seconds(server.url, args.days, aggregated=True)
        finally:
            server.stop()
            if schema is not None:
                drop_schema(db, schema)
        vm = VictoriaMetricsServer(
            Path(tmp) / "vm", extra_args=[f"-storageDataPath={vm_data}", *VM_QUERY_LIMITS]
        ).start()
        try:
            metricsql = [_promql_seconds(vm.url, totals, end) for _ in range(3)]
        finally:
            vm.stop()
    if args.profile:
        print(f"profiled {run['hours']} hours in {run['wall_s']:.1f} s: {BENCH / 'billing-profile.txt'}")
        return 0
    if args.hours or args.without:
        without = f" without {', '.join(args.without)}" if args.without else ""
        print(
            f"{run['hours']} hours{without}: {run['wall_s']:.1f} s wall, {run['cpu_s']:.1f} s CPU, "
            f"peak {peak / 2**20:.0f} MiB"
        )
        return 0
    hours = args.days * 24
    if run["failed"] or run["hours"] != hours:
        raise SystemExit(f"ingest failed: {run['failed'][:1]} ({run['hours']} hours ingested)")
    if promql[0][1] != metricsql[0][1]:
        raise SystemExit(
            f"Prometheus and VictoriaMetrics disagree on {totals}: {promql[0][1]} vs {metricsql[0][1]} series"
        )
    rows = sum(v for k, v in run["rows"].items() if k not in ("ingest_runs", "price_book_versions"))
    busy = run["store_busy_s"]
    ratio = round(run["wall_s"] / busy, 2) if busy else None
    month = 30 * 24 / hours  # a shorter period's figures, scaled to a 30-day month
    gpu_months = gpus * hours / (30 * 24)
    report = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "load_average_before": [round(x, 2) for x in load],
        "fleet": f"{125 * args.scale:,} nodes x 8 GPUs = {gpus:,} GPUs, {3360 * args.scale:,} MIG instances "
        "(tests/bench_billing.py)",
        "period": f"{START.isoformat()} + {args.days} days = {hours} hours, samples every {args.step} s",
        "ledger": db.split(":", 1)[0],
        "store": args.store,
        "store_busy_seconds": None if run["store_busy_s"] is None else round(run["store_busy_s"], 1),
        "store_requests": run["store_requests"],
        "ingest_to_store_ratio": ratio,
        "reprice_seconds": None if run["reprice"] is None else round(run["reprice"]["wall_s"], 1),
        "workers": args.workers,
        "ingest_price_seconds": round(run["wall_s"], 1),
        "ingest_price_cpu_seconds": round(run["cpu_s"], 1),
        "peak_rss_bytes_all_billing_processes": peak,
        "maxrss_bytes_parent": run["maxrss_self"],
        "maxrss_bytes_largest_worker": run["maxrss_largest_worker"],
        "rows_written": run["rows"],
        "ledger_bytes": ledger_bytes,
        "ledger_bytes_per_gpu_month": round(ledger_bytes / gpu_months),
        "rows_per_gpu_month": round(rows / gpu_months),
        "python_loop_seconds": round(python_loop_seconds(), 2),
        "store_ingest_queries_seconds_per_day": round(answering, 2),
        "store_aggregating_seconds_per_day": round(aggregating, 2),
        "store_totals_seconds": [round(t, 2) for t, _ in promql],
        "metricsql_totals_seconds": [round(t, 2) for t, _ in metricsql],
        "totals_series": promql[0][1],
        "target_seconds": TARGET_SECONDS if gpus == 1000 and hours == 720 and args.workers == 1 else None,
        "target_bytes": TARGET_BYTES if gpus == 1000 else None,
    }
    suffix = ("" if args.scale == 1 else f"-{gpus}") + (
        "" if args.store == "prometheus" else f"-{args.store}"
    )
    out = BENCH / f"billing{suffix}.json"
    out.write_text(json.dumps(report, indent=2) + "\n")
    timed = report["target_seconds"] is not None
    ok_time = not timed or run["wall_s"] < TARGET_SECONDS
    ok_mem = gpus != 1000 or peak < TARGET_BYTES

    def verdict(ok: bool) -> str:
        return "ok" if ok else "MISSED"

    print(
        f"billing bench: {report['fleet']}; {report['period']}; store {args.store}, ledger {report['ledger']}, "
        f"{args.workers} process(es)"
    )
    print(f"{'what':<58} {'measured':>14} {'target':>10}")
    target = f"< {TARGET_SECONDS:g} s" if timed else "(recorded)"
    print(
        f"{f'ingest + price, {hours} hours (wall)':<58} {run['wall_s']:>12.1f} s {target:>10} {verdict(ok_time) if timed else ''}"
    )
    print(f"{'  CPU seconds, all billing processes':<58} {run['cpu_s']:>12.1f} s")
    print(
        f"{f'  {args.store} answering its queries, one day x {args.days}':<58} {answering * args.days:>12.1f} s"
    )
    print(f"{f'    the same with max by in {args.store}':<58} {aggregating * args.days:>12.1f} s")
    if ratio is not None:
        print(f"{f'  {args.store} busy answering this ingest (same run)':<58} {busy:>12.1f} s")
        print(
            f"{'  ingest wall / store busy':<58} {ratio:>13.2f}x {f'<= {TARGET_STORE_RATIO:g}x':>10} "
            f"{verdict(ratio <= TARGET_STORE_RATIO)}"
        )
    ok_reprice = run["reprice"] is None or run["reprice"]["wall_s"] * month < TARGET_REPRICE_SECONDS
    if run["reprice"] is not None:
        print(
            f"{f're-price the {hours} stored hours (wall)':<58} {run['reprice']['wall_s']:>12.1f} s "
            f"{f'< {TARGET_REPRICE_SECONDS:g} s':>10} {verdict(ok_reprice) if hours == 720 else ''}"
        )
        if hours != 720:
            print(
                f"{'  scaled to a 30-day month':<58} {run['reprice']['wall_s'] * month:>12.1f} s "
                f"{f'< {TARGET_REPRICE_SECONDS:g} s':>10} {verdict(ok_reprice)}"
            )
    print(f"{'  this machine: a 10M-step Python loop':<58} {report['python_loop_seconds']:>12.2f} s")
    if hours != 720:
        print(f"{'  scaled to a 30-day month (wall)':<58} {run['wall_s'] * month:>12.1f} s")
    print(
        f"{'peak RSS, billing process tree (sum)':<58} {peak / 2**20:>10.0f} MiB {'< 1 GiB' if gpus == 1000 else '(recorded)':>10} {verdict(ok_mem) if gpus == 1000 else ''}"
    )
    print(
        f"{'  largest single process (maxrss)':<58} {max(run['maxrss_self'], run['maxrss_largest_worker']) / 2**20:>10.0f} MiB"
    )
    print(f"{'rows written (facts + lines)':<58} {rows:>14,}")
    print(f"{'  per GPU-month':<58} {report['rows_per_gpu_month']:>14,}")
    print(
        f"{'ledger size on disk, per GPU-month':<58} {report['ledger_bytes_per_gpu_month'] / 1024:>10.1f} KiB"
    )
    # the first answered on the store billing asked, the second on VictoriaMetrics' copy
    for engine, times in ((args.store, promql), ("victoriametrics", metricsql)):
        what = f"{engine}: the period's totals, one query"
        print(f"{what:<58} {min(t for t, _ in times):>12.2f} s")
    print(f"wrote {out}")
    return 0 if ok_time and ok_mem and ok_reprice else 1


if __name__ == "__main__":
    sys.exit(main())
