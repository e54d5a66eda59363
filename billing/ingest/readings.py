"""A run's ratio readings (utilizations, process SM shares) as the ledger's exact decimals, made a
whole hour's column at a time (docs/billing.md §2.2): `RatioColumns`.

Each reading becomes the decimal of its shortest text rounded half to even at the ledger's 10⁻⁹
(`labels._ratio`: 0.77 µs a value, ~9 values a GPU-hour, a fifth of a 1,000-GPU month's ingest).
Here the run's series are one float matrix, scaled and rounded by numpy once, and an hour's
integers become decimals in one pass (0.21 µs a value); a series several facts read (a MIG
instance's utilization and its holders', a GPU's and its time-sliced replicas') is converted once.
Readings whose scaled value lies within 10⁻⁶ of a half (where the float's rounding and the shortest
text's could part), and anything outside (0, 2], go through `_ratio` itself, so every decimal is
the one `_ratio` gives (a hypothesis test holds them to it)."""

from __future__ import annotations

from decimal import Decimal

import numpy as np

from gpumeter.billing.ingest.columns import Values
from gpumeter.billing.ingest.labels import _RATIO, _ratio

# Within this of a half, the scaled float may round otherwise than the shortest text's exact
# value: the two differ by at most ~3.4e-7 for readings up to 2 (half an ulp of the reading, times
# 10⁹, plus half an ulp of the product), so a margin of 10⁻⁶ leaves no case undecided.
_HALF_MARGIN = 1e-6
_FAST_MOST = 2.0  # readings above this go through `_ratio` (ratios lie in [0, 1]; the product stays exact)
_SCALE = 1e9  # 1 / _RATIO


class RatioColumns:
    """The ratio series of a run, each a row of a float matrix, converted an hour at a time.

    ``row(values)`` names a series' row (the same list given twice is one row); after `freeze`,
    ``at(index)`` is the hour's decimals by row, None where the series has no sample, made once per
    hour however many facts read them."""

    def __init__(self, hours: int):
        self.hours = hours
        self._rows: dict[int, int] = {}  # id(values) -> row: a run's value lists live as long as it
        self._series: list[Values] = []
        self._index = -1
        self._column: list[Decimal | None] = []

    def row(self, values: Values | None) -> int | None:
        if values is None:
            return None
        row = self._rows.get(id(values))
        if row is None:
            row = self._rows[id(values)] = len(self._series)
            self._series.append(values)
        return row

    def freeze(self) -> None:
        """Scale and round the rows (called once every row is named), in place: a run holds up to
        `IngestConfig.run_points` values, so no more than the integers and a mask are kept."""
        floats = np.empty((len(self._series), self.hours), dtype=np.float64)
        nan = float("nan")
        for row, values in enumerate(self._series):
            floats[row] = [nan if v is None else v for v in values]
        with np.errstate(invalid="ignore"):
            # +0.0 is made fast; NaN (no sample), -0.0, negatives and readings past 2 go through `_ratio`
            fast = ((floats > 0.0) & (floats <= _FAST_MOST)) | ((floats == 0.0) & ~np.signbit(floats))
            scaled = np.multiply(floats, _SCALE, out=floats)
            fast &= np.abs(scaled - np.floor(scaled) - 0.5) > _HALF_MARGIN
            rounded = np.rint(scaled, out=scaled)
            rounded[~fast] = 0.0
        self._ints = rounded.astype(np.int64)
        self._slow = ~fast

    def at(self, index: int) -> list[Decimal | None]:
        """Every row's decimal at the run's ``index``-th hour (kept until another hour is asked for)."""
        if index != self._index:
            scale = _RATIO.__rmul__
            column = list(map(scale, map(Decimal, self._ints[:, index].tolist())))
            for row in np.flatnonzero(self._slow[:, index]).tolist():
                value = self._series[row][index]
                column[row] = None if value is None else _ratio(value)
            self._index, self._column = index, column
        return self._column
