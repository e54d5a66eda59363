"""What ingest writes, in memory: an hour replaced whole, a re-price's lines, the runs and the audit
of billed hours changed."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Sequence
from dataclasses import replace
from datetime import UTC, datetime

from gpumeter import contract
from gpumeter.billing.ledger.base import (
    Actor,
    HourRecord,
    IngestLedger,
    IngestRunRecord,
    LineGroups,
    PriceVersionRecord,
    RefusedGpuHour,
    audited_changes,
    hour_totals,
    refuse_duplicate_lines,
    run_status,
)
from gpumeter.billing.ledger.memory.store import MemoryStore
from gpumeter.billing.models import Line
from gpumeter.billing.pricing.base import PriceBook, PriceVersion


class MemoryWrites(MemoryStore, IngestLedger):
    """`IngestLedger` in memory."""

    def __init__(self) -> None:
        super().__init__()
        self.actor = Actor()

    def _version_rows(self, book: PriceBook | None, lines: Iterable[Line]) -> dict[str | None, int | None]:
        """The stored id of each price version the lines name (registered once, body and all)."""
        rows: dict[str | None, int | None] = {None: None}
        for name in {line.price_version for line in lines if line.price_version is not None}:
            if book is None:
                raise ValueError("lines name a price version but no price book came with them")
            rows[name] = self._version_row(book, book.version(name))
        return rows

    def _version_row(self, book: PriceBook, version: PriceVersion) -> int:
        key = (book.digest or "inline", version.effective_from)
        if key not in self._versions:
            self._versions[key] = PriceVersionRecord(
                id=len(self._versions) + 1,
                digest=key[0],
                path=book.path,
                currency=book.currency,
                effective_from=version.effective_from,
                effective_to=version.effective_to,
                source=version.source,
                body=json.loads(book.version_body(version)),
            )
        return self._versions[key].id

    def _run(
        self, hour: datetime, status: str, source: str, started_at: datetime | None, error: str | None
    ) -> None:
        now = datetime.now(UTC)
        run = IngestRunRecord(len(self._runs) + 1, hour, started_at or now, now, status, source)
        self._runs.append(run)
        if error is not None:
            self._errors[run.id] = error[:4000]

    def write_hour(self, record: HourRecord, *, source: str = "", started_at: datetime | None = None) -> None:
        refuse_duplicate_lines(record.hour, record.lines)  # the SQL ledger's unique (hour, line_key)
        with self._guard:
            self._audit_change(record.hour, record.lines, record.book)
            rows = self._version_rows(record.book, record.lines)
            self._facts[record.hour] = copy.deepcopy(record.gpu_hours)
            self._lines[record.hour] = [(line, rows[line.price_version]) for line in record.lines]
            status, error = run_status(record)
            self._run(record.hour, status, source, started_at, error)
            now = datetime.now(UTC)
            self._refused[record.hour] = [
                RefusedGpuHour(record.hour, c or None, u, why, now) for c, u, why in record.refused
            ]

    def replace_lines(
        self, hour: datetime, lines: Sequence[Line], book: PriceBook, line_groups: LineGroups = ()
    ) -> None:
        refuse_duplicate_lines(hour, lines)
        with self._guard:
            self._audit_change(hour, lines, book)
            rows = self._version_rows(book, lines)
            self._lines[hour] = [(line, rows[line.price_version]) for line in lines]

    def _audit_change(self, hour: datetime, lines, book: PriceBook | None) -> None:
        kept = self._lines.get(hour)
        if not kept:
            return
        old = hour_totals(line for line, _ in kept)
        for change in audited_changes(self.actor, book, hour, old, hour_totals(lines), datetime.now(UTC)):
            self._audit.append(replace(change, id=len(self._audit) + 1))

    def record_run(
        self,
        hour: datetime,
        status: str,
        reason: str,
        *,
        source: str = "",
        started_at: datetime | None = None,
    ) -> None:
        with self._guard:
            self._run(hour, status, source, started_at, reason)

    def ingested_hours(self, start: datetime, end: datetime) -> set[datetime]:
        with self._guard:
            return {r.hour for r in self._runs if r.status in contract.INGEST_DONE and start <= r.hour < end}

    def billed_clusters(self, start: datetime, end: datetime) -> dict[datetime, set[str]]:
        with self._guard:
            return {
                hour: {gh.device.cluster for gh in facts}
                for hour, facts in self._facts.items()
                if facts and start <= hour < end
            }
