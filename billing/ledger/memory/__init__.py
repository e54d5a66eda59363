"""The in-memory ledger: the whole `Ledger` interface over plain Python containers.

For fast tests (`make check` runs the ledger suite on it with no database) and for one-shot runs
(``memory://``). It keeps the SQL ledger's semantics, which the same suite checks on all three
backends: an hour is replaced whole, price versions are registered once per (book digest, effective
from), sums are exact at the stored scales (quantities to 10⁻⁶, money to 10⁻⁴), and one lock holder
at a time. A lock guards every method, as a database transaction would.
"""

from __future__ import annotations

from gpumeter.billing.ledger.base import Ledger
from gpumeter.billing.ledger.memory.reads import MemoryReads
from gpumeter.billing.ledger.memory.service import MemoryService
from gpumeter.billing.ledger.memory.writes import MemoryWrites

__all__ = ["MemoryLedger"]


class MemoryLedger(MemoryWrites, MemoryReads, MemoryService, Ledger):
    """The whole ledger in memory: each part's methods from its own module (`writes`, `reads`,
    `service`), over the containers of `store`."""
