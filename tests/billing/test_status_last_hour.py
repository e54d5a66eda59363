"""`gpumeter billing status` names the newest hour billed by its start, as every other command does.

A finance analyst's probe: a ledger billed up to 2026-11-30T20:00Z (its newest hour 19:00-20:00) was
reported as "last hour billed: 2026-11-30T20:00:00+00:00", the END of that hour, which reads as the
hour 20:00-21:00: one hour more than was billed. The refused rows, reports and --from name an hour
by its start."""

from __future__ import annotations

from datetime import UTC, datetime

from gpumeter import main
from gpumeter.billing.allocate import price_gpu_hour
from gpumeter.billing.ledger import open_ledger
from gpumeter.billing.ledger.base import HourRecord
from gpumeter.billing.pricing import load_price_book
from tests.billing.factories import H100, alloc, gpu_hour, write_book


def _status(url: str, capsys) -> list[str]:
    assert main(["billing", "status", "--db", url]) == 0
    return capsys.readouterr().out.splitlines()


def test_the_last_hour_billed_is_named_by_its_start(tmp_path, capsys):
    """Two hours billed, 18:00-19:00 and 19:00-20:00 of November 30: the newest starts at 19:00, so
    the line names 19:00 and no 20:00 (before: `last hour billed: 2026-11-30T20:00:00+00:00`)."""
    book = load_price_book(
        write_book(
            tmp_path,
            {"currency": "USD", "versions": [{"effective_from": "2026-01-01", "gpus": {H100: "6.88"}}]},
        )
    )
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    ledger = open_ledger(url)
    try:
        for hour in (datetime(2026, 11, 30, 18, tzinfo=UTC), datetime(2026, 11, 30, 19, tzinfo=UTC)):
            gh = gpu_hour("GPU-u", H100, allocations=[alloc("GPU-u", "ns", "p")], hour=hour)
            ledger.write_hour(HourRecord(hour, [gh], price_gpu_hour(gh, book).lines, book))
    finally:
        ledger.close()
    first = _status(url, capsys)[0]
    assert first == "last hour billed: the hour starting 2026-11-30T19:00:00+00:00", first
    assert "20:00" not in first


def test_an_empty_ledger_says_none(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    open_ledger(url).close()
    assert _status(url, capsys)[0] == "last hour billed: none"
