"""`gpumeter billing price`: re-pricing stored facts, e.g. once an unpriced model gets a price."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import gpumeter
from gpumeter.billing.allocate import price_gpu_hour
from gpumeter.billing.ledger.base import HourRecord
from gpumeter.billing.pricing import load_price_book
from tests.billing.factories import HOUR0, alloc, gpu_hour, write_book

B200 = "NVIDIA B200"


def test_unpriced_hours_are_priced_after_the_book_learns_the_model(sql_ledger, tmp_path, capsys):
    ledger = sql_ledger  # the CLI opens the database by URL
    doc = {"currency": "USD", "versions": [{"effective_from": "2026-01-01", "gpus": {"H100-80GB": "6.88"}}]}
    prices = load_price_book(write_book(tmp_path, doc))
    gh = gpu_hour("GPU-b", B200, allocations=[alloc("GPU-b", "ml", "p", share="0.5")])
    ledger.write_hour(HourRecord(HOUR0, [gh], price_gpu_hour(gh, prices).lines, prices))
    end = HOUR0 + timedelta(hours=1)
    assert [(x.namespace, x.amount) for x in ledger.lines(HOUR0, end)] == [("__unpriced__", None)]

    doc["versions"][0]["gpus"]["B200-180GB"] = "9.00"
    doc["aliases"] = {B200: "B200-180GB"}
    book_path = write_book(tmp_path, doc, "v2.yaml")
    teams = tmp_path / "teams.yaml"
    teams.write_text("namespaces: {ml: research}\n")
    url = ledger.engine.url.render_as_string(hide_password=False)
    argv = ["billing", "price", "--db", url, "--prices", str(book_path), "--teams", str(teams)]
    if ledger.engine.dialect.name == "postgresql":
        argv += ["--db-schema", ledger.engine.dialect.default_schema_name]
    assert gpumeter.main([*argv, "--from", HOUR0.isoformat(), "--to", end.isoformat()]) == 0
    assert "re-priced 1 hour(s)" in capsys.readouterr().out
    lines = {(x.namespace, x.team): x.amount for x in ledger.lines(HOUR0, end)}
    assert lines == {("ml", "research"): Decimal("4.50"), ("__unallocated__", ""): Decimal("4.50")}
