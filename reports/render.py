"""Rendering a Report: HTML (Jinja2, autoescaped, plotly.js inline once), CSV, JSON and FOCUS CSV.

CSV, FOCUS and JSON output depend only on the report (the ledger and the price-book versions): no
clock, no locale, sorted rows, so the same ledger renders byte-identical files. Every CSV is written by
`reports.csvfile` (RFC 4180, CRLF, formula-leading text cells defused unless ``keep_formulas``). The
HTML carries the generation time, given by the caller.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from functools import lru_cache
from pathlib import Path
from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape

from gpumeter.billing.models import LineKind
from gpumeter.reports import csvfile, focus, lines_file
from gpumeter.reports.files import Content, WrittenApart, temporary_beside, write_files
from gpumeter.reports.lines_file import LinesSpec
from gpumeter.reports.model import PLATFORM_NAMES, ZERO, Change, Report, Usage, version_label
from gpumeter.reports.period import utc_text

FORMATS = ("html", "csv", "json", "focus")


@dataclass(frozen=True)
class RenderOptions:
    account: str = "gpumeter"  # FOCUS BillingAccountId / ProviderName / InvoiceIssuerName
    service: str = "Kubernetes GPU"  # FOCUS ServiceName
    generated_at: datetime | None = None  # shown in the HTML only
    top: int = 10
    # write text cells of the CSVs and FOCUS exactly, formula-leading ones too (--keep-formulas)
    keep_formulas: bool = False
    focus_version: str = focus.FOCUS_VERSION  # 1.3, 1.4 or 1.2 (--focus-version)


def file_stem(report: Report) -> str:
    by = re.sub(r"[^A-Za-z0-9_.-]+", "-", report.grouping.name.replace(":", "-"))
    return f"gpumeter-{report.period.label}-by-{by}"


def file_names(
    report: Report, formats: tuple[str, ...], focus_version: str = focus.FOCUS_VERSION
) -> dict[str, list[str]]:
    stem = file_stem(report)
    names = {
        "html": [f"{stem}.html"],
        "csv": [f"{stem}.csv", f"gpumeter-{report.period.label}-lines.csv"],
        "json": [f"{stem}.json"],
        "focus": [f"gpumeter-{report.period.label}-focus-{focus_version}.csv"],
    }
    if report.budgets:  # budget against actual per team, when the report has budgets
        names["csv"].append(f"gpumeter-{report.period.label}-budgets.csv")
    return {f: names[f] for f in formats}


# --- small formatting helpers ------------------------------------------------------------------------


def _ratio(value: float | None) -> str:
    return "" if value is None else f"{value:.6f}"


def _qty(value: Decimal) -> str:
    return str(value.quantize(Decimal("0.000001")))


def _change_fields(report: Report, change: Change) -> list[str]:
    return [
        report.money(change.previous),
        report.money(change.delta),
        "" if change.ratio is None else f"{change.ratio:.6f}",
    ]


# --- CSV ------------------------------------------------------------------------------------------------

SUMMARY_HEADER = [
    "period_start",
    "period_end",
    "group_by",
    "group",
    "line",
    "cost",
    "idle_share_cost",
    "currency",
    "gpu_hours",
    "slice_hours",
    "mean_utilization",
    "efficiency",
    "previous_cost",
    "change",
    "change_ratio",
    "price_book_versions",
]
LINES_HEADER = lines_file.HEADER  # the lines CSV's (reports.lines_file)


def csv_text(header: list[str], rows: Iterable[list], *, keep_formulas: bool = False) -> str:
    """A report's CSV: a header row, then the rows, every field quoted (`reports.csvfile`)."""
    return csvfile.text(header, rows, keep_formulas=keep_formulas)


