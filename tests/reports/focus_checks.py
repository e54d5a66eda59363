"""Checks of a FOCUS export shared by the report tests and the demo's: the FinOps Foundation's
focus-validator over a 1.2 export, and the project's own schema test of a 1.3 export against the 1.3
column definitions as the spec's public text states them (data/focus-1.3-columns.json names the
repository, ref and path of each).

focus-validator 2.x needs Python >= 3.12 (the project runs on 3.11), so it lives in its own virtual
environment, .venv-focus/ (FOCUS_VENV overrides), installed by tests/reports/focus-validator-venv.sh
(`make test`'s setup). Where it is missing the test fails, naming the script; it never skips. The rules
model it ships is FOCUS 1.2's (model 1.2.0.1; 1.3's is downloaded at run time, which --block-download
forbids), so it validates 1.2 exports; `schema_problems` checks 1.3 ones. The schema test reads the
definitions, not reports/focus_columns.py's own tables, so a mistake copied into both is still caught.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import subprocess
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import pytest

from tests.support import needs

ROOT = Path(__file__).resolve().parents[2]
FOCUS_VENV = Path(os.environ.get("FOCUS_VENV", ROOT / ".venv-focus"))
# focus-validator 2.2.1 with model 1.2.0.1: InvoiceId-C-004-C ("MUST be null when the charge is not
# associated either with an invoice or with a pre-generated provisional invoice") and -005-C ("MUST
# NOT be null when the charge is associated with ...") both have an empty Condition, so each is
# checked on every row and one of them always fails; the export's InvoiceId names the period's
# invoice, which satisfies the spec's text and -005-C (docs/reports.md, "Checks").
KNOWN_VALIDATOR_FAILURES = {"InvoiceId-C-004-C"}

DEFINITIONS = json.loads((Path(__file__).parent / "data" / "focus-1.3-columns.json").read_text())
COLUMNS = DEFINITIONS["columns"]
_DECIMAL = re.compile(r"-?\d+(\.\d+)?([eE][-+]?\d+)?")
_DATETIME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z")


@dataclass(frozen=True)
class ValidatorOutcome:
    rules: int  # the rules it ran
    passed: int
    failed: frozenset[str]  # rule ids

    def __str__(self) -> str:
        return f"{self.rules} rules, {self.passed} passed, failed: {sorted(self.failed)}"


def focus_validator() -> Path:
    needs.require("focus_validator")
    program = FOCUS_VENV / "bin" / "focus-validator"
    if not program.exists():
        pytest.fail(
            f"{program} is missing; run `bash tests/reports/focus-validator-venv.sh` (make test does) "
            "— never skipped",
            pytrace=False,
        )
    return program


def validate_12(path: Path, workdir: Path, timeout: float = 240) -> ValidatorOutcome:
    """focus-validator over the FOCUS 1.2 file ``path``, offline, with the rules it ships."""
    program = focus_validator()
    package = subprocess.run(
        [
            str(program.parent / "python"),
            "-c",
            "import focus_validator, os; print(os.path.dirname(focus_validator.__file__))",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    workdir.mkdir(parents=True)
    supported = subprocess.run(
        [str(program), "--supported-versions", "--block-download"],
        cwd=workdir,
        capture_output=True,
        text=True,
        check=False,
    )
    assert "1.2" in supported.stdout, supported.stdout + supported.stderr
    # it loads currency codes from a path relative to the working directory (focus_validator/rules/
    # currency_codes.csv): run it beside a link to the installed package; its bundled rules, offline
    (workdir / "focus_validator").symlink_to(package)
    junit = workdir / "focus.xml"
    proc = subprocess.run(
        [
            str(program),
            *("--data-file", str(path), "--validate-version", "1.2", "--block-download"),
            *("--rule-set-path", str(Path(package) / "rules")),
            *("--output-type", "unittest", "--output-destination", str(junit)),
        ],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    # its exit code is 0 even when rules fail: read the JUnit XML
    assert junit.exists(), proc.stdout[-2000:] + proc.stderr[-2000:]
    root = ET.parse(junit).getroot()
    failed, passed = set(), 0
    for case in root.iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            failed.add(case.get("name", "").split(" :: ")[0])
        elif case.find("skipped") is None:
            passed += 1
    return ValidatorOutcome(int(root.get("tests", "0")), passed, frozenset(failed))


def rows_of(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    reader = csv.DictReader(io.StringIO(path.read_bytes().decode("utf-8"), newline=""))
    rows = list(reader)
    return list(reader.fieldnames or []), rows


def _details_problems(value: str, spec: dict) -> list[str]:
    """The AllocatedMethodDetails object's rules as its definition states them."""
    doc = json.loads(value)
    shape = spec["object"]
    if not isinstance(doc, dict) or not isinstance(doc.get("Elements"), list) or not doc["Elements"]:
        return ["Elements must be a non-empty array"]
    problems = [
        f"root key {k}" for k in doc if k != "Elements" and not k.startswith(shape["custom_key_prefix"])
    ]
    for element in doc["Elements"]:
        for key in shape["element_required"]:
            if not isinstance(element.get(key), int | float):
                problems.append(f"{key} must be numeric")
        if shape["usage_unit_required_with"] in element and not isinstance(element.get("UsageUnit"), str):
            problems.append("UsageUnit must be given with UsageQuantity")
        known = set(shape["element_required"]) | set(shape["element_optional"])
        problems += [f"element key {k}" for k in element if k not in known and not k.startswith("x_")]
    return problems


