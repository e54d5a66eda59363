"""One bad reading costs one GPU-hour, not the fleet's week (docs/billing.md §6.5).

A week of two simulated fleets (`workstation`, 2 RTX 6000 Ada; `a100-mixed`, 6 A100s with MIG, whole and
time-sliced pods) at a 5-minute step, in a real Prometheus (backfilled by promtool). The clean week
is billed by `gpumeter billing ingest` into the reference ledger. Then, each time by `billing serve`'s
hourly catch-up over the whole week:

- the same week with one GPU's utilization NaN for one hour, stored in a second real Prometheus;
- the clean week behind a loopback proxy that answers one GPU's allocation count as -3 for one hour.

Each time every other GPU-hour of the week is billed exactly as in the reference ledger, compared
line by line; the catch-up reaches the week's last hour; the refused GPU-hour is listed by `billing
status` and `billing audit`, counted on billing's /metrics, and fires GpumeterBillingGpuHoursRefused in
a real Prometheus scraping that /metrics. Before, the NaN stopped the range at that hour: the catch-up
never attempted the hours after it, and the negative count did the same.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gpumeter import contract, web
from gpumeter.alerts import ALERTS_FILE
from gpumeter.billing.config import Settings
from gpumeter.billing.ingest import QUERIES
from gpumeter.billing.ledger import open_ledger
from gpumeter.service import JOBS, build_app, hourly_ingest
from gpumeter.simulator.fleet import load_fleet
from gpumeter.simulator.history import write_history
from tests.billing import factories
from tests.billing.conftest import serve_history
from tests.support import loopback
from tests.support.servers import AnswerHandler, PrometheusServer, answering, free_port

START = datetime(2026, 11, 2, tzinfo=UTC)
END = START + timedelta(days=7)
STEP = 300  # seconds between samples: 12 an hour
FLEETS = ("workstation", "a100-mixed")
NAN_HOUR = START + timedelta(days=1, hours=6)  # 2026-11-03 06:00
NEGATIVE_HOUR = START + timedelta(days=3, hours=14)  # 2026-11-05 14:00
RULE = "GpumeterBillingGpuHoursRefused"

pytestmark = pytest.mark.prometheus


def _history(out: Path, nan_uuid: str | None = None) -> Path:
    """The week as OpenMetrics; with ``nan_uuid``, that GPU's utilization samples inside NAN_HOUR
    (its [1h] window, ends left out) are NaN, as a store holding a broken exporter's samples has them."""
    fleets = [load_fleet(name) for name in FLEETS]
    with out.open("w") as file:
        write_history(fleets, START.timestamp(), END.timestamp(), STEP, file)
    if nan_uuid is None:
        return out
    first, last = NAN_HOUR.timestamp(), NAN_HOUR.timestamp() + 3600
    sample = re.compile(r"^nvidia_gpu_utilization_ratio\{(.*)\} (\S+) (\S+)$")
    text = out.read_text().splitlines(keepends=True)
    changed = 0
    with out.open("w") as file:
        for line in text:
            found = sample.match(line)
            if found and f'uuid="{nan_uuid}"' in found[1] and first < float(found[3]) < last:
                line = f"nvidia_gpu_utilization_ratio{{{found[1]}}} NaN {found[3]}\n"
                changed += 1
            file.write(line)
    assert changed == 3600 // STEP - 1  # the hour's samples but the one at its start
    return out


def _workstation_gpu() -> str:
    return load_fleet("workstation").nodes[0].gpus[0].uuid


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    root = tmp_path_factory.mktemp("clean-week")
    server = serve_history("prometheus", _history(root / "week.om"), root)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def with_nan(tmp_path_factory):
    root = tmp_path_factory.mktemp("nan-week")
    server = serve_history("prometheus", _history(root / "week.om", _workstation_gpu()), root)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def book(tmp_path_factory):
    return factories.write_book(
        tmp_path_factory.mktemp("book"),
        {
            "currency": "USD",
            "versions": [
                {
                    "effective_from": "2026-01-01T00:00:00Z",
                    "gpus": {"A100-40GB": "3.00", "NVIDIA RTX 6000 Ada Generation": "1.20"},
                }
            ],
        },
    )


