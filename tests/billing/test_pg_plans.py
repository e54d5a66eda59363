"""The ledger's PostgreSQL connections plan every statement with its values.

psycopg prepares a statement on its fifth run, and PostgreSQL may then keep one generic plan for it. A
generic plan made while the ledger was empty kept a sequential scan for the term look-up (`digest IN`
500 values) as the table grew: each row compared with each value, 0.3 s a query and 52 of the first two
hours' 78 s at 10,000 GPUs (docs/performance.md, issue 17, ninth pass). PostgreSQL counts the plans of
a session's prepared statements in `pg_prepared_statements` (generic_plans, custom_plans; 14+)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from gpumeter.billing.allocate import price_gpu_hour
from gpumeter.billing.ledger import open_ledger
from gpumeter.billing.ledger.base import HourRecord
from tests.billing.conftest import PG_URL
from tests.billing.factories import A100, HOUR0, alloc, book, gpu_hour

pytestmark = pytest.mark.postgres


def test_lookups_by_key_are_never_planned_generically(pg_schema, tmp_path):
    prices = book(tmp_path, {"A100-40GB": "3.00"})
    ledger = open_ledger(PG_URL + "?options=-capplication_name%3Dgpumeter-plans", schema=pg_schema)
    try:
        for n in range(12):  # a new pod each hour: new terms to look up and store, hour after hour
            hour = HOUR0 + timedelta(hours=n)
            gh = gpu_hour("GPU-p", A100, allocations=[alloc("GPU-p", "research", f"pod-{n}")], hour=hour)
            ledger.write_hour(HourRecord(hour, [gh], price_gpu_hour(gh, prices, {}).lines, prices))
        with ledger.engine.connect() as conn:
            prepared = conn.exec_driver_sql(
                "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements"
            ).all()
            settings = conn.exec_driver_sql(
                "SELECT current_setting('plan_cache_mode'), current_setting('application_name'), "
                "current_setting('search_path')"
            ).one()
    finally:
        ledger.close()
    looked_up = [row for row in prepared if "cost_line_terms.digest" in row[0]]
    assert looked_up and all(row[2] >= 6 for row in looked_up), prepared  # prepared, and run as such
    # no generic plan for any query (SAVEPOINT and RELEASE have no plan to choose: counted generic)
    queries = [row for row in prepared if row[0].lstrip().upper().startswith(("SELECT", "INSERT"))]
    assert [row for row in queries if row[1]] == [], queries
    # the options the URL gave are kept beside the ledger's own
    assert tuple(settings) == ("force_custom_plan", "gpumeter-plans", pg_schema)


def test_every_options_the_url_repeats_is_kept(pg_schema):
    """libpq takes `options` once; a URL may give it twice (a base URL and an overlay's addition):
    each is kept beside the ledger's own, none dropped or mangled."""
    url = PG_URL + "?options=-capplication_name%3Dgpumeter-twice&options=-cstatement_timeout%3D7000"
    ledger = open_ledger(url, schema=pg_schema)
    try:
        with ledger.engine.connect() as conn:
            settings = conn.exec_driver_sql(
                "SELECT current_setting('application_name'), current_setting('statement_timeout'), "
                "current_setting('plan_cache_mode'), current_setting('search_path')"
            ).one()
    finally:
        ledger.close()
    assert tuple(settings) == ("gpumeter-twice", "7s", "force_custom_plan", pg_schema)