def summary_csv(report: Report, *, keep_formulas: bool = False) -> str:
    out: list[list] = []
    versions = " ".join(version_label(v) for v in report.price_versions)
    head = [utc_text(report.period.start), utc_text(report.period.end), report.grouping.name]

    def row(group: str, line: str, usage: Usage, change: Change, cost: str | None = None):
        out.append(
            [
                *head,
                group,
                line,
                report.money(usage.cost) if cost is None else cost,
                report.money(usage.idle_share),
                report.currency,
                _qty(usage.gpu_hours),
                _qty(usage.slice_hours),
                _ratio(usage.utilization),
                _ratio(usage.efficiency),
                *_change_fields(report, change),
                versions,
            ]
        )

    for group in report.groups:
        row(group.key, LineKind.TENANT, group.usage, group.change)
    for platform in report.platform:
        row(platform.namespace, platform.kind, platform.usage, platform.change)
    for unpriced in report.unpriced:
        usage = Usage(gpu_hours=unpriced.gpu_hours)
        out.append(
            [
                *head,
                f"__unpriced__ {unpriced.model}",
                LineKind.UNPRICED.value,
                "",
                "",
                report.currency,
                _qty(usage.gpu_hours),
            ]
            + [""] * 6  # slice-hours, utilization, efficiency and the change: none for an unpriced model
            + [versions]
        )
    # the total row's gpu_hours counts every GPU-hour the rows above count, the unpriced ones too, so
    # the column adds up; its cost is the priced lines' (an unpriced GPU-hour is billed nothing)
    unpriced_hours = sum((u.gpu_hours for u in report.unpriced), ZERO)
    total = dataclasses.replace(report.total, gpu_hours=report.total.gpu_hours + unpriced_hours)
    row("__total__", "total", total, report.total_change)
    return csv_text(SUMMARY_HEADER, out, keep_formulas=keep_formulas)


def lines_csv(report: Report, *, keep_formulas: bool = False) -> str:
    return "".join(lines_csv_parts(report, keep_formulas=keep_formulas))


def lines_csv_parts(report: Report, *, keep_formulas: bool = False) -> Iterator[str]:
    """The charges' CSV (`lines_csv`) in parts, made as the charges are read (`reports.lines_file`)."""
    return lines_file.parts(report.charges, LinesSpec.of(report, keep_formulas=keep_formulas))


BUDGETS_HEADER = [
    "period_start",
    "period_end",
    "team",
    "budget",
    "actual",
    "remaining",
    "used_ratio",
    "over_budget",
    "currency",
]


def budgets_csv(report: Report, *, keep_formulas: bool = False) -> str:
    """Budget against actual per team: actual = the team's tenant and idle-share lines of the month."""
    return csv_text(
        BUDGETS_HEADER,
        (
            [
                utc_text(report.period.start),
                utc_text(report.period.end),
                row.team,
                report.money(row.budget),
                report.money(row.actual),
                report.money(row.remaining),
                _ratio(row.used),
                "" if row.budget is None else str(row.over).lower(),
                report.currency,
            ]
            for row in report.budgets
        ),
        keep_formulas=keep_formulas,
    )


def _budget(report: Report, row) -> dict:
    return {
        "team": row.team,
        "budget": report.money(row.budget) if row.budget is not None else None,
        "actual": report.money(row.actual),
        "remaining": report.money(row.remaining) if row.remaining is not None else None,
        "used_ratio": None if row.used is None else round(row.used, 6),
        "over_budget": None if row.budget is None else row.over,
    }


def focus_csv(report: Report, options: RenderOptions | None = None) -> str:
    return "".join(focus_csv_parts(report, options))


def focus_csv_parts(report: Report, options: RenderOptions | None = None) -> Iterator[str]:
    """The FOCUS file (`focus_csv`) in parts, made a bucket of charges at a time."""
    options = options or RenderOptions()
    version = options.focus_version
    return focus.report_csv_parts(
        report,
        account=options.account,
        service=options.service,
        version=version,
        keep_formulas=options.keep_formulas,
    )


# --- JSON -----------------------------------------------------------------------------------------------


def _usage(report: Report, usage: Usage) -> dict:
    return {
        "cost": report.money(usage.cost),
        "idle_share_cost": report.money(usage.idle_share),
        "gpu_hours": _qty(usage.gpu_hours),
        "slice_hours": _qty(usage.slice_hours),
        "mean_utilization": None if usage.utilization is None else round(usage.utilization, 6),
        "efficiency": None if usage.efficiency is None else round(usage.efficiency, 6),
    }


def _change(report: Report, change: Change) -> dict:
    return {
        "previous_cost": None if change.previous is None else report.money(change.previous),
        "change": None if change.delta is None else report.money(change.delta),
        "change_ratio": None if change.ratio is None else round(change.ratio, 6),
    }