def _lines(url: str) -> list[tuple]:
    ledger = open_ledger(url)
    try:
        return sorted(dataclasses.astuple(line) for line in ledger.lines(START, END))
    finally:
        ledger.close()


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gpumeter", "billing", *argv],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_COLOR": "1"},
    )


@pytest.fixture(scope="module")
def reference(clean, book, tmp_path_factory):
    """The clean week billed by `billing ingest`: the ledger every other one is compared with."""
    url = f"sqlite:///{tmp_path_factory.mktemp('reference') / 'ledger.db'}"
    done = _run(
        "ingest",
        "--db",
        url,
        "--prometheus",
        clean.url,
        "--prices",
        str(book),
        "--from",
        START.isoformat(),
        "--to",
        END.isoformat(),
        "--scrape-interval",
        str(STEP),
        "--no-progress",
        "--workers",
        "1",
    )
    assert done.returncode == 0, done.stderr
    lines = _lines(url)
    hours = {line[0] for line in lines}
    assert len(hours) == 7 * 24  # every hour of the week billed
    return lines


def _catch_up(prometheus: str, book: Path, url: str, now: datetime) -> str:
    """`billing serve`'s hourly job, as it runs at ``now``: catch up every hour of the last week."""
    JOBS.start(datetime.now(UTC), {})
    settings = Settings(
        db=url, prometheus=prometheus, prices=str(book), scrape_interval=STEP, catchup_hours=168, workers=1
    )
    return hourly_ingest(settings.as_dict(), now=now, holder="test")


def _metrics(url: str) -> dict[str, float]:
    ledger = open_ledger(url)
    try:
        body = b"".join(
            build_app(ledger)({"PATH_INFO": "/metrics", "REQUEST_METHOD": "GET"}, lambda *a: None)
        )
    finally:
        ledger.close()
    return {
        s.name: s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
        if not s.labels
    }


def _refused_alert_fires(url: str, tmp_path: Path) -> None:
    """A real Prometheus scraping the billing service's /metrics, with the shipped rule (its `for`
    set to 0s here; alerts/tests/billing-refused-test.yaml checks the 2h with promtool)."""
    groups = [g for g in yaml.safe_load(ALERTS_FILE.read_text())["groups"] if g["name"] == "gpumeter-billing"]
    (rule,) = [r for r in groups[0]["rules"] if r.get("alert") == RULE]
    rule["for"] = "0s"
    rules = tmp_path / "refused.yaml"
    rules.write_text(yaml.safe_dump({"groups": [{"name": "refused", "rules": [rule]}]}))
    ledger = open_ledger(url)
    port = free_port()
    billing = web.serve(build_app(ledger), ("127.0.0.1", port), name="billing")
    try:
        with PrometheusServer(
            tmp_path / "prom", scrape_targets={"gpumeter-billing": [f"127.0.0.1:{port}"]}, rule_files=[rules]
        ) as prom:
            (firing,) = prom.wait_for(f'ALERTS{{alertname="{RULE}", alertstate="firing"}}', timeout=60)
            assert firing["metric"]["job"] == "gpumeter-billing" and firing["metric"]["severity"] == "warning"
    finally:
        billing.close()
        ledger.close()


def _check_scoped(
    url: str, reference: list[tuple], hour: datetime, uuid: str, reading: str, tmp_path
) -> None:
    lines = _lines(url)
    expected = [line for line in reference if not (line[0] == hour and line[1] == uuid)]
    assert len(expected) < len(reference)  # the refused GPU-hour had lines in the clean week
    assert lines == expected  # every other GPU-hour of the week, line by line
    assert max(line[0] for line in lines) == END - timedelta(hours=1)  # the catch-up reached the end

    status = _run("status", "--db", url)
    assert status.returncode == 0, status.stderr
    assert f"{hour.isoformat()}\t{uuid}\t{reading}" in status.stdout, status.stdout
    assert "1 GPU-hour(s) refused and not billed" in status.stdout
    audit = _run("audit", "--db", url)
    assert audit.returncode == 0 and f"{hour.isoformat()}\t{uuid}\t{reading}" in audit.stdout, audit.stdout
    assert _metrics(url)[contract.BILLING_REFUSED_GPU_HOURS.name] == 1
    _refused_alert_fires(url, tmp_path)


