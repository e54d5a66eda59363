"""`gpumeter alerts ...`: the alerting part's subcommands."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpumeter.alerts.clusters import CLUSTER_LABEL

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "alerts", help="alerting rules", description="Prometheus alerting and recording rules."
    )
    actions = parser.add_subparsers(dest="alerts_command", required=True, metavar="ACTION")
    rule = actions.add_parser(
        "prometheusrule",
        help="print the Kubernetes PrometheusRule generated from the rule files",
        description="Generate the PrometheusRule object (monitoring.coreos.com/v1) from "
        "alerts/gpumeter-rules.yaml and alerts/gpumeter-alerts.yaml.",
    )
    rule.add_argument("--out", type=Path, default=None, help="write to FILE instead of standard output")
    rule.add_argument("--name", default="gpumeter", help="metadata.name (default: %(default)s)")
    rule.add_argument(
        "--namespace", default=None, help="metadata.namespace (default: none, set by kustomize)"
    )
    rule.add_argument(
        "--cluster-label",
        default=CLUSTER_LABEL,
        help="the label the metrics store tells clusters apart by (default: %(default)s)",
    )
    rule.set_defaults(func=_prometheusrule)
    files = actions.add_parser(
        "rule-files",
        help="write the plain rule files with the cluster label renamed",
        description="Write gpumeter-rules.yaml and gpumeter-alerts.yaml into DIR with the cluster label "
        "called LABEL, for a global store whose clusters are told apart by another label than `cluster`.",
    )
    files.add_argument("--cluster-label", required=True, help="the label's name, e.g. region")
    files.add_argument("--out", type=Path, required=True, metavar="DIR", help="the folder to write them into")
    files.set_defaults(func=_rule_files)


def _prometheusrule(args: argparse.Namespace) -> int:
    from gpumeter.alerts import prometheusrule

    try:
        obj = prometheusrule.build(name=args.name, namespace=args.namespace, cluster_label=args.cluster_label)
    except ValueError as error:
        print(f"gpumeter alerts prometheusrule: --cluster-label: {error}", file=sys.stderr)
        return 2
    if args.out is None:
        sys.stdout.write(prometheusrule.render(obj))
    else:
        prometheusrule.write(args.out, obj)
    return 0


def _rule_files(args: argparse.Namespace) -> int:
    from gpumeter.alerts import prometheusrule
    from gpumeter.alerts.files import RULE_FILES

    try:
        texts = {path.name: prometheusrule.rule_file(path, args.cluster_label) for path in RULE_FILES}
    except ValueError as error:
        print(f"gpumeter alerts rule-files: --cluster-label: {error}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    for name, text in texts.items():
        (args.out / name).write_text(text, encoding="utf-8")
    return 0
