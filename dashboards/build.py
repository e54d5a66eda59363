"""Render the dashboards to JSON, and the kube-prometheus-stack sidecar ConfigMaps beside them.

``gpumeter dashboards build --out DIR [--configmaps DIR]`` writes only under the folders it is given:

* ``<out>/<uid>.json``: the models Grafana's file provisioning (deploy/grafana/) loads;
* ``<configmaps>/<uid>.yaml``: one ConfigMap per dashboard, labelled ``grafana_dashboard: "1"`` for
  the Grafana sidecar, and the ``kustomization.yaml`` listing them.

The package ships one build of the models (``GENERATED``, package data, read only); the checkout's
Makefile passes its own folders (``make dashboards``). Nothing here writes into the installed package.
Output is deterministic (sorted keys, fixed ids), so a test can compare committed files with a fresh
build.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from importlib.resources import files
from pathlib import Path

import yaml
from grafana_foundation_sdk.builders import dashboard as d
from grafana_foundation_sdk.cog.encoder import JSONEncoder

from gpumeter.contract import CLUSTER_LABEL

from . import capacity, core, cost, fleet, health, mig, node

# The models as shipped in the package: read them, never write them (site-packages may be read-only).
GENERATED = Path(str(files("gpumeter.dashboards") / "generated"))
FOLDER = "gpumeter"

# In the order of the drill-down: fleet → GPU → MIG instance and pod → cost; then health and capacity.
BUILDERS: tuple[Callable[[], d.Dashboard], ...] = (
    fleet.build,
    node.build,
    mig.build,
    cost.build,
    health.build,
    capacity.build,
)


def dashboards(cluster_label: str = CLUSTER_LABEL, multi_cluster: bool = False) -> list[dict]:
    """Every dashboard as the JSON model Grafana loads (plain dicts), each with the cluster variable and
    every query filtered by it (:func:`for_clusters`)."""
    return [
        for_clusters(_json(build().build()), cluster_label, multi_cluster=multi_cluster) for build in BUILDERS
    ]


def _json(obj: object) -> dict:
    return json.loads(json.dumps(obj, cls=JSONEncoder))


def _panels(model: dict) -> Iterator[dict]:
    for panel in model.get("panels", []):
        yield panel
        yield from panel.get("panels", [])  # panels inside a collapsed row


_LABEL_VALUES = re.compile(r"^label_values\((.+),\s*(\w+)\)$", re.S)
_QUERY_RESULT = re.compile(r"^query_result\((.+)\)$", re.S)


def _variable_query(query: str, label: str) -> str:
    if match := _LABEL_VALUES.match(query.strip()):
        return f"label_values({core.with_cluster(match.group(1), label)}, {match.group(2)})"
    if match := _QUERY_RESULT.match(query.strip()):
        return f"query_result({core.with_cluster(match.group(1), label)})"
    raise ValueError(
        f"variable query {query!r}: neither label_values(SELECTOR, LABEL) nor query_result(EXPR)"
    )


def for_clusters(model: dict, label: str = CLUSTER_LABEL, *, multi_cluster: bool = False) -> dict:
    """``model`` for a store of one or many clusters told apart by ``label``: the ``cluster`` variable
    after the datasource, and every panel query and variable query filtered by it.

    Grafana cannot hide a variable by how many values it has, so whether it shows is decided here, as the
    Kubernetes mixins' ``showMultiCluster`` does: hidden by default (a cluster's own Prometheus: the
    variable has no value and ``label=~""`` matches every series), shown with ``multi_cluster`` for a
    global store (docs/dashboards.md, "Clusters")."""
    variables = model["templating"]["list"]
    for var in variables:
        if var.get("type") == "query":
            var["query"] = _variable_query(var["query"], label)
    for panel in _panels(model):
        for target in panel.get("targets") or []:
            if target.get("expr"):
                target["expr"] = core.with_cluster(target["expr"], label)
    position = next((i + 1 for i, var in enumerate(variables) if var.get("type") == "datasource"), 0)
    variables.insert(position, _json(core.cluster_var(label, hide=not multi_cluster).build()))
    return model


def to_text(model: dict) -> str:
    return json.dumps(model, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def configmap(model: dict) -> str:
    uid = model["uid"]
    doc = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": f"{uid}-dashboard",
            "labels": {
                "grafana_dashboard": "1",
                "app.kubernetes.io/name": "gpumeter",
                "app.kubernetes.io/component": "dashboards",
            },
            # kube-prometheus-stack's sidecar puts the dashboard in this folder when
            # sidecar.dashboards.folderAnnotation is set to grafana_folder.
            "annotations": {"grafana_folder": FOLDER},
        },
        "data": {f"{uid}.json": to_text(model)},
    }
    return _HEADER + yaml.safe_dump(doc, sort_keys=False, width=1_000_000, allow_unicode=True)


def kustomization(models: list[dict]) -> str:
    doc = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [f"{m['uid']}.yaml" for m in models],
    }
    return _HEADER + yaml.safe_dump(doc, sort_keys=False)


_HEADER = "# Generated by `gpumeter dashboards build` (dashboards/build.py); do not edit by hand.\n"


def render(
    out: Path, configmaps: Path | None = None, cluster_label: str = CLUSTER_LABEL, multi_cluster: bool = False
) -> dict[Path, str]:
    """Every generated file, by path: the models under ``out``, their ConfigMaps under ``configmaps``."""
    models = dashboards(cluster_label, multi_cluster)
    files: dict[Path, str] = {}
    for model in models:
        files[out / f"{model['uid']}.json"] = to_text(model)
        if configmaps is not None:
            files[configmaps / f"{model['uid']}.yaml"] = configmap(model)
    if configmaps is not None:
        files[configmaps / "kustomization.yaml"] = kustomization(models)
    return files


def _folders(out: Path, configmaps: Path | None) -> list[tuple[Path, str]]:
    return [(out, "*.json")] + ([(configmaps, "*.yaml")] if configmaps is not None else [])


def stale(
    out: Path, configmaps: Path | None = None, cluster_label: str = CLUSTER_LABEL, multi_cluster: bool = False
) -> list[Path]:
    """Generated files that are missing or differ from a fresh build, and leftovers of old builds."""
    files = render(out, configmaps, cluster_label, multi_cluster)
    paths = [path for path, text in files.items() if not path.exists() or path.read_text() != text]
    for directory, pattern in _folders(out, configmaps):
        paths.extend(p for p in sorted(directory.glob(pattern)) if p not in files)
    return paths


def write(
    out: Path, configmaps: Path | None = None, cluster_label: str = CLUSTER_LABEL, multi_cluster: bool = False
) -> list[Path]:
    """Write every generated file; remove generated files no dashboard produces any more."""
    files = render(out, configmaps, cluster_label, multi_cluster)
    for directory, pattern in _folders(out, configmaps):
        directory.mkdir(parents=True, exist_ok=True)
        for path in directory.glob(pattern):
            if path not in files:
                path.unlink()
    written = []
    for path, text in files.items():
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            written.append(path)
    return written