def test_a_gpus_nan_utilization_for_one_hour_costs_that_gpu_hour_only(with_nan, book, reference, tmp_path):
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    uuid = _workstation_gpu()
    outcome = _catch_up(with_nan.url, book, url, END + timedelta(minutes=5))
    assert outcome == "ingested 168", outcome
    reading = f"gpu_util ({QUERIES['gpu_util']!r}): value nan is not a number in [0, 1]"
    _check_scoped(url, reference, NAN_HOUR, uuid, reading, tmp_path)

    # the next hourly run retries the partial hour (still NaN in the store) and bills the new one
    assert _catch_up(with_nan.url, book, url, END + timedelta(hours=1, minutes=5)) == "ingested 1"
    ledger = open_ledger(url)
    try:
        runs = [r for r in ledger.ingest_runs(NAN_HOUR, NAN_HOUR + timedelta(hours=1))]
        assert [r.status for r in runs] == [contract.INGEST_PARTIAL] * 2
        assert [(r.hour, r.uuid) for r in ledger.refused_gpu_hours()] == [(NAN_HOUR, uuid)]
    finally:
        ledger.close()


def _negative_count_proxy(upstream: str, uuid: str, value: str = "-3") -> type[AnswerHandler]:
    """Forwards every query to the real Prometheus; answers ``uuid``'s allocation counts for
    NEGATIVE_HOUR as ``value`` (what a broken query frontend or recording rule could serve)."""
    at = NEGATIVE_HOUR.timestamp() + 3600  # the hour's step: its end (billing asks 1 ms before it)

    class Proxy(AnswerHandler):
        def answer(self) -> None:
            reply = loopback.post(f"{upstream}{self.path}", data=self.form, timeout=60)
            body = reply.json()
            if self.form["query"] == QUERIES["alloc_count"] and body.get("status") == "success":
                for item in body["data"]["result"]:
                    if item["metric"].get("uuid") != uuid:
                        continue
                    for point in item.get("values", [item.get("value")]):
                        if point and abs(float(point[0]) - at) < 1:
                            point[1] = value
            self.send_json(body, reply.status_code)

    return Proxy


def test_a_gpus_negative_allocation_count_for_one_hour_costs_that_gpu_hour_only(
    clean, book, reference, tmp_path
):
    # a GPU with a pod on it at that hour in the clean week
    uuid = next(line[1] for line in reference if line[0] == NEGATIVE_HOUR and line[2] == "tenant")
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    with answering(_negative_count_proxy(clean.url, uuid)) as proxy:
        outcome = _catch_up(proxy, book, url, END + timedelta(minutes=5))
    assert outcome == "ingested 168", outcome
    reading = f"alloc_count ({QUERIES['alloc_count']!r}): value -3.0 is not a number in [0, 3601]"
    _check_scoped(url, reference, NEGATIVE_HOUR, uuid, reading, tmp_path)


def test_a_gpus_allocation_count_that_is_no_number_costs_that_gpu_hour_only(clean, book, reference, tmp_path):
    """Text that is no number, in one series of a well-formed answer, is a bad reading like -3 or NaN:
    before, it made the whole answer "of the wrong shape" and refused the hour of every GPU."""
    uuid = next(line[1] for line in reference if line[0] == NEGATIVE_HOUR and line[2] == "tenant")
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    with answering(_negative_count_proxy(clean.url, uuid, "abc")) as proxy:
        outcome = _catch_up(proxy, book, url, END + timedelta(minutes=5))
    assert outcome == "ingested 168", outcome
    reading = f"alloc_count ({QUERIES['alloc_count']!r}): value 'abc' is not a number in [0, 3601]"
    _check_scoped(url, reference, NEGATIVE_HOUR, uuid, reading, tmp_path)
