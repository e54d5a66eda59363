"""What an ingest is told (`IngestConfig`) and what it reports (`IngestResult`), and the logger
that names each hour it could not bill."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from gpumeter import contract
from gpumeter.billing.models import hour_floor

# Hours that failed or were refused: the service's log keeps them; `billing ingest` states each itself
# in one line on stderr and silences this logger (FAILURES_LOGGER), so none is said twice.
FAILURES_LOGGER = "gpumeter.billing.ingest.failures"
failures = logging.getLogger(FAILURES_LOGGER)


@dataclass
class IngestConfig:
    # seconds per sample (docs/billing.md §2.1); 0 = derived from the data, per exporter and hour.
    # Given explicitly, an hour whose samples show another interval is refused, not billed.
    scrape_interval: float = 0.0
    gap_grace_intervals: int = 2
    catchup_hours: int = 168
    settle: timedelta = timedelta(minutes=2)  # an hour is closed this long after its end
    teams: dict[str, str] = field(default_factory=dict)  # from the team map file; wins over kube
    # hours of the first run of range queries, and the least of any; then series x hours a run's
    # answers may hold: later runs of a smaller fleet are longer (`_run_hours`, docs/billing.md §6)
    chunk_hours: int = 24
    run_points: int = 5_000_000
    workers: int = 1  # processes ingesting runs of hours side by side (docs/billing.md §6)
    # seconds an ingest of a range of hours may take in all (0: no deadline). Past it no query is
    # sent: the hour in flight is recorded failed, and later hours are left to the next run. Well
    # inside the hour: the hourly job starts at :05 and is done by :25 whatever Prometheus does
    deadline: float = 1200.0
    # the label a global store's series name their cluster by (docs/billing.md §2.3); a store whose
    # series carry none is one cluster, billed as before
    cluster_label: str = contract.CLUSTER_LABEL
    # re-ingest an hour even where a cluster billed in it before has no series now, its lines going
    # (a cluster's label renamed); by default such an hour is kept as billed (docs/billing.md §2.3)
    drop_missing_clusters: bool = False

    def catchup_window(self, now: datetime) -> tuple[datetime, datetime]:
        """[start, end) of the closed hours catch-up looks back over at ``now``: the open hour and
        the future are not billable yet (``settle``), and it reaches ``catchup_hours`` back."""
        end = hour_floor(now - self.settle)
        return end - timedelta(hours=self.catchup_hours), end


@dataclass
class IngestResult:
    ingested: list[datetime] = field(default_factory=list)  # written (suspect ones included)
    failed: list[tuple[datetime, str]] = field(default_factory=list)
    unpriced_gpu_hours: int = 0
    suspect: list[tuple[datetime, str]] = field(default_factory=list)  # written, but doubtful
    empty: list[datetime] = field(default_factory=list)  # nothing in Prometheus: not written, retried
    stopped: bool = False  # asked to stop (`stopping`): the hours after the last one written are left
    # hours written without some GPU-hours, or kept as billed before, for a refused reading: (hour, why)
    refused: list[tuple[datetime, str]] = field(default_factory=list)
    halted: bool = False  # Prometheus unreachable or the ledger lost: the hours after `failed` were left