def _pod(report: Report, pod) -> dict:
    out = {
        "namespace": pod.namespace,
        "pod": pod.pod,
        "team": pod.team,
        "gpu_models": pod.models,
        "mig_profiles": pod.profiles,
        **_usage(report, pod.usage),
    }
    if pod.shared is not None:  # its own use on shared GPUs, not the devices' (docs/billing.md §3.5)
        out["shared_gpu_use"] = _shared(pod.shared)
    out["sharing"] = pod.sharing
    if pod.claims:  # the DRA ResourceClaims it held GPUs through
        out["resource_claims"] = pod.claims
    return out


def _shared(use) -> dict:
    return {
        "hours_with_process_data": use.hours,
        "mean_memory_bytes": int(use.memory_bytes),
        "mean_sm_utilization": None if use.sm is None else round(float(use.sm), 6),
    }


def report_dict(report: Report, pod_list: Callable[[list[tuple[str, str]]], Any] | None = None) -> dict:
    """The JSON document of ``report``; ``pod_list`` writes a sharing mode's pods (default: a list of
    ``{"namespace", "pod"}``; `json_text` leaves a place for each list instead)."""
    out = _report_dict(report, pod_list or _pod_dicts)
    if report.has_clusters:  # a store without a cluster label: the document as before clusters
        # each cluster's unpriced GPU-hours beside its priced ones (a cluster of unpriced GPUs alone
        # costs 0), and each unpriced entry per (model, cluster), naming its cluster
        unpriced = report.cluster_unpriced
        out["clusters"] = [
            {"cluster": name, **_usage(report, usage), "unpriced_gpu_hours": _qty(unpriced.get(name, ZERO))}
            for name, usage in report.clusters
        ]
        out["only_clusters"] = list(report.only_clusters)
        if report.unpriced_by_cluster:
            out["unpriced"] = [
                {"gpu_model": u.model, "cluster": u.cluster, "gpu_hours": _qty(u.gpu_hours), "gpus": u.gpus}
                for u in report.unpriced_by_cluster
            ]
    return out


def _pod_dicts(pods: list[tuple[str, str]]) -> list[dict[str, str]]:
    return [{"namespace": ns, "pod": pod} for ns, pod in pods]


def _report_dict(report: Report, pod_list: Callable[[list[tuple[str, str]]], Any]) -> dict:
    return {
        "schema": "gpumeter.report/1",
        "period": {
            "label": report.period.label,
            "start": utc_text(report.period.start),
            "end": utc_text(report.period.end),
        },
        "previous_period": {
            "label": report.previous_period.label,
            "start": utc_text(report.previous_period.start),
            "end": utc_text(report.previous_period.end),
        },
        "group_by": report.grouping.name,
        "currency": report.currency,
        "grain": report.grain,
        "totals": {
            "all": {**_usage(report, report.total), **_change(report, report.total_change)},
            "tenants": {**_usage(report, report.tenants), **_change(report, report.tenants_change)},
        },
        "groups": [
            {
                "group": g.key,
                **_usage(report, g.usage),
                **_change(report, g.change),
                "namespaces": [{"namespace": ns, **_usage(report, u)} for ns, u in g.namespaces],
                "gpu_models": [
                    {"gpu_model": m, "mig_profile": p, **_usage(report, u)} for m, p, u in g.models
                ],
                "top_pods": [_pod(report, p) for p in g.top_pods],
                "daily": {d.isoformat(): report.money(v) for d, v in g.daily.items()},
            }
            for g in report.groups
        ],
        "platform": [
            {"line": p.kind, "namespace": p.namespace, **_usage(report, p.usage), **_change(report, p.change)}
            for p in report.platform
        ],
        "unpriced": [
            {"gpu_model": u.model, "gpu_hours": _qty(u.gpu_hours), "gpus": u.gpus} for u in report.unpriced
        ],
        "top_pods": [_pod(report, p) for p in report.top_pods],
        "shared_gpu_pods": [_pod(report, p) for p in report.shared_use],
        "sharing_modes": [{"sharing": m.sharing, "pods": pod_list(m.pods)} for m in report.sharing_modes],
        "resource_claims": [
            {"namespace": c.namespace, "claim": c.claim, "sharing": c.sharing, "pods": c.pods}
            for c in report.claims
        ],
        "daily": [
            {"day": d.isoformat(), "costs": {k: report.money(v) for k, v in costs.items()}}
            for d, costs in report.daily
        ],
        "provenance": {
            "price_book_versions": [
                {
                    "id": v.id,
                    "label": version_label(v),
                    "digest": v.digest,
                    "path": v.path,
                    "effective_from": utc_text(v.effective_from),
                    "effective_to": None if v.effective_to is None else utc_text(v.effective_to),
                    "source": v.source,
                    "rates": v.body.get("rates", {}),
                    "slice_weight": v.body.get("slice_weight"),
                    "idle": v.body.get("idle"),
                    "sharing_efficiency": v.body.get("sharing_efficiency", {}),
                }
                for v in report.price_versions
            ],
            "ingest_runs": report.ingest.as_dict(),
        },
    }


