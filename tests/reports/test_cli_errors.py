"""`gpumeter report` refuses what it cannot honestly report, in one line (issue 13, point 7): a SQLite
ledger that does not exist (it used to create an empty one and report $0, exit 0), years outside
what the ledger can hold (0, 9999-12 whose end is year 10000, 10000), and --out naming a file
(each a traceback before). And the FOCUS description of an unpriced hour says why it is unpriced."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime

import pytest

from gpumeter.billing.allocate import price_gpu_hour
from gpumeter.billing.ledger import open_ledger
from gpumeter.billing.ledger.base import HourRecord
from gpumeter.reports import focus
from gpumeter.reports.model import build_report, month_period
from tests.billing.factories import H100, alloc, gpu_hour, write_book

VR200 = "NVIDIA VR200"


def _report(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gpumeter", "report", *argv], capture_output=True, text=True, timeout=120
    )


def _one_line_error(run: subprocess.CompletedProcess, *expected: str) -> str:
    assert run.returncode == 2, (run.returncode, run.stdout, run.stderr)
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), run.stderr
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def ledger_url(tmp_path):
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    open_ledger(url).close()
    return url


@pytest.mark.spawns
def test_a_missing_sqlite_ledger_is_refused_not_created(tmp_path):
    typo = tmp_path / "typo.db"
    run = _report("--db", f"sqlite:///{typo}", "--period", "2026-10", "--out", str(tmp_path / "out"))
    _one_line_error(run, str(typo), "no such SQLite file")
    assert not typo.exists()
    assert not (tmp_path / "out").exists()


@pytest.mark.spawns
@pytest.mark.parametrize(
    ("period", "shown"),
    [
        (["--period", "0000-01"], "'0000-01'"),
        (["--period", "9999-12"], "'9999-12'"),  # its end, 10000-01-01, is no date
        (["--period", "10000-01"], "'10000-01'"),
        (["--from", "0000-01-01", "--to", "2026-01-01"], "'0000-01-01'"),
        (["--from", "9999-12-01", "--to", "10000-01-01"], "'10000-01-01'"),
        (["--from", "1969-12-01", "--to", "1970-01-01"], "1969-12-01"),
    ],
    ids=["period-0", "period-9999-12", "period-10000", "from-0", "to-10000", "before-epoch"],
)
def test_years_the_ledger_cannot_hold_are_one_line(ledger_url, tmp_path, period, shown):
    _one_line_error(_report("--db", ledger_url, *period, "--out", str(tmp_path / "out")), "period", shown)


@pytest.mark.spawns
def test_out_naming_a_file_is_one_line_and_the_file_is_kept(ledger_url, tmp_path):
    target = tmp_path / "report.html"
    target.write_text("keep me")
    for out in (target, target / "sub"):
        run = _report("--db", ledger_url, "--period", "2026-10", "--out", str(out))
        _one_line_error(run, "out", str(out))
    assert target.read_text() == "keep me"


def test_focus_says_why_an_hour_is_unpriced(tmp_path):
    """October 20 is before the book's only version (from November 1): no version is in effect, so
    it says that, not that the model has no rate. On November 2 the version is in effect but has no
    VR200 rate: it says that, naming the version."""
    doc = {"currency": "USD", "versions": [{"effective_from": "2026-11-01", "gpus": {"H100-80GB": "6.88"}}]}
    from gpumeter.billing.pricing import load_price_book

    book = load_price_book(write_book(tmp_path, doc))
    ledger = open_ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    try:
        for hour, model in (
            (datetime(2026, 10, 20, tzinfo=UTC), H100),
            (datetime(2026, 11, 2, tzinfo=UTC), VR200),
        ):
            gh = gpu_hour("GPU-u", model, allocations=[alloc("GPU-u", "ns", "p")], hour=hour)
            ledger.write_hour(HourRecord(hour, [gh], price_gpu_hour(gh, book).lines, book))
        october = focus.rows(build_report(ledger, month_period("2026-10"), "team"))
        november = focus.rows(build_report(ledger, month_period("2026-11"), "team"))
    finally:
        ledger.close()
    (before,) = [r["ChargeDescription"] for r in october]
    assert before == (
        "Unpriced GPU model H100-80GB: no price-book version in effect for the hour; quantity only, not billed"
    )
    assert "no rate" not in before
    # the model as the ledger keys it (the price book's canonical name where it knows the GPU)
    (model,) = [r["x_GpuModel"] for r in november]
    assert [r["SkuPriceId"] for r in october + november] == [
        "h100-80gb:unpriced",
        f"{model.lower()}:unpriced",
    ]
    (missing,) = [r["ChargeDescription"] for r in november]
    assert (
        missing.startswith(f"Unpriced GPU model {model}: price-book version ")
        and "@2026-11-01T00:00:00Z" in missing
    )
    assert missing.endswith("has no rate for it; quantity only, not billed")
