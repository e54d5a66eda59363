"""Where the alerting part's files are: the rule files (the source of truth) and the runbook."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

__all__ = ["ALERTS_FILE", "RULES_FILE", "RULE_FILES", "RUNBOOK_FILE", "RUNBOOK_URL"]

_HERE = Path(str(files("gpumeter.alerts")))  # package data: the rule files and the runbook

ALERTS_FILE = _HERE / "gpumeter-alerts.yaml"
RULES_FILE = _HERE / "gpumeter-rules.yaml"
# Recording rules first: GpuMissing reads hostname:nvidia_gpu_info:count.
RULE_FILES: tuple[Path, ...] = (RULES_FILE, ALERTS_FILE)
RUNBOOK_FILE = _HERE / "runbook.md"
# Every alert's runbook_url is this plus its lowercased name.
RUNBOOK_URL = "https://github.com/gpumeter/gpumeter/blob/main/alerts/runbook.md#"
