"""`gpumeter dashboards build [--check]`: regenerate the Grafana dashboards and their ConfigMaps."""

from __future__ import annotations

import argparse
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("dashboards", help="Grafana dashboards as code")
    sub = parser.add_subparsers(dest="dashboards_command", required=True, metavar="ACTION")
    build = sub.add_parser(
        "build",
        help="write dashboards/generated/*.json and deploy/kubernetes/base/dashboards/*.yaml",
    )
    build.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 when a generated file is stale"
    )
    build.set_defaults(func=run_build)


def run_build(args: argparse.Namespace) -> int:
    from .build import ROOT, stale, write

    if args.check:
        paths = stale()
        for path in paths:
            print(f"stale: {path.relative_to(ROOT)}", file=sys.stderr)
        if paths:
            print("run: gpumeter dashboards build", file=sys.stderr)
        return 1 if paths else 0
    for path in write():
        print(f"wrote {path.relative_to(ROOT)}")
    return 0
