from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpumeter.alerts import ALERTS_FILE, RULES_FILE

ROOT = Path(__file__).resolve().parents[2]
TESTS_DIR = ROOT / "alerts" / "tests"


def _rules(path: Path, kind: str) -> list[dict]:
    return [
        rule
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
        if kind in rule
    ]


@pytest.fixture(scope="session")
def alert_rules() -> list[dict]:
    return _rules(ALERTS_FILE, "alert") + _rules(RULES_FILE, "alert")


@pytest.fixture(scope="session")
def recording_rules() -> list[dict]:
    return _rules(RULES_FILE, "record") + _rules(ALERTS_FILE, "record")


@pytest.fixture(scope="session")
def unit_tests() -> list[dict]:
    """Every test case of every promtool test file."""
    cases = []
    for path in sorted(TESTS_DIR.glob("*.yaml")):
        cases.extend(yaml.safe_load(path.read_text())["tests"])
    return cases
