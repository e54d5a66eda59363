"""The PrometheusRule is generated from the rule files and the committed copy is current."""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

import gpumeter.cli
from gpumeter.alerts import ALERTS_FILE, RULES_FILE, cli, prometheusrule
from tests.support.checkout import PROMETHEUSRULE


def _main(argv: list[str]) -> int:
    """Run `gpumeter ...` with only this part registered, as gpumeter.main does."""
    parser = argparse.ArgumentParser(prog="gpumeter")
    cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


def test_part_is_registered_with_the_gpumeter_command():
    assert "gpumeter.alerts.cli" in gpumeter.cli.PARTS


def test_committed_prometheusrule_is_fresh():
    committed = PROMETHEUSRULE
    assert committed.exists(), f"{committed} is missing: run gpumeter alerts prometheusrule --out {committed}"
    assert committed.read_text(encoding="utf-8") == prometheusrule.render(), (
        f"{committed} is stale: run `gpumeter alerts prometheusrule --out deploy/kubernetes/base/prometheusrule.yaml`"
    )


def test_object_carries_the_rule_files_unchanged():
    obj = yaml.safe_load(prometheusrule.render())
    assert obj["apiVersion"] == "monitoring.coreos.com/v1"
    assert obj["kind"] == "PrometheusRule"
    assert obj["metadata"]["name"] == "gpumeter"
    assert obj["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    expected = (
        yaml.safe_load(RULES_FILE.read_text())["groups"] + yaml.safe_load(ALERTS_FILE.read_text())["groups"]
    )
    assert obj["spec"]["groups"] == expected


def test_group_names_are_unique():
    names = [group["name"] for group in prometheusrule.load_groups()]
    assert len(names) == len(set(names))


def test_cli_writes_the_file(tmp_path: Path):
    out = tmp_path / "rule.yaml"
    assert _main(["alerts", "prometheusrule", "--out", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == prometheusrule.render()


def test_cli_prints_to_stdout_with_namespace(capsys):
    assert _main(["alerts", "prometheusrule", "--namespace", "monitoring"]) == 0
    obj = yaml.safe_load(capsys.readouterr().out)
    assert obj["metadata"]["namespace"] == "monitoring"
    assert obj["spec"]["groups"] == prometheusrule.load_groups()
