"""Tenant-controlled strings (namespace, pod, team and label values) are inert in HTML, quoted (RFC
4180) and defused in every CSV including FOCUS, and exact in JSON, on SQLite and PostgreSQL."""

from __future__ import annotations

import csv
import io
import json
from decimal import Decimal

from gpumeter.billing.allocate import price_gpu_hour
from gpumeter.billing.config import Budget
from gpumeter.billing.ledger.base import HourRecord
from gpumeter.reports import csvfile, focus
from gpumeter.reports.model import Grouping, build_report, month_period
from gpumeter.reports.render import RenderOptions, html_text, render
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
    # FOCUS defuses it too, quotes where CSV needs it, and stays valid
    focus_path = out / "gpumeter-2026-11-focus-1.3.csv"
    assert focus.check_file(focus_path) == []
    focus_rows = list(csv.DictReader(io.StringIO(focus_path.read_text(), newline="")))
    assert {(r["x_Namespace"], r["x_Pod"]) for r in focus_rows if r["x_LineKind"] == "tenant"} == {
        (SCRIPT, DROP),
        ("'" + FORMULA, "pod-2"),
    }
    assert '"""; DROP TABLE cost_lines; --"' in focus_path.read_text()
    doc = json.loads((out / "gpumeter-2026-11-by-namespace.json").read_text())
    assert {g["group"] for g in doc["groups"]} == {SCRIPT, FORMULA}
    assert ledger.counts()["cost_lines"] == 3  # the ledger is intact


# A team name with a bare CR, a bare LF and a quote, and one that is a formula (issue 42, point 8):
# written unquoted, the CR split a FOCUS row in two, and `=2+2` reached a spreadsheet as a formula.
FORGED_TEAM = 'ops\r=2+2,"x"\nBilledCost'
FORMULA_TEAM = "=2+2"


def _forged_ledger(ledger, tmp_path):
    prices = book(tmp_path, {"A100-40GB": {"hourly_rate": "3.00"}})
    u = "GPU-f"
    gh = gpu_hour(
        u,
        A100,
        [mig(u, "1", "3g.20gb"), mig(u, "2", "3g.20gb")],
        [
            alloc(u, "ns-cr", "p1", gi="1", profile="3g.20gb"),
            alloc(u, "ns-eq", "p2", gi="2", profile="3g.20gb"),
        ],
    )
    lines = price_gpu_hour(gh, prices, {"ns-cr": FORGED_TEAM, "ns-eq": FORMULA_TEAM}).lines
    ledger.write_hour(HourRecord(HOUR0, [gh], lines, prices))
    return len(lines)


def _records(path) -> list[list[str]]:
    """The records of a CSV file as an RFC 4180 reader sees them (CR and LF both end a record)."""
    return list(csv.reader(io.StringIO(path.read_bytes().decode("utf-8"), newline="")))


def test_every_csv_quotes_a_bare_cr_and_defuses_formulas(ledger, tmp_path):
    count = _forged_ledger(ledger, tmp_path)  # 2 tenants + stranded
    budgets = {FORGED_TEAM: Budget(team=FORGED_TEAM, amount=Decimal("10"), currency="USD")}
    report = build_report(ledger, month_period("2026-11"), "team", budgets=budgets)
    out = tmp_path / "out"
    render(report, out, ("csv", "focus"))
    files = {
        "lines": (out / "gpumeter-2026-11-lines.csv", count, "team"),
        "summary": (out / "gpumeter-2026-11-by-team.csv", None, "group"),
        "budgets": (out / "gpumeter-2026-11-budgets.csv", 2, "team"),
        "focus": (out / "gpumeter-2026-11-focus-1.3.csv", count, "x_Team"),
    }
    for name, (path, rows, team_column) in files.items():
        raw = path.read_bytes()
        assert raw.endswith(b"\r\n") and b"\r\n" in raw, name  # RFC 4180 line ends
        records = _records(path)
        header = records[0]
        assert all(len(r) == len(header) for r in records), (name, [len(r) for r in records])
        if rows is not None:
            assert len(records) == 1 + rows, (name, len(records))
        teams = {r[header.index(team_column)] for r in records[1:]}
        assert {"'" + FORMULA_TEAM, FORGED_TEAM} <= teams, (name, teams)
        # no text cell a spreadsheet would evaluate: only plain numbers start with - (none here)
        assert not [c for r in records for c in r if csvfile.is_formula(c)], name
    assert focus.check_file(files["focus"][0]) == []
    # each team's one FOCUS row carries its cost: example (d) of docs/billing.md, 1.28 / 1.29 with
    # the tie in turns by the hour, 0.43 stranded, 3.00 in all
    focus_rows = list(csv.DictReader(io.StringIO(files["focus"][0].read_bytes().decode(), newline="")))
    cost = {r["x_Team"] or r["x_LineKind"]: r["BilledCost"] for r in focus_rows}
    assert sorted(cost.values()) == ["0.43", "1.28", "1.29"] and set(cost) == {
        FORGED_TEAM,
        "'" + FORMULA_TEAM,
        "stranded",
    }

    # --keep-formulas: exact values, still quoted so the CR cannot split a row
    render(report, tmp_path / "exact", ("focus",), RenderOptions(keep_formulas=True))
    exact = _records(tmp_path / "exact" / "gpumeter-2026-11-focus-1.3.csv")
    assert len(exact) == 1 + count
    team = exact[0].index("x_Team")
    assert {r[team] for r in exact[1:]} >= {FORMULA_TEAM, FORGED_TEAM}


def test_negative_numbers_are_not_formulas():
    assert csvfile.neutralise("-12.50") == "-12.50"
    assert csvfile.neutralise("-1e-05") == "-1e-05"
    assert csvfile.neutralise("-1+2") == "'-1+2"
    for start in ("=", "+", "@", "\t", "\r", "-"):
        assert csvfile.neutralise(start + "SUM(A1)") == "'" + start + "SUM(A1)"
    assert csvfile.neutralise("team") == "team"
