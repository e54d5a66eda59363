"""Rendering a HealthReport: HTML (the chargeback report's Jinja2 environment, autoescaped, plotly.js
inline once), CSV (every field quoted, formulas neutralised) and JSON. Same rules as reports.render:
no clock or locale in CSV/JSON, sorted rows, LF line ends."""

from __future__ import annotations

import json
from datetime import datetime
from decimal import Decimal
from pathlib import Path

from gpumeter import contract
from gpumeter.reports.files import write_files
from gpumeter.reports.health import (
    IDLE_BELOW,
    MATURITY,
    SPARE_POLICY,
    UTILIZATION_GOAL,
    XID_CLASSES,
    HealthReport,
    Incidents,
    PoolCapacity,
)
from gpumeter.reports.period import utc_text
from gpumeter.reports.render import (
    PALETTE,
    _environment,
    _layout,
    chart_text,
    csv_text,
    plotly_js,
    script_json,
)

FORMATS = ("html", "csv", "json")


def file_names(report: HealthReport, formats: tuple[str, ...]) -> dict[str, list[str]]:
    stem = f"gpumeter-health-{report.period.label}"
    names = {
        "html": [f"{stem}.html"],
        "csv": [f"{stem}-pools.csv", f"{stem}-gpus.csv", f"{stem}-teams.csv"],
        "json": [f"{stem}.json"],
    }
    return {f: names[f] for f in formats}


def _num(value: float | None, places: int = 6) -> str:
    return "" if value is None else f"{value:.{places}f}"


def _incidents(i: Incidents) -> dict:
    return {
        "gpus": i.gpus,
        "mean_utilization": None if i.utilization is None else round(i.utilization, 6),
        "gpus_measured": i.measured,
        "utilization_sources": {name: n for name, n in i.sources.items() if name},
        "maturity_level": i.maturity,
        "xid_events": dict(i.xids),
        "lost_gpus": i.lost_gpus,
        "lost_incidents": i.lost_incidents,
        "lost_hours": round(i.lost_hours, 6),
        "remapped_rows": i.remapped_rows,
        "retired_pages": i.retired_pages,
        "gpus_with_pending_remap_or_retirement": i.pending,
        "thermal_slowdown_hours": round(i.thermal_hours, 6),
        "node_outages": i.node_outages,
        "node_down_hours": round(i.node_down_hours, 6),
        "gpu_hours_in_service": i.hours_up,
        "failures": i.failures,
        "mtbf_hours": None if i.mtbf_hours is None else round(i.mtbf_hours, 6),
        "failures_per_1000_gpu_hours": None
        if i.failures_per_1000_gpu_hours is None
        else round(i.failures_per_1000_gpu_hours, 6),
        "annualized_failure_rate": None
        if i.annualized_failure_rate is None
        else round(i.annualized_failure_rate, 6),
    }


def _capacity(c: PoolCapacity) -> dict:
    return {
        "spare_policy": c.policy,
        "gpu_hours_billed": c.gpu_hours,
        "gpu_hours_held": str(c.held),
        "headroom": _round(c.headroom),
        "hours": c.hours,
        "mean_spare_gpus": _round(c.mean_spare),
        "min_spare_gpus": c.min_spare,
        "hours_below_spare_policy": c.hours_below_policy,
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 6)


def report_dict(report: HealthReport) -> dict:
    out = _report_dict(report)
    if report.clusters:  # a store without a cluster label: the document as before clusters
        out["clusters"] = [{"cluster": name, **_incidents(i)} for name, i in report.clusters]
        for gpu, health in zip(out["gpus"], report.gpus, strict=True):
            gpu["cluster"] = health.cluster
    return out


