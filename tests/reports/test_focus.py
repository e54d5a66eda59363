"""The FOCUS 1.2 export: the project's own schema check (which must catch what focus-validator is
known to miss, docs/reports.md "FOCUS 1.2 mapping"), and focus-validator itself as an advisory step.

focus-validator 2.x needs Python >= 3.12 (the project runs on 3.11), so it lives in its own virtual
environment: `.bench/focus-venv` (see docs/reports.md for the two commands), or the program named by
GPUMETER_FOCUS_VALIDATOR. Where neither exists the advisory step reports that and the test still
asserts the project's own check; it never skips.
"""

from __future__ import annotations

import csv
import io
import os
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

from gpumeter.reports import focus
from gpumeter.reports.model import build_report, month_period
from gpumeter.reports.render import render

ROOT = Path(__file__).resolve().parents[2]
# focus-validator 2.2.1 with model 1.2.0.1: InvoiceId-C-004-C ("MUST be null") and -005-C ("MUST NOT be
# null") both have empty conditions, so one of them always fails (docs/reports.md).
KNOWN_VALIDATOR_FAILURES = {"InvoiceId-C-004-C", "InvoiceId-C-005-C"}


def _focus_file(ledger, tmp_path) -> Path:
    render(build_report(ledger, month_period("2026-11"), "team"), tmp_path, ("focus",))
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
        # focus-validator passes all three of these (docs/reports.md, "FOCUS 1.2 mapping")
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


def _validator() -> tuple[str | None, str]:
    named = os.environ.get("GPUMETER_FOCUS_VALIDATOR")
    candidates = (
        [named]
        if named
        else [str(ROOT / ".bench/focus-venv/bin/focus-validator"), shutil.which("focus-validator")]
    )
    for candidate in candidates:
        if candidate and Path(candidate).exists():
            return candidate, ""
    return None, (
        "focus-validator not installed (it needs Python >= 3.12 and ~650 MB; see docs/reports.md): "
        "the export was checked by reports.focus only"
    )


def test_focus_validator_advisory(worked_ledger, tmp_path, record_property, capsys):
    path = _focus_file(worked_ledger, tmp_path)
    assert focus.check_file(path) == []  # our own check always runs
    program, why = _validator()
    if program is None:
        record_property("focus_validator", why)
        with capsys.disabled():
            print(f"\nadvisory: {why}")
        return
    # it loads currency codes from a path relative to the working directory: run it beside a link
    # to the installed package; its rules offline (both workarounds: docs/reports.md)
    package = subprocess.run(
        [
            str(Path(program).parent / "python"),
            "-c",
            "import focus_validator, os; print(os.path.dirname(focus_validator.__file__))",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    workdir = tmp_path / "validator"
    workdir.mkdir()
    (workdir / "focus_validator").symlink_to(package)
    junit = workdir / "focus.xml"
    proc = subprocess.run(
        [
            program,
            "--data-file",
            str(path),
            "--validate-version",
            "1.2",
            "--block-download",
            "--rule-set-path",
            str(Path(package) / "rules"),
            "--output-type",
            "unittest",
            "--output-destination",
            str(junit),
        ],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    # its exit code is 0 even when rules fail (problem 4): read the JUnit XML
    assert junit.exists(), proc.stdout[-2000:] + proc.stderr[-2000:]
    root = ET.parse(junit).getroot()
    assert int(root.get("tests", "0")) >= 500
    failed = set()
    for case in root.iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            failed.add(case.get("name", "").split(" :: ")[0])
    record_property("focus_validator", f"{root.get('tests')} rules, failed: {sorted(failed)}")
    assert failed <= KNOWN_VALIDATOR_FAILURES, sorted(failed - KNOWN_VALIDATOR_FAILURES)
