"""The FOCUS 1.2 export: the project's own schema check (which must catch what focus-validator is
known to miss, docs/reports.md "FOCUS mapping"), and the FinOps Foundation's focus-validator itself
(tests/reports/focus_checks.py: its own Python 3.12 environment, offline, never skipped)."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest

from gpumeter.reports import focus
from gpumeter.reports.model import build_report, month_period
from gpumeter.reports.render import RenderOptions, render
from tests.reports.focus_checks import KNOWN_VALIDATOR_FAILURES, validate_12


def _focus_file(ledger, tmp_path) -> Path:
    report = build_report(ledger, month_period("2026-11"), "team", splits=False)
    render(report, tmp_path, ("focus",), RenderOptions(focus_version="1.2"))
    return tmp_path / "gpumeter-2026-11-focus-1.2.csv"


def _rewrite(path: Path, target: Path, edit) -> Path:
    rows = list(csv.DictReader(io.StringIO(path.read_text(), newline="")))
    header = list(rows[0])
    header, rows = edit(header, rows)
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=header, lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    target.write_text(out.getvalue())
    return target


def test_own_check_passes_the_export_and_catches_what_the_validator_misses(worked_ledger, tmp_path):
    path = _focus_file(worked_ledger, tmp_path)
    assert focus.check_file(path) == []
    header = path.read_text().splitlines()[0].split(",")
    assert header[: len(focus.COLUMNS)] == [c[0] for c in focus.COLUMNS]
    assert all(name.startswith("x_") for name in header[len(focus.COLUMNS) :])
    assert {"x_MigProfile", "x_GpuUuid"} <= set(header)

    def one_row(column, value):
        def edit(header, rows):
            rows[1][column] = value
            return header, rows

        return edit

    cases = {
        # focus-validator passes all three of these (docs/reports.md, "FOCUS mapping")
        "ListCost": one_row("ListCost", "99"),
        "ChargeCategory": one_row("ChargeCategory", "GPU"),
        "ChargePeriodStart": one_row("ChargePeriodStart", "2026-11-01 00:00:00"),
        "BilledCost": one_row("BilledCost", "12,5"),
        "ConsumedUnit": one_row("ConsumedUnit", ""),
        "Tags": one_row("Tags", '{"nested": {"a": 1}}'),
        "BillingCurrency": one_row("BillingCurrency", "XYZ"),
        "ChargePeriodEnd": one_row("ChargePeriodEnd", "2026-10-01T00:00:00Z"),
    }
    for column, edit in cases.items():
        broken = _rewrite(path, tmp_path / f"bad-{column}.csv", edit)
        problems = focus.check_file(broken)
        assert any(p.startswith(f"row 3: {column}:") for p in problems), (column, problems)
        assert all(p.startswith("row 3: ") for p in problems), (column, problems)

    def drop_column(header, rows):
        return [h for h in header if h != "ServiceName"], rows

    def unprefixed(header, rows):
        for row in rows:
            row["GpuModel"] = "x"
        return [*header, "GpuModel"], rows

    assert focus.check_file(_rewrite(path, tmp_path / "a.csv", drop_column)) == [
        "header: missing mandatory FOCUS columns ['ServiceName']"
    ]
    assert focus.check_file(_rewrite(path, tmp_path / "b.csv", unprefixed)) == [
        "header: unknown column 'GpuModel' (custom columns need the x_ prefix)"
    ]


@pytest.mark.focus_validator
def test_focus_validator_passes_the_12_export(worked_ledger, tmp_path, record_property):
    path = _focus_file(worked_ledger, tmp_path)
    assert focus.check_file(path) == []  # our own check too
    outcome = validate_12(path, tmp_path / "validator")
    record_property("focus_validator", str(outcome))
    assert outcome.rules >= 500 and outcome.passed >= 100, outcome
    assert outcome.failed == KNOWN_VALIDATOR_FAILURES, outcome
