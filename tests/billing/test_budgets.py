"""Teams' monthly budgets (docs/billing.md §4.4): the team map file's `budgets`, validated like the
price book; month-to-date and the forecast worked out by hand; the series of a real `billing serve`.

The ledgers below are built by hand: one A100-40GB per team at 3.00 USD per GPU-hour, so a held hour
is a tenant line of exactly 3.00 and an idle one an `__unallocated__` line nobody's budget pays.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from fractions import Fraction

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

import gpumeter
from gpumeter.billing.allocate import price_gpu_hour
from gpumeter.billing.budget import month_bounds, team_months
from gpumeter.billing.config import Budget, ConfigError, Settings, load_budgets, load_team_map
from gpumeter.billing.ledger import open_ledger
from gpumeter.billing.ledger.base import HourRecord
from gpumeter.billing.models import HOUR, hour_floor
from gpumeter.billing.pricing.static import DEFAULT_BOOK
from gpumeter.service import build_app, serve
from tests.billing.factories import A100, alloc, book, gpu_hour, mig
from tests.support import loopback
from tests.support.servers import free_port, wait_http_ok

TEAMS = {"ns-a": "alpha", "ns-b": "beta"}
BUDGETS = {
    "alpha": Budget("alpha", Decimal("1000"), "USD"),
    "beta": Budget("beta", Decimal("200"), "USD"),
    "gamma": Budget("gamma", Decimal("50"), "USD"),  # a team with a budget and no cost at all
}
TEAM_FILE = """\
namespaces:
  ns-a: alpha
  ns-b: beta
budgets:
  alpha: {amount: 1000, currency: USD}
  beta: {amount: "200.00", currency: USD}
  gamma: {amount: 50, currency: USD}
