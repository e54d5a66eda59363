"""Shared pieces of the gpumeter dashboards: the datasource, template variables, PromQL helpers that
join device series to ``nvidia_gpu_info`` (the only device series with ``hostname``), and small panel
factories over grafana-foundation-sdk's builders.

Conventions every dashboard follows:

* every query selects template variables through regex matchers (``=~"$var"``); "All" is ``.*``;
* every selector is filtered by the ``cluster`` variable (``with_cluster``, applied to the built models
  by ``build.for_clusters``), so the same dashboards serve a cluster's own Prometheus and a global store;
* device series are joined ``* on(instance, uuid) group_left(hostname, model) nvidia_gpu_info{...}``
  (docs/architecture.md, "The contract": descriptive metadata sits on ``_info`` series), which is also how a panel is filtered
  by host and GPU;
* power and temperature are per *physical* GPU: no panel sums a device series over MIG series;
* thresholds are relative to each GPU's own limits: panels show headroom (slowdown − temperature)
  or power as a fraction of the enforced limit, never a fixed temperature or wattage.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as d
from grafana_foundation_sdk.builders import prometheus, stat, statetimeline, table, timeseries
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import prometheus as pm

from gpumeter import contract

DS = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
TAG = "gpumeter"
EXPORTER_JOB = "gpumeter-exporter"
BILLING_JOB = "gpumeter-billing"

# Dashboard UIDs (stable: data links and the docs refer to them).
UID_FLEET = "gpumeter-fleet"
UID_NODE = "gpumeter-node"
UID_MIG = "gpumeter-mig"
UID_COST = "gpumeter-cost"
UID_HEALTH = "gpumeter-health"
UID_CAPACITY = "gpumeter-capacity"

# Throttle reasons that are not a problem worth a glance (idle, clocks pinned by the admin, display).
BENIGN_REASONS = "gpu_idle|applications_clocks|display_clocks"
# The only device series with the node's hostname, which every other device series is joined to.
GPU_INFO = contract.GPU_INFO.name

# --- PromQL helpers -------------------------------------------------------------------------------


def info(hostname: bool = True, gpu: bool = False, extra: str = "") -> str:
    """``nvidia_gpu_info`` filtered by the host (and GPU) variables."""
    matchers = []
    if hostname:
        matchers.append('hostname=~"$hostname"')
    if gpu:
        matchers.append('gpu=~"$gpu"')
    if extra:
        matchers.append(extra)
    return GPU_INFO + "{" + ", ".join(matchers) + "}"


def on_gpu(expr: str, *, gpu: bool = False, labels: str = "hostname, model", extra: str = "") -> str:
    """Join a device-scoped expression (labels instance, uuid, ...) to its GPU's identity.

    The result keeps the expression's labels plus ``labels`` from ``nvidia_gpu_info``, and only GPUs
    that match the host (and GPU) variables."""
    return f"({expr}) * on(instance, uuid) group_left({labels}) {info(True, gpu, extra)}"


def on_exporter(expr: str) -> str:
    """Give an exporter-scoped series the hostname of its node (exporter series carry only instance),
    as the alert rules do; exporters whose node has no GPU info keep no hostname and are dropped by a
    specific host selection."""
    return (
        f"({expr}) * on(instance) group_left(hostname) "
        "topk by (instance) (1, group by (instance, hostname) "
        f'(last_over_time({GPU_INFO}{{hostname=~"$hostname"}}[1h])))'
    )


def in_range(metric: str, by: str) -> str:
    """How much a cumulative ledger series (billing counters) grew during the dashboard's time range.

    Unlike increase(), a series that first appeared inside the range counts in full (the billing
    collector renders ledger totals, so a new namespace's first value is its first cost)."""
    return (
        f"sum by ({by}) ({metric})"
        f" - (sum by ({by}) ({metric} offset $__range) or 0 * sum by ({by}) ({metric}))"
    )


# --- clusters -------------------------------------------------------------------------------------
# A global store (VictoriaMetrics, Thanos, Mimir) holds many clusters' series, told apart by the label
# their Prometheus servers add (external_labels). Every query is filtered by the `cluster` variable:
# with_cluster() puts the matcher into each selector, so no panel mixes clusters (docs/dashboards.md).

CLUSTER_VARIABLE = "cluster"
_KEYWORDS = frozenset(
    {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
     "offset", "inf", "nan", "atan2"}
)  # fmt: skip
_LABEL_LISTS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
# Aggregations may put their label list first: `sum by (x) (…)`.
_AGGREGATIONS = frozenset(
    {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk",
     "quantile", "limitk", "limit_ratio"}
)  # fmt: skip
_NAME_START = re.compile(r"[A-Za-z_:]")
_NAME = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_NUMBER = re.compile(r"(?:0x[0-9a-fA-F]+|[0-9][0-9a-zA-Z_.]*)")  # numbers and durations (5m, 1e9, 1h30m)
_VARIABLE = re.compile(r"\$(\{[^}]*\}|\w+)")
_LIST_FIRST = re.compile(r"(by|without)\s*\(")


def _skip_string(expr: str, start: int) -> int:
    quote, i = expr[start], start + 1
    while i < len(expr) and expr[i] != quote:
        i += 2 if expr[i] == "\\" else 1
    return i + 1


def _skip_group(expr: str, start: int, open_: str, close: str) -> int:
    """Index past the bracket that closes the one at ``start`` (strings inside skipped)."""
    depth, i = 0, start
    while i < len(expr):
        char = expr[i]
        if char in "\"'`":
            i = _skip_string(expr, i)
            continue
        if char == open_:
            depth += 1
        elif char == close:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise ValueError(f"unbalanced {open_!r} in PromQL: {expr!r}")


def with_cluster(expr: str, label: str = "cluster", variable: str = CLUSTER_VARIABLE) -> str:
    """``expr`` with ``label=~"$variable"`` in every series selector.

    A regex matcher, as every variable here is used (an empty value, a store without clusters, matches
    the series that have no such label). Function names, keywords, label lists (by, on, …), strings,
    numbers, durations, ranges and ``$variables`` are left as they are."""
    matcher = f'{label}=~"${variable}"'
    out: list[str] = []
    i = 0
    while i < len(expr):
        char = expr[i]
        end = i + 1
        if char in "\"'`":
            end = _skip_string(expr, i)
        elif char == "[":  # range or subquery: durations and $__rate_interval only
            end = _skip_group(expr, i, "[", "]")
        elif char == "$":
            match = _VARIABLE.match(expr, i)
            end = match.end() if match else end
        elif char == "{":  # a selector without a metric name
            end = _skip_group(expr, i, "{", "}")
            out.append(_add_matcher(expr[i:end], matcher))
            i = end
            continue
        elif char.isdigit() or (char == "." and expr[i + 1 : i + 2].isdigit()):
            match = _NUMBER.match(expr, i)
            end = match.end() if match else end
        elif _NAME_START.match(char):
            i = _name(expr, i, matcher, out)
            continue
        out.append(expr[i:end])
        i = end
    return "".join(out)


def _name(expr: str, i: int, matcher: str, out: list[str]) -> int:
    """Copy the name at ``i`` (and what belongs to it) to ``out``; the index after it."""
    match = _NAME.match(expr, i)
    assert match is not None
    name, end = match.group(0), match.end()
    rest = expr[end:].lstrip()
    gap = expr[end : len(expr) - len(rest)]
    if name.lower() in _LABEL_LISTS and rest.startswith("("):
        close = _skip_group(expr, end + len(gap), "(", ")")
        out.append(expr[i:close])
        return close
    if (
        name.lower() in _KEYWORDS
        or rest.startswith("(")
        or (name in _AGGREGATIONS and _LIST_FIRST.match(rest))
    ):
        out.append(name)  # a keyword, a function or an aggregation
        return end
    if rest.startswith("{"):
        close = _skip_group(expr, end + len(gap), "{", "}")
        out.append(name + gap + _add_matcher(expr[end + len(gap) : close], matcher))
        return close
    out.append(name + "{" + matcher + "}")
    return end


def _add_matcher(braces: str, matcher: str) -> str:
    inner = braces[1:-1].strip()
    return "{" + matcher + (", " + inner if inner else "") + "}"


def cluster_var(label: str = "cluster", *, hide: bool = False) -> d.QueryVariable:
    """The cluster variable: one cluster at a time (no "All", which would add clusters up), the first
    by default. In a store without the label it has no value, and ``label=~""`` matches every series."""
    var = query_var(
        CLUSTER_VARIABLE,
        "Cluster",
        f"label_values({GPU_INFO}, {label})",
        multi=False,
        include_all=False,
        description=f"The cluster (label `{label}`, which each cluster's Prometheus adds as an external label).",
    )
    return var.hide(dm.VariableHide.HIDE_VARIABLE) if hide else var


# --- template variables ---------------------------------------------------------------------------


def datasource_var() -> d.DatasourceVariable:
    return d.DatasourceVariable("datasource").label("Prometheus").type("prometheus")


def query_var(
    name: str,
    label: str,
    query: str,
    *,
    multi: bool = True,
    include_all: bool = True,
    description: str = "",
    sort: dm.VariableSort = dm.VariableSort.ALPHABETICAL_ASC,
) -> d.QueryVariable:
    var = (
        d.QueryVariable(name)
        .label(label)
        .query(query)
        .datasource(DS)
        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(sort)
        .multi(multi)
        .include_all(include_all)
    )
    if include_all:
        var = var.all_value(".*").current(dm.VariableOption(text="All", value="$__all", selected=True))
    if description:
        var = var.description(description)
    return var


def hostname_var(multi: bool = True) -> d.QueryVariable:
    return query_var(
        "hostname",
        "Node",
        f"label_values({GPU_INFO}, hostname)",
        multi=multi,
        include_all=multi,
        description="Node name (the exporter's NODE_NAME), from nvidia_gpu_info.",
    )


def gpu_var() -> d.QueryVariable:
    return query_var(
        "gpu",
        "GPU",
        f'label_values({GPU_INFO}{{hostname=~"$hostname"}}, gpu)',
        description="GPU index on the selected node(s).",
        sort=dm.VariableSort.NUMERICAL_ASC,
    )


def namespace_var() -> d.QueryVariable:
    return query_var(
        "namespace",
        "Namespace",
        f'label_values({contract.ALLOCATION.name}{{hostname=~"$hostname"}}, namespace)',
        description="Namespaces of the pods holding GPUs or MIG instances (nvidia_gpu_allocation).",
    )


# --- links ----------------------------------------------------------------------------------------

_CARRY = "${datasource:queryparam}&${cluster:queryparam}&${__url_time_range}"


def url(uid: str, **variables: str) -> str:
    """URL of another gpumeter dashboard with variables set (values may be data-link macros)."""
    query = "&".join(f"var-{name}={value}" for name, value in variables.items())
    return f"/d/{uid}?{query}{'&' if query else ''}{_CARRY}"


def link(title: str, target: str) -> d.DashboardLink:
    """A data link (panel field link)."""
    return d.DashboardLink(title).url(target)


# Queries more than one dashboard draws: what each namespace holds now, in GPU equivalents (whole GPUs
# their share, MIG instances compute slices / 7), which is what the next ingest bills.
NAMESPACE_GPU_EQUIVALENTS = 'namespace:nvidia_gpu_allocated_gpu_equivalents:sum{namespace=~"$namespace"}'

# Data links more than one dashboard uses. "Row" links read a table row's fields, "series" links a
# time series' labels.
GPU_DETAIL_ROW = link(
    "Node & GPU detail: GPU ${__data.fields.gpu} on ${__data.fields.hostname}",
    url(UID_NODE, hostname="${__data.fields.hostname}", gpu="${__data.fields.gpu}"),
)
NODE_DETAIL_SERIES = link(
    "Node & GPU detail: ${__field.labels.hostname}",
    url(UID_NODE, hostname="${__field.labels.hostname}"),
)
NAMESPACE_COST_ROW = link(
    "Cost & chargeback of namespace ${__data.fields.namespace}",
    url(UID_COST, namespace="${__data.fields.namespace}"),
)
NAMESPACE_COST_SERIES = link(
    "Cost & chargeback of namespace ${__field.labels.namespace}",
    url(UID_COST, namespace="${__field.labels.namespace}"),
)


def dashboard_links() -> list[d.DashboardLink]:
    """Every gpumeter dashboard links to the others (by tag), keeping the time range and variables."""
    return [
        d.DashboardLink("gpumeter")
        .type(dm.DashboardLinkType.DASHBOARDS)
        .tags([TAG])
        .as_dropdown(False)
        .include_vars(True)
        .keep_time(True)
    ]


# --- panels ---------------------------------------------------------------------------------------


@dataclass
class Query:
    expr: str
    legend: str = ""
    instant: bool = False
    table: bool = False


def _targets(queries: Query | Sequence[Query]) -> list[prometheus.Dataquery]:
    if isinstance(queries, Query):
        queries = [queries]
    out = []
    for index, q in enumerate(queries):
        target = prometheus.Dataquery().expr(q.expr).ref_id(chr(ord("A") + index)).datasource(DS)
        if q.legend:
            target = target.legend_format(q.legend)
        target = target.instant() if q.instant or q.table else target.range()
        if q.table:
            target = target.format(pm.PromQueryFormat.TABLE)
        out.append(target)
    return out


def steps(*pairs: tuple[float | None, str]) -> d.ThresholdsConfig:
    return (
        d.ThresholdsConfig()
        .mode(dm.ThresholdsMode.ABSOLUTE)
        .steps([dm.Threshold(value=value, color=color) for value, color in pairs])
    )


@dataclass(frozen=True)
class Axis:
    """A unit with the bounds its axis always has (a panel's own min and max win)."""

    unit: str
    min: float | None = None
    max: float | None = None


# A share of time or of a capacity, 0 to 1, drawn as a percentage on a 0–100 % axis.
SHARE = Axis("percentunit", 0, 1)

NEUTRAL = steps((None, "green"))
# Counts of what should be none: any at all is a fault (red), or worth a look (orange).
ANY_FAULT = steps((None, "green"), (1, "red"))
ANY_WARNING = steps((None, "green"), (1, "orange"))
UP_STEPS = steps((None, "red"), (1, "green"))  # 1 up, 0 down
# Headroom to the GPU's own slowdown temperature, in °C (device-scoped: join it with on_gpu), and its
# thresholds: at or past it red, within 5 °C orange.
SLOWDOWN_HEADROOM = f'{contract.TEMPERATURE_THRESHOLD.name}{{threshold="slowdown"}} - ignoring(threshold) {contract.TEMPERATURE.name}'
HEADROOM = steps((None, "red"), (1, "orange"), (5, "green"))
# Power as a fraction of the GPU's own enforced limit.
POWER_FRACTION = steps((None, "green"), (0.9, "orange"), (0.98, "red"))

# --- dashboards as tables -------------------------------------------------------------------------
# A dashboard is a table: Section rows start a row of the grid, Panel rows are panels, so adding a
# panel is adding one row. What a panel shows (title, queries, unit, thresholds) comes first; how it
# is drawn (kind, size, overrides) after.

TIMESERIES = "timeseries"
STAT = "stat"
TABLE = "table"
TIMELINE = "timeline"


@dataclass(frozen=True)
class Section:
    """Starts a row of the dashboard's grid, titled."""

    title: str


@dataclass(frozen=True)
class Panel:
    """One panel of a dashboard's table: a time series unless ``kind`` says otherwise."""

    title: str
    queries: Query | Sequence[Query]
    unit: str | Axis = "short"
    thresholds: d.ThresholdsConfig = NEUTRAL
    kind: str = TIMESERIES
    description: str = ""
    links: Iterable[d.DashboardLink] = ()
    w: int = 12
    h: int = 8
    decimals: float | None = None
    min: float | None = None
    max: float | None = None
    overrides: Sequence = ()
    transformations: Sequence = ()
    mappings: Sequence = ()
    stack: bool = False  # time series: stacked, filled
    threshold_lines: bool = False  # time series: the thresholds drawn as lines
    sort_by: str | None = None  # table: the column sorted by, descending unless ``ascending``
    ascending: bool = False


def _common(builder, spec: Panel):
    axis = spec.unit if isinstance(spec.unit, Axis) else Axis(spec.unit)
    minimum = axis.min if spec.min is None else spec.min
    maximum = axis.max if spec.max is None else spec.max
    builder = (
        builder.title(spec.title)
        .datasource(DS)
        .targets(_targets(spec.queries))
        .unit(axis.unit)
        .thresholds(spec.thresholds)
        .span(spec.w)
        .height(spec.h)
    )
    if spec.description:
        builder = builder.description(spec.description)
    if spec.links:
        builder = builder.data_links(list(spec.links))
    if spec.decimals is not None:
        builder = builder.decimals(spec.decimals)
    if minimum is not None:
        builder = builder.min(minimum)
    if maximum is not None:
        builder = builder.max(maximum)
    if spec.mappings:
        builder = builder.mappings(spec.mappings)
    for name, properties in spec.overrides:
        builder = builder.override_by_name(name, properties)
    for transformation in spec.transformations:
        builder = builder.with_transformation(transformation)
    return builder


def ts(spec: Panel, *, stack: bool = False, threshold_lines: bool = False) -> timeseries.Panel:
    panel = _common(timeseries.Panel(), spec)
    panel = (
        panel.legend(
            cb.VizLegendOptions()
            .display_mode(cm.LegendDisplayMode.TABLE)
            .placement(cm.LegendPlacement.RIGHT)
            .show_legend(True)
            .calcs(["lastNotNull", "max"])
        )
        .tooltip(cb.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI).sort(cm.SortOrder.DESCENDING))
        .line_width(1)
        .fill_opacity(10 if stack else 0)
    )
    if stack:
        panel = panel.stacking(cb.StackingConfig().mode(cm.StackingMode.NORMAL))
    if threshold_lines:
        panel = panel.thresholds_style(cb.GraphThresholdsStyleConfig().mode(cm.GraphTresholdsStyleMode.LINE))
    return panel


