"""Priced record → ledger: the hour written in one transaction, or recorded empty, refused or failed,
and counted in the ingest's result."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from gpumeter import contract
from gpumeter.billing.ingest.config import IngestResult, failures
from gpumeter.billing.ledger.base import HourRecord, Ledger, LedgerError, missing_clusters_text
from gpumeter.billing.models import (
    HOUR,
)
from gpumeter.billing.refusals import refusal_text

log = logging.getLogger(__name__)


def _write_hour(ledger: Ledger, record: HourRecord, kube_teams, source: str, started: datetime) -> None:
    ledger.write_hour(record, source=source, started_at=started)
    ledger.set_namespace_teams(kube_teams, "kube", started)


def _write_priced(
    ledger: Ledger,
    record: HourRecord,
    kube_teams,
    source: str,
    started: datetime,
    unpriced: int,
    result,
    billed_before: set[str] | None = None,
) -> None:
    """Write the hour, unless the ledger holds it billed already and the write would take away what
    was billed: a refused reading, or a cluster billed before (``billed_before``: the clusters of its
    stored GPU-hours, or None for a hour whose writer allows dropping them) with no series now. The
    attempt is then recorded failed, and the hour stays as billed."""
    dropped = sorted(billed_before - _clusters_of(record)) if billed_before else []
    if dropped:
        reason = (
            f"cluster(s) {', '.join(dropped)}: billed in this hour before, but the store has no GPU or "
            "allocation series of them now (their retention ended, or the store answered without them); "
            "the hour as billed before is kept (--drop-missing-clusters replaces it)"
        )
    elif record.refused and ledger.ingested_hours(record.hour, record.hour + HOUR):
        reason = refusal_text(record.refused) + "; the hour as billed before is kept"
    else:
        _write_hour(ledger, record, kube_teams, source, started)
        _count_written(record, unpriced, result)
        return
    failures.error("ingest of %s: %s", record.hour.isoformat(), reason)
    ledger.record_failure(record.hour, reason, source=source, started_at=started)
    result.refused.append((record.hour, reason))


def _clusters_of(record: HourRecord) -> set[str]:
    """The clusters the hour's answers had GPU-hours of, refused ones included."""
    return {gh.device.cluster for gh in record.gpu_hours} | {cluster for cluster, _, _ in record.refused}


def _count_written(record: HourRecord, unpriced: int, result: IngestResult) -> None:
    if record.missing_clusters:
        reason = missing_clusters_text(record.missing_clusters) + "; catch-up retries the hour"
        failures.error("ingest of %s: %s", record.hour.isoformat(), reason)
        result.refused.append((record.hour, reason))
    if record.refused:
        reason = refusal_text(record.refused) + "; the rest of the hour is billed and catch-up retries it"
        failures.error("ingest of %s: %s", record.hour.isoformat(), reason)
        result.refused.append((record.hour, reason))
    result.ingested.append(record.hour)
    result.unpriced_gpu_hours += unpriced
    if record.warnings:
        result.suspect.append((record.hour, "; ".join(record.warnings)))


def _record_empty(
    ledger: Ledger, hour: datetime, source: str, started: datetime, result: IngestResult
) -> None:
    reason = "Prometheus had no GPU or allocation series for this hour; it will be retried"
    ledger.record_run(hour, contract.INGEST_EMPTY, reason, source=source, started_at=started)
    result.empty.append(hour)


def _write_failed(
    ledger: Ledger, hour: datetime, exc: LedgerError, source: str, started: datetime, result
) -> None:
    """The ledger refused the hour (or lost its database past the retries): nothing of it was
    committed. Recorded as a failed run when the ledger still answers; the range stops here."""
    failures.error("ingest of %s failed: %s", hour.isoformat(), exc)
    try:
        ledger.record_failure(hour, str(exc), source=source, started_at=started)
    except LedgerError as again:
        log.error("the failed run of %s could not be recorded either: %s", hour.isoformat(), again)
    result.failed.append((hour, str(exc)))
    result.halted = True


def _refuse(ledger: Ledger, hour: datetime, reason: str, source: str, started: datetime, result) -> None:
    failures.error("ingest of %s refused: %s", hour.isoformat(), reason)
    ledger.record_failure(hour, reason, source=source, started_at=started)
    result.failed.append((hour, reason))


def _halted(ledger: Ledger, hour: datetime, reason: str, source: str) -> IngestResult:
    failures.error("ingest of %s failed: %s", hour.isoformat(), reason)
    ledger.record_failure(hour, reason, source=source, started_at=datetime.now(UTC))
    return IngestResult(failed=[(hour, reason)], halted=True)