def _report_dict(report: HealthReport) -> dict:
    idle_hours, idle_cost = report.waste
    return {
        "schema": "gpumeter.health/1",
        "period": {
            "label": report.period.label,
            "start": utc_text(report.period.start),
            "end": utc_text(report.period.end),
        },
        "prometheus": report.source,
        "currency": report.currency,
        "fleet": _incidents(report.fleet),
        "pools": [{"pool": name, **_incidents(i)} for name, i in report.pools],
        "pool_capacity": [{"pool": name, **_capacity(c)} for name, c in sorted(report.capacity.items())],
        "nodes": [{"node": name, **_incidents(i)} for name, i in report.nodes],
        "teams": [
            {
                "team": t.team,
                "gpu_hours": str(t.gpu_hours),
                "cost": report.money(t.cost),
                "mean_utilization": None if t.utilization is None else round(t.utilization, 6),
                "maturity_level": t.maturity,
                "unmeasured_gpu_hours": str(t.unmeasured_hours),
                "idle_gpu_hours": str(t.idle_hours),
                "idle_cost": report.money(t.idle_cost),
            }
            for t in report.teams
        ],
        "waste": {
            "idle_gpu_hours": str(idle_hours),
            "idle_cost": report.money(idle_cost),
            "idle_below": IDLE_BELOW,
        },
        "rma_candidates": [
            {"uuid": g.uuid, "model": g.model, "node": g.hostname, "reasons": g.rma_reasons}
            for g in report.rma
        ],
        "gpus": [
            {
                "uuid": g.uuid,
                "model": g.model,
                "node": g.hostname,
                "hours_in_service": g.hours_up,
                "mean_utilization": None if g.utilization is None else round(g.utilization, 6),
                "utilization_source": g.utilization_source or None,
                "pool": g.pool or g.model,
                "xids": {str(code): n for code, n in sorted(g.xids.items())},
                "lost_incidents": g.lost_incidents,
                "lost_hours": round(g.lost_hours, 6),
                "remapped_rows": dict(sorted(g.remapped_rows.items())),
                "remap_pending": g.remap_pending,
                "remap_failure": g.remap_failure,
                "retired_pages": dict(sorted(g.retired_pages.items())),
                "retired_pages_total": dict(sorted(g.retired_total.items())),
                "retired_pending": g.retired_pending,
                "thermal_slowdown_hours": round(g.thermal_hours, 6),
                "failures": g.failures,
                "rma_reasons": g.rma_reasons,
            }
            for g in report.gpus
        ],
    }


def json_text(report: HealthReport) -> str:
    return json.dumps(report_dict(report), indent=1, sort_keys=True, ensure_ascii=False) + "\n"


POOL_HEADER = [
    "period_start",
    "period_end",
    "level",
    "name",
    "gpus",
    "mean_utilization",
    "maturity_level",
    *(f"xid_{c}" for c in XID_CLASSES),
    "lost_gpus",
    "lost_incidents",
    "lost_hours",
    "remapped_rows",
    "retired_pages",
    "thermal_slowdown_hours",
    "node_outages",
    "node_down_hours",
    "gpu_hours_in_service",
    "failures",
    "mtbf_hours",
    "annualized_failure_rate",
    # a pool's capacity, from the ledger (pool rows only: the spare policy is kept per pool)
    "gpu_hours_billed",
    "gpu_hours_held",
    "headroom",
    "mean_spare_gpus",
    "min_spare_gpus",
    "hours_below_spare_policy",
    "spare_policy",
]


def pools_csv(report: HealthReport) -> str:
    head = [utc_text(report.period.start), utc_text(report.period.end)]
    rows = [("pool", n, i) for n, i in report.pools] + [("node", n, i) for n, i in report.nodes]
    capacity = {("pool", name): c for name, c in report.capacity.items()}
    return csv_text(
        POOL_HEADER,
        (
            [
                *head,
                level,
                name,
                i.gpus,
                _num(i.utilization),
                i.maturity or "",
                *(i.xids[c] for c in XID_CLASSES),
                i.lost_gpus,
                i.lost_incidents,
                _num(i.lost_hours),
                i.remapped_rows,
                i.retired_pages,
                _num(i.thermal_hours),
                i.node_outages,
                _num(i.node_down_hours),
                i.hours_up,
                i.failures,
                _num(i.mtbf_hours),
                _num(i.annualized_failure_rate),
                *_capacity_cells(capacity.get((level, name))),
            ]
            for level, name, i in [*rows, ("fleet", "__fleet__", report.fleet)]
        ),
    )


