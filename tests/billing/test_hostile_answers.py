"""Every answer is checked before it becomes money (issue 42, points 1 and 2).

A REAL Prometheus holds test_ingest_prometheus' hand-written history (its totals worked out by hand
there); billing ingests it once, then again through a loopback proxy that forwards every query to
that Prometheus and tampers with one answer the way a broken query frontend would: a negative count,
NaN, infinity, 1e308, text, a ratio out of [0, 1], an answer of the wrong shape, a megabyte label.
Each time `gpumeter billing ingest` exits 1 with one line per hour on stderr naming the problem,
records a `failed` run per hour with that reason, and leaves every line of the earlier billing as it
was. A value out of range refuses the GPU-hours it belongs to (here every one: every value is
tampered with), an answer of the wrong shape its hour; either way the range goes on to the next hour
(tests/billing/test_refusal_scope.py has one GPU's reading refused in a week of others billed)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text

from gpumeter import contract
from gpumeter.billing import queries
from gpumeter.billing.ingest import IngestConfig, ingest_hours
from gpumeter.billing.ledger import open_ledger
from gpumeter.billing.pricing import load_price_book
from gpumeter.billing.prom import PrometheusClient
from tests.billing import test_ingest_prometheus as history
from tests.support import loopback
from tests.support.servers import AnswerHandler, PrometheusServer, answering

H0, EXPECTED_TOTAL, _by_namespace = history.H0, history.EXPECTED_TOTAL, history._by_namespace
tsdb, book = history.tsdb, history.book  # its backfilled TSDB and its price book: the same fixtures
HOURS = [H0 + timedelta(hours=n) for n in range(3)]
END = H0 + timedelta(hours=3)
QUERIES = {name: query.promql() for name, query in queries.BILLING_QUERIES.items()}

Tamper = Callable[[dict], None]  # changes a decoded answer in place


@pytest.fixture(scope="module")
def real_prometheus(tsdb, tmp_path_factory):
    """One real Prometheus with the backfilled history, only read by this module's tests."""
    root = tmp_path_factory.mktemp("hostile")
    shutil.copytree(tsdb, root / "data")
    server = PrometheusServer(root / "prom", data_dir=root / "data").start()
    yield server
    server.stop()


def _points(answer: dict) -> list[list]:
    """Every point of an instant or range answer, as lists that can be changed in place."""
    points = []
    for item in answer["data"]["result"]:
        points.extend(item["values"] if "values" in item else [item["value"]])
    return points


def _every_value(text: str) -> Tamper:
    def tamper(answer: dict) -> None:
        for point in _points(answer):
            point[1] = text

    return tamper


def _result(value) -> Tamper:
    def tamper(answer: dict) -> None:
        answer["data"]["result"] = value

    return tamper


def _metric_null(answer: dict) -> None:
    for item in answer["data"]["result"]:
        item["metric"] = None


def _no_value(answer: dict) -> None:
    for point in _points(answer):
        del point[1:]


def _no_data(answer: dict) -> None:
    del answer["data"]


def _long_label(answer: dict) -> None:
    for item in answer["data"]["result"]:
        item["metric"]["pod"] = "p" * (1 << 20)


def _proxy(upstream: str, query: str, tamper: Tamper) -> type[AnswerHandler]:
    """A handler forwarding every query to ``upstream``; the answers to ``query`` are tampered with."""

    class Proxy(AnswerHandler):
        def answer(self) -> None:
            reply = loopback.post(f"{upstream}{self.path}", data=self.form, timeout=30)
            body = reply.json()
            if self.form["query"] == query and body.get("status") == "success":
                tamper(body)
            self.send_json(body, reply.status_code)

    return Proxy


def _ledger_state(url: str):
    ledger = open_ledger(url)
    try:
        lines = sorted(
            (x.hour, x.uuid, x.kind, x.namespace, x.pod, x.amount, x.quantity) for x in ledger.lines(H0, END)
        )
        with ledger.engine.connect() as conn:
            runs = conn.execute(text("SELECT id, hour, status, error, source FROM ingest_runs")).all()
        return lines, ledger.counts(), runs
    finally:
        ledger.close()


def _ingest_cli(url: str, prometheus: str, prices, *extra: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "gpumeter", "billing", "ingest", "--db", url, "--prometheus", prometheus]
    argv += ["--prices", str(prices), "--from", H0.isoformat(), "--to", END.isoformat()]
    argv += ["--scrape-interval", "30", "--no-progress", "--workers", "1", *extra]
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=120, env={**os.environ, "NO_COLOR": "1"}
    )


