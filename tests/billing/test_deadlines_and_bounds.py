"""Deadlines and bounds (issue 42, point 4): a request's whole answer within its timeout, a whole
ingest within its deadline, an answer within its size cap, the hours asked for within the ledger's
plausible span. Loopback servers answer the hostile cases: one that trickles, one that hangs, one
that answers without end."""

from __future__ import annotations

import threading
from datetime import timedelta

import httpx
import pytest

from gpumeter import main
from gpumeter.billing.ingest import IngestConfig, ingest_hours
from gpumeter.billing.ledger import MEMORY_URL
from gpumeter.billing.pricing import load_price_book
from gpumeter.billing.pricing.static import DEFAULT_BOOK
from gpumeter.billing.prom import BadAnswer, PrometheusClient, PrometheusError
from tests.billing.factories import HOUR0
from tests.support.servers import AnswerHandler, answering

HOURS = [HOUR0 + timedelta(hours=i) for i in range(4)]


class Ticking:
    """A clock that reads ``step`` seconds later each time it is read."""

    def __init__(self, step: float):
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def test_an_answer_trickled_in_is_given_up_at_the_request_timeout():
    """200 bytes a write, without end: each read is within httpx's read timeout, so before, the answer
    was waited on for as long as it trickled (600 s and more in the probe). The whole answer now has
    the timeout, on the client's clock, here one that reads 4 s later each time: given up at its third
    reading of the body, while the answer is still arriving. (Without the bound the client reads
    on to the trickle's end, a megabyte in, then waits for the rest: an httpx ReadTimeout instead.)"""
    stop = threading.Event()

    class Trickle(AnswerHandler):
        def answer(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(10**7))
            self.end_headers()
            for _ in range(5000):
                if stop.is_set():
                    return
                self.wfile.write(b" " * 200)
                self.wfile.flush()
            stop.wait(30)

    with answering(Trickle) as url, PrometheusClient(url, timeout=10.0, clock=Ticking(4.0)) as client:
        try:
            with pytest.raises(PrometheusError, match=r"not complete within 10 s"):
                client.fetch_range("up", HOURS[0], HOURS[-1], 3600)
        finally:
            stop.set()


class Hung(httpx.BaseTransport):
    """A Prometheus that never answers: each request waits out the timeout it was sent with (given up
    at once here, with the timeouts recorded: the wait itself is httpx's, not billing's)."""

    def __init__(self) -> None:
        self.timeouts: list[dict[str, float]] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.timeouts.append(request.extensions["timeout"])
        raise httpx.ReadTimeout("timed out", request=request)


def test_a_hung_prometheus_is_given_up_at_the_run_deadline(sql_ledger):
    """Every request hangs. With a 30 s request timeout and a 1.5 s deadline each request is sent with
    no more than the deadline's 1.5 s to wait (before: 241 s with one worker, the range query then the
    hour's instant retry each waiting the full timeout), with the first hour recorded failed and
    nothing written."""
    book = load_price_book(DEFAULT_BOOK)
    config = IngestConfig(scrape_interval=30, deadline=1.5, workers=1)
    before = sql_ledger.counts()
    hung = Hung()
    with PrometheusClient("http://prometheus.invalid:9090", timeout=30, transport=hung) as client:
        result = ingest_hours(client, sql_ledger, book, HOURS, config)
    assert hung.timeouts, "no request sent"
    for timeouts in hung.timeouts:
        assert 0 < max(timeouts.values()) <= 1.5, timeouts
    assert [hour for hour, _ in result.failed] == [HOURS[0]] and result.ingested == []
    assert "deadline" in result.failed[0][1] or "ReadTimeout" in result.failed[0][1]
    after = sql_ledger.counts()
    assert after["ingest_runs"] == before["ingest_runs"] + 1 and after["cost_lines"] == before["cost_lines"]


def test_an_answer_larger_than_the_cap_is_refused_without_being_held():
    """An answer that never ends (the probe's 200 MB took ingest to 2.9 GB) is refused once it passes
    the cap, before its body is decoded."""
    stop = threading.Event()

    class Endless(AnswerHandler):
        def answer(self) -> None:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b'{"status":"success","data":{"resultType":"matrix","result":[')
            chunk = b'{"metric":{},"values":[]},' * 4000
            try:
                while not stop.is_set():
                    self.wfile.write(chunk)
            except OSError:
                pass

    with answering(Endless) as url, PrometheusClient(url, max_answer_bytes=4 << 20) as client:
        try:
            with pytest.raises(BadAnswer, match=r"answer larger than 4194304 bytes"):
                client.fetch_range("up", HOURS[0], HOURS[-1], 3600)
        finally:
            stop.set()


def _refused(capsys, *argv: str) -> str:
    """``gpumeter billing ARGV`` in this process (the refusals below are the command line's own, made
    before anything is opened, so no child is needed): its exit status 2 and what it wrote to stderr."""
    try:
        status = main(["billing", *argv])
    except SystemExit as exited:  # argparse's refusal
        status = exited.code
    stderr = capsys.readouterr().err
    assert status == 2, stderr
    return stderr


@pytest.mark.parametrize(
    ("command", "span", "refusal"),
    [
        (
            "ingest",
            ("--from", "1970-01-01"),
            "expected a time from 2000-01-01 to a year from now (value '1970-01-01')",
        ),
        (
            "ingest",
            ("--from", "0001-01-01"),
            "expected a time from 2000-01-01 to a year from now (value '0001-01-01')",
        ),
        ("ingest", ("--from", "9999-12-31T23:59Z"), "(value '9999-12-31T23:59Z')"),
        (
            "ingest",
            ("--from", "2020-01-01", "--to", "2022-01-01"),
            "--from .. --to spans more than 8784 hours; split it",
        ),
        ("price", ("--from", "1970-01-01", "--to", "2026-01-01"), "(value '1970-01-01')"),
        ("price", ("--from", "2020-01-01", "--to", "2026-01-01"), "spans more than 8784 hours"),
    ],
)
def test_hours_outside_the_ledgers_plausible_span_are_refused_with_one_line(
    tmp_path, capsys, command, span, refusal
):
    db = f"sqlite:///{tmp_path / 'ledger.db'}"
    prometheus = ("--prometheus", "http://127.0.0.1:1") if command == "ingest" else ()
    stderr = _refused(capsys, command, "--db", db, *span, *prometheus)
    last = stderr.strip().splitlines()[-1]
    assert refusal in last and "Traceback" not in stderr, stderr
    assert not (tmp_path / "ledger.db").exists()  # refused before the ledger was opened


@pytest.mark.parametrize(
    ("flag", "value"), [("--prometheus-timeout", "0"), ("--prometheus-timeout", "nan"), ("--deadline", "-3")]
)
def test_timeouts_out_of_range_are_refused(capsys, flag, value):
    stderr = _refused(capsys, "ingest", "--db", MEMORY_URL, flag, value)
    assert f"(value {value!r})" in stderr, stderr
