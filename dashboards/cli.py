"""`gpumeter dashboards build --out DIR [--configmaps DIR] [--check]`: the Grafana dashboards as JSON,
and their kube-prometheus-stack ConfigMaps, written only under the folders given."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("dashboards", help="Grafana dashboards as code")
    sub = parser.add_subparsers(dest="dashboards_command", required=True, metavar="ACTION")
    build = sub.add_parser(
        "build",
        help="write the dashboards' JSON models (and optionally their ConfigMaps) under the folders given",
        description="Render every dashboard. Writes only under --out (and --configmaps); a checkout's "
        "own copies are refreshed with `make dashboards`.",
    )
    build.add_argument("--out", type=Path, required=True, metavar="DIR", help="folder for <uid>.json")
    build.add_argument(
        "--configmaps",
        type=Path,
        metavar="DIR",
        help="also write one Grafana-sidecar ConfigMap per dashboard and their kustomization.yaml here",
    )
    build.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 when a file under the folders is stale"
    )
    build.add_argument(
        "--cluster-label",
        default="cluster",
        metavar="LABEL",
        help="the label a global store tells clusters apart by (default: %(default)s)",
    )
    build.add_argument(
        "--multi-cluster",
        action="store_true",
        help="show the cluster variable (for a store of many clusters); hidden otherwise",
    )
    build.set_defaults(func=run_build)


def run_build(args: argparse.Namespace) -> int:
    from .build import stale, write

    if args.check:
        paths = stale(args.out, args.configmaps, args.cluster_label, args.multi_cluster)
        for path in paths:
            print(f"stale: {path}", file=sys.stderr)
        if paths:
            print("run: gpumeter dashboards build with the same folders", file=sys.stderr)
        return 1 if paths else 0
    try:
        written = write(args.out, args.configmaps, args.cluster_label, args.multi_cluster)
    except OSError as error:
        print(f"gpumeter dashboards build: cannot write {error.filename}: {error.strerror}", file=sys.stderr)
        return 1
    for path in written:
        print(f"wrote {path}")
    return 0