def json_text(report: Report) -> str:
    # Each sharing mode lists every pod that held a GPU so (~760,000 in a month of 10,000 GPUs, 94 % of
    # the file). `indent` makes json use its Python encoder, one generator step a token: the lists are
    # written apart, each name by json's own string encoder, and put in their places' indentation.
    listed: list[list[tuple[str, str]]] = []

    def place(pods: list[tuple[str, str]]) -> str | list:
        if not pods:
            return []
        listed.append(pods)
        return _POD_LIST.format(len(listed) - 1)

    doc = report_dict(report, place)
    if report.budgets:  # only with budgets: a report without keeps its bytes
        doc["budgets"] = [_budget(report, row) for row in report.budgets]
    if report.billed_changes:  # likewise only for a period changed after billing
        doc["provenance"]["billed_hours_changed"] = [c.as_dict() for c in report.billed_changes]
    if report.ingest.refused:  # and for one with GPU-hours a refused reading left unbilled
        doc["provenance"]["ingest_runs"]["refused_gpu_hours"] = report.ingest.refused_dicts()
    text = json.dumps(doc, indent=1, sort_keys=True, ensure_ascii=False)
    where = text.find('\n "sharing_modes": ')  # the slots are in this key's value, in order
    for at, pods in enumerate(listed):
        slot = json.encoder.encode_basestring(_POD_LIST.format(at))
        where = text.index(slot, where)
        indent = where - text.rindex("\n", 0, where) - 1 - len('"pods": ')
        written = _pod_list(pods, indent)
        text = text[:where] + written + text[where + len(slot) :]
        where += len(written)
    return text + "\n"


_POD_LIST = "\ue000pods {}\ue001"  # a list's place in the document, as no name is written


def _pod_list(pods: list[tuple[str, str]], indent: int) -> str:
    """``[{"namespace": …, "pod": …}, …]`` as `json.dumps(…, indent=1, sort_keys=True,
    ensure_ascii=False)` writes it as the value of a key indented ``indent`` spaces."""
    quoted = json.encoder.encode_basestring  # what ensure_ascii=False encodes a string with
    item, key = " " * (indent + 1), " " * (indent + 2)
    rows = ",\n".join(
        f'{item}{{\n{key}"namespace": {quoted(namespace)},\n{key}"pod": {quoted(pod)}\n{item}}}'
        for namespace, pod in pods
    )
    return f"[\n{rows}\n{' ' * indent}]"


# --- HTML -----------------------------------------------------------------------------------------------