def stat_panel(spec: Panel) -> stat.Panel:
    return (
        _common(stat.Panel(), spec)
        .reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
        .color_mode(cm.BigValueColorMode.VALUE)
        .graph_mode(cm.BigValueGraphMode.AREA)
        .text_mode(cm.BigValueTextMode.AUTO)
        .justify_mode(cm.BigValueJustifyMode.AUTO)
        .orientation(cm.VizOrientation.AUTO)
    )


HIDDEN_COLUMNS = ("Time", "__name__", "job", "instance")


def organize(exclude: Iterable[str] = (), rename: dict[str, str] | None = None) -> dm.DataTransformerConfig:
    return dm.DataTransformerConfig(
        id_val="organize",
        options={
            "excludeByName": {name: True for name in (*HIDDEN_COLUMNS, *exclude)},
            "renameByName": dict(rename or {}),
        },
    )


MERGE = dm.DataTransformerConfig(id_val="merge", options={})


def table_panel(spec: Panel, *, sort_by: str | None = None, desc: bool = True) -> table.Panel:
    panel = _common(table.Panel(), spec).show_header(True).cell_height(cm.TableCellHeight.SM)
    if sort_by:
        panel = panel.sort_by([cb.TableSortByFieldState().display_name(sort_by).desc(desc)])
    return panel


