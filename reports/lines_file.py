"""The report's lines CSV: one row per charge (the ledger's lines summed per grain bucket), written
from the charges' columns (`reports.grouped.Charges`).

Apart from the rest of the rendering because two processes write it: the report's, and the sums'
worker (`reports.sums_worker`), which holds the same lines and writes this file from them while the
report's process writes FOCUS. What the file says beyond the charges is `LinesSpec`, small enough to
hand over.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from typing import TYPE_CHECKING

from gpumeter.billing.models import LineKind
from gpumeter.reports import csvfile
from gpumeter.reports.period import HOUR, utc_text

if TYPE_CHECKING:
    import pandas as pd

    from gpumeter.billing.ledger.base import LineTotal
    from gpumeter.reports.model import Report

HEADER = [
    "bucket",
    "charge_period_start",
    "charge_period_end",
    "line",
    "team",
    "namespace",
    "pod",
    "container",
    "gpu_model",
    "mig_profile",
    "gpu_uuid",
    "gpu_instance_id",
    "gpu_hours",
    "slice_hours",
    "cost",
    "currency",
    "mean_utilization",
    "efficiency",
    "price_book_version",
    "hourly_lines",
]


@dataclass(frozen=True)
class LinesSpec:
    """What the lines CSV states beyond the charges: each price-book version's label by id, whether
    the store labels clusters (then a cluster column, else a single cluster's file is as before
    clusters), the currency's minor unit, and whether formula-leading cells are kept."""

    labels: dict[int, str]
    clustered: bool
    exponent: int
    keep_formulas: bool = False

    @classmethod
    def of(cls, report: Report, *, keep_formulas: bool = False) -> LinesSpec:
        from gpumeter.reports.model import version_label

        labels = {v.id: version_label(v) for v in report.price_versions}
        return cls(labels, report.has_clusters, report.exponent, keep_formulas)


def parts(charges: Sequence[LineTotal], spec: LinesSpec) -> Iterator[str]:
    """The lines CSV in parts, made a chunk of charges at a time."""
    from gpumeter.reports.grouped import Charges

    if not isinstance(charges, Charges):
        raise TypeError(
            "lines CSV: the report's charges are read from their columns (reports.grouped.Charges)"
        )
    return parts_of(charges.chunks(), spec)


def parts_of(chunks: Iterable[pd.DataFrame], spec: LinesSpec) -> Iterator[str]:
    """The lines CSV in parts from the charges' columns (`grouped.Charges`' frame) given as chunks of
    rows in order, of any length: the same file however they are cut."""
    header = [*HEADER[:4], "cluster", *HEADER[4:]] if spec.clustered else HEADER
    return csvfile.column_parts(header, _columns(chunks, spec), keep_formulas=spec.keep_formulas)


def _columns(chunks: Iterable[pd.DataFrame], spec: LinesSpec) -> Iterator[list[list]]:
    """The CSV's columns, a chunk of charges at a time: no `LineTotal` or datetime per charge (a month
    of 10,000 GPUs is ~1 million), each distinct time written once. What each charge's figures say,
    as the report writes a `Usage`'s (`reports.render`): quantities are integers of 10⁻⁶ GPU-hours,
    amounts of 10⁻⁴ (billing/ledger/frames.py), slice-hours the charges' own column
    (`grouped._with_figures`, `Report.slices`), means from the exact sums as FOCUS writes them."""
    import pandas as pd  # loaded by a report that writes its lines, not by the CLI's start

    from gpumeter.billing.ledger.frames import MONEY_UNIT, QUANTITY_SCALE
    from gpumeter.reports.focus_origins import mean_millionths
    from gpumeter.reports.grouped import per_distinct
    from gpumeter.reports.model import money_text

    unpriced = LineKind.UNPRICED.value
    labels, exponent = spec.labels, spec.exponent

    def times(column: pd.Series, shift: timedelta = timedelta(0)) -> list[str]:
        return per_distinct(column, lambda moment: utc_text(moment.to_pydatetime() + shift))

    def micro(value: int) -> str:  # an integer of 10⁻⁶ as the report writes its Decimal: six places
        whole, part = divmod(abs(value), QUANTITY_SCALE)
        return f"{'-' if value < 0 else ''}{whole}.{part:06d}"

    def means(weighted: pd.Series, quantity: pd.Series) -> list[str]:
        return [
            "" if m is None else micro(m) for m in map(mean_millionths, weighted.tolist(), quantity.tolist())
        ]

    for c in chunks:
        amounts: list[Decimal | None] = [
            None if a is pd.NA else a * MONEY_UNIT for a in c["amount"].astype(object).tolist()
        ]
        versions = [None if v is pd.NA else v for v in c["price_version_id"].astype(object).tolist()]
        columns = [
            times(c["bucket"]),
            times(c["first_hour"]),
            times(c["last_hour"], HOUR),
            [unpriced if a is None else k for a, k in zip(amounts, c["kind"].tolist(), strict=True)],
            c["team"].tolist(),
            c["namespace"].tolist(),
            c["pod"].tolist(),
            c["container"].tolist(),
            c["model"].tolist(),
            c["mig_profile"].tolist(),
            c["uuid"].tolist(),
            c["gpu_instance_id"].tolist(),
            [micro(q) for q in c["quantity"].tolist()],
            [micro(held) for held in c["slice_hours"].tolist()],
            [money_text(a, exponent) for a in amounts],
            c["currency"].tolist(),
            means(c["uw_exact"], c["uq"]),
            means(c["ew_exact"], c["eq"]),
            [labels.get(v, "") for v in versions],  # type: ignore[arg-type]
            c["lines"].tolist(),
        ]
        if spec.clustered:
            columns.insert(4, c["cluster"].tolist())
        yield columns
