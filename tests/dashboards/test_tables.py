"""A dashboard is a table of Section and Panel rows (dashboards/core.py): each row becomes the panel it
says, laid out left to right, and a row that names no known kind of panel is refused by name."""

from __future__ import annotations

import json

import pytest
from grafana_foundation_sdk.cog.encoder import JSONEncoder

from gpumeter.dashboards import core
from gpumeter.dashboards.core import SHARE, STAT, TABLE, Panel, Query, Section


def _model(table: tuple[Section | Panel, ...]) -> dict:
    built = core.dashboard("test-uid", "test", "a table of rows", [], table).build()
    return json.loads(json.dumps(built, cls=JSONEncoder))


def test_each_row_is_the_panel_it_names_laid_out_left_to_right():
    model = _model(
        (
            Section("First"),
            Panel("a", Query("up"), kind=STAT, w=6, h=4),
            Panel("b", Query("up", table=True), kind=TABLE, w=18, h=5),
            Panel("c", [Query("up", "x"), Query("up", "y")]),  # a full row: wraps below the taller of a, b
        )
    )
    placed = [(p["title"], p["type"], p["gridPos"]) for p in model["panels"]]
    assert placed == [
        ("First", "row", {"h": 1, "w": 24, "x": 0, "y": 0}),
        ("a", "stat", {"h": 4, "w": 6, "x": 0, "y": 1}),
        ("b", "table", {"h": 5, "w": 18, "x": 6, "y": 1}),
        ("c", "timeseries", {"h": 8, "w": 12, "x": 0, "y": 6}),
    ]
    assert [p["id"] for p in model["panels"]] == [1, 2, 3, 4]
    assert [t["refId"] for t in model["panels"][3]["targets"]] == ["A", "B"]
    assert [t["legendFormat"] for t in model["panels"][3]["targets"]] == ["x", "y"]


def test_a_share_is_a_percentage_from_0_to_1_unless_the_row_bounds_it_itself():
    model = _model(
        (Panel("share", Query("up"), unit=SHARE), Panel("bounded", Query("up"), unit=SHARE, max=0.5))
    )
    defaults = [p["fieldConfig"]["defaults"] for p in model["panels"]]
    assert [(d["unit"], d["min"], d["max"]) for d in defaults] == [
        ("percentunit", 0, 1),
        ("percentunit", 0, 0.5),
    ]


def test_a_row_of_an_unknown_kind_is_refused_with_its_title_and_kind():
    with pytest.raises(ValueError, match=r"panel 'Odd one' has unknown kind 'piechart'"):
        _model((Panel("Odd one", Query("up"), kind="piechart"),))