def color_background(name: str) -> tuple[str, list[dm.DynamicConfigValue]]:
    """Override: colour a table column's cells by the panel's thresholds."""
    return (name, [dm.DynamicConfigValue(id_val="custom.cellOptions", value={"type": "color-background"})])


def unit_override(name: str, unit: str, thresholds: d.ThresholdsConfig | None = None):
    properties = [dm.DynamicConfigValue(id_val="unit", value=unit)]
    if thresholds is not None:
        properties.append(dm.DynamicConfigValue(id_val="thresholds", value=thresholds.build()))
        properties.append(
            dm.DynamicConfigValue(id_val="custom.cellOptions", value={"type": "color-background"})
        )
    return (name, properties)


def dashed(name_regex: str) -> tuple[str, list[dm.DynamicConfigValue]]:
    """Override for threshold series drawn beside the value (dashed, no fill)."""
    return (
        name_regex,
        [
            dm.DynamicConfigValue(id_val="custom.lineStyle", value={"fill": "dash", "dash": [10, 10]}),
            dm.DynamicConfigValue(id_val="custom.fillOpacity", value=0),
        ],
    )


def value_map(mapping: dict[str, tuple[str, str]]) -> list[dm.ValueMap]:
    """Value mappings {value: (text, colour)} for state timelines."""
    return [
        dm.ValueMap(
            options={
                value: dm.ValueMappingResult(text=text, color=color, index=index)
                for index, (value, (text, color)) in enumerate(mapping.items())
            }
        )
    ]