"""


# --- the team map file ----------------------------------------------------------------------------


def test_budgets_are_read_from_the_team_map_file(tmp_path):
    path = tmp_path / "teams.yaml"
    path.write_text(TEAM_FILE)
    assert load_team_map(path) == TEAMS
    assert load_budgets(path) == BUDGETS
    path.write_text("namespaces: {ns-a: alpha}\n")
    assert load_budgets(path) == {}  # budgets are optional


BAD_BUDGETS = {
    "negative": (
        "alpha: {amount: -5, currency: USD}",
        "budgets.alpha.amount",
        "must be greater than 0",
        "-5",
    ),
    "zero": ("alpha: {amount: 0, currency: USD}", "budgets.alpha.amount", "must be greater than 0", "0"),
    "nan": ("alpha: {amount: .nan, currency: USD}", "budgets.alpha.amount", "not a finite number", "nan"),
    "nan-text": ("alpha: {amount: NaN, currency: USD}", "budgets.alpha.amount", "not a finite number", "NaN"),
    "infinite": (
        "alpha: {amount: .inf, currency: USD}",
        "budgets.alpha.amount",
        "not a finite number",
        "inf",
    ),
    "absurd": ("alpha: {amount: 1e16, currency: USD}", "budgets.alpha.amount", "larger than", "1e16"),
    "40-digits": (
        "alpha: {amount: '" + "9" * 40 + "', currency: USD}",
        "budgets.alpha.amount",
        "larger than",
        "999",
    ),
    "megabyte": (
        "alpha: {amount: '" + "9" * 100 + "', currency: USD}",
        "budgets.alpha.amount",
        "not a number",
        "100 characters",
    ),
    "text": ("alpha: {amount: lots, currency: USD}", "budgets.alpha.amount", "not a number", "lots"),
    "bool": ("alpha: {amount: true, currency: USD}", "budgets.alpha.amount", "expected a number", "True"),
    "missing": ("alpha: {currency: USD}", "budgets.alpha.amount", "expected a number", "None"),
    "sub-cent": (
        "alpha: {amount: '10.001', currency: USD}",
        "budgets.alpha.amount",
        "decimal places",
        "10.001",
    ),
    "yen-decimals": (
        "alpha: {amount: '10.5', currency: JPY}",
        "budgets.alpha.amount",
        "decimal places",
        "10.5",
    ),
    "currency": (
        "alpha: {amount: 10, currency: dollars}",
        "budgets.alpha.currency",
        "unknown currency",
        "dollars",
    ),
    "no-currency": ("alpha: {amount: 10}", "budgets.alpha.currency", "unknown currency", "None"),
    "extra-key": (
        "alpha: {amount: 10, currency: USD, month: 11}",
        "budgets.alpha.month",
        "unknown key",
        "month",
    ),
    "not-a-mapping": ("alpha: 1000", "budgets.alpha", "expected {amount, currency}", "1000"),
    "twice": (
        "alpha: {amount: 1, currency: USD}\n  alpha: {amount: 2, currency: USD}",
        "budgets.alpha",
        "duplicate key",
        "alpha",
    ),
}


@pytest.mark.parametrize("case", list(BAD_BUDGETS), ids=list(BAD_BUDGETS))
def test_bad_budgets_are_refused_naming_file_field_and_value(tmp_path, capsys, case):
    body, field, problem, value = BAD_BUDGETS[case]
    path = tmp_path / "teams.yaml"
    path.write_text(f"namespaces: {{ns-a: alpha}}\nbudgets:\n  {body}\n")
    with pytest.raises(ConfigError) as refused:
        load_budgets(path)
    message = str(refused.value)
    assert message.startswith(f"{path}: {field}") and problem in message and value in message, message
    assert "\n" not in message
    # the command: one line, exit 2, no ledger opened (so nothing written)
    db = tmp_path / "ledger.db"
    argv = ["--db", f"sqlite:///{db}", "--prices", str(DEFAULT_BOOK), "--teams", str(path)]
    code = gpumeter.main(
        ["billing", "price", *argv, "--from", "2026-11-01T00:00Z", "--to", "2026-11-02T00:00Z"]
    )
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith(f"error: {path}: {field}"), err
    assert not db.exists()


def test_a_misspelt_budgets_key_is_refused(tmp_path):
    path = tmp_path / "teams.yaml"
    path.write_text("namespaces: {ns-a: alpha}\nbudget:\n  alpha: {amount: 10, currency: USD}\n")
    with pytest.raises(ConfigError, match=r"teams.yaml: budget: unknown key.*\(value 'budget'\)"):
        load_team_map(path)


def test_a_budget_in_another_currency_than_the_price_book_is_refused(tmp_path, capsys):
    path = tmp_path / "teams.yaml"
    path.write_text("namespaces: {ns-a: alpha}\nbudgets:\n  alpha: {amount: 900, currency: EUR}\n")
    db = tmp_path / "ledger.db"
    argv = ["--db", f"sqlite:///{db}", "--prices", str(DEFAULT_BOOK), "--teams", str(path)]
    code = gpumeter.main(["billing", "serve", *argv, "--listen", f"127.0.0.1:{free_port()}"])
    err = capsys.readouterr().err
    # the shipped book is in USD: an EUR budget would never meet a cost series in the alerts' join
    assert code == 2 and err == (
        f"error: {path}: budgets.alpha.currency: not the price book's currency USD (value 'EUR')\n"
    )
    assert not db.exists()


# --- month-to-date and the forecast, by hand ------------------------------------------------------


def _write(ledger, prices, hour: datetime, holders: dict[str, str]) -> None:
    """One ingested hour: one A100-40GB per team's GPU uuid; ``holders`` {uuid: namespace} held it."""
    gpu_hours, lines = [], []
    for uuid in ("GPU-a", "GPU-b"):
        allocations = [alloc(uuid, holders[uuid], "pod")] if uuid in holders else []
        gh = gpu_hour(uuid, A100, allocations=allocations, hour=hour)
        gpu_hours.append(gh)
        lines += price_gpu_hour(gh, prices, TEAMS).lines
    ledger.write_hour(HourRecord(hour, gpu_hours, lines, prices))