def _capacity_cells(c: PoolCapacity | None) -> list:
    if c is None:
        return [""] * 7
    return [
        c.gpu_hours,
        c.held,
        _num(c.headroom),
        _num(c.mean_spare),
        "" if c.min_spare is None else c.min_spare,
        c.hours_below_policy,
        c.policy,
    ]


def gpus_csv(report: HealthReport) -> str:
    clustered = bool(report.clusters)  # a first cluster column only where the store labels clusters
    return csv_text(
        [
            *(["cluster"] if clustered else []),
            "uuid",
            "model",
            "node",
            "hours_in_service",
            "mean_utilization",
            "utilization_source",
            "xids",
            "lost_incidents",
            "lost_hours",
            "remapped_rows",
            "retired_pages",
            "thermal_slowdown_hours",
            "failures",
            "rma_reasons",
        ],
        (
            [
                *([g.cluster] if clustered else []),
                g.uuid,
                g.model,
                g.hostname,
                g.hours_up,
                _num(g.utilization),
                g.utilization_source,
                " ".join(f"{code}:{n}" for code, n in sorted(g.xids.items())),
                g.lost_incidents,
                _num(g.lost_hours),
                sum(g.remapped_rows.values()),
                sum(g.retired_pages.values()),
                _num(g.thermal_hours),
                g.failures,
                "; ".join(g.rma_reasons),
            ]
            for g in report.gpus
        ),
    )


def teams_csv(report: HealthReport) -> str:
    return csv_text(
        [
            "team",
            "gpu_hours",
            "cost",
            "currency",
            "mean_utilization",
            "maturity_level",
            "unmeasured_gpu_hours",
            "idle_gpu_hours",
            "idle_cost",
        ],
        (
            [
                t.team,
                str(t.gpu_hours),
                report.money(t.cost),
                report.currency,
                _num(t.utilization),
                t.maturity or "",
                str(t.unmeasured_hours),
                str(t.idle_hours),
                report.money(t.idle_cost),
            ]
            for t in report.teams
        ),
    )


def _charts(report: HealthReport) -> list[dict]:
    charts = []
    named = [(f"pool {n}", i.utilization) for n, i in report.pools] + [
        (f"team {t.team}", t.utilization) for t in report.teams
    ]
    named = [(n, u) for n, u in named if u is not None]
    if named:
        charts.append(
            {
                "id": "chart-utilization",
                "data": [
                    {
                        "type": "bar",
                        "orientation": "h",
                        "y": [chart_text(n) for n, _ in named][::-1],
                        "x": [u for _, u in named][::-1],
                        "marker": {"color": PALETTE[0]},
                        "hovertemplate": "%{y}: %{x:.1%}<extra></extra>",
                    }
                ],
                "layout": _layout(
                    "Mean utilization against the 80 % goal",
                    height=max(300, 28 * len(named) + 90),
                    margin={"l": 220, "r": 20, "t": 50, "b": 40},
                    xaxis={"range": [0, 1], "tickformat": ".0%"},
                    shapes=[
                        {
                            "type": "line",
                            "x0": UTILIZATION_GOAL,
                            "x1": UTILIZATION_GOAL,
                            "yref": "paper",
                            "y0": 0,
                            "y1": 1,
                            "line": {"color": "#2ca02c", "dash": "dash"},
                        }
                    ],
                ),
            }
        )
    wasting = [t for t in report.teams if t.idle_cost > 0 or t.idle_hours > 0]
    if wasting:
        charts.append(
            {
                "id": "chart-waste",
                "data": [
                    {
                        "type": "bar",
                        "x": [chart_text(t.team) for t in wasting],
                        "y": [float(t.idle_cost) for t in wasting],
                        "marker": {"color": PALETTE[3]},
                        "name": "idle cost",
                    }
                ],
                "layout": _layout(f"Allocated but idle: cost by team ({chart_text(report.currency)})"),
            }
        )
    return charts


