"""What the service keeps, in memory: the namespace → team map, the report runs and the lock."""

from __future__ import annotations

import copy
from dataclasses import replace
from datetime import datetime, timedelta

from gpumeter.billing.ledger.base import ReportRunRecord, ServiceLedger
from gpumeter.billing.ledger.memory.store import MemoryStore


class MemoryService(MemoryStore, ServiceLedger):
    """`ServiceLedger` in memory."""

    def set_namespace_teams(self, teams: dict[str, str], source: str, now: datetime) -> None:
        with self._guard:
            self._teams.update(teams)

    def namespace_teams(self) -> dict[str, str]:
        with self._guard:
            return dict(self._teams)

    def record_report_run(self, run: ReportRunRecord) -> int:
        with self._guard:
            stored = replace(run, id=len(self._reports) + 1)
            self._reports.append(copy.deepcopy(stored))
            return stored.id

    def report_runs(self, start: datetime | None = None) -> list[ReportRunRecord]:
        with self._guard:
            return [copy.deepcopy(r) for r in self._reports if start is None or r.period_start == start]

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