def _fill(ledger, prices, start: datetime, end: datetime, skip: frozenset[datetime] = frozenset()) -> None:
    """Every hour of [start, end): alpha (ns-a) holds its GPU all day, beta (ns-b) from 08:00 to 19:59."""
    hour = start
    while hour < end:
        if hour not in skip:
            holders = {"GPU-a": "ns-a"} | ({"GPU-b": "ns-b"} if 8 <= hour.hour < 20 else {})
            _write(ledger, prices, hour, holders)
        hour += HOUR


@pytest.fixture
def prices(tmp_path):
    return book(tmp_path, {"A100-40GB": {"hourly_rate": "3.00"}})


NOW = datetime(2026, 11, 24, 10, 30, tzinfo=UTC)
LEDGER_FROM = datetime(2026, 11, 17, tzinfo=UTC)  # the ledger begins a week before NOW's day
CUTOFF = datetime(2026, 11, 24, 10, tzinfo=UTC)  # hour 09:00-10:00 is the newest ingested


def _by_team(months) -> dict[str, tuple]:
    return {m.team: (m.month_to_date, m.forecast, m.budget.amount if m.budget else None) for m in months}


def test_month_to_date_and_forecast_match_the_hand_worked_figures(prices):
    ledger = open_ledger("memory://")
    _fill(ledger, prices, LEDGER_FROM, CUTOFF)
    months = team_months(ledger, BUDGETS, NOW, CUTOFF)
    # Month: November 2026, [11-01 00:00, 12-01 00:00) UTC. Cutoff 11-24 10:00; remaining hours to
    # 12-01 00:00 = 6 days 14 h = 158. Window: the 7 whole days [11-17, 11-24) = 168 hours, all ingested.
    # alpha: MTD = 178 hours (11-17 00:00 .. 11-24 09:00) x 3.00 = 534.00;
    #        window 168 x 3.00 = 504.00 -> 3.00/h; forecast 534.00 + 3.00 x 158 = 534 + 474 = 1008.00
    # beta:  12 hours a day: window 7 x 36.00 = 252.00 -> 252/168 = 1.50/h;
    #        MTD 252.00 + 11-24 08:00 and 09:00 (2 x 3.00) = 258.00; forecast 258 + 1.50 x 158 = 495.00
    # gamma: no cost: MTD 0, forecast 0 (a rate of 0 over the 168 ingested hours)
    assert _by_team(months) == {
        "alpha": (Decimal("534.00"), Fraction(1008), Decimal(1000)),
        "beta": (Decimal("258.00"), Fraction(495), Decimal(200)),
        "gamma": (Decimal(0), Fraction(0), Decimal(50)),
    }
    alpha = months[0]
    assert (alpha.month_start, alpha.month_end, alpha.cutoff) == (
        datetime(2026, 11, 1, tzinfo=UTC),
        datetime(2026, 12, 1, tzinfo=UTC),
        CUTOFF,
    )
    assert (alpha.window_start, alpha.window_end, alpha.window_hours, alpha.remaining_hours) == (
        LEDGER_FROM,
        datetime(2026, 11, 24, tzinfo=UTC),
        168,
        158,
    )


def test_hours_missing_from_the_window_do_not_drag_the_rate_down(prices):
    ledger = open_ledger("memory://")
    lost = datetime(2026, 11, 20, 3, tzinfo=UTC)  # an hour the ingest never got (a night hour: beta idle)
    _fill(ledger, prices, LEDGER_FROM, CUTOFF, skip=frozenset({lost}))
    # alpha: window 167 hours ingested, 167 x 3.00 = 501.00 -> still 3.00/h; MTD 534.00 - 3.00 = 531.00;
    #        forecast 531.00 + 3.00 x 158 = 1005.00
    # beta:  window 252.00 over 167 hours -> 252/167 per hour; forecast 258 + 252 x 158 / 167
    #        = 258 + 39816/167 = (43086 + 39816)/167 = 82902/167 = 496.419...
    months = _by_team(team_months(ledger, BUDGETS, NOW, CUTOFF))
    assert months["alpha"][:2] == (Decimal("531.00"), Fraction(1005))
    assert months["beta"][:2] == (Decimal("258.00"), Fraction(82902, 167))


