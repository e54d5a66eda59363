"""The autoscaling examples (deploy/kubernetes/autoscaling/, docs/autoscaling.md) against a real Prometheus
that loads gpumeter's rules and scrapes `gpumeter exporter --simulate h100-mig` with its stand-in kubelet:
the prometheus-adapter rules' series queries find the pods, their metrics queries (rendered as
prometheus-adapter renders <<.Series>>, <<.LabelMatchers>> and <<.GroupBy>>) answer one value per pod,
and the KEDA ScaledObject's query answers the sum the HPA it makes divides by the replicas."""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from gpumeter.alerts import RULES_FILE
from gpumeter.simulator.fleet import load_fleet
from gpumeter.simulator.kubelet import StandInKubelet
from tests.support.servers import PrometheusServer, _Process, free_port, wait_http_ok

from .conftest import KUSTOMIZE

EXAMPLES = KUSTOMIZE / "autoscaling"
FLEET, NAMESPACE = "h100-mig", "search-inference"


def _render(template: str, series: str, matchers: str, group_by: str) -> str:
    """prometheus-adapter's metricsQuery template (Go text/template with << >> delimiters)."""
    return (
        template.replace("<<.Series>>", series)
        .replace("<<.LabelMatchers>>", matchers)
        .replace("<<.GroupBy>>", group_by)
    )


def test_the_hpa_reproduces_seed_003s_target_on_the_adapters_metric():
    hpa = yaml.safe_load((EXAMPLES / "triton-hpa.yaml").read_text())
    adapter = yaml.safe_load((EXAMPLES / "prometheus-adapter-rules.yaml").read_text())
    (metric,) = hpa["spec"]["metrics"]
    assert metric["pods"]["metric"]["name"] in {rule["name"]["as"] for rule in adapter["rules"]}
    assert metric["pods"]["target"] == {"type": "AverageValue", "averageValue": "700m"}  # seed 003: 70 %
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 10)
    scaled = yaml.safe_load((EXAMPLES / "triton-scaledobject.yaml").read_text())
    assert scaled["spec"]["triggers"][0]["metadata"]["threshold"] == "0.7"


@pytest.mark.prometheus
def test_the_adapter_and_keda_queries_answer_per_pod_from_a_real_prometheus(tmp_path):
    fleet = load_fleet(FLEET)
    node = fleet.nodes[0]
    pods = sorted({p.name for p in fleet.pods_on(node.name) if p.namespace == NAMESPACE and p.running(0)})
    assert pods
    directory = tempfile.mkdtemp(prefix="gpm-", dir="/tmp")
    socket_path = str(Path(directory) / "kubelet.sock")
    kubelet = StandInKubelet(fleet, node.name, socket_path).start()
    port = free_port()
    exporter = _Process(
        [
            str(Path(sys.executable).parent / "gpumeter"),
            "exporter",
            f"--simulate={FLEET}",
            f"--kubelet-socket={socket_path}",
            f"--listen=127.0.0.1:{port}",
            "--interval=1",
        ],
        tmp_path / "exporter.log",
    )
    try:
        wait_http_ok(f"http://127.0.0.1:{port}/metrics", proc=exporter.proc)
        targets = {"gpumeter-exporter": [f"127.0.0.1:{port}"]}
        with PrometheusServer(tmp_path / "prom", scrape_targets=targets, rule_files=[RULES_FILE]) as prom:
            adapter = yaml.safe_load((EXAMPLES / "prometheus-adapter-rules.yaml").read_text())
            for rule in adapter["rules"]:
                found = prom.wait_for(
                    rule["seriesQuery"], predicate=lambda r: len({x["metric"]["pod"] for x in r}) >= len(pods)
                )
                series = found[0]["metric"]["__name__"]
                assert series == rule["name"]["matches"].strip("^$")
                query = _render(
                    rule["metricsQuery"], series, f'namespace="{NAMESPACE}",pod=~"{"|".join(pods)}"', "pod"
                )
                answer = prom.query(query)
                assert sorted(x["metric"]["pod"] for x in answer) == pods, query
                assert all(0.0 <= float(x["value"][1]) <= 1.0 for x in answer)
            # KEDA's query, with the example's Deployment selector pointed at this fleet's pods
            scaled = yaml.safe_load((EXAMPLES / "triton-scaledobject.yaml").read_text())
            query = scaled["spec"]["triggers"][0]["metadata"]["query"]
            query = query.replace('namespace="inference"', f'namespace="{NAMESPACE}"').replace(
                'pod=~"triton-inference-server-.*"', 'pod=~"ranker-.*"'
            )
            total = prom.query(query)
            per_pod = prom.query(
                f'namespace_pod:nvidia_gpu_memory_utilization:max{{namespace="{NAMESPACE}"}}'
            )
            assert len(total) == 1
            assert float(total[0]["value"][1]) == pytest.approx(sum(float(x["value"][1]) for x in per_pod))
    finally:
        exporter.stop()
        kubelet.stop()
        shutil.rmtree(directory, ignore_errors=True)
