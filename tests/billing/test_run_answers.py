"""Range answers are read column-wise (billing.ingest.RunAnswers, docs/billing.md §6): each series once
for a run of hours, its joins (share, utilization, process use) worked out once. Whatever series come
and go between hours, each hour built from the run must be the hour built from its own samples
alone, as the instant queries of the hourly service give them."""

from __future__ import annotations

import copy
import gc
import gzip
import os
import pickle
import socket
import subprocess
import sys
import threading
from datetime import timedelta
from decimal import Decimal

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpumeter import contract
from gpumeter.billing import queries
from gpumeter.billing.allocate import price_gpu_hour
from gpumeter.billing.ingest import (
    QUERIES,
    CarriedLayouts,
    HourIntervals,
    IngestConfig,
    RunAnswers,
    build_hour,
    priced_record,
)
from gpumeter.billing.ingest.columns import _at
from gpumeter.billing.ingest.fetch import FetchedRun
from gpumeter.billing.ingest.runs import MAX_RUN_HOURS, _run_hours
from gpumeter.billing.ledger import layouts
from gpumeter.billing.models import SteadyGpuHour
from gpumeter.billing.pricer import Pricer
from gpumeter.billing.pricing import load_price_book
from gpumeter.billing.pricing.static import DEFAULT_BOOK
from gpumeter.billing.prom import PrometheusClient, PrometheusError, Sample
from gpumeter.process import no_collections
from tests.billing.factories import H100, HOUR0
from tests.support.hypothesis_profiles import examples
from tests.support.servers import AnswerHandler, answering

HOURS = [HOUR0 + timedelta(hours=i) for i in range(4)]
CONFIG = IngestConfig(scrape_interval=30.0)


def _series() -> dict[str, list[dict[str, str]]]:
    """A MIG GPU and a whole GPU; on them MIG holders, time-sliced replicas and a fractional grant,
    with process data, and two namespaces' team labels: one label set per query name."""
    mig, whole = "GPU-mig", "GPU-whole"
    device = {contract.GPU: "0", contract.MODEL: H100, contract.HOSTNAME: "node-1"}
    out: dict[str, list[dict[str, str]]] = {name: [] for name in queries.BILLING_QUERIES}
    out["gpu_count"] = [
        {**device, contract.UUID: mig, contract.MIG_MODE: "enabled"},
        {**device, contract.UUID: whole, contract.GPU: "1", contract.MIG_MODE: "disabled"},
        # the same GPU under a changed label inside an hour: its counts add up
        {
            **device,
            contract.UUID: whole,
            contract.GPU: "1",
            contract.MIG_MODE: "disabled",
            contract.MODEL: "x",
        },
    ]
    out["gpu_util"] = [{contract.UUID: mig}, {contract.UUID: whole}]
    for gi, profile, slices in (("1", "3g.40gb", "3"), ("2", "3g.40gb", "3")):
        out["mig_count"].append(
            {
                contract.UUID: mig,
                contract.GPU_INSTANCE_ID: gi,
                contract.MIG_PROFILE: profile,
                contract.COMPUTE_SLICES: slices,
                contract.MEMORY_SLICES: "4",
            }
        )
        out["mig_util"].append({contract.UUID: mig, contract.GPU_INSTANCE_ID: gi})
    holders = [
        (mig, "1", "3g.40gb", "team-a", "train", contract.SHARING_MIG),
        (mig, "2", "3g.40gb", "team-b", "infer", contract.SHARING_TIME_SLICING),
        (mig, "2", "3g.40gb", "team-b", "infer-2", contract.SHARING_TIME_SLICING),
        (whole, "", "", "team-a", "notebook", contract.SHARING_FRACTIONAL),
        (whole, "", "", "Team-C", "batch", contract.SHARING_TIME_SLICING),
    ]
    for uuid, gi, profile, namespace, pod, sharing in holders:
        labels = {
            contract.HOSTNAME: "node-1",
            contract.NAMESPACE: namespace,
            contract.POD: pod,
            contract.CONTAINER: "main",
            contract.RESOURCE: "nvidia.com/gpu",
            contract.UUID: uuid,
            contract.GPU: "0" if uuid == mig else "1",
            contract.GPU_INSTANCE_ID: gi,
            contract.MIG_PROFILE: profile,
            contract.SHARING: sharing,
        }
        for name in ("alloc_count", "alloc_share"):
            out[name].append(labels)
        if sharing == contract.SHARING_FRACTIONAL:
            out["alloc_memory"].append(labels)
            out["alloc_compute"].append(labels)
        process = {key: labels[key] for key in queries.BILLING_QUERIES["proc_sm"].by}
        out["proc_sm"].append(process)
        out["proc_memory"].append(process)
    out["teams"] = [
        {contract.NAMESPACE: "team-a", contract.LABEL_TEAM: "alpha"},
        {contract.NAMESPACE: "team-b", contract.LABEL_TEAM: "beta"},
    ]
    return out


