"""The ledger interface (implementations: `billing.ledger.sqlalchemy`)."""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from billing.models import GpuHour, Line
from billing.pricing.base import PriceBook


class LockNotAcquired(RuntimeError):
    """Another replica holds the lock."""


@dataclass(frozen=True)
class HourRecord:
    """What one ingest wrote for one hour: facts, priced lines and the book that priced them."""

    hour: datetime
    gpu_hours: list[GpuHour]
    lines: list[Line]
    book: PriceBook | None


@dataclass(frozen=True)
class LedgerSummary:
    """Aggregates for /metrics."""

    cost: list[tuple[dict[str, str], Decimal]]
    gpu_hours: list[tuple[dict[str, str], Decimal]]
    unpriced: list[tuple[dict[str, str], Decimal]]
    last_success: datetime | None  # end of the newest hour ingested successfully
    runs: dict[str, int]


class Ledger(abc.ABC):
    @abc.abstractmethod
    def write_hour(self, record: HourRecord, *, source: str = "", started_at: datetime | None = None) -> None:
        """Replace everything of ``record.hour`` (facts, lines) and record a successful run, atomically."""

    @abc.abstractmethod
    def replace_lines(self, hour: datetime, lines: list[Line], book: PriceBook) -> None:
        """Re-price: replace the hour's lines only, in one transaction."""

    @abc.abstractmethod
    def record_failure(self, hour: datetime, error: str, *, source: str = "", started_at=None) -> None:
        """Record a failed ingest run (its own transaction; no facts or lines)."""

    @abc.abstractmethod
    def facts(self, hour: datetime) -> list[GpuHour]:
        """The stored facts of one hour, as domain objects."""

    @abc.abstractmethod
    def ingested_hours(self, start: datetime, end: datetime) -> set[datetime]:
        """Hours in [start, end) with a successful ingest run."""

    @abc.abstractmethod
    def lines(self, start: datetime, end: datetime) -> list[Line]:
        """Priced lines of the hours in [start, end)."""

    @abc.abstractmethod
    def set_namespace_teams(self, teams: dict[str, str], source: str, now: datetime) -> None: ...

    @abc.abstractmethod
    def namespace_teams(self) -> dict[str, str]: ...

    @abc.abstractmethod
    def acquire_lock(self, name: str, holder: str, now: datetime, ttl_seconds: int) -> bool: ...

    @abc.abstractmethod
    def release_lock(self, name: str, holder: str) -> None: ...

    @abc.abstractmethod
    def summary(self) -> LedgerSummary: ...

    @contextlib.contextmanager
    def lock(self, name: str, holder: str, now: datetime, ttl_seconds: int = 1800) -> Iterator[None]:
        if not self.acquire_lock(name, holder, now, ttl_seconds):
            raise LockNotAcquired(name)
        try:
            yield
        finally:
            self.release_lock(name, holder)
