"""Two clusters into one VictoriaMetrics, live (tests/clusters/conftest.py): each cluster's alerts fire
with their cluster named, no recording rule evaluated there by vmalert mixes clusters (each cluster's
own Prometheus, evaluating the same rule files on that cluster alone, is the reference), and every
dashboard panel answers for each cluster, differently."""

from __future__ import annotations

import json
import re
import time

import pytest
import yaml

from gpumeter.alerts import RULE_FILES
from gpumeter.dashboards import build
from gpumeter.simulator.device import LOAD_NOISE
from tests.dashboards.promql import EMPTY_WHEN_HEALTHY, queries, substitute

pytestmark = pytest.mark.slow

MODELS = build.dashboards(multi_cluster=True)
FOUND = [found for model in MODELS for found in queries(model) if found.where != "variable cluster"]
RULES = {
    rule["record"]: str(rule["expr"])
    for path in RULE_FILES
    for group in yaml.safe_load(path.read_text())["groups"]
    for rule in group["rules"]
    if "record" in rule
}
RECORDED = list(RULES)
# vmalert's recorded value is held to what the cluster's Prometheus recorded this many seconds either side
WINDOW_S = 300
# Label sets that differ are asked for again, up to this many times in all, two evaluation rounds apart
# (both rulers evaluate every 2 s: tests/clusters/conftest.py)
LABEL_ATTEMPTS, ROUND_S = 4, 4.0
# Rates over a window longer than the series have lived: Prometheus extrapolates to the window's edge
# and VictoriaMetrics does not (MetricsQL's rate), so only their label sets are compared.
RATES = {record for record, expr in RULES.items() if re.search(r"\b(rate|irate|increase)\(", expr)}
# Rules over series that follow the simulator's per-step load (gpumeter/simulator/device.py): the
# utilizations, and memory in use, which a held GPU or MIG instance fills to 0.1 + 0.75 x its load.
LOAD_FOLLOWING = {
    record for record, expr in RULES.items() if re.search(r"utilization|memory_used_bytes", expr)
}


def _answer(result: list[dict], drop: str = "cluster") -> list[tuple]:
    return sorted(
        (tuple(sorted((k, v) for k, v in item["metric"].items() if k != drop)), item["value"][1])
        for item in result
    )


def _outside(stack, cluster, record: str, selector: str, global_: list[tuple], at: float) -> list[tuple]:
    """vmalert's values of ``record`` (``global_``, asked of VictoriaMetrics at ``at``) outside what
    the cluster's Prometheus recorded within WINDOW_S of vmalert's own samples, with the slack the
    docstring of `test_no_recording_rule_mixes_clusters` gives: (labels, why) each. Rates: none."""
    if record in RATES:
        return []
    stamps = [float(v) for _, v in _answer(stack.victoriametrics.query(f"timestamp({selector})", time=at))]
    first, last = min(stamps), max(stamps)
    window = f"{round(last - first) + 2 * WINDOW_S}s"
    asked = {"time": last + WINDOW_S}
    low = dict(
        _answer(cluster.prometheus.query(f"min_over_time({record}[{window}])", **asked), drop="__name__")
    )
    high = dict(
        _answer(cluster.prometheus.query(f"max_over_time({record}[{window}])", **asked), drop="__name__")
    )
    outside = []
    for labels, value in global_:
        key = tuple(item for item in labels if item[0] != "__name__")
        lo, hi = float(low[key]), float(high[key])
        # vmalert evaluates between Prometheus' evaluations, on other scrapes: a value that follows the
        # load may lie by the simulator's per-step noise outside every value the other ruler saw
        noise = LOAD_NOISE if record in LOAD_FOLLOWING else 0.0
        slack = 0.02 * max(abs(lo), abs(hi)) + noise + 1e-9
        if not lo - slack <= float(value) <= hi + slack:
            outside.append(
                (
                    dict(labels),
                    f"{value} globally at {last}, {low[key]}..{high[key]} alone within {WINDOW_S} s of it",
                )
            )
    return outside


def test_each_clusters_alerts_fire_with_the_cluster_named(stack):
    found = stack.webhook.wait_for(
        [("firing", "GpuXidCritical", {"cluster": name}) for name in stack.clusters], timeout=120
    )
    for (_, _, labels), alert in found.items():
        cluster = dict(labels)["cluster"]
        assert alert["annotations"]["description"].startswith(f"Cluster {cluster}: XID 48 on GPU ")
    # east's XID is on GPU 1, west's on GPU 2 (tests/clusters/conftest.py): never the other's
    east = stack.webhook.find("firing", "GpuXidCritical", cluster="east")
    west = stack.webhook.find("firing", "GpuXidCritical", cluster="west")
    assert east["labels"]["gpu"] == "1" and west["labels"]["gpu"] == "2"
    assert east["labels"]["uuid"] != west["labels"]["uuid"]


