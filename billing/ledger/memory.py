"""The in-memory ledger: the whole `Ledger` interface over plain Python containers.

For fast tests (`make check` runs the ledger suite on it with no database) and for one-shot runs
(``memory://``). It keeps the SQL ledger's semantics, which the same suite checks on all three
backends: an hour is replaced whole, price versions are registered once per (book digest, effective
from), sums are exact at the stored scales (quantities to 10⁻⁶, money to 10⁻⁴), and one lock holder
at a time. A lock guards every method, as a database transaction would.
"""

from __future__ import annotations

import copy
import itertools
import json
import threading
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from gpumeter import contract
from gpumeter.billing.ledger import layouts, terms
from gpumeter.billing.ledger.base import (
    Actor,
    AuditRecord,
    HourRecord,
    IngestRunRecord,
    Ledger,
    LedgerSummary,
    LineTotal,
    PriceVersionRecord,
    RefusedGpuHour,
    ReportRunRecord,
    audited_change,
    hour_total,
    refuse_duplicate_lines,
    run_status,
    summarise,
)
from gpumeter.billing.models import GpuHour, Line
from gpumeter.billing.pricing.base import PriceBook, PriceVersion

__all__ = ["MemoryLedger"]

_QUANTITY = Decimal("0.000001")  # the SQL ledger's NUMERIC(18, 6)
_MONEY = Decimal("0.0001")  # the SQL ledger's NUMERIC(20, 4)


def _scaled(value: Decimal, quantum: Decimal) -> Decimal:
    return value.quantize(quantum, rounding=ROUND_HALF_UP)  # SQL's round(): half away from zero