def timeline(spec: Panel) -> statetimeline.Panel:
    return (
        _common(statetimeline.Panel(), spec)
        .show_value(cm.VisibilityMode.NEVER)
        .merge_values(True)
        .row_height(0.8)
        .fill_opacity(80)
        .line_width(0)
        .legend(cb.VizLegendOptions().show_legend(True).display_mode(cm.LegendDisplayMode.LIST))
        .tooltip(cb.VizTooltipOptions().mode(cm.TooltipDisplayMode.SINGLE))
    )


# --- laying a table out --------------------------------------------------------------------------


def build_panel(row: Panel):
    """The grafana-foundation-sdk builder for one row of a table."""
    if row.kind == TIMESERIES:
        return ts(row, stack=row.stack, threshold_lines=row.threshold_lines)
    if row.kind == STAT:
        return stat_panel(row)
    if row.kind == TABLE:
        return table_panel(row, sort_by=row.sort_by, desc=not row.ascending)
    if row.kind == TIMELINE:
        return timeline(row)
    raise ValueError(f"dashboards: panel {row.title!r} has unknown kind {row.kind!r}")


def dashboard(
    uid: str,
    title: str,
    description: str,
    variables: list,
    table: Iterable[Section | Panel],
    *,
    since: str = "now-6h",
) -> d.Dashboard:
    """A dashboard laid out from its table of sections and panels, left to right, top to bottom."""
    layout = Layout(new_dashboard(uid, title, description, variables, since=since))
    for row in table:
        if isinstance(row, Section):
            layout.row(row.title)
        else:
            layout.add(build_panel(row), row.w, row.h)
    return layout.builder