SERIES = _series()
COUNTS = (1.0, 60.0, 100.0, 119.0, 120.0, 121.0)  # samples at 30 s: an hour holds 120


def _value(name: str) -> st.SearchStrategy[float]:
    if name.endswith("_count"):
        return st.sampled_from(COUNTS)
    if name == "proc_memory":
        return st.sampled_from((0.0, 1.5e9, 4e10))
    return st.sampled_from((0.0, 0.125, 0.3, 0.5, 1.0))


@st.composite
def histories(draw) -> dict[str, list[list[float | None]]]:
    """Per query name, per series, a value or None (no sample) for each hour. In an hour that moves,
    each series may take a new value; in one that does not, every series keeps the hour before's, as
    most GPUs' do most hours (their layouts' keys are then carried from the hour before)."""
    moves = [True] + [draw(st.booleans()) for _ in HOURS[1:]]

    def series(name: str) -> list[float | None]:
        values: list[float | None] = []
        for moving in moves:
            if values and not (moving and draw(st.booleans())):
                values.append(values[-1])
            else:
                values.append(draw(st.none() | _value(name)))
        return values

    return {name: [series(name) for _ in labels] for name, labels in SERIES.items()}


def _range_answers(history: dict[str, list[list[float | None]]]) -> dict[str, list]:
    """As Prometheus sends a range answer: each series with only the steps it has a value at, as text."""
    return {
        name: [
            (
                labels,
                [[_at(h).timestamp(), repr(v)] for h, v in zip(HOURS, values, strict=True) if v is not None],
            )
            for labels, values in zip(SERIES[name], history[name], strict=True)
            if any(v is not None for v in values)
        ]
        for name in SERIES
    }


def _samples_at(history: dict[str, list[list[float | None]]], index: int) -> dict[str, list[Sample]]:
    """The ``index``-th hour's samples alone, as its instant queries give them."""
    return {
        name: [
            Sample(dict(labels), values[index])
            for labels, values in zip(SERIES[name], history[name], strict=True)
            if values[index] is not None
        ]
        for name in SERIES
    }


# seconds per sample of node-1 in each hour: 30 s, or 60 s after an exporter's restart with another
# interval; the seconds of every series change with it, and so may every GPU's layout
INTERVALS = st.lists(st.sampled_from((30.0, 60.0)), min_size=len(HOURS), max_size=len(HOURS))
# the order the hours are built in: in order (as ingest does), or any other (a layout key carried
# from the hour before must then not be taken from another hour)
ORDERS = st.just(list(range(len(HOURS)))) | st.permutations(range(len(HOURS)))


