"""A YAML value its reader cannot make (a date that is none: 2026-13-01) is refused naming the file, in
every input file a person writes: price book, team map, labels, exporter config, fleet, web config.
PyYAML's date reader raises a bare ValueError, which escaped every one of them as a traceback."""

from __future__ import annotations

import argparse

import pytest

import gpumeter
from gpumeter.billing.config import ConfigError as TeamMapError
from gpumeter.billing.config import load_team_file
from gpumeter.exporter import config as exporter_config
from gpumeter.reports.model import ReportError
from gpumeter.reports.run import load_labels
from gpumeter.simulator.fleet import FleetError, load_fleet
from gpumeter.web.config import WebConfigError, load_web_config


def test_a_price_book_with_an_impossible_date_is_refused_naming_line_and_value(tmp_path, capsys):
    book = tmp_path / "book.yaml"
    book.write_text("currency: USD\nversions:\n  - effective_from: 2026-13-01\n    gpus: {}\n")
    assert gpumeter.main(["billing", "prices", "check", str(book)]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"error: {book}: (yaml): line 3 column 21: not a valid timestamp: month must be in 1..12 "
        "(value '2026-13-01')\n"
    )


def test_a_team_map_with_an_impossible_date_names_it(tmp_path):
    teams = tmp_path / "teams.yaml"
    teams.write_text("namespaces:\n  nlp: 2026-02-30\n")
    with pytest.raises(TeamMapError, match=r"line 2 column 8: not a valid timestamp: day is out of range"):
        load_team_file(teams)


def test_a_labels_file_with_an_impossible_date_names_it(tmp_path):
    labels = tmp_path / "labels.yaml"
    labels.write_text("namespaces:\n  nlp: {since: 2026-13-01}\n")
    with pytest.raises(ReportError) as raised:
        load_labels(labels)
    assert str(raised.value).startswith(f"{labels}: (yaml): line 2 column 16: not a valid timestamp")


def test_an_exporter_config_a_fleet_and_a_web_config_name_their_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("since: 2026-13-01\n")
    parser = argparse.ArgumentParser()
    exporter_config.add_arguments(parser)
    with pytest.raises(exporter_config.ConfigError, match=r"bad\.yaml: a value YAML cannot read: month"):
        exporter_config.resolve(parser.parse_args(["--config", str(path)]), {})
    with pytest.raises(FleetError, match=r"bad\.yaml: a value YAML cannot read: month"):
        load_fleet(path)
    with pytest.raises(WebConfigError, match=r"bad\.yaml: a value YAML cannot read: month"):
        load_web_config(path)