class Layout:
    """Adds rows and panels to a dashboard builder, assigning ids and grid positions left to right."""

    def __init__(self, builder: d.Dashboard):
        self.builder = builder
        self.next_id = 1
        self.x = 0
        self.y = 0
        self.row_h = 0

    def row(self, title: str) -> Layout:
        self._newline()
        self.builder = self.builder.with_row(
            d.Row(title).id(self.next_id).grid_pos(dm.GridPos(h=1, w=24, x=0, y=self.y))
        )
        self.next_id += 1
        self.y += 1
        return self

    def _newline(self) -> None:
        if self.x:
            self.y += self.row_h
            self.x = 0
            self.row_h = 0

    def add(self, panel, w: int, h: int) -> Layout:
        if self.x + w > 24:
            self._newline()
        panel = panel.id(self.next_id).grid_pos(dm.GridPos(h=h, w=w, x=self.x, y=self.y))
        self.builder = self.builder.with_panel(panel)
        self.next_id += 1
        self.x += w
        self.row_h = max(self.row_h, h)
        return self


def new_dashboard(
    uid: str, title: str, description: str, variables: list, *, since: str = "now-6h"
) -> d.Dashboard:
    builder = (
        d.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags([TAG])
        .timezone("utc")
        .time(since, "now")
        .refresh("1m")
        .tooltip(dm.DashboardCursorSync.CROSSHAIR)
        .readonly()
        .links(dashboard_links())
    )
    for var in [datasource_var(), *variables]:
        builder = builder.with_variable(var)
    return builder