@settings(max_examples=examples(300), deadline=None)
@given(histories(), INTERVALS, ORDERS)
def test_each_hour_of_a_run_is_the_hour_built_from_its_own_samples(history, seconds, order):
    run = RunAnswers.of(_range_answers(history), HOURS)
    for index in order:
        hour = HOURS[index]
        intervals = HourIntervals({"node-1": seconds[index]}, 30.0)
        alone = _samples_at(history, index)
        problems_run: list[str] = []
        problems_alone: list[str] = []
        built = run.build(index, CONFIG, intervals, problems=problems_run)
        assert built == build_hour(alone, hour, CONFIG, intervals, problems=problems_alone)
        assert problems_run == problems_alone
        for gpu_hour in built[0]:  # listed in the canonical order, with the key of that layout
            instances, allocations = layouts.ordered(gpu_hour)
            assert (gpu_hour.instances, gpu_hour.allocations) == (instances, allocations)
            assert gpu_hour.layout == layouts.layout_key(instances, allocations)


def test_a_run_reads_each_hour_at_its_own_step():
    """Not vacuous: values placed at their hours, a gap left empty, process use only where measured
    (memory alone: SM unknown, None; SM measured for another holder of the GPU: 0 for this one)."""
    history: dict[str, list[list[float | None]]] = {
        name: [[None] * len(HOURS) for _ in labels] for name, labels in SERIES.items()
    }
    history["gpu_count"][1] = [120.0, None, 60.0, 120.0]  # the whole GPU: absent in hour 1
    history["alloc_count"][4] = [120.0, None, 60.0, 120.0]  # Team-C's batch pod on it
    history["alloc_share"][4] = [0.5, None, 0.25, 0.5]
    history["proc_memory"][4] = [None, None, 2e9, 2e9]
    history["proc_sm"][3] = [None, None, None, 0.3]  # team-a's notebook on the same GPU, not allocated
    run = RunAnswers.of(_range_answers(history), HOURS)
    got = []
    for index in range(len(HOURS)):
        gpu_hours, _ = run.build(index, CONFIG)
        got.append(
            [
                (a.pod, a.allocated_seconds, str(a.share), a.process_memory, a.process_sm, a.utilization)
                for gh in gpu_hours
                for a in gh.allocations
            ]
        )
    assert got == [
        [("batch", 3600, "0.500000000", None, None, None)],
        [],
        [("batch", 1800, "0.250000000", 2000000000, None, None)],
        [("batch", 3600, "0.500000000", 2000000000, 0, 0)],
    ]


@pytest.mark.spawns
def test_a_layout_key_keeps_its_hash_in_this_process_only():
    """`LayoutKey` works its hash out once; copied or pickled (to an ingest worker, say) it must not
    carry it, since a string's hash differs from process to process (PYTHONHASHSEED)."""
    key = layouts.LayoutKey(((("1", "1g.10gb", 1, 1, 3600),), (("ns", "pod", "c", "", "1", "1g.10gb"),)))
    assert hash(key) == hash(tuple(key))
    assert hash(copy.deepcopy(key)) == hash(key) and "_hash" not in copy.deepcopy(key).__dict__
    code = "import pickle, sys; k = pickle.loads(sys.stdin.buffer.read()); print(hash(k) == hash(tuple(k)))"
    seed = {**os.environ, "PYTHONHASHSEED": "1234"}
    out = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(key), capture_output=True, env=seed)
    assert out.stdout.strip() == b"True", out.stderr.decode()


def test_a_layout_that_comes_back_is_named_by_the_key_object_it_had():
    """A pod on a schedule takes its GPU's layout away and brings it back. The hour it is back names
    the key object of the hour it left, in the same run and in the next one (`CarriedLayouts`), so the
    pricer's memo and the ledger's layout ids find it by identity; a layout never met before is a
    new object."""
    history: dict[str, list[list[float | None]]] = {
        name: [[None] * len(HOURS) for _ in labels] for name, labels in SERIES.items()
    }
    history["gpu_count"][1] = [120.0] * len(HOURS)  # the whole GPU, every hour
    history["alloc_count"][4] = [120.0, None, 120.0, 60.0]  # Team-C's batch pod: away in hour 1
    history["alloc_share"][4] = [0.5, None, 0.5, 0.5]
    carried = CarriedLayouts()
    keys = []
    for _ in range(2):  # two runs of the same hours, the layouts carried from the first to the second
        run = RunAnswers.of(_range_answers(history), HOURS)
        run.layouts = carried
        keys.append([run.build(index, CONFIG)[0][0].layout for index in range(len(HOURS))])
    (held, idle, back, half), again = keys
    assert idle is None and held is not None and half is not None
    assert back is held and half != held and half is not held
    assert all(k is k0 for k, k0 in zip(again, keys[0], strict=True))


