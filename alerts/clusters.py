"""The cluster label in the rules, and how a deployment that names it differently gets its own rule files.

Series from many clusters meet in a global store (VictoriaMetrics, Thanos, Mimir) told apart by one label
that each cluster's Prometheus adds (``external_labels``), never the exporter. The rule files are written
with that label called ``cluster``, as the Kubernetes monitoring mixins' ``clusterLabel`` defaults: every
aggregation across nodes is ``by (cluster, …)``, every join ``on(cluster, …)``, and every description
names the cluster when there is one. In a cluster's own Prometheus the label is absent, ``by (cluster)``
keeps nothing and ``cluster=""`` matches every series, so the same file is right there and in a global
ruler. :func:`relabel_groups` renames the label for a store that calls it otherwise (``region``,
``k8s_cluster``): it rewrites label lists, template lookups and ``cluster="…"`` matchers, nothing else
(recording rule names such as ``cluster:nvidia_gpu_info:count`` keep their ``cluster:`` level).
"""

from __future__ import annotations

import copy
import re
from typing import Any

# The label the rule files are written with: the contract's, which billing and the dashboards use too.
from gpumeter.contract import CLUSTER_LABEL

__all__ = ["CLUSTER_LABEL", "relabel_expr", "relabel_groups", "relabel_template"]

_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
# by (…), without (…), on(…), ignoring(…), group_left(…), group_right(…): label lists, no nested parentheses.
_LABEL_LIST = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)(\s*)\(([^()]*)\)")
# A matcher on the label inside a selector: {cluster="east"}, {…, cluster=~"e.*"}
_MATCHER = re.compile(r"([{,]\s*)" + CLUSTER_LABEL + r"(\s*(?:=~|!~|!=|=))")
# Templates: $labels.cluster, and `cluster=%q` in the selectors they look series up with.
_TEMPLATE_LABEL = re.compile(r"\$labels\." + CLUSTER_LABEL + r"\b")
_TEMPLATE_MATCHER = re.compile(r"([{,])" + CLUSTER_LABEL + r"=%q")


def _check(label: str) -> None:
    if not _LABEL_NAME.match(label) or label.startswith("__"):
        raise ValueError(f"cluster label {label!r} is not a Prometheus label name")


def relabel_expr(expr: str, label: str) -> str:
    """``expr`` with the cluster label called ``label`` in its label lists and matchers."""
    _check(label)
    if label == CLUSTER_LABEL:
        return expr

    def in_list(match: re.Match[str]) -> str:
        names = [
            label if name.strip() == CLUSTER_LABEL else name.strip() for name in match.group(3).split(",")
        ]
        return f"{match.group(1)}{match.group(2)}({', '.join(name for name in names if name)})"

    return _MATCHER.sub(rf"\g<1>{label}\g<2>", _LABEL_LIST.sub(in_list, expr))


def relabel_template(text: str, label: str) -> str:
    """An annotation or label template with the cluster label called ``label``."""
    _check(label)
    if label == CLUSTER_LABEL:
        return text
    return _TEMPLATE_MATCHER.sub(rf"\g<1>{label}=%q", _TEMPLATE_LABEL.sub(f"$labels.{label}", text))


def relabel_groups(groups: list[dict[str, Any]], label: str) -> list[dict[str, Any]]:
    """A copy of rule ``groups`` with the cluster label called ``label`` (the groups unchanged for ``cluster``)."""
    _check(label)
    groups = copy.deepcopy(groups)
    if label == CLUSTER_LABEL:
        return groups
    for group in groups:
        for rule in group.get("rules", []):
            rule["expr"] = relabel_expr(str(rule["expr"]), label)
            for key in ("labels", "annotations"):
                for name, value in rule.get(key, {}).items():
                    rule[key][name] = relabel_template(str(value), label)
    return groups