@pytest.fixture
def billed(real_prometheus, tmp_path, book):
    """A SQLite ledger holding the three hours billed from the real Prometheus: the hand totals."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    ledger = open_ledger(url)
    try:
        with PrometheusClient(real_prometheus.url) as client:
            result = ingest_hours(
                client, ledger, load_price_book(book), HOURS, IngestConfig(scrape_interval=30)
            )
        assert result.ingested == HOURS and result.failed == []
        assert _by_namespace(ledger.lines(H0, END)) == EXPECTED_TOTAL
    finally:
        ledger.close()
    return url


CASES = [
    # (query name, tampering, words of the refusal)
    ("alloc_count", _every_value("-12"), "value -12.0 is not a number in [0, 3601]"),
    ("gpu_count", _every_value("-12"), "value -12.0 is not a number in [0, 3601]"),
    ("gpu_count", _every_value("1e308"), "value 1e+308 is not a number in [0, 3601]"),
    ("alloc_share", _every_value("NaN"), "value nan is not a number in [0, 1]"),
    ("alloc_share", _every_value("+Inf"), "value inf is not a number in [0, 1]"),
    # text that is no number is a bad reading, refused as a NaN is (tests/billing/test_refusal_scope.py)
    ("alloc_share", _every_value("abc"), "value 'abc' is not a number in [0, 1]"),
    ("gpu_util", _every_value("NaN"), "value nan is not a number in [0, 1]"),
    ("gpu_util", _every_value("-12"), "value -12.0 is not a number in [0, 1]"),
    ("mig_util", _every_value("11.5"), "value 11.5 is not a number in [0, 1]"),
    ("mig_count", _result({"not": "a list"}), "result is dict, not a list"),
    ("gpu_count", _metric_null, "the wrong shape: AttributeError"),
    ("alloc_count", _no_value, "wrong shape to 'count_over_time(nvidia_gpu_allocation[1h])': IndexError"),
    ("gpu_count", _no_data, "an answer without data"),
    ("alloc_count", _long_label, "not text of at most 1024 characters"),
]


@pytest.mark.parametrize(
    ("name", "tamper", "refusal"),
    CASES,
    ids=[f"{n}-{t.__qualname__.split('.')[0]}-{i}" for i, (n, t, _) in enumerate(CASES)],
)
def test_a_hostile_answer_is_refused_and_the_billing_before_it_kept(
    real_prometheus, billed, book, name, tamper, refusal
):
    before_lines, before_counts, before_runs = _ledger_state(billed)
    with answering(_proxy(real_prometheus.url, QUERIES[name], tamper)) as proxy:
        done = _ingest_cli(billed, proxy, book)
    assert done.returncode == 1, done.stderr
    stderr = done.stderr.splitlines()
    assert len(stderr) == len(HOURS), done.stderr  # one line an hour: no traceback, no second account
    for hour, line in zip(HOURS, stderr, strict=True):
        assert line.startswith(
            (f"error: hour {hour.isoformat()} not ingested: ", f"error: hour {hour.isoformat()}: ")
        ), line
        assert refusal in line and repr(QUERIES[name]) in line, line
        assert len(line) < 1000  # a megabyte label is not repeated in the message

    lines, counts, runs = _ledger_state(billed)
    assert lines == before_lines  # $11.18 for inference etc.: not $0.00, not a mix
    assert {k: v for k, v in counts.items() if k != "ingest_runs"} == {
        k: v for k, v in before_counts.items() if k != "ingest_runs"
    }
    assert counts["ingest_runs"] == before_counts["ingest_runs"] + len(HOURS)
    failed = [run for run in runs if run not in before_runs]
    assert len({str(run.hour) for run in failed}) == len(HOURS)  # one run an hour
    for run in failed:
        assert run.status == contract.INGEST_FAILED and refusal in run.error and run.source == proxy


def test_the_same_proxy_untampered_bills_the_hand_totals(real_prometheus, billed, book):
    """The proxy itself changes nothing: what the cases above refuse is the tampering alone."""
    with answering(_proxy(real_prometheus.url, "", _no_data)) as proxy:
        done = _ingest_cli(billed, proxy, book)
    assert done.returncode == 0, done.stderr
    ledger = open_ledger(billed)
    try:
        assert _by_namespace(ledger.lines(H0, END)) == EXPECTED_TOTAL
    finally:
        ledger.close()


def test_an_answer_with_an_error_text_of_control_characters_is_shown_escaped(billed, book):
    """A Prometheus error's own text reaches stderr as repr: no raw escape sequence or newline."""

    class Failing(AnswerHandler):
        def answer(self) -> None:
            self.send_json({"status": "error", "errorType": "bad_data", "error": "x\x1b[2J\ny"}, 400)

    with answering(Failing) as url:
        done = _ingest_cli(billed, url, book)
    assert done.returncode == 1
    assert "\x1b" not in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr
    assert "x\\x1b[2J\\ny" in done.stderr


