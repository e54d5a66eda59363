"""The HTML report in headless Chromium: every chart drawn, no JavaScript error, tenant strings inert,
and a screenshot (also kept as docs/img/report.png for the README).

How errors are detected: the report's first script (before plotly.js) records every `error` and
`unhandledrejection` event as `<html data-js-errors=N>`; after all charts are drawn the page sets
`<html data-charts-drawn=N>` (charts whose SVG has a trace) and appends "[charts drawn: N]" to the
title. `--dump-dom` returns the DOM after the scripts ran, and `--enable-logging=stderr --v=0` prints
every console message as a `CONSOLE` line. A deliberately broken copy proves both detectors fire.
"""

from __future__ import annotations

import json
import re
import shutil
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpumeter.billing.allocate import price_gpu_hour
from gpumeter.billing.ledger import open_ledger
from gpumeter.billing.ledger.base import HourRecord
from gpumeter.billing.pricing import load_price_book
from gpumeter.reports.model import month_period
from gpumeter.reports.render import RenderOptions
from gpumeter.reports.run import generate
from tests.billing.factories import A100, HOUR0, alloc, gpu_hour, mig, write_book
from tests.reports import browser, synthetic

ROOT = Path(__file__).resolve().parents[2]
README_SHOT = ROOT / "docs" / "img" / "report.png"
PWN = "document.documentElement.setAttribute('data-pwned','1')"
EVIL_NS = f"<script>{PWN}</script>"
EVIL_POD = f'"><img src=x onerror="{PWN}">'


def _check_clean(run: browser.PageRun) -> int:
    assert run.console == [], run.console
    assert "data-js-errors" not in run.root_attrs, run.root_attrs
    assert "data-pwned" not in run.root_attrs, "tenant string executed as script"
    charts = int(run.root_attrs["data-charts"])
    assert charts >= 3
    assert run.root_attrs.get("data-charts-drawn") == str(charts), run.root_attrs
    assert f"[charts drawn: {charts}]" in run.title
    return charts


def test_report_draws_every_chart_without_js_errors(worked_ledger, tmp_path):
    # add tenant strings that would run if they were not escaped
    book = load_price_book(
        write_book(
            tmp_path,
            {
                "currency": "USD",
                "versions": [{"effective_from": "2026-01-01T00:00:00Z", "gpus": {"A100-40GB": "3.00"}}],
            },
        )
    )
    u = "GPU-x"
    hour = HOUR0.replace(month=10, day=20)
    gh = gpu_hour(
        u, A100, [mig(u, "1", "7g.40gb")], [alloc(u, EVIL_NS, EVIL_POD, gi="1", profile="7g.40gb")], hour=hour
    )
    scratch = open_ledger(f"sqlite:///{tmp_path / 'evil.db'}")
    scratch.write_hour(HourRecord(hour, [gh], price_gpu_hour(gh, book, {EVIL_NS: EVIL_POD}).lines, book))
    for ledger, period, by in ((worked_ledger, "2026-11", "team"), (scratch, "2026-10", "namespace")):
        result = generate(ledger, month_period(period), by, ("html",), tmp_path / period, record=False)
        html = next(p for p in result.out_dir.iterdir() if p.suffix == ".html")
        charts = _check_clean(browser.load(html, tmp_path))
        groups = sum(1 for g in result.report.groups if g.usage.lines)
        assert charts == 3 + 2 * groups  # summary charts + two per group section
    scratch.close()


def test_detectors_catch_a_broken_page(worked_ledger, tmp_path):
    result = generate(worked_ledger, month_period("2026-11"), "team", ("html",), tmp_path, record=False)
    html = next(p for p in result.out_dir.iterdir() if p.suffix == ".html")
    broken = tmp_path / "broken.html"
    text = html.read_text()
    # a chart with a bad spec (Plotly rejects it) and a script error after plotly.js loads
    text = text.replace('"data":[{', '"data":[{"type":"no-such-trace",', 1)
    text = text.replace("</body>", "<script>undefinedReportFunction();</script></body>")
    broken.write_text(text)
    run = browser.load(broken, tmp_path)
    assert any("undefinedReportFunction" in line for line in run.console), run.console
    assert run.root_attrs.get("data-js-errors"), run.root_attrs


def test_screenshot_of_a_synthetic_month(tmp_path, request):
    book = load_price_book(write_book(tmp_path, synthetic.BOOK))
    ledger = open_ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    try:
        october, november = month_period("2026-10"), month_period("2026-11")
        synthetic.fill(ledger, book, october.start.replace(day=18), 14, 48, seed=3)
        synthetic.fill(ledger, book, november.start, 30, 48, seed=4)
        result = generate(
            ledger,
            november,
            "team",
            ("html", "json"),
            tmp_path / "out",
            options=RenderOptions(generated_at=datetime(2026, 12, 1, 1, 0, tzinfo=UTC)),
            record=False,
        )
    finally:
        ledger.close()
    html = next(p for p in result.out_dir.iterdir() if p.suffix == ".html")
    _check_clean(browser.load(html, tmp_path))
    png = browser.screenshot(html, tmp_path / "report.png", tmp_path)
    width, height, drawn = browser.png_summary(png)
    assert (width, height) == (1400, 2000)
    assert drawn > 0.02, f"screenshot looks blank ({drawn:.3f} non-white)"
    doc = json.loads((result.out_dir / "gpumeter-2026-11-by-team.json").read_text())
    assert len(doc["groups"]) == len(synthetic.TEAMS)
    if request.config.getoption("--update-golden") or not README_SHOT.exists():
        README_SHOT.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(png, README_SHOT)
    assert README_SHOT.exists()


@pytest.fixture(autouse=True)
def _chromium_installed():
    from tests.support.servers import require_binary

    require_binary("chromium")


PHISH = '<a href="https://evil.example/login">Pay here</a>'
_LINK = re.compile(r"<a\b[^>]*evil\.example", re.IGNORECASE)


def test_a_team_named_like_a_link_is_drawn_as_text_not_a_link(tmp_path):
    """plotly reads HTML tags in the text it draws: the team's name became a clickable link in the
    bar chart's axis, the legend and the group's chart (issue 13, point 7). Escaped, Chromium's DOM
    holds no <a> element pointing at evil.example, and the name is drawn as typed."""
    book = load_price_book(
        write_book(
            tmp_path,
            {
                "currency": "USD",
                "versions": [{"effective_from": "2026-01-01T00:00:00Z", "gpus": {"A100-40GB": "3.00"}}],
            },
        )
    )
    u = "GPU-p"
    hour = HOUR0.replace(month=10, day=20)
    gh = gpu_hour(
        u, A100, [mig(u, "1", "7g.40gb")], [alloc(u, "billing", "p", gi="1", profile="7g.40gb")], hour=hour
    )
    ledger = open_ledger(f"sqlite:///{tmp_path / 'phish.db'}")
    ledger.write_hour(HourRecord(hour, [gh], price_gpu_hour(gh, book, {"billing": PHISH}).lines, book))
    result = generate(ledger, month_period("2026-10"), "team", ("html",), tmp_path / "out", record=False)
    ledger.close()
    html = next(p for p in result.out_dir.iterdir() if p.suffix == ".html")
    run = browser.load(html, tmp_path)
    _check_clean(run)
    assert not _LINK.search(run.dom), _LINK.search(run.dom).group(0)
    # drawn as typed: plotly's SVG text holds the escaped characters, the tables the same as text
    assert run.dom.count('&lt;a href="https://evil.example/login"&gt;Pay here&lt;/a&gt;') >= 3