def test_on_the_first_of_the_month_the_rate_comes_from_last_month(prices):
    ledger = open_ledger("memory://")
    _fill(ledger, prices, datetime(2026, 11, 24, tzinfo=UTC), datetime(2026, 12, 1, tzinfo=UTC))
    now = datetime(2026, 12, 1, 0, 40, tzinfo=UTC)  # December's first hour is not ingested yet
    months = team_months(ledger, BUDGETS, now, datetime(2026, 12, 1, tzinfo=UTC))
    # December: MTD 0 for everyone; window [11-24, 12-01) = 168 h; remaining 31 x 24 = 744 h
    # alpha 0 + 3.00 x 744 = 2232.00; beta 0 + 1.50 x 744 = 1116.00
    assert _by_team(months) == {
        "alpha": (Decimal(0), Fraction(2232), Decimal(1000)),
        "beta": (Decimal(0), Fraction(1116), Decimal(200)),
        "gamma": (Decimal(0), Fraction(0), Decimal(50)),
    }
    assert month_bounds(now) == (datetime(2026, 12, 1, tzinfo=UTC), datetime(2027, 1, 1, tzinfo=UTC))


def test_no_forecast_without_an_ingested_hour_in_the_window(prices):
    ledger = open_ledger("memory://")
    _write(ledger, prices, datetime(2026, 11, 24, 9, tzinfo=UTC), {"GPU-a": "ns-a"})  # today only
    months = _by_team(team_months(ledger, BUDGETS, NOW, CUTOFF))
    assert months["alpha"] == (Decimal("3.00"), None, Decimal(1000))  # MTD yes, a forecast no


def test_metrics_export_budget_month_to_date_and_forecast(prices):
    ledger = open_ledger("memory://")
    _fill(ledger, prices, LEDGER_FROM, CUTOFF)
    app = build_app(ledger, clock=lambda: NOW, budgets=BUDGETS)
    with httpx.Client(transport=httpx.WSGITransport(app=app), base_url="http://billing") as client:
        families = {f.name: f.samples for f in text_string_to_metric_families(client.get("/metrics").text)}

    def values(name):
        return {(s.labels["team"], s.labels["currency"]): s.value for s in families[name]}

    # the figures of test_month_to_date_and_forecast_match_the_hand_worked_figures
    assert values("gpumeter_billing_team_month_to_date_cost") == {
        ("alpha", "USD"): 534.0,
        ("beta", "USD"): 258.0,
        ("gamma", "USD"): 0.0,
    }
    assert values("gpumeter_billing_team_forecast_cost") == {
        ("alpha", "USD"): 1008.0,
        ("beta", "USD"): 495.0,
        ("gamma", "USD"): 0.0,
    }
    assert values("gpumeter_billing_team_budget") == {
        ("alpha", "USD"): 1000.0,
        ("beta", "USD"): 200.0,
        ("gamma", "USD"): 50.0,
    }


