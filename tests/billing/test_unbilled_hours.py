"""`gpumeter_billing_unbilled_hours{status}`: the closed hours of the catch-up window that no ingest has
billed, by their latest run's status, as /metrics renders them from the ledger (docs/billing.md §7).
A failed hour left unbilled past the window was visible nowhere: `GpumeterBillingIngestStale` reads the
newest hour, and catch-up stopped retrying it without a word.

By hand: a window of 6 hours closed at 06:00 (now 06:10, the settle 2 minutes). 00:00 ok; 01:00 failed
then ok (billed); 02:00 failed; 03:00 ok then failed (billed: the failed attempt did not unbill it);
04:00 empty; 05:00 never run. Unbilled: failed 1 (02:00), empty 1, none 1, partial 0."""

from __future__ import annotations

from datetime import timedelta

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpumeter import contract
from gpumeter.billing.metrics import BillingCollector
from tests.billing.factories import HOUR0

RUNS = [
    (0, contract.INGEST_OK),
    (1, contract.INGEST_FAILED),
    (1, contract.INGEST_OK),
    (2, contract.INGEST_FAILED),
    (3, contract.INGEST_OK),
    (3, contract.INGEST_FAILED),
    (4, contract.INGEST_EMPTY),
]


def test_the_windows_unbilled_hours_by_latest_status(ledger):
    for hour, status in RUNS:
        ledger.record_run(HOUR0 + timedelta(hours=hour), status, "test")
    now = HOUR0 + timedelta(hours=6, minutes=10)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BillingCollector(ledger, lambda: now, catchup_hours=6))
    (family,) = [
        f
        for f in text_string_to_metric_families(generate_latest(registry).decode())
        if f.name == contract.BILLING_UNBILLED_HOURS.name
    ]
    assert {s.labels["status"]: s.value for s in family.samples} == {
        "failed": 1.0,
        "partial": 0.0,
        "empty": 1.0,
        "none": 1.0,
    }
