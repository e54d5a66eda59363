"""An already-billed hour changes only on purpose (issue 42, point 6).

A REAL Prometheus holds test_ingest_prometheus' history: three hours of an A100 (book A: $3.00) and
an H100 ($6.88), so each hour bills $9.88 in all (its hand-computed lines sum to that: 1.29 + 1.07 +
4.30 + 3.22 for the first). Book B halves both rates ($1.50 and $3.44): $4.94 an hour. Re-pricing
with B writes an audit record per hour (old $9.88, new $4.94, who, why, which book) that
`gpumeter billing audit` lists; re-pricing again with B changes nothing and records nothing;
re-ingesting with A records the way back. A JPY book on these USD months is refused with one line.
A re-price started while an ingest runs waits for it, and the hours end as the re-price reports."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from datetime import timedelta
from decimal import Decimal

import pytest

from gpumeter.billing.ledger import open_ledger
from tests.billing import test_ingest_prometheus as history
from tests.billing.factories import write_book
from tests.support import loopback
from tests.support.servers import AnswerHandler, PrometheusServer, answering

D = Decimal
H0, EXPECTED_TOTAL = history.H0, history.EXPECTED_TOTAL
tsdb = history.tsdb
HOURS = [H0 + timedelta(hours=n) for n in range(3)]
END = H0 + timedelta(hours=3)


def _book(tmp_path, name: str, a100: str, h100: str, currency: str = "USD"):
    doc = {
        "currency": currency,
        "versions": [
            {
                "effective_from": "2026-01-01T00:00:00Z",
                "gpus": {"A100-40GB": {"hourly_rate": a100}, "H100-80GB": {"hourly_rate": h100}},
            }
        ],
    }
    return write_book(tmp_path, doc, name)


@pytest.fixture(scope="module")
def prometheus(tsdb, tmp_path_factory):
    root = tmp_path_factory.mktemp("audit")
    shutil.copytree(tsdb, root / "data")
    server = PrometheusServer(root / "prom", data_dir=root / "data").start()
    yield server
    server.stop()


def _billing(*argv: str, wait: bool = True):
    command = [sys.executable, "-m", "gpumeter", "billing", *argv]
    if not wait:
        return subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ}
        )
    return subprocess.run(command, capture_output=True, text=True, timeout=180, env={**os.environ})


def _db_args(db) -> list[str]:
    url, schema = db
    return ["--db", url, *(["--db-schema", schema] if schema else [])]


def _ingest_args(db, prometheus: str, book) -> list[str]:
    return [
        "ingest",
        *_db_args(db),
        "--prometheus",
        prometheus,
        "--prices",
        str(book),
        "--from",
        H0.isoformat(),
    ]


def _span() -> list[str]:
    return ["--from", H0.isoformat(), "--to", END.isoformat()]


def _hour_totals(db) -> dict:
    url, schema = db
    ledger = open_ledger(url, schema=schema)
    try:
        totals: dict = {}
        for line in ledger.lines(H0, END):
            totals[line.hour] = totals.get(line.hour, D(0)) + (line.amount or 0)
        return totals
    finally:
        ledger.close()


def _audit(db):
    url, schema = db
    ledger = open_ledger(url, schema=schema)
    try:
        return ledger.audit_records()
    finally:
        ledger.close()


# What book B changes, per hour and team (test_ingest_prometheus' hand-computed lines; team-a's
# namespace is labelled team alpha, the rest bill no team). Book A: alpha 1.29, 1.28, 1.29 and no
# team the rest of 9.88: 8.59, 8.60, 8.59. Book B (A100 1.50): team-a 3/7 x 1.50 = 0.642857 -> 0.64
# every hour (its remainder .2857 never gets a residue cent: b-0's .8571 and b-1's .7142 or .4285
# come first); no team 4.94 - 0.64 = 4.30 (hour 0: b-0 0.43 + b-1 0.11 + unallocated 0.32 + H's p1
# 0.86 + p2 0.86 + p3 0.43 + unallocated 1.29). Records per team, no team ("") first.
BY_TEAM = {
    hour: [
        (hour, "", D(none), D("4.30"), "USD", "price"),
        (hour, "alpha", D(alpha), D("0.64"), "USD", "price"),
    ]
    for hour, alpha, none in zip(HOURS, ("1.29", "1.28", "1.29"), ("8.59", "8.60", "8.59"), strict=True)
}

INGEST_TAIL = ["--to", END.isoformat(), "--scrape-interval", "30", "--no-progress", "--workers", "1"]


def test_a_re_price_is_audited_and_listed_with_old_and_new_totals(prometheus, db, tmp_path):
    book_a, book_b = _book(tmp_path, "a.yaml", "3.00", "6.88"), _book(tmp_path, "b.yaml", "1.50", "3.44")
    done = _billing(*_ingest_args(db, prometheus.url, book_a), *INGEST_TAIL)
    assert done.returncode == 0, done.stderr
    assert _hour_totals(db) == dict.fromkeys(HOURS, D("9.88"))
    assert _audit(db) == []  # billed for the first time: nothing to audit

    priced = _billing(
        "price", *_db_args(db), "--prices", str(book_b), *_span(), "--reason", "contract renegotiated"
    )
    assert priced.returncode == 0, priced.stderr
    assert _hour_totals(db) == dict.fromkeys(HOURS, D("4.94"))
    assert "3 already-billed hour(s) changed from 29.64" in priced.stderr and "to 14.82 USD" in priced.stderr
    records = _audit(db)
    assert [(r.hour, r.team, r.old_total, r.new_total, r.currency, r.command) for r in records] == [
        row for hour in HOURS for row in BY_TEAM[hour]
    ]
    assert {r.reason for r in records} == {"contract renegotiated"} and len({r.run for r in records}) == 1
    assert all(len(r.book_digest) == 64 and r.operator for r in records)

    listed = _billing("audit", *_db_args(db))
    assert listed.returncode == 0, listed.stderr
    rows = listed.stdout.splitlines()
    assert rows[0].split("\t") == [
        "at",
        "command",
        "operator",
        "reason",
        "book",
        "hour",
        "team",
        "old",
        "new",
        "currency",
    ]
    assert [row.split("\t")[5:] for row in rows[1:7]] == [
        [hour.isoformat(), team or "(no team)", f"{old:.2f}", f"{new:.2f}", "USD"]
        for hour in HOURS
        for _, team, old, new, _, _ in BY_TEAM[hour]
    ]
    assert (
        "price by" in rows[7]
        and "3 hour(s), total 29.64" in rows[7]
        and "-> 14.82 USD ('contract renegotiated')" in rows[7]
    )

    # the month's report says its hours were re-priced after billing: who, why, the totals (issue 42)
    assert _report_changes(db, tmp_path / "after-price") == [
        {
            "at": records[0].at.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "command": "price",
            "operator": records[0].operator,
            "reason": "contract renegotiated",
            "hours": 3,
            "old_total": "29.64",
            "new_total": "14.82",
            "currency": "USD",
        }
    ]
    page = (tmp_path / "after-price" / "gpumeter-2026-11-by-team.html").read_text()
    assert "<strong>Changed after billing:</strong>" in page and "29.64 → 14.82 USD" in page

    again = _billing("price", *_db_args(db), "--prices", str(book_b), *_span())
    assert again.returncode == 0 and "changed" not in again.stderr
    assert len(_audit(db)) == 6  # the same totals: nothing changed, nothing recorded

    back = _billing(*_ingest_args(db, prometheus.url, book_a), *INGEST_TAIL, "--reason", "undo")
    assert back.returncode == 0, back.stderr
    assert "note: 3 already-billed hour(s) changed from 14.82 to 29.64 USD" in back.stderr
    assert [(r.command, r.team, r.old_total, r.new_total, r.reason) for r in _audit(db)[6:]] == [
        ("ingest", team, new, old, "undo") for hour in HOURS for _, team, old, new, _, _ in BY_TEAM[hour]
    ]
    changes = _report_changes(db, tmp_path / "after-undo")
    assert [(c["command"], c["hours"], c["old_total"], c["new_total"], c["reason"]) for c in changes] == [
        ("price", 3, "29.64", "14.82", "contract renegotiated"),
        ("ingest", 3, "14.82", "29.64", "undo"),
    ]


def _report_changes(db, out) -> list[dict]:
    """What `gpumeter report` (JSON and HTML) says of the month's hours changed after billing."""
    url, schema = db
    argv = [sys.executable, "-m", "gpumeter", "report", "--db", url, "--period", "2026-11"]
    argv += [*(["--db-schema", schema] if schema else []), "--format", "json,html", "--out", str(out)]
    done = subprocess.run([*argv, "--no-record"], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    doc = json.loads((out / "gpumeter-2026-11-by-team.json").read_text())
    return doc["provenance"].get("billed_hours_changed", [])


def test_a_book_in_another_currency_is_refused_on_a_ledgers_months(prometheus, db, tmp_path):
    book_a, yen = _book(tmp_path, "a.yaml", "3.00", "6.88"), _book(tmp_path, "jpy.yaml", "450", "1030", "JPY")
    assert _billing(*_ingest_args(db, prometheus.url, book_a), *INGEST_TAIL).returncode == 0
    for argv in (
        ["price", *_db_args(db), "--prices", str(yen), *_span()],
        [*_ingest_args(db, prometheus.url, yen), *INGEST_TAIL],
    ):
        done = _billing(*argv)
        assert done.returncode == 2, done.stderr
        assert done.stderr.splitlines() == [
            f"error: {yen}: currency: the ledger bills 2026-11-01..2026-12-01 in USD, not this book's currency (value 'JPY')"
        ]
    assert _hour_totals(db) == dict.fromkeys(HOURS, D("9.88")) and _audit(db) == []


def _slow(upstream: str, delay: float) -> type[AnswerHandler]:
    class Slow(AnswerHandler):
        def answer(self) -> None:
            time.sleep(delay)
            reply = loopback.post(f"{upstream}{self.path}", data=self.form, timeout=30)
            self.send_json(reply.content, reply.status_code)

    return Slow


def test_a_re_price_during_an_ingest_waits_for_it_and_the_hours_end_as_it_reports(prometheus, db, tmp_path):
    """Before, both reported success and the hours ended an arbitrary mix of the two books (SQLite:
    40/104, 14/130, 31/113 hours of each in three rounds). The ingest (book A, through a Prometheus
    slowed to 0.4 s an answer) holds the ledger shared; the re-price (book B) started meanwhile waits,
    then re-prices every hour the ingest wrote, and says so."""
    book_a, book_b = _book(tmp_path, "a.yaml", "3.00", "6.88"), _book(tmp_path, "b.yaml", "1.50", "3.44")
    with answering(_slow(prometheus.url, 0.4)) as slow:
        ingest = _billing(*_ingest_args(db, slow, book_a), *INGEST_TAIL, wait=False)
        time.sleep(3.0)  # the ingest has started and holds the ledger (it takes ~5 s more)
        priced = _billing("price", *_db_args(db), "--prices", str(book_b), *_span())
        _, ingest_err = ingest.communicate(timeout=180)
    assert ingest.returncode == 0, ingest_err
    assert priced.returncode == 0, priced.stderr
    assert "note: waited for the ingests running on this ledger to finish" in priced.stderr
    assert "re-priced 3 hour(s)" in priced.stdout
    assert "3 already-billed hour(s) changed from 29.64 to 14.82 USD" in priced.stderr
    assert _hour_totals(db) == dict.fromkeys(HOURS, D("4.94"))  # all the re-price's, as it says