@lru_cache(maxsize=1)
def _environment() -> Environment:
    env = Environment(
        loader=PackageLoader("gpumeter.reports", "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    return env


# Every template the reports render (reports/templates/, package data).
TEMPLATES = ("report.html.j2", "health.html.j2", "allocations.html.j2")


def check_templates() -> None:
    """Load every template and plotly's script: raises what the first HTML report would."""
    for name in TEMPLATES:
        _environment().get_template(name)
    plotly_js()


@lru_cache(maxsize=1)
def plotly_js() -> str:
    from plotly.offline import get_plotlyjs

    js = get_plotlyjs()
    if "</script" in js.lower():  # never true for plotly.min.js; guard the inline embedding anyway
        js = re.sub(r"</(script)", r"<\\/\1", js, flags=re.IGNORECASE)
    return js


def script_json(value) -> str:
    """JSON safe inside a <script> element: no '<', '>', '&' or line separators appear raw."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    for raw, escaped in (
        ("<", "\\u003c"),
        (">", "\\u003e"),
        ("&", "\\u0026"),
        ("\u2028", "\\u2028"),
        ("\u2029", "\\u2029"),
    ):
        text = text.replace(raw, escaped)
    return text


PALETTE = [
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#17becf",
    "#bcbd22",
    "#7f7f7f",
]
PLATFORM_COLOURS = {
    "__unallocated__": "#b0b0b0",
    "__stranded__": "#6b6b6b",
    "__sharing_shortfall__": "#d9b38c",
    "__utilization_shortfall__": "#c9a0dc",
}


def chart_text(value: str) -> str:
    """A string as plotly draws it literally. plotly reads a subset of HTML in every text it draws
    (titles, legend names, axis categories, pie labels, hover): a team named
    `<a href="…">Pay here</a>` became a link in the chart. Its entities `&amp;`, `&lt;`, `&gt;` stand
    for the characters, so escaping those three leaves no tag to parse and shows the name as given."""
    return value.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _layout(title: str, **extra) -> dict:
    return {
        "title": {"text": chart_text(title), "font": {"size": 15}},
        "margin": {"l": 60, "r": 20, "t": 50, "b": 60},
        "height": 360,
        "paper_bgcolor": "#ffffff",
        "plot_bgcolor": "#ffffff",
        "font": {"family": "Helvetica, Arial, sans-serif", "size": 12},
        **extra,
    }


def _charts(report: Report, top: int) -> tuple[list[dict], dict[str, list[dict]]]:
    cur = report.currency
    keys = report.group_keys
    shown = keys[:8]
    summary: list[dict] = []
    # 1. cost by group, with platform lines
    labels = [chart_text(k) for k in [*keys[:20], *[p.namespace for p in report.platform]]]
    costs = [float(g.usage.cost) for g in report.groups[:20]] + [float(p.usage.cost) for p in report.platform]
    colours = [PALETTE[0]] * min(20, len(keys)) + [
        PLATFORM_COLOURS.get(p.namespace, "#999") for p in report.platform
    ]
    summary.append(
        {
            "id": "chart-cost-by-group",
            "data": [
                {
                    "type": "bar",
                    "orientation": "h",
                    "y": labels[::-1],
                    "x": costs[::-1],
                    "marker": {"color": colours[::-1]},
                    "hovertemplate": "%{y}: %{x:,.2f} " + chart_text(cur) + "<extra></extra>",
                }
            ],
            "layout": _layout(
                f"Cost by {report.grouping.title} ({cur})",
                height=max(300, 28 * len(labels) + 90),
                margin={"l": 200, "r": 20, "t": 50, "b": 40},
            ),
        }
    )
    # 2. day-by-day trend, stacked
    days = [d.isoformat() for d, _ in report.daily]
    traces = []
    for i, key in enumerate(shown):
        traces.append(
            {
                "type": "bar",
                "name": chart_text(key),
                "x": days,
                "y": [float(costs_of.get(key, 0)) for _, costs_of in report.daily],
                "marker": {"color": PALETTE[i % len(PALETTE)]},
            }
        )
    if len(keys) > len(shown):
        rest = set(keys[len(shown) :])
        traces.append(
            {
                "type": "bar",
                "name": "other",
                "x": days,
                "y": [
                    float(sum((v for k, v in c.items() if k in rest), Decimal(0))) for _, c in report.daily
                ],
                "marker": {"color": "#c7c7c7"},
            }
        )
    for name in PLATFORM_NAMES.values():
        if any(name in c for _, c in report.daily):
            traces.append(
                {
                    "type": "bar",
                    "name": chart_text(name),
                    "x": days,
                    "y": [float(c.get(name, 0)) for _, c in report.daily],
                    "marker": {"color": PLATFORM_COLOURS[name]},
                }
            )
    summary.append(
        {
            "id": "chart-daily",
            "data": traces,
            "layout": _layout(
                f"Cost per day ({cur})", barmode="stack", legend={"orientation": "h", "y": -0.25}
            ),
        }
    )
    # 3. where the money went
    split_labels = ["tenants", *[p.namespace for p in report.platform]]
    split_values = [float(report.tenants.cost), *[float(p.usage.cost) for p in report.platform]]
    summary.append(
        {
            "id": "chart-split",
            "data": [
                {
                    "type": "pie",
                    "hole": 0.45,
                    "labels": [chart_text(label) for label in split_labels],
                    "values": split_values,
                    "sort": False,
                    "marker": {
                        "colors": [PALETTE[0], *[PLATFORM_COLOURS.get(n, "#999") for n in split_labels[1:]]]
                    },
                }
            ],
            "layout": _layout(f"Where the money went ({cur})"),
        }
    )
    per_group: dict[str, list[dict]] = {}
    for index, group in enumerate(report.groups):
        if not group.usage.lines:
            continue
        charts = [
            {
                "id": f"chart-g{index}-daily",
                "data": [
                    {
                        "type": "bar",
                        "x": days,
                        "y": [float(group.daily.get(d, 0)) for d, _ in report.daily],
                        "marker": {"color": PALETTE[index % len(PALETTE)]},
                        "name": chart_text(group.key),
                    }
                ],
                "layout": _layout(f"Cost per day ({cur})", height=300),
            },
            {
                "id": f"chart-g{index}-models",
                "data": [
                    {
                        "type": "bar",
                        "x": [chart_text(f"{m} {p}") for m, p, _ in group.models[:top]],
                        "y": [float(u.cost) for _, _, u in group.models[:top]],
                        "marker": {"color": PALETTE[(index + 1) % len(PALETTE)]},
                        "name": "cost",
                    }
                ],
                "layout": _layout(f"Cost by GPU model and MIG profile ({cur})", height=300),
            },
        ]
        per_group[group.key] = charts
    return summary, per_group


def html_text(report: Report, options: RenderOptions | None = None) -> str:
    options = options or RenderOptions()
    summary_charts, group_charts = _charts(report, options.top)
    template = _environment().get_template("report.html.j2")
    return template.render(
        r=report,
        options=options,
        generated_at=utc_text(options.generated_at) if options.generated_at else None,
        summary_charts=summary_charts,
        group_charts=group_charts,
        chart_count=len(summary_charts) + sum(len(c) for c in group_charts.values()),
        plotly_js=plotly_js(),
        script_json=script_json,
        money=lambda v: "" if v is None else f"{Decimal(report.money(v)):,}",
        qty=lambda v: f"{v:,.2f}",
        pct=lambda v: "–" if v is None else f"{v * 100:.1f} %",
        version_label=version_label,
        ts=utc_text,
    )


# --- writing files ------------------------------------------------------------------------------------


# what has another process write the lines CSV of the report's period (`SumsWorker.write_lines`): into
# a temporary file, for the report's clusters; returns what waits for it and gives its SHA-256
LinesApart = Callable[[Path, LinesSpec, tuple[str, ...]], Callable[[], str]]


def render(
    report: Report,
    out_dir: str | Path,
    formats: tuple[str, ...] = FORMATS,
    options=None,
    *,
    lines_apart: LinesApart | None = None,
) -> dict[str, str]:
    """Write the report's files into ``out_dir``; returns {file name: sha256 hex}. With
    ``lines_apart``, the lines CSV is written by another process from the same lines while this one
    makes the other files, and put in place after them."""
    options = options or RenderOptions()
    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        raise ValueError(f"format: expected some of {', '.join(FORMATS)} (value {','.join(unknown)!r})")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    names = file_names(report, formats, options.focus_version)
    keep = options.keep_formulas
    texts: dict[str, Content] = {}
    apart: dict[str, WrittenApart] = {}
    if lines_apart is not None and "csv" in formats:  # asked first: it is written beside all the rest
        name = names["csv"][1]
        temporary = temporary_beside(out / name)
        try:
            spec = LinesSpec.of(report, keep_formulas=keep)
            apart[name] = WrittenApart(temporary, lines_apart(temporary, spec, report.only_clusters))
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise
    try:
        for fmt in formats:
            if fmt == "html":
                texts[names["html"][0]] = html_text(report, options)
            elif fmt == "csv":
                texts[names["csv"][0]] = summary_csv(report, keep_formulas=keep)
                if names["csv"][1] not in apart:
                    texts[names["csv"][1]] = functools.partial(lines_csv_parts, report, keep_formulas=keep)
                if report.budgets:
                    texts[names["csv"][2]] = budgets_csv(report, keep_formulas=keep)
            elif fmt == "json":
                texts[names["json"][0]] = json_text(report)
            elif fmt == "focus":
                texts[names["focus"][0]] = functools.partial(focus_csv_parts, report, options)
    except BaseException:
        for file in apart.values():
            file.discard()
        raise
    return write_files(out, {**texts, **apart})
