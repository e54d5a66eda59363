"""The in-memory ledger's state, which each part of it (writes, reads, service) works on, under one
lock that guards every method, as a database transaction would."""

from __future__ import annotations

import threading
from datetime import datetime
from decimal import ROUND_HALF_UP, Decimal

from gpumeter.billing.ledger.base import (
    AuditRecord,
    IngestRunRecord,
    LedgerStore,
    PriceVersionRecord,
    RefusedGpuHour,
    ReportRunRecord,
)
from gpumeter.billing.models import GpuHour, Line

_QUANTITY = Decimal("0.000001")  # the SQL ledger's NUMERIC(18, 6)
_MONEY = Decimal("0.0001")  # the SQL ledger's NUMERIC(20, 4)


def _scaled(value: Decimal, quantum: Decimal) -> Decimal:
    return value.quantize(quantum, rounding=ROUND_HALF_UP)  # SQL's round(): half away from zero


class MemoryStore(LedgerStore):
    """Every record the ledger keeps, in plain containers."""

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

    def ping(self) -> None:
        return None

    def close(self) -> None:
        return None