# --- a real `billing serve` ---------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_billing_serve_exports_the_hand_worked_budget_series(sql_ledger, prices, tmp_path):
    """The service reads the wall clock, so the ledger is built around it: every hour of the 7 whole
    days before today plus today's closed hours. The figures are the same arithmetic as above, with
    the hours counted from the clock by the test."""
    ledger = sql_ledger
    now = datetime.now(UTC)
    cutoff = hour_floor(now)  # the newest hour written ends at the current hour
    today = cutoff.replace(hour=0)  # at 00:xx no hour of today is closed: the arithmetic holds the same
    window_start = today - timedelta(days=7)
    _fill(ledger, prices, window_start, cutoff)
    teams = tmp_path / "teams.yaml"
    teams.write_text(TEAM_FILE)
    url = ledger.engine.url.render_as_string(hide_password=False)
    schema = ledger.engine.dialect.default_schema_name if ledger.engine.dialect.name == "postgresql" else None
    settings = Settings(
        db=url,
        schema=schema,
        prices=str(tmp_path / "prices.yaml"),
        teams_file=str(teams),
        prometheus="http://127.0.0.1:9",  # nothing answers: the catch-up at start fails and writes nothing
        catchup_hours=1,
    )
    port, stop = free_port(), threading.Event()
    # /metrics sees the clock the ledger was built around, so a month turning mid-test changes nothing
    thread = threading.Thread(
        target=serve, args=(settings, f"127.0.0.1:{port}", stop), kwargs={"clock": lambda: now}, daemon=True
    )
    thread.start()
    try:
        wait_http_ok(f"http://127.0.0.1:{port}/healthz")
        exposition = loopback.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    finally:
        stop.set()
        thread.join(20)
    families = {f.name: f.samples for f in text_string_to_metric_families(exposition)}

    def values(name):
        return {s.labels["team"]: s.value for s in families[name] if s.labels["currency"] == "USD"}

    month_start, month_end = month_bounds(now)
    remaining = (month_end - cutoff) // HOUR
    # month-to-date: the written hours of this month; alpha 3.00 each, beta 3.00 for each 08..19 hour
    written = [window_start + i * HOUR for i in range((cutoff - window_start) // HOUR)]
    this_month = [h for h in written if h >= month_start]
    alpha_mtd = 3 * len(this_month)
    beta_mtd = 3 * sum(1 for h in this_month if 8 <= h.hour < 20)
    # rates over the 168 window hours: alpha 3.00/h; beta 36.00 a day = 1.50/h
    assert values("gpumeter_billing_team_month_to_date_cost") == {
        "alpha": alpha_mtd,
        "beta": beta_mtd,
        "gamma": 0.0,
    }
    assert values("gpumeter_billing_team_forecast_cost") == {
        "alpha": pytest.approx(alpha_mtd + 3 * remaining),
        "beta": pytest.approx(beta_mtd + 1.5 * remaining),
        "gamma": 0.0,
    }
    assert values("gpumeter_billing_team_budget") == {"alpha": 1000.0, "beta": 200.0, "gamma": 50.0}


# --- what counts against a budget, on every ledger ----------------------------------------------------


def test_team_costs_count_tenant_and_idle_share_lines_only(ledger, tmp_path):
    """The SQL ledgers sum in the database, the memory ledger in Python: the same figures."""
    spread = book(tmp_path, {"A100-40GB": {"hourly_rate": "3.00"}}, idle="spread")
    hour = datetime(2026, 11, 2, 5, tzinfo=UTC)
    u = "GPU-m"
    held = gpu_hour(
        u,
        A100,
        [mig(u, "1", "3g.20gb"), mig(u, "2", "3g.20gb")],
        [alloc(u, "ns-a", "a", gi="1", profile="3g.20gb")],
        hour=hour,
    )
    nobody = gpu_hour("GPU-n", A100, hour=hour)  # all __unallocated__: counts for no team
    no_team = gpu_hour("GPU-o", A100, allocations=[alloc("GPU-o", "ns-x", "x")], hour=hour)  # unmapped ns
    unpriced = gpu_hour("GPU-u", "NVIDIA B200", allocations=[alloc("GPU-u", "ns-a", "b")], hour=hour)
    hours = [held, nobody, no_team, unpriced]
    lines = [line for gh in hours for line in price_gpu_hour(gh, spread, TEAMS).lines]
    ledger.write_hour(HourRecord(hour, hours, lines, spread))
    # alpha holds 3/7 of 3.00 as a tenant line (1.29) and gets the rest, 4/7 of 3.00 (unallocated
    # 3/7 + stranded 1/7), as idle share (1.71): 3.00. GPU-n's 3.00 is the platform's; ns-x's 3.00 has
    # no team; the B200 has no price. Nothing else.
    assert ledger.team_costs(hour, hour + HOUR) == {("alpha", "USD"): Decimal("3.00")}
    assert ledger.team_costs(hour + HOUR, hour + 2 * HOUR) == {}