def test_a_wrong_shaped_instant_answer_is_a_bad_answer(billed):
    """The instant path (the service's hourly job) checks shapes too; a value whose text is no number
    is a reading (a NaN that names its text), refused with its GPU-hour as the range path refuses it."""
    from gpumeter.billing.prom import BadAnswer

    result: list = []

    class Shaped(AnswerHandler):
        def answer(self) -> None:
            self.send_json({"status": "success", "data": {"resultType": "vector", "result": result}})

    with answering(Shaped) as url, PrometheusClient(url) as client:
        result[:] = [{"metric": {"uuid": "GPU-1"}, "value": [1, "x"]}]
        (sample,) = client.query("up", H0)
        assert sample.value != sample.value and repr(sample.value) == "'x'"
        for value in ([1], [1, None], [1, ["2"]]):
            result[:] = [{"metric": {}, "value": value}]
            with pytest.raises(BadAnswer, match="wrong shape"):
                client.query("up", H0)


def test_billing_serve_bills_the_rest_and_counts_the_refused_gpu_hours(real_prometheus, book, tmp_path):
    """The service's hourly job meets the negative allocation counts: the two GPUs holding
    allocations are refused in each of the three hours, the job goes on to the last hour, and /metrics
    counts the six refused GPU-hours (before: the job died with a traceback on the first hour every
    time while /healthz said ok; then it billed nothing and stopped there)."""
    from prometheus_client.parser import text_string_to_metric_families

    from gpumeter.billing.config import Settings
    from gpumeter.service import JOBS, build_app, hourly_ingest

    url = f"sqlite:///{tmp_path / 'served.db'}"
    JOBS.start(datetime.now(UTC), {})
    with answering(_proxy(real_prometheus.url, QUERIES["alloc_count"], _every_value("-12"))) as proxy:
        settings = Settings(
            db=url, prometheus=proxy, prices=str(book), scrape_interval=30, catchup_hours=3, workers=1
        )
        outcome = hourly_ingest(settings.as_dict(), now=END + timedelta(minutes=5), holder="test")
    assert outcome == "ingested 3", outcome

    ledger = open_ledger(url)
    try:
        out: list = []
        body = b"".join(
            build_app(ledger)({"PATH_INFO": "/metrics", "REQUEST_METHOD": "GET"}, lambda *a: out.append(a))
        )
        lines, counts, runs = _ledger_state(url)
        refused = ledger.refused_gpu_hours()
    finally:
        ledger.close()
    samples = {
        (s.name, s.labels.get("task")): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }
    assert samples["gpumeter_billing_refused_gpu_hours", None] == 6
    assert [(r.hour, r.uuid) for r in refused] == [(h, u) for h in HOURS for u in ("GPU-aaaa", "GPU-hhhh")]
    assert all("value -12.0 is not a number in [0, 3601]" in r.reason for r in refused)
    assert lines == []  # the history's two GPUs both hold allocations: nothing else to bill
    assert counts["refused_gpu_hours"] == 6
    assert [(run.status, run.source) for run in runs] == [(contract.INGEST_PARTIAL, proxy)] * 3


def _label(name: str, value: str) -> Tamper:
    def tamper(answer: dict) -> None:
        for item in answer["data"]["result"]:
            item["metric"][name] = value

    return tamper


def test_a_namespace_named_as_a_reports_row_refuses_its_gpu_hours(real_prometheus, billed, book):
    """An allocation whose namespace is `__total__` (no Kubernetes namespace can be: a forged label)
    would merge with the reports' total row: its GPU-hours are refused, the billing before kept."""
    before_lines, _, _ = _ledger_state(billed)
    with answering(
        _proxy(real_prometheus.url, QUERIES["alloc_count"], _label("namespace", "__total__"))
    ) as proxy:
        done = _ingest_cli(billed, proxy, book)
    assert done.returncode == 1, done.stderr
    assert len(done.stderr.splitlines()) == len(HOURS)
    assert "namespace '__total__' is a name the reports use" in done.stderr
    assert _ledger_state(billed)[0] == before_lines


def test_a_kube_team_label_named_as_a_reports_row_is_ignored(real_prometheus, billed, book):
    """kube-state-metrics' label_team `__total__` for a namespace: not taken as its team."""
    with answering(
        _proxy(real_prometheus.url, QUERIES["teams"], _label(contract.LABEL_TEAM, "__total__"))
    ) as proxy:
        done = _ingest_cli(billed, proxy, book)
    assert done.returncode == 0, done.stderr
    ledger = open_ledger(billed)
    try:
        assert "__total__" not in ledger.namespace_teams().values()
        assert "__total__" not in {line.team for line in ledger.lines(H0, END)}
    finally:
        ledger.close()