def test_no_recording_rule_mixes_clusters(stack):
    """Every rule vmalert recorded in VictoriaMetrics, for each cluster, has exactly the label sets the
    cluster's own Prometheus recorded, and values within what that Prometheus recorded in the five
    minutes either side of vmalert's own sample (the two rulers evaluate at different moments, and
    vmalert's last evaluation may be minutes old on a loaded machine: the window is anchored to it, not
    to now; loads move between scrapes: 2 % of slack, and a value following the load the simulator's noise besides;
    rates: label sets only, see RATES)."""
    compared = 0
    problems = []
    for record in RECORDED:
        for name, cluster in stack.clusters.items():
            selector = f'{record}{{cluster="{name}"}}'
            # the two rulers evaluate at other moments, over other scrapes: series one of them lacked
            # for a round (CI on 2026-12-06, under load: the seven MIG instances of one GPU), or a value
            # made of such a round (a clean clone's make test on 2026-12-07: west's headroom 0.7046
            # against 0.449..0.659, one GPU's allocation short), are a difference of a moment, asked
            # again; a rule that mixes clusters differs every time
            for attempt in range(LABEL_ATTEMPTS):
                local = _answer(cluster.prometheus.query(record))
                if not local:
                    break
                at = time.time()  # both questions to VictoriaMetrics at one instant: the same samples
                global_ = _answer(stack.victoriametrics.query(selector, time=at))
                same = [labels for labels, _ in global_] == [labels for labels, _ in local]
                outside = _outside(stack, cluster, record, selector, global_, at) if same else []
                if (same and not outside) or attempt == LABEL_ATTEMPTS - 1:
                    break
                time.sleep(ROUND_S)
            if not local:
                continue
            compared += 1
            if not same:
                problems.append(f"{record} in {name}: {global_} in VictoriaMetrics, {local} alone")
                continue
            problems += [f"{record}{labels} in {name}: {why}" for labels, why in outside]
    assert not problems, "\n".join(problems)
    # most rules have results in each cluster (the rest need what neither cluster runs: DCGM, A30s)
    assert compared >= len(RECORDED), compared


# Panels whose answer is the same in both clusters by construction here, and why; each still has to
# answer for both. West is engineered to differ in everything else (tests/clusters/conftest.py).
SAME_IN_BOTH = {
    # healthy in both: neither cluster's NVML, kubelet attribution or MIG XID reading is broken
    "gpumeter-health: panel 'NVML down' / A": "no NVML outage in either cluster",
    "gpumeter-health: panel 'Kubelet attribution down' / A": "no kubelet outage in either cluster",
    "gpumeter-health: panel 'Exporters blind to MIG XIDs' / A": "every exporter reads MIG XIDs",
    "gpumeter-health: panel 'Ledger readable' / A": "both billing services read their ledgers",
    "gpumeter-mig: panel 'Idle allocations (< 5 % over the range)' / A": "no MIG pod idle for the range",
    "gpumeter-capacity: panel 'MIG slices per node' / C": "no stranded slice in either layout",
    "gpumeter-capacity: panel 'Memory fragmentation (fractional GPUs)' / A": "no fractional request pending",
    # the shipped rules' one spare policy, and a 1-5 level that both fleets' loads reach
    "gpumeter-capacity: panel 'Spare policy' / A": "one spare policy in the rules",
    "gpumeter-capacity: panel 'Headroom against the spare policy' / B": "one spare policy in the rules",
    "gpumeter-capacity: panel 'Maturity level' / A": "a level from 1 to 5",
    # the same namespaces are billed in both clusters (owned by other teams in west)
    "gpumeter-cost: variable namespace": "the same namespace names",
    # both billing services run in this process and share its job status (gpumeter.service.JOBS)
    "gpumeter-health: panel 'Scheduled job failures in the range' / A": "one process's job status",
    "gpumeter-health: panel 'Scheduled jobs: last success' / A": "one process's job status",
    "gpumeter-health: panel 'Scheduled jobs: last due' / A": "one process's job status",
}


@pytest.mark.parametrize("found", FOUND, ids=lambda f: f.id)
def test_every_panel_answers_for_each_cluster_and_they_differ(stack, found):
    answers = {}
    for name in stack.clusters:
        promql = substitute(found.expr, {"cluster": name})
        answers[name] = _answer(stack.victoriametrics.query(promql))
        if found.id in EMPTY_WHEN_HEALTHY:
            assert answers[name] == [], f"{found.id}: {EMPTY_WHEN_HEALTHY[found.id]} in cluster {name}"
        else:
            assert answers[name], f"{found.id}: no series for cluster {name}: {promql}"
    if found.id not in SAME_IN_BOTH and found.id not in EMPTY_WHEN_HEALTHY:
        assert answers["east"] != answers["west"], f"{found.id}: the same in both clusters: {answers['east']}"


def test_the_panels_let_off_differing_exist():
    assert set(SAME_IN_BOTH) | set(EMPTY_WHEN_HEALTHY) <= {found.id for found in FOUND}


def test_the_cluster_variable_lists_both_clusters(stack):
    (model,) = [m for m in MODELS if m["uid"] == "gpumeter-fleet"]
    variable = model["templating"]["list"][1]
    assert variable["name"] == "cluster" and variable["hide"] == 0
    result = stack.victoriametrics.query("count by (cluster) (nvidia_gpu_info)")
    assert sorted(item["metric"]["cluster"] for item in result) == ["east", "west"]
    assert json.dumps(variable).count("label_values(nvidia_gpu_info, cluster)") == 1
