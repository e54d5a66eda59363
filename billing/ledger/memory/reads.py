"""What reports read, in memory: facts, lines and their sums at the SQL ledger's stored scales, the
price versions and runs behind them, audit records and refused GPU-hours."""

from __future__ import annotations

import copy
import itertools
from collections import defaultdict
from dataclasses import replace
from datetime import datetime
from decimal import Decimal
from typing import Any

from gpumeter import contract
from gpumeter.billing.ledger import layouts, terms
from gpumeter.billing.ledger.base import (
    AuditRecord,
    IngestRunRecord,
    LedgerSummary,
    LineTotal,
    PriceVersionRecord,
    RefusedGpuHour,
    ReportLedger,
    summarise,
)
from gpumeter.billing.ledger.memory.store import _MONEY, _QUANTITY, MemoryStore, _scaled
from gpumeter.billing.models import GpuHour, Line


class MemoryReads(MemoryStore, ReportLedger):
    """`ReportLedger` in memory: sums at the SQL ledger's stored scales."""

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

    def audit_records(self, start: datetime | None = None, end: datetime | None = None) -> list[AuditRecord]:
        with self._guard:
            return [
                r for r in self._audit if (start is None or r.hour >= start) and (end is None or r.hour < end)
            ]

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

    def _stored_lines(self, start: datetime, end: datetime) -> list[tuple[Line, int | None]]:
        with self._guard:
            return [pair for hour in sorted(self._lines) if start <= hour < end for pair in self._lines[hour]]

    def lines(self, start: datetime, end: datetime) -> list[Line]:
        return [line for line, _ in self._stored_lines(start, end)]

    def line_frame(self, start: datetime, end: datetime, grain: str = "day"):
        """The lines of [start, end) as columns (billing/ledger/frames.py)."""
        from gpumeter.billing.ledger import frames  # pandas: loaded by reports only

        if grain == "range":  # a row a term, as the SQL ledger's
            return frames.from_totals(self.line_totals(start, end, grain))
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