def schema_problems(path: Path, version: str = "1.3") -> list[str]:
    """Every departure of a 1.3 (or 1.4: less the columns the definitions say 1.4 removed) export from
    the definitions: columns, types, nulls, allowed values, the allocation columns' rules, and
    AllocatedRatio summing to 1 per origin charge."""
    header, rows = rows_of(path)
    columns = {n: s for n, s in COLUMNS.items() if not (version == "1.4" and s.get("removed") == "1.4")}
    problems = [f"header: {c} missing" for c in columns if c not in header]
    problems += [
        f"header: {c} is no FOCUS {version} column"
        for c in header
        if not c.startswith("x_") and c not in columns
    ]
    ratios: dict[tuple, Decimal] = defaultdict(Decimal)
    for number, row in enumerate(rows, start=2):

        def bad(column: str, what: str, row=row, number=number) -> None:
            problems.append(f"row {number}: {column}: {what} (value {row.get(column)!r})")

        for name, spec in columns.items():
            value = row.get(name, "")
            if value == "":
                if not spec["allows_nulls"]:
                    bad(name, "null")
                continue
            kind = spec["data_type"]
            if kind == "Decimal" and not _DECIMAL.fullmatch(value):
                bad(name, "not a decimal")
            elif kind == "Date/Time" and not _DATETIME.fullmatch(value):
                bad(name, "not a UTC date-time")
            elif kind == "JSON" and not isinstance(json.loads(value), dict):
                bad(name, "not a JSON object")
            allowed = spec.get("allowed_values")
            if isinstance(allowed, dict):
                allowed = allowed.get(row.get("ServiceCategory", ""), [])
            if allowed is not None and value not in allowed:
                bad(name, "not an allowed value")
        split = row["AllocatedMethodId"] != ""
        if (row["AllocatedMethodDetails"] != "") != split:
            bad("AllocatedMethodDetails", "null exactly when AllocatedMethodId is")
        if (row["AllocatedResourceName"] != "") != (row["AllocatedResourceId"] != ""):
            bad("AllocatedResourceName", "null exactly when AllocatedResourceId is")
        if not split and (row["AllocatedResourceId"] or row["AllocatedTags"]):
            bad("AllocatedResourceId", "set on a charge not related to a split")
        if (
            split
            and row["x_LineKind"] in ("unallocated", "stranded", "sharing_shortfall", "utilization_shortfall")
            and row["AllocatedResourceId"]
        ):
            bad("AllocatedResourceId", "must be null on the unallocated portion")
        if row["ContractApplied"]:
            bad("ContractApplied", "must be null: no ContractID")
        # listunitprice.md, contractedunitprice.md: "MUST NOT be null when ChargeCategory is "Usage" or
        # "Purchase" and ChargeClass is not "Correction"", and ListUnitPrice "when SkuPriceId is not null"
        usage = row["ChargeCategory"] in ("Usage", "Purchase") and row["ChargeClass"] != "Correction"
        for price in ("ListUnitPrice", "ContractedUnitPrice"):
            if row[price] == "" and (usage or (price == "ListUnitPrice" and row["SkuPriceId"])):
                bad(price, "null on a Usage row or beside a SkuPriceId")
        if row["AllocatedTags"] and set(json.loads(row["AllocatedTags"])) & set(
            json.loads(row["Tags"] or "{}")
        ):
            bad("AllocatedTags", "repeats a tag of Tags")
        if split:
            found = _details_problems(row["AllocatedMethodDetails"], COLUMNS["AllocatedMethodDetails"])
            for problem in found:
                bad("AllocatedMethodDetails", problem)
            details = json.loads(row["AllocatedMethodDetails"], parse_float=Decimal)
            origin = details.get("x_OriginCharge")  # the export names the origin charge of each row
            if not found and origin:
                ratios[
                    (
                        origin["ResourceId"],
                        origin["ChargePeriodStart"],
                        origin.get("SkuPriceId"),
                        origin.get("SubAccountId"),
                    )
                ] += sum(e["AllocatedRatio"] for e in details["Elements"])
    problems += [
        f"origin {key}: AllocatedRatio sums to {total!r}"
        for key, total in ratios.items()
        if total != 1  # "MUST be equal to 1", as the decimals written add up
    ]
    return problems