def test_a_gpu_whose_layout_did_not_move_is_built_priced_and_stored_from_its_readings(sql_ledger):
    """Hours 1-3 repeat hour 0 but for the readings (utilization, process use): each GPU is built
    steady (`SteadyGpuHour`: its layout the first hour's, its readings its own), priced from the
    kept result and stored, its facts never made; and each is the hour built from its own samples,
    and what the ledger gives back, readings and all."""
    readings = [0.0, 0.125, 0.3, 0.5]
    history: dict[str, list[list[float | None]]] = {}
    for name, labels in SERIES.items():
        if name.endswith("_count"):
            history[name] = [[120.0] * len(HOURS) for _ in labels]
        elif name == "proc_memory":
            history[name] = [[r * 4e10 for r in readings] for _ in labels]
        else:
            history[name] = [
                list(readings) if name in ("gpu_util", "mig_util", "proc_sm") else [0.5] * 4 for _ in labels
            ]
    history["gpu_count"][2] = [None] * len(HOURS)  # no label change: one series per GPU
    run = RunAnswers.of(_range_answers(history), HOURS)
    pricer = Pricer(load_price_book(DEFAULT_BOOK))
    records, built = [], []
    for index, hour in enumerate(HOURS):
        gpu_hours, teams = run.build(index, CONFIG)
        built.append(gpu_hours)
        records.append(priced_record(pricer, hour, gpu_hours, teams)[0])
        sql_ledger.write_hour(records[-1])
    steady = [[type(gh) is SteadyGpuHour and gh._facts is None for gh in gpu_hours] for gpu_hours in built]
    assert steady == [[False, False], [True, True], [True, True], [True, True]]
    for index, hour in enumerate(HOURS):
        alone = _samples_at(history, index)
        assert built[index] == build_hour(alone, hour, CONFIG)[0]
        assert sql_ledger.facts(hour) == built[index]
        assert records[index].lines == price_all(pricer.book, built[index], records[index])
    utilizations = [[i.utilization for i in gpu_hours[0].instances] for gpu_hours in built]
    assert utilizations == [[Decimal(repr(r)).quantize(Decimal("1e-9"))] * 2 for r in readings]


def price_all(book, gpu_hours, record):
    """The hour's lines priced from scratch, GPU-hour by GPU-hour, with the teams the record used."""
    teams = {line.namespace: line.team for line in record.lines if line.team}
    return [line for gh in gpu_hours for line in price_gpu_hour(gh, book, teams).lines]


def test_runs_start_at_chunk_hours_and_grow_threefold_within_the_points():
    """`_run_hours`: chunk_hours for the first run; then as many hours as run_points
    allows for them, at most three times the run before, never fewer than chunk_hours nor more than
    a month of steps (docs/billing.md §6)."""
    config = IngestConfig(chunk_hours=24, run_points=5_000_000)
    assert _run_hours(config, 24, None) == 24  # nothing decoded yet
    assert _run_hours(config, 24, 20_460) == 72  # 1,000 GPUs' series: 5,000,000 // 20,460 = 244
    assert _run_hours(config, 72, 20_460) == 216
    assert _run_hours(config, 216, 20_460) == 244
    assert _run_hours(config, 24, 204_600) == 24  # 10,000 GPUs: 24 hours, as before runs grew
    assert _run_hours(config, 24, 2_000_000) == 24  # never fewer than chunk_hours
    assert _run_hours(config, 648, 16) == MAX_RUN_HOURS  # a small fleet: a month's steps at most
    assert _run_hours(IngestConfig(chunk_hours=0), 1, None) == 1