class MemoryLedger(Ledger):
    def __init__(self) -> None:
        self._guard = threading.RLock()
        self._facts: dict[datetime, list[GpuHour]] = {}
        self._lines: dict[datetime, list[tuple[Line, int | None]]] = {}
        self._versions: dict[tuple[str, datetime], PriceVersionRecord] = {}
        self._runs: list[IngestRunRecord] = []
        self._refused: dict[datetime, list[RefusedGpuHour]] = {}
        self._errors: dict[int, str] = {}
        self._teams: dict[str, str] = {}
        self._reports: list[ReportRunRecord] = []
        self._locks: dict[str, tuple[str, datetime]] = {}
        self._audit: list[AuditRecord] = []
        self.actor = Actor()

    def ping(self) -> None:
        return None

    def close(self) -> None:
        return None

    # --- writes ----------------------------------------------------------------------------

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

    def refused_gpu_hours(
        self, start: datetime | None = None, end: datetime | None = None
    ) -> list[RefusedGpuHour]:
        with self._guard:
            return [
                r
                for hour in sorted(self._refused)
                if (start is None or hour >= start) and (end is None or hour < end)
                for r in sorted(self._refused[hour], key=lambda r: (r.cluster or "", r.uuid))
            ]

    def replace_lines(self, hour: datetime, lines: list[Line], book: PriceBook) -> None:
        refuse_duplicate_lines(hour, lines)
        with self._guard:
            self._audit_change(hour, lines, book)
            rows = self._version_rows(book, lines)
            self._lines[hour] = [(line, rows[line.price_version]) for line in lines]

    def _audit_change(self, hour: datetime, lines, book: PriceBook | None) -> None:
        kept = self._lines.get(hour)
        if not kept:
            return
        old = hour_total(line for line, _ in kept)
        change = audited_change(self.actor, book, hour, old, hour_total(lines), datetime.now(UTC))
        if change is not None:
            self._audit.append(replace(change, id=len(self._audit) + 1))

    def audit_records(self, start: datetime | None = None, end: datetime | None = None) -> list[AuditRecord]:
        with self._guard:
            return [
                r for r in self._audit if (start is None or r.hour >= start) and (end is None or r.hour < end)
            ]

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

    def set_namespace_teams(self, teams: dict[str, str], source: str, now: datetime) -> None:
        with self._guard:
            self._teams.update(teams)

    # --- reads -----------------------------------------------------------------------------

    def namespace_teams(self) -> dict[str, str]:
        with self._guard:
            return dict(self._teams)

    def facts(self, hour: datetime) -> list[GpuHour]:
        with self._guard:
            stored = sorted(self._facts.get(hour, []), key=lambda gh: (gh.device.cluster, gh.device.uuid))
            out = copy.deepcopy(stored)
        for gh in out:  # the SQL ledger's read order
            gh.instances.sort(key=lambda m: (m.uuid, m.gpu_instance_id, m.mig_profile))
            gh.allocations.sort(
                key=lambda a: (a.uuid, a.gpu_instance_id, a.namespace, a.pod, a.container, a.resource)
            )
        return out

    def ingested_hours(self, start: datetime, end: datetime) -> set[datetime]:
        with self._guard:
            return {r.hour for r in self._runs if r.status in contract.INGEST_DONE and start <= r.hour < end}

    def _stored_lines(self, start: datetime, end: datetime) -> list[tuple[Line, int | None]]:
        with self._guard:
            return [pair for hour in sorted(self._lines) if start <= hour < end for pair in self._lines[hour]]

    def lines(self, start: datetime, end: datetime) -> list[Line]:
        return [line for line, _ in self._stored_lines(start, end)]

    def line_frame(self, start: datetime, end: datetime, grain: str = "day"):
        """The lines of [start, end) as columns (billing/ledger/frames.py)."""
        from gpumeter.billing.ledger import frames  # pandas: loaded by reports only

        return frames.from_lines(self._stored_lines(start, end), grain)

    def counts(self) -> dict[str, int]:
        with self._guard:
            hours = [gh for ghs in self._facts.values() for gh in ghs]
            return {
                "billing_audit": len(self._audit),
                "ingest_runs": len(self._runs),
                "price_book_versions": len(self._versions),
                "gpu_hours": len(hours),
                "gpu_layouts": len({layouts.canonical(gh)[2] for gh in hours} - {None}),
                "cost_lines": sum(len(lines) for lines in self._lines.values()),
                "cost_line_terms": len(
                    {(terms.of_line(line), row) for lines in self._lines.values() for line, row in lines}
                ),
                # as the SQL ledger groups them: each run of consecutive lines of one GPU, by its terms
                "cost_line_sets": len(
                    {
                        tuple((terms.of_line(line), row) for line, row in run)
                        for lines in self._lines.values()
                        for _, run in itertools.groupby(
                            lines, key=lambda stored: (stored[0].cluster, stored[0].uuid)
                        )
                    }
                ),
                "namespace_teams": len(self._teams),
                "refused_gpu_hours": sum(map(len, self._refused.values())),
            }

    def summary(self) -> LedgerSummary:
        with self._guard:
            every = [line for pairs in self._lines.values() for line, _ in pairs]
            ok = [r.hour for r in self._runs if r.status in contract.INGEST_DONE]
            runs: dict[str, int] = defaultdict(int)
            for run in self._runs:
                runs[run.status] += 1
        rows = [
            (
                x.namespace,
                x.team,
                x.model,
                x.mig_profile,
                x.kind.value,
                x.currency,
                x.quantity,
                x.amount,
                x.cluster,
            )
            for x in every
        ]
        return summarise(rows, max(ok) if ok else None, runs)

    # --- reads for reports --------------------------------------------------------------------

    def line_totals(self, start: datetime, end: datetime, grain: str = "day") -> list[LineTotal]:
        if grain not in ("hour", "day", "range"):
            raise ValueError(f"unknown grain {grain!r}")
        groups: dict[tuple[Any, ...], LineTotal] = {}
        for line, version_id in self._stored_lines(start, end):
            if grain == "hour":
                bucket = line.hour
            elif grain == "day":
                bucket = line.hour.replace(hour=0, minute=0, second=0, microsecond=0)
            else:
                bucket = start
            key = (
                bucket,
                line.kind.value,
                line.namespace,
                line.team,
                line.pod,
                line.container,
                line.uuid,
                line.gpu_instance_id,
                line.mig_profile,
                line.model,
                line.currency,
                version_id,
                line.held_unit.value,
                line.cluster,
            )
            quantity = _scaled(line.quantity, _QUANTITY)
            amount = None if line.amount is None else _scaled(line.amount, _MONEY)
            utilization, efficiency = line.utilization, line.efficiency
            this = LineTotal(
                bucket=bucket,
                first_hour=line.hour,
                last_hour=line.hour,
                kind=line.kind.value,
                namespace=line.namespace,
                team=line.team,
                pod=line.pod,
                container=line.container,
                uuid=line.uuid,
                gpu_instance_id=line.gpu_instance_id,
                mig_profile=line.mig_profile,
                model=line.model,
                currency=line.currency,
                price_version_id=version_id,
                lines=1,
                quantity=quantity,
                amount=amount,
                utilization_weighted=0.0 if utilization is None else float(utilization * line.quantity),
                utilization_quantity=Decimal(0) if utilization is None else quantity,
                efficiency_weighted=0.0 if efficiency is None else float(efficiency * line.quantity),
                efficiency_quantity=Decimal(0) if efficiency is None else quantity,
                held=_scaled(line.held, _QUANTITY),
                held_unit=line.held_unit.value,
                cluster=line.cluster,
            )
            seen = groups.get(key)
            if seen is None:
                groups[key] = this
                continue
            groups[key] = replace(
                seen,
                first_hour=min(seen.first_hour, this.first_hour),
                last_hour=max(seen.last_hour, this.last_hour),
                lines=seen.lines + 1,
                quantity=seen.quantity + this.quantity,
                amount=this.amount if seen.amount is None else seen.amount + (this.amount or Decimal(0)),
                utilization_weighted=seen.utilization_weighted + this.utilization_weighted,
                utilization_quantity=seen.utilization_quantity + this.utilization_quantity,
                efficiency_weighted=seen.efficiency_weighted + this.efficiency_weighted,
                efficiency_quantity=seen.efficiency_quantity + this.efficiency_quantity,
                held=seen.held + this.held,
            )
        return list(groups.values())

    def price_versions(self, ids: set[int]) -> dict[int, PriceVersionRecord]:
        with self._guard:
            return {v.id: v for v in self._versions.values() if v.id in ids}

    def ingest_runs(self, start: datetime, end: datetime) -> list[IngestRunRecord]:
        with self._guard:
            chosen = [r for r in self._runs if start <= r.hour < end]
        return sorted(chosen, key=lambda r: (r.hour, r.id))

    def record_report_run(self, run: ReportRunRecord) -> int:
        with self._guard:
            stored = replace(run, id=len(self._reports) + 1)
            self._reports.append(copy.deepcopy(stored))
            return stored.id

    def report_runs(self, start: datetime | None = None) -> list[ReportRunRecord]:
        with self._guard:
            return [copy.deepcopy(r) for r in self._reports if start is None or r.period_start == start]

    # --- lock ----------------------------------------------------------------------------------

    def acquire_lock(self, name: str, holder: str, now: datetime, ttl_seconds: int) -> bool:
        with self._guard:
            held = self._locks.get(name)
            if held is not None and held[0] != holder and held[1] >= now:
                return False
            self._locks[name] = (holder, now + timedelta(seconds=ttl_seconds))
            return True

    def release_lock(self, name: str, holder: str) -> None:
        with self._guard:
            if self._locks.get(name, ("", None))[0] == holder:
                del self._locks[name]
