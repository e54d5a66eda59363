"""Tenant-controlled strings (namespace, pod, team and label values) are inert in HTML, quoted in CSV
and exact in JSON and FOCUS, on SQLite and PostgreSQL."""

from __future__ import annotations

import csv
import io
import json

from gpumeter.billing.allocate import price_gpu_hour
from gpumeter.billing.ledger.base import HourRecord
from gpumeter.reports import focus
from gpumeter.reports.model import Grouping, build_report, month_period
from gpumeter.reports.render import html_text, render
from gpumeter.reports.run import load_labels
from tests.billing.factories import A100, HOUR0, alloc, book, gpu_hour, mig
from tests.reports.helpers import html_tables, read_csv

SCRIPT = "<script>alert(1)</script>"
DROP = '"; DROP TABLE cost_lines; --'
IMG = "<img src=x onerror=alert(2)>"
BREAKOUT = "</script><script>alert(3)</script>"
FORMULA = '=HYPERLINK("http://evil","x")'


def _evil_ledger(ledger, tmp_path):
    prices = book(tmp_path, {"A100-40GB": {"hourly_rate": "3.00"}})
    u = "GPU-e"
    gh = gpu_hour(
        u,
        A100,
        [mig(u, "1", "3g.20gb"), mig(u, "2", "3g.20gb")],
        [
            alloc(u, SCRIPT, DROP, gi="1", profile="3g.20gb"),
            alloc(u, FORMULA, "pod-2", gi="2", profile="3g.20gb"),
        ],
    )
    lines = price_gpu_hour(gh, prices, {SCRIPT: IMG, FORMULA: "finance"}).lines
    ledger.write_hour(HourRecord(HOUR0, [gh], lines, prices))
    labels_file = tmp_path / "labels.yaml"
    labels_file.write_text(json.dumps({"namespaces": {SCRIPT: {"cost-center": BREAKOUT}}}))
    return load_labels(labels_file)


def _script_tags(text: str) -> int:
    return text.lower().count("<script")


def test_html_shows_tenant_strings_as_text_only(ledger, tmp_path):
    labels = _evil_ledger(ledger, tmp_path)
    period = month_period("2026-11")
    for grouping in (Grouping.parse("team"), Grouping.parse("label:cost-center", labels)):
        report = build_report(ledger, period, grouping)
        text = html_text(report)
        for evil in (SCRIPT, IMG, BREAKOUT, DROP):
            assert evil not in text, evil
        # the page's own scripts only: the error hook, one per chart's JSON, plotly.js, the renderer
        charts = text.count('class="chart-data"')
        assert charts >= 3
        assert _script_tags(text) == 3 + charts
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
        # inside chart JSON, entity-escaped for plotly (which reads tags in what it draws), then
        # JSON-escaped for the <script> element
        assert "\\u0026lt;script\\u0026gt;" in text or grouping.name == "team"
        tables = html_tables(text)
        shown = {cell for row in tables["groups"] + tables["top-pods"] for cell in row}
        assert DROP in shown  # displayed, as text
        if grouping.name == "team":
            assert IMG in shown and SCRIPT in shown
            assert "\\u0026lt;img src=x onerror=alert(2)\\u0026gt;" in text  # the team in chart JSON
        else:
            assert BREAKOUT in shown
            assert "\\u0026lt;/script\\u0026gt;\\u0026lt;script\\u0026gt;alert(3)" in text


def test_csv_quotes_tenant_strings_and_defuses_formulas(ledger, tmp_path):
    _evil_ledger(ledger, tmp_path)
    report = build_report(ledger, month_period("2026-11"), "namespace")
    render(report, tmp_path / "out", ("csv", "json", "focus"))
    out = tmp_path / "out"
    summary = (out / "gpumeter-2026-11-by-namespace.csv").read_text()
    lines_text = (out / "gpumeter-2026-11-lines.csv").read_text()
    # every field quoted; the quote in the pod name doubled
    assert f'"{SCRIPT}"' in summary
    assert '"""; DROP TABLE cost_lines; --"' in lines_text
    for line in lines_text.splitlines():
        assert line.startswith('"') and line.endswith('"')
    rows = read_csv(out / "gpumeter-2026-11-lines.csv")
    assert {r["pod"] for r in rows if r["namespace"] == SCRIPT} == {DROP}
    # a spreadsheet formula in a namespace name is defused with a leading apostrophe
    assert {r["namespace"] for r in rows if r["pod"] == "pod-2"} == {"'" + FORMULA}
    # FOCUS keeps the exact values (machine-readable), quoted where CSV needs it, and stays valid
    focus_path = out / "gpumeter-2026-11-focus-1.2.csv"
    assert focus.check_file(focus_path) == []
    focus_rows = list(csv.DictReader(io.StringIO(focus_path.read_text(), newline="")))
    assert {(r["x_Namespace"], r["x_Pod"]) for r in focus_rows if r["x_LineKind"] == "tenant"} == {
        (SCRIPT, DROP),
        (FORMULA, "pod-2"),
    }
    assert '"""; DROP TABLE cost_lines; --"' in focus_path.read_text()
    doc = json.loads((out / "gpumeter-2026-11-by-namespace.json").read_text())
    assert {g["group"] for g in doc["groups"]} == {SCRIPT, FORMULA}
    assert ledger.counts()["cost_lines"] == 3  # the ledger is intact