class _RecordingClient:
    """A query client whose range answers note whether the cyclic collector ran while each was
    decoded (`FetchedRun.answers`): nothing but the answers' own decoding is under test."""

    def __init__(self) -> None:
        self.collector_on: list[bool] = []

    def fetch_range(self, promql, start, end, step):
        def decoded():
            self.collector_on.append(gc.isenabled())
            return []

        return decoded


def test_a_run_is_decoded_with_the_cyclic_collector_paused_and_restored():
    client = _RecordingClient()
    assert gc.isenabled()
    FetchedRun(client, HOURS).answers()
    assert client.collector_on == [False] * len(QUERIES)
    assert gc.isenabled()
    gc.disable()  # one who paused it themselves keeps it paused
    try:
        FetchedRun(client, HOURS).answers()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_fetched_range_answer_is_held_by_no_response():
    """The body is kept by the answer only. An httpx response over a real connection sits in a
    reference cycle (its gzip decoder and streams, as Prometheus' answers are gzipped), so one that
    kept the body too (its ``_content``) held the answer's megabytes until the collector next ran."""
    body = b'{"status":"success","data":{"resultType":"matrix","result":[]}}' + b" " * 1_000_000
    packed = gzip.compress(body)

    class Gzipped(AnswerHandler):
        def answer(self) -> None:
            self.send_response(200)
            self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Length", str(len(packed)))
            self.end_headers()
            self.wfile.write(packed)

    gc.disable()  # a response left in a cycle stays there while this test looks
    try:
        with answering(Gzipped) as url, PrometheusClient(url) as client:
            answer = client.fetch_range("up", HOURS[0], HOURS[-1], 3600)
            kept = answer.args[-1]
            assert kept == body
            holders = [
                r
                for r in gc.get_referrers(kept)
                if isinstance(r, httpx.Response) or (isinstance(r, dict) and "_content" in r)
            ]
            assert holders == []
            assert list(answer()) == []  # decoded as it is read (billing/promjson.py)
    finally:
        gc.enable()


def test_the_collector_is_paused_for_what_runs_within_and_restored_when_it_fails():
    with pytest.raises(RuntimeError, match="mid-ingest"), no_collections():
        assert not gc.isenabled()
        raise RuntimeError("mid-ingest")
    assert gc.isenabled()


def test_a_range_answer_cut_off_mid_body_is_a_prometheus_error_naming_the_server():
    """The body is read as a stream: a connection that drops before the promised length arrives
    (a restarted Prometheus, a proxy's timeout) fails the query as any other HTTP failure does."""

    class CutOff(AnswerHandler):
        def answer(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "1000000")
            self.end_headers()
            self.wfile.write(b'{"status":"success","data":{"resultType":"matrix","result":[')
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)

    with (
        answering(CutOff) as url,
        PrometheusClient(url, timeout=10) as client,
        pytest.raises(PrometheusError, match=url),
    ):
        client.fetch_range("up", HOURS[0], HOURS[-1], 3600)


def test_a_range_answer_that_stalls_mid_body_times_out_as_a_prometheus_error():
    """Headers, then nothing: the client's read timeout applies to each read of the streamed body,
    so a stalled answer fails within the timeout instead of holding the ingest forever. Told apart by
    the error, not a stopwatch: without the read timeout the body is waited on until the server lets
    go (10 s) and ends short, a protocol error rather than a ReadTimeout."""
    release = threading.Event()

    class Stalled(AnswerHandler):
        def answer(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "1000")
            self.end_headers()
            self.wfile.write(b'{"status":')
            self.wfile.flush()
            release.wait(10)

    with answering(Stalled) as url, PrometheusClient(url, timeout=0.2) as client:
        try:
            with pytest.raises(PrometheusError, match="ReadTimeout"):
                client.fetch_range("up", HOURS[0], HOURS[-1], 3600)
        finally:
            release.set()  # the handler's thread let go before the server closes
