"""The metric contract: every series that crosses a process boundary, declared once.

The exporter serves its series to Prometheus, where the alert rules, the dashboards and billing's
ingest read them; billing serves its own series to Prometheus for the cost dashboard and its alert;
billing also reads one kube-state-metrics series. Each of them is declared here (name as Prometheus
stores it, type, full label set in exposition order, unit, help) with the label names consumers read,
and the PromQL billing's ingest runs is built from these declarations (docs/billing.md §6).

Producers and consumers import from here: ``exporter/catalog.py`` (which adds the NVML source and the
dcgm-exporter mapping), the history generator, billing's ingest and ``/metrics``, and the alert and
dashboard lint tests. ``tests/test_contract_parity.py`` checks that the live exporter and the history
generator agree on the series billing consumes. This module imports nothing from the parts.

The series of exporters gpumeter does not own (kube-state-metrics' demand and node labels, Volcano's
queues, dcgm-exporter's fields) are declared beside it, in ``gpumeter/third_party.py``.
"""

from __future__ import annotations

from gpumeter.contract.billing import *  # noqa: F403
from gpumeter.contract.billing import BILLING_SERIES, KUBE_NAMESPACE_LABELS
from gpumeter.contract.exporter import *  # noqa: F403
from gpumeter.contract.exporter import CRITICAL_XIDS, EXPORTER_SERIES
from gpumeter.contract.labels import *  # noqa: F403
from gpumeter.contract.labels import CLUSTER_LABEL, MetricType, Producer, Series

__all__ = [
    "BILLING_SERIES",
    "CLUSTER_LABEL",
    "CONTRACT",
    "CRITICAL_XIDS",
    "EXPORTER_SERIES",
    "MetricType",
    "Producer",
    "Series",
    "series",
]

# gpumeter's own series and what billing reads; the other exporters' series are gpumeter/third_party.py's
# (its EVERY_SERIES is both).
CONTRACT: tuple[Series, ...] = (
    *EXPORTER_SERIES,
    KUBE_NAMESPACE_LABELS,
    *BILLING_SERIES,
)
_BY_NAME = {s.name: s for s in CONTRACT}
if len(_BY_NAME) != len(CONTRACT):
    raise ValueError("contract: a series name is declared twice")


def series(name: str) -> Series:
    """The declared series named ``name`` (as Prometheus stores it); KeyError when there is none."""
    return _BY_NAME[name]