def html_text(report: HealthReport, generated_at: datetime | None = None) -> str:
    template = _environment().get_template("health.html.j2")
    return template.render(
        r=report,
        fleet=report.fleet,
        pools=report.pools,
        nodes=report.nodes,
        # by cluster first, where the store labels clusters
        incident_groups=[
            *([("By cluster", report.clusters, "incidents-cluster")] if report.clusters else []),
            ("By GPU model", report.pools, "incidents-model"),
            ("By node", report.nodes, "incidents-node"),
        ],
        rma=report.rma,
        waste=report.waste,
        classes=XID_CLASSES,
        maturity=MATURITY,
        idle_below=IDLE_BELOW,
        goal=UTILIZATION_GOAL,
        charts=_charts(report),
        generated_at=utc_text(generated_at) if generated_at else None,
        plotly_js=plotly_js(),
        script_json=script_json,
        ts=utc_text,
        money=lambda v: f"{Decimal(report.money(v)):,}",
        qty=lambda v: "–" if v is None else f"{v:,.2f}",
        pct=lambda v: "–" if v is None else f"{v * 100:.1f} %",
    )


def render(
    report: HealthReport, out_dir: str | Path, formats: tuple[str, ...] = FORMATS, generated_at=None
) -> dict[str, str]:
    """Write the report's files into ``out_dir``; returns {file name: sha256 hex}."""
    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        raise ValueError(f"format: expected some of {', '.join(FORMATS)} (value {','.join(unknown)!r})")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    names = file_names(report, formats)
    texts: dict[str, str] = {}
    for fmt in formats:
        if fmt == "html":
            texts[names["html"][0]] = html_text(report, generated_at)
        elif fmt == "csv":
            for name, text in zip(
                names["csv"], (pools_csv(report), gpus_csv(report), teams_csv(report)), strict=True
            ):
                texts[name] = text
        elif fmt == "json":
            texts[names["json"][0]] = json_text(report)
    return write_files(out, texts)


MANIFEST = "manifest-health.json"


def generate(
    client,
    ledger,
    period,
    formats: tuple[str, ...],
    out_dir: str | Path,
    *,
    trigger: str = "cli",
    now: datetime | None = None,
    record: bool = True,
    spare_policy: float | None = None,  # None: SPARE_POLICY (seed 002's 10 %)
    cluster_label: str = contract.CLUSTER_LABEL,
):
    """Build the health report, write its files and ``manifest-health.json`` (beside a chargeback
    report's ``manifest.json`` in the same directory), and record the run in ``report_runs`` with
    grouping ``health``. Returns (report, {file: sha256}, run id)."""
    from datetime import UTC

    from gpumeter.reports.health import build_health
    from gpumeter.reports.model import ReportError
    from gpumeter.reports.run import finish_run, output_directory

    now = now or datetime.now(UTC)
    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        raise ReportError(f"format: the health report has {', '.join(FORMATS)} (value {','.join(unknown)!r})")
    out = output_directory(out_dir)
    report = build_health(
        client, ledger, period, SPARE_POLICY if spare_policy is None else spare_policy, cluster_label
    )
    files = render(report, out, formats, now)
    manifest = {
        "report": "health",
        "period": {"label": period.label, "start": period.start.isoformat(), "end": period.end.isoformat()},
        "prometheus": report.source,
        "generated_at": now.isoformat(),
        "trigger": trigger,
        "files": files,
    }
    run_id = finish_run(
        ledger,
        out / MANIFEST,
        manifest,
        period=period,
        now=now,
        trigger=trigger,
        grouping="health",
        versions=[],
        ingest_runs={},
        record=record,
    )
    return report, files, run_id
