"""The report's figures grouped from the period's lines as columns (billing/ledger/frames.py): the
charges (lines summed per grain bucket) and every table of the report (groups, namespaces, models,
pods, platform lines, clusters, days) are pandas group-bys over one frame, not loops over lines.

Sums of money and quantities are int64 of the ledger's stored scale, made `Decimal` only when a
figure is handed to the report (`Usage`), so every total is the sum of its lines to the cent.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from decimal import Decimal
from typing import Any, NamedTuple, TypeVar, overload

import numpy as np
import pandas as pd

from gpumeter.billing.ledger.base import LineTotal
from gpumeter.billing.ledger.frames import MONEY_UNIT, QUANTITY_UNIT
from gpumeter.billing.models import PLATFORM_KINDS, LineKind, QuantityUnit

T = TypeVar("T")

TENANT_VALUES = (LineKind.TENANT.value, LineKind.IDLE_SHARE.value)
# the charge's keys, as `Ledger.line_totals` groups lines
KEYS = (
    "kind",
    "namespace",
    "team",
    "pod",
    "container",
    "uuid",
    "gpu_instance_id",
    "mig_profile",
    "model",
    "currency",
    "price_version_id",
    "held_unit",
    "cluster",
)
# the report's order of charges (reports.model `_sort_key`): kinds ranked, then the names
KIND_ORDER = {
    str(kind): rank for rank, kind in enumerate((*TENANT_VALUES, *PLATFORM_KINDS, LineKind.UNPRICED))
}
SORT = (
    "bucket",
    "kind_rank",
    "namespace",
    "pod",
    "container",
    "uuid",
    "gpu_instance_id",
    "mig_profile",
    "model",
    "team",
    "currency",
    "version_rank",
    "cluster",
)
# the figures a `Usage` sums, per charge
FIGURES = ("f_cost", "f_idle", "f_gpu_hours", "f_slice_hours", "f_lines", "f_uw", "f_uq", "f_ew", "f_eq")
# what the report's tables group and filter the charges by, with FIGURES (reports.model.build_report)
SUMMED: tuple[str, ...] = (
    "kind",
    "namespace",
    "team",
    "pod",
    "uuid",
    "model",
    "mig_profile",
    "profile",
    "cluster",
    "day",
)
SUMMED += ("quantity", "priced_line", "tenant", *FIGURES)


class Probe(NamedTuple):
    """What `Grouping.key` reads of a line."""

    team: str
    namespace: str
    model: str
    mig_profile: str
    cluster: str


def _text(frame: pd.DataFrame, name: str) -> pd.Series:
    return frame[name].astype(object)


def name_clusters(lines: pd.DataFrame, clusters: tuple[str, ...]) -> pd.DataFrame:
    """The lines of ``clusters`` (all: none named), each tenant line's namespace named with its
    cluster (`billing.models.cluster_namespace`: the same name in two clusters is two namespaces)."""
    if clusters:
        lines = lines[lines["cluster"].isin(list(clusters))]
    tenant = lines["kind"].isin(TENANT_VALUES) & (lines["cluster"] != "")
    if tenant.any():
        namespace = _text(lines, "namespace")
        named = _text(lines, "cluster")[tenant] + "/" + namespace[tenant]
        namespace = namespace.where(~tenant, named)
        lines = lines.assign(namespace=pd.Categorical(namespace))
    return lines


def charges(lines: pd.DataFrame) -> pd.DataFrame:
    """The frame's rows (billing/ledger/frames.py, already per grain bucket) summed per bucket and
    charge key, sorted as the report lists them, with the figures a `Usage` sums per charge (FIGURES)."""
    summed = (
        lines.groupby(["bucket", *KEYS], observed=True, dropna=False, sort=False)
        .agg(
            first_hour=("first_hour", "min"),
            last_hour=("last_hour", "max"),
            lines=("lines", "sum"),
            quantity=("quantity", "sum"),
            amount=("amount", "sum"),
            priced=("amount", "count"),
            uw=("uw", "sum"),
            uq=("uq", "sum"),
            ew=("ew", "sum"),
            eq=("eq", "sum"),
            uw_exact=("uw_exact", "sum"),
            ew_exact=("ew_exact", "sum"),
            held=("held", "sum"),
        )
        .reset_index()
    )
    summed["amount"] = summed["amount"].astype("Int64").where(summed["priced"] > 0)
    kind = _text(summed, "kind")
    summed["kind_rank"] = kind.map(KIND_ORDER).fillna(99).astype("int64")
    summed["version_rank"] = summed["price_version_id"].fillna(0).astype("int64")
    for name in KEYS:  # names sort as Python sorts str; categories would sort by first appearance
        if name != "price_version_id":
            summed[name] = _text(summed, name)
    summed = summed.sort_values(list(SORT), kind="stable", ignore_index=True)
    return _with_figures(summed)


def _with_figures(c: pd.DataFrame) -> pd.DataFrame:
    kind = c["kind"]
    priced = (kind != LineKind.UNPRICED.value) & c["amount"].notna()
    cost = c["amount"].fillna(0).astype("int64").to_numpy()
    idle = (kind == LineKind.IDLE_SHARE.value).to_numpy()
    use = ~idle  # an idle share's quantity is idle capacity, not usage
    tenant = kind.isin(TENANT_VALUES).to_numpy()
    slices = tenant & (c["held_unit"] == QuantityUnit.SLICE_HOUR.value).to_numpy()
    c["priced_line"] = priced.to_numpy()
    c["tenant"] = tenant & c["priced_line"].to_numpy()
    c["slice_hours"] = np.where(slices, c["held"].to_numpy(), 0)
    c["f_cost"] = cost
    c["f_idle"] = np.where(idle, cost, 0)
    c["f_gpu_hours"] = np.where(use, c["quantity"].to_numpy(), 0)
    c["f_slice_hours"] = np.where(use, c["slice_hours"].to_numpy(), 0)
    c["f_lines"] = c["lines"].to_numpy()
    for name in ("uw", "ew"):
        c[f"f_{name}"] = np.where(use, c[name].to_numpy(), 0.0)
    for name in ("uq", "eq"):
        c[f"f_{name}"] = np.where(use, c[name].to_numpy(), 0)
    c["profile"] = c["mig_profile"].where(c["mig_profile"] != "", "(whole GPU)")
    c["day"] = c["bucket"].dt.date
    return c


def group_keys(c: pd.DataFrame, key: Callable[[Probe], str]) -> pd.Series:
    """Each charge's group (`Grouping.key`), asked once per distinct (team, namespace, model,
    profile, cluster)."""
    names = list(Probe._fields)
    if c.empty:
        return pd.Series([], dtype=object, index=c.index)
    grouped = c.groupby(names, sort=False, dropna=False)
    firsts = grouped.head(1)[names]
    keys = np.array([key(Probe(*row)) for row in firsts.itertuples(index=False)], dtype=object)
    return pd.Series(keys[grouped.ngroup().to_numpy()], index=c.index)


class Before(NamedTuple):
    """What the previous period billed, for the report's changes: its total, its tenants' total, per
    group and per platform line; whether it had lines at all; the price versions its lines name."""

    had_lines: bool
    total: Decimal
    tenants: Decimal
    groups: dict[str, Decimal]
    platform: dict[str, Decimal]
    version_ids: set[int]


def before(lines: pd.DataFrame, group_key: Callable[[Probe], str]) -> Before:
    """`Before` from the previous period's line frame (billing/ledger/frames.py, named by
    `name_clusters`): summed in columns, as the period's own charges are (a month of 10,000 GPUs whose
    pods change daily has ~1 million distinct charges)."""
    versions = {int(v) for v in lines["price_version_id"].dropna().unique()}
    priced = lines[lines["amount"].notna()]
    priced = priced.assign(f_cost=priced["amount"].astype("int64"), kind=_text(priced, "kind"))
    tenant = priced["kind"].isin(TENANT_VALUES)
    held, others = priced[tenant], priced[~tenant]
    return Before(
        len(lines) > 0,
        Decimal(int(priced["f_cost"].sum())) * MONEY_UNIT,
        Decimal(int(held["f_cost"].sum())) * MONEY_UNIT,
        money_by(held.assign(group=group_keys(held, group_key)), ["group"]),
        money_by(others, ["kind"]),
        versions,
    )


PodKey = tuple[str, str]  # (namespace, pod)


class Pods(NamedTuple):
    """The pods a report shows (`pods`), ranked by cost (then namespace and pod), with what it shows of
    each: its FIGURES sums, its team (that of its first charge in the report's order), and the models
    and profiles of its charges."""

    top: list[PodKey]
    per_group: dict[str, list[PodKey]]  # each group's first pods; empty unless asked
    shared: list[PodKey]  # the pods of ``shared`` that were charged, in rank order
    figures: dict[PodKey, tuple]
    teams: dict[PodKey, str]
    models: dict[PodKey, set[str]]
    profiles: dict[PodKey, set[str]]


def pods(
    tenant: pd.DataFrame,
    *,
    top: int,
    shared: set[PodKey],
    group_key: Callable[[Probe], str] | None = None,
) -> Pods:
    """The pods of the tenant charges a report shows: the ``top`` by cost, with ``group_key`` each
    group's ``top`` too, and those of ``shared``. Ranked in columns: a month of 10,000 GPUs whose pods
    change daily bills ~1 million pods, and only the shown ones are made into Python objects."""
    keys = ["namespace", "pod"]
    if tenant.empty:
        return Pods([], {}, [], {}, {}, {}, {})
    # each pod's sums and its first charge's team and cluster (a pod is one namespace's: one team; a
    # namespace named by `name_clusters` is one cluster's)
    ranked = (
        tenant.groupby(keys, sort=False)
        .agg(
            **{name: (name, "sum") for name in FIGURES}, team=("team", "first"), cluster=("cluster", "first")
        )
        .reset_index()
    )
    ranked = ranked.sort_values(
        ["f_cost", "namespace", "pod"], ascending=[False, True, True], kind="stable", ignore_index=True
    )

    def listed(rows: pd.DataFrame) -> list[PodKey]:
        return list(zip(rows["namespace"].tolist(), rows["pod"].tolist(), strict=True))

    top_pods = listed(ranked.head(top))
    per_group: dict[str, list[PodKey]] = {}
    if group_key is not None:  # a pod's group as a line of its namespace, team and cluster names it
        # the cluster too: `Grouping.key` reads a `cluster/namespace`'s labels by the name without it
        probes = ranked[["team", "namespace"]].assign(model="", mig_profile="", cluster=ranked["cluster"])
        ranked["group"] = group_keys(probes, group_key).to_numpy()
        for key, rows in ranked.groupby("group", sort=False).head(top).groupby("group", sort=False):
            per_group[key] = listed(rows)
    shared_pods = listed(ranked[_among(ranked, shared)])
    shown = set(top_pods).union(shared_pods, *per_group.values())
    chosen = ranked[_among(ranked, shown)]
    chosen_keys = listed(chosen)
    figures = dict(zip(chosen_keys, chosen[list(FIGURES)].itertuples(index=False, name=None), strict=True))
    met = tenant[["namespace", "pod", "model", "profile"]].drop_duplicates()
    met = met[_among(met, shown)]
    models: dict[PodKey, set[str]] = {key: set() for key in shown}
    profiles: dict[PodKey, set[str]] = {key: set() for key in shown}
    for namespace, pod, model, profile in met.itertuples(index=False):
        models[(namespace, pod)].add(model)
        profiles[(namespace, pod)].add(profile)
    pod_teams = dict(zip(chosen_keys, chosen["team"].tolist(), strict=True))
    return Pods(top_pods, per_group, shared_pods, figures, pod_teams, models, profiles)


def _among(frame: pd.DataFrame, pods: set[PodKey]) -> np.ndarray:
    """Whether each row's (namespace, pod) is one of ``pods``, a few of ~1 million: the rows whose
    namespace and pod are each among theirs, then those pairs checked (a MultiIndex of every row's
    pair cost 2.2 s at 10,000 GPUs)."""
    near = np.flatnonzero(
        (frame["namespace"].isin([p[0] for p in pods]) & frame["pod"].isin([p[1] for p in pods])).to_numpy()
    )
    among = np.zeros(len(frame), dtype=bool)
    pairs = zip(frame["namespace"].to_numpy()[near], frame["pod"].to_numpy()[near], strict=True)
    among[near] = [pair in pods for pair in pairs]
    return among


def usage_of(sums: Any, usage_type: Callable[..., Any]) -> Any:
    """A `reports.model.Usage` from one row of FIGURES sums."""
    f_cost, f_idle, f_gpu_hours, f_slice_hours, f_lines, f_uw, f_uq, f_ew, f_eq = sums
    return usage_type(
        cost=Decimal(int(f_cost)) * MONEY_UNIT,
        idle_share=Decimal(int(f_idle)) * MONEY_UNIT,
        gpu_hours=Decimal(int(f_gpu_hours)) * QUANTITY_UNIT,
        slice_hours=Decimal(int(f_slice_hours)) * QUANTITY_UNIT,
        lines=int(f_lines),
        _u_w=float(f_uw),
        _u_q=Decimal(int(f_uq)) * QUANTITY_UNIT,
        _e_w=float(f_ew),
        _e_q=Decimal(int(f_eq)) * QUANTITY_UNIT,
    )


def usage_by(c: pd.DataFrame, keys: list[str], usage_type: Callable[..., Any]) -> dict[Any, Any]:
    """The charges' `Usage` per value of ``keys`` (a tuple for several)."""
    if c.empty:
        return {}
    sums = c.groupby(keys, sort=False, dropna=False)[list(FIGURES)].sum()
    return {
        key: usage_of(row, usage_type)
        for key, row in zip(sums.index.tolist(), sums.itertuples(index=False, name=None), strict=True)
    }


def usage_all(c: pd.DataFrame, usage_type: Callable[..., Any]) -> Any:
    return usage_of(tuple(c[name].sum() for name in FIGURES), usage_type)


def money_by(c: pd.DataFrame, keys: list[str]) -> dict[Any, Decimal]:
    """The charges' cost per value of ``keys``."""
    if c.empty:
        return {}
    sums = c.groupby(keys, sort=False, dropna=False)["f_cost"].sum()
    return {key: Decimal(int(v)) * MONEY_UNIT for key, v in sums.items()}


# the columns a charge is made of (`Charges`), in `LineTotal`'s order of fields
_CHARGE_COLUMNS: tuple[str, ...] = ("bucket", "first_hour", "last_hour", *KEYS, "lines", "quantity")
_CHARGE_COLUMNS += ("amount", "uw", "uq", "ew", "eq", "held", "slice_hours", "uw_exact", "ew_exact")


class Charges(Sequence[LineTotal]):
    """The report's charges, in order, as `LineTotal`s made from the charges' frame (`charges`) a
    chunk at a time when read: the frame's columns are all that is kept (a month of 10,000 GPUs is
    ~1 million charges, ~1.7 KiB each as objects with their Decimals and datetimes)."""

    CHUNK = 20_000

    def __init__(self, c: pd.DataFrame):
        self._frame = c[list(_CHARGE_COLUMNS)].reset_index(drop=True)

    def __len__(self) -> int:
        return len(self._frame)

    def __iter__(self) -> Iterator[LineTotal]:
        for chunk in self.chunks():
            yield from _line_totals(chunk)

    def chunks(self) -> Iterator[pd.DataFrame]:
        """The charges' columns (`_CHARGE_COLUMNS`) a chunk of rows at a time, in order: for a file
        written from the columns, with no `LineTotal` made (`reports.render.lines_csv_parts`)."""
        for at in range(0, len(self._frame), self.CHUNK):
            yield self._frame.iloc[at : at + self.CHUNK]

    def buckets(self) -> Iterator[pd.DataFrame]:
        """The charges' columns a run of one grain bucket at a time, in order (the report's is bucket
        first: `SORT`), for a file made a bucket at a time (`reports.focus_origins.buckets`, which
        refuses a bucket that comes back after another)."""
        stamps = self._frame["bucket"].to_numpy(dtype="datetime64[ns]")  # not a Timestamp each
        if not len(stamps):
            return
        starts = [0, *(np.flatnonzero(stamps[1:] != stamps[:-1]) + 1).tolist()]
        for at, end in zip(starts, [*starts[1:], len(stamps)], strict=True):
            yield self._frame.iloc[at:end]

    @overload
    def __getitem__(self, index: int) -> LineTotal: ...
    @overload
    def __getitem__(self, index: slice) -> list[LineTotal]: ...
    def __getitem__(self, index: int | slice) -> LineTotal | list[LineTotal]:
        if isinstance(index, slice):
            return _line_totals(self._frame.iloc[index])
        at = range(len(self._frame))[index]  # IndexError beyond either end
        return _line_totals(self._frame.iloc[at : at + 1])[0]


def per_distinct(column: pd.Series, convert: Callable[[Any], T]) -> list[T]:
    """``convert`` of each value of ``column``, called once per distinct value: a chunk of 20,000
    charges has a few dozen distinct hours (the shared results are immutable: times, text)."""
    codes, distinct = pd.factorize(column)
    converted = [convert(value) for value in distinct]
    return [converted[code] for code in codes.tolist()]


def _line_totals(c: pd.DataFrame) -> list[LineTotal]:
    """Rows of the charges' frame as `LineTotal`s."""
    qty = QUANTITY_UNIT

    def exact(name: str, unit: Decimal) -> list[Decimal]:
        return [Decimal(v) * unit for v in c[name].to_numpy(dtype="int64").tolist()]

    amounts = [None if v is pd.NA else Decimal(v) * MONEY_UNIT for v in c["amount"].astype(object).tolist()]
    versions = [None if v is pd.NA else int(v) for v in c["price_version_id"].astype(object).tolist()]
    columns = zip(
        *(
            per_distinct(c[name], pd.Timestamp.to_pydatetime)
            for name in ("bucket", "first_hour", "last_hour")
        ),
        *(c[name].tolist() for name in KEYS if name not in ("price_version_id", "held_unit", "cluster")),
        versions,
        c["lines"].tolist(),
        exact("quantity", qty),
        amounts,
        c["uw"].tolist(),
        exact("uq", qty),
        c["ew"].tolist(),
        exact("eq", qty),
        exact("held", qty),
        c["held_unit"].tolist(),
        c["cluster"].tolist(),
        strict=True,
    )
    return [LineTotal(*row) for row in columns]
