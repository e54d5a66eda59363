"""`gpumeter alerts ...`: the alerting part's subcommands."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

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
    rule.set_defaults(func=_prometheusrule)


def _prometheusrule(args: argparse.Namespace) -> int:
    from gpumeter.alerts import prometheusrule

    obj = prometheusrule.build(name=args.name, namespace=args.namespace)
    if args.out is None:
        sys.stdout.write(prometheusrule.render(obj))
    else:
        prometheusrule.write(args.out, obj)
    return 0
