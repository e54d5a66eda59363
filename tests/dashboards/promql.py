"""Reading the PromQL out of Grafana dashboard JSON, substituting template variables the way Grafana
would for "All", and naming the metrics a query reads (a small lexer: enough for the PromQL the
dashboards use; Prometheus itself checks the syntax when the test runs the query)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

# Grafana's built-in interval variables, replaced by concrete durations (1 s scrape interval).
BUILTINS = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "1h"}
VARIABLE = re.compile(r"\$\{(\w+)(?::[^}]*)?\}|\$(\w+)")
LABEL_VALUES = re.compile(r"^label_values\((?:(.*),\s*)?(\w+)\)$", re.S)
QUERY_RESULT = re.compile(r"^query_result\((.*)\)$", re.S)

# Panels that are empty on a healthy fleet, by design: the live tests check that they evaluate and stay
# empty there (tests/reports/test_full_disk.py fills the one below). Each with what would fill it.
EMPTY_WHEN_HEALTHY = {
    "gpumeter-health: panel 'Report files not written' / A": "a report file the job could not write",
}

KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
    "offset", "inf", "nan",
}  # fmt: skip


@dataclass(frozen=True)
class Found:
    dashboard: str
    where: str  # "panel <title> / <refId>" or "variable <name>"
    expr: str

    @property
    def id(self) -> str:
        return f"{self.dashboard}: {self.where}"


def panels(model: dict) -> Iterator[dict]:
    for panel in model.get("panels", []):
        yield panel
        yield from panel.get("panels", [])  # panels inside a collapsed row


def queries(model: dict) -> Iterator[Found]:
    uid = model["uid"]
    for panel in panels(model):
        for target in panel.get("targets", []) or []:
            if target.get("expr"):
                yield Found(uid, f"panel {panel['title']!r} / {target.get('refId')}", target["expr"])
    for var in model.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            yield Found(uid, f"variable {var['name']}", variable_promql(var["query"]))


def variable_promql(query: str) -> str:
    """A Grafana Prometheus variable query as the PromQL it runs."""
    query = query.strip()
    if match := LABEL_VALUES.match(query):
        selector, label = match.groups()
        return f"count by ({label}) ({selector or '{' + label + '!=' + chr(34) + chr(34) + '}'})"
    if match := QUERY_RESULT.match(query):
        return match.group(1)
    return query


def variables_outside_regex(expr: str) -> list[str]:
    """Template variables used anywhere but inside a regex matcher's quotes (=~"...$var...")."""
    inside = {m.span() for m in re.finditer(r'=~"[^"]*"', expr)}
    bad = []
    for match in VARIABLE.finditer(expr):
        if match.group(0).startswith("$__"):
            continue
        if not any(start <= match.start() < end for start, end in inside):
            bad.append(match.group(0))
    return bad


def substitute(expr: str, values: dict[str, str] | None = None) -> str:
    """Builtins to durations; every other variable to ``values[name]``, else ``.*`` (Grafana's "All")."""
    for name, value in BUILTINS.items():
        expr = expr.replace(name, value)
    values = values or {}
    return VARIABLE.sub(lambda m: values.get(m.group(1) or m.group(2), ".*"), expr)


def metric_names(expr: str) -> set[str]:
    """Names of the series a PromQL expression selects."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)  # string literals
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # ranges and subqueries
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        word = match.group(0)
        following = text[match.end() :].lstrip()
        if word.lower() in KEYWORDS or following.startswith("("):
            continue
        before = text[: match.start()]
        if re.search(r"\d$", before):  # a duration or number suffix such as 5m, 1e3
            continue
        names.add(word)
    return names
