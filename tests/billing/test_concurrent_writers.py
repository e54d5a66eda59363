"""Money under concurrency: two writers of the same hour never leave it billed twice.

Two ingests (or an ingest and a re-price) of one hour used to run DELETE then INSERT under READ
COMMITTED with nothing held on the hour: both deleted nothing, both inserted, and PostgreSQL kept a
doubled hour. Each writer here runs in its own thread on its own connection, released together by a
barrier, many times over; after every round the hour holds exactly one writer's lines.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from decimal import Decimal

import pytest

from gpumeter.billing.allocate import price_gpu_hour
from gpumeter.billing.ledger.base import HourRecord
from tests.billing.factories import A100, HOUR0, alloc, book, gpu_hour, mig

ROUNDS = 25


def _record(prices, hour):
    u = "GPU-race"
    gh = gpu_hour(
        u,
        A100,
        [mig(u, "1", "3g.20gb"), mig(u, "2", "3g.20gb")],
        [alloc(u, "ns-a", "a", gi="1", profile="3g.20gb"), alloc(u, "ns-b", "b", gi="2", profile="3g.20gb")],
        hour=hour,
    )
    return HourRecord(hour, [gh], price_gpu_hour(gh, prices).lines, prices)


def _race(*writers) -> None:
    barrier = threading.Barrier(len(writers))
    errors: list[BaseException] = []

    def run(write):
        try:
            barrier.wait(timeout=30)
            write()
        except BaseException as exc:  # re-raised below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(w,)) for w in writers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors


@pytest.mark.parametrize("second", ["ingest", "reprice"])
def test_two_writers_of_one_hour_leave_one_copy(ledger, tmp_path, second):
    prices = book(tmp_path, {"A100-40GB": {"hourly_rate": "3.00"}})
    single = _record(prices, HOUR0)
    expected_lines = len(single.lines)  # two tenants and the stranded 1/7: 3 lines, $3.00 in all
    assert expected_lines == 3 and sum(line.amount for line in single.lines) == Decimal("3.00")
    for n in range(ROUNDS):
        hour = HOUR0 + timedelta(hours=n)
        record = _record(prices, hour)
        other = (
            (lambda r=record: ledger.write_hour(r))
            if second == "ingest"
            else (lambda r=record: ledger.replace_lines(r.hour, r.lines, prices))
        )
        _race(lambda r=record: ledger.write_hour(r), other)
        stored = ledger.lines(hour, hour + timedelta(hours=1))
        assert len(stored) == expected_lines, f"round {n}: {len(stored)} lines"
        assert sum(line.amount for line in stored) == Decimal("3.00"), f"round {n}"
