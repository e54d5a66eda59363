"""Prometheus alerting and recording rules for gpumeter, with their runbook and promtool tests.

The rule files (``gpumeter-alerts.yaml``, ``gpumeter-rules.yaml``) are the source; the Kubernetes
PrometheusRule in ``deploy/kubernetes/base/prometheusrule.yaml`` is generated from them by
``gpumeter alerts prometheusrule`` (``alerts.prometheusrule``).
"""

from __future__ import annotations

from gpumeter.alerts.files import ALERTS_FILE, RULE_FILES, RULES_FILE, RUNBOOK_FILE, RUNBOOK_URL

__all__ = ["ALERTS_FILE", "RULES_FILE", "RULE_FILES", "RUNBOOK_FILE", "RUNBOOK_URL"]
