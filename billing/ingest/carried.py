"""What building the facts carries from hour to hour and run to run: each GPU's layout key, one key
object per layout, and which GPUs' layouts moved."""

from __future__ import annotations

import itertools
from collections.abc import Iterable

from gpumeter.billing.ingest.columns import (
    Values,
)
from gpumeter.billing.ledger.layouts import LayoutKey


class CarriedLayouts:
    """What `RunAnswers.build` carries from hour to hour and run to run of an ingest: each GPU's
    layout key of the last hour built (``last``), and one key object per layout seen (``one``).

    A GPU whose layout comes back (a pod on a schedule, an idle MIG GPU like its neighbours) then
    names the object it named before, which the pricer's memo and the ledger's layout ids hold: their
    look-ups compare it by identity, not value by value (~130 values, the labels' strings made anew
    by each run's answers: ~5 µs a look-up). In the first 72 hours of the 1,000-GPU bench, 42,352 of
    66,600 GPU-hours with a layout had such an equal key made anew."""

    __slots__ = ("clusters", "last", "one")

    def __init__(self) -> None:
        self.last: dict[str, LayoutKey | None] = {}
        self.one: dict[LayoutKey, LayoutKey] = {}
        self.clusters: dict[str, CarriedLayouts] = {}

    def of_cluster(self, cluster: str) -> CarriedLayouts:
        """The keys carried for one cluster's GPUs (its own: a UUID may be in two clusters)."""
        if not cluster:
            return self
        kept = self.clusters.get(cluster)
        if kept is None:
            kept = self.clusters[cluster] = CarriedLayouts()
        return kept


LAYOUTS_KEPT = 50_000  # layout key objects kept (~1,400 layouts a month on 1,000 GPUs)


def _moved(hours: int, *series: Iterable[tuple[str, tuple[Values | None, ...]]]) -> list[set[str]]:
    """Per hour of a run, the GPUs with a series whose value in any of its columns differs from the
    hour before's (an appearing or vanishing series included; every GPU at the first hour).

    A GPU-hour's layout (its instances and holders with their seconds and shares, `layout_key`) is a
    function of these values, the labels and the seconds per sample alone, so a GPU absent here kept
    the layout of the hour before: `RunAnswers.build` then carries that hour's key instead of building
    and comparing the ~130 values of a new one (a quarter of building an hour on the 1,000-GPU bench)."""
    moved: list[set[str]] = [set() for _ in range(hours)]
    everything = set()
    for of_gpu in series:
        for uuid, columns in of_gpu:
            everything.add(uuid)
            for values in columns:
                if values is None:
                    continue
                first = values[0]
                if first == first and values.count(first) == hours:  # the same all run (most are)
                    continue  # (a NaN, which differs from itself, is compared hour by hour)
                for i, (last, value) in enumerate(itertools.pairwise(values), 1):
                    if value != last:  # a NaN differs from itself: a moved hour, never a wrong key
                        moved[i].add(uuid)
    if hours:
        moved[0] = everything
    return moved
