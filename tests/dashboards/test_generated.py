"""The committed dashboards are what the generator builds, round-trip through grafana-foundation-sdk's
dashboard model, link to each other with variables that exist, and ship as provisioning files and
sidecar ConfigMaps."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

import pytest
import yaml
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as dm

import gpumeter
from gpumeter import contract
from gpumeter.dashboards import build
from gpumeter.exporter.catalog import CATALOG, Scope
from tests.dashboards.promql import panels
from tests.support.checkout import DASHBOARD_CONFIGMAPS, DASHBOARDS, ROOT
from tests.support.servers import require_binary

MODELS = {path.stem: json.loads(path.read_text()) for path in sorted(build.GENERATED.glob("*.json"))}
UIDS = {
    "gpumeter-fleet",
    "gpumeter-node",
    "gpumeter-mig",
    "gpumeter-cost",
    "gpumeter-health",
    "gpumeter-capacity",
}


def _variables(model: dict) -> set[str]:
    return {v["name"] for v in model["templating"]["list"]}


def _links(model: dict):
    """(panel title, link url) of every data link."""
    for panel in panels(model):
        for item in panel.get("fieldConfig", {}).get("defaults", {}).get("links", []):
            yield panel["title"], item["url"]


def test_committed_files_are_a_fresh_build():
    assert build.stale(DASHBOARDS, DASHBOARD_CONFIGMAPS) == [], "run: make dashboards"


def test_the_package_ships_the_committed_models():
    shipped = {path.name: path.read_text() for path in build.GENERATED.glob("*.json")}
    committed = {path.name: path.read_text() for path in DASHBOARDS.glob("*.json")}
    assert shipped == committed


def test_build_check_command(capsys):
    argv = [
        "dashboards",
        "build",
        "--check",
        "--out",
        str(DASHBOARDS),
        "--configmaps",
        str(DASHBOARD_CONFIGMAPS),
    ]
    assert gpumeter.main(argv) == 0


def test_build_writes_only_under_the_folders_given(tmp_path, capsys):
    out, configmaps = tmp_path / "models", tmp_path / "cm"
    assert gpumeter.main(["dashboards", "build", "--out", str(out)]) == 0
    assert sorted(p.stem for p in out.iterdir()) == sorted(UIDS) and not configmaps.exists()
    assert gpumeter.main(["dashboards", "build", "--out", str(out), "--check"]) == 0
    (out / "gpumeter-fleet.json").write_text("{}")
    (out / "left-over.json").write_text("{}")
    assert gpumeter.main(["dashboards", "build", "--out", str(out), "--check"]) == 1
    assert "stale: " in capsys.readouterr().err
    assert gpumeter.main(["dashboards", "build", "--out", str(out), "--configmaps", str(configmaps)]) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(f"{uid}.json" for uid in UIDS)
    assert json.loads((out / "gpumeter-fleet.json").read_text()) == MODELS["gpumeter-fleet"]
    assert (configmaps / "kustomization.yaml").exists()


def test_build_into_an_unwritable_folder_says_so_in_one_line(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert gpumeter.main(["dashboards", "build", "--out", str(blocker / "models")]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cannot write" in err and str(blocker) in err


def test_every_dashboard_is_generated_with_its_uid():
    assert set(MODELS) == UIDS
    for uid, model in MODELS.items():
        assert model["uid"] == uid
        assert "gpumeter" in model["tags"]


@pytest.mark.parametrize("uid", sorted(UIDS))
def test_round_trips_through_the_sdk_model(uid):
    """JSON → grafana-foundation-sdk Dashboard model → JSON gives the same document."""
    model = MODELS[uid]
    decoded = dm.Dashboard.from_json(model)
    assert isinstance(decoded, dm.Dashboard)
    assert all(isinstance(p, dm.Panel | dm.RowPanel) for p in decoded.panels)
    again = json.loads(json.dumps(decoded, cls=JSONEncoder))
    assert again == model


@pytest.mark.parametrize("uid", sorted(UIDS))
def test_panels_are_well_formed(uid):
    model = MODELS[uid]
    ids = [p["id"] for p in panels(model)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in panels(model):
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)) and all(refs), panel["title"]
        assert all(t["datasource"]["uid"] == "${datasource}" for t in panel["targets"])
        assert panel["fieldConfig"]["defaults"].get("unit"), f"{panel['title']} has no unit"
    positions = [(p["gridPos"]["x"], p["gridPos"]["y"]) for p in panels(model)]
    assert len(positions) == len(set(positions)), "panels overlap"


def test_template_variables():
    for model in MODELS.values():
        variables = model["templating"]["list"]
        assert variables[0]["name"] == "datasource" and variables[0]["query"] == "prometheus"
        for var in variables[1:]:
            assert var["datasource"]["uid"] == "${datasource}"
            if var.get("includeAll"):
                assert var["allValue"] == ".*"
    every = set().union(*(_variables(m) for m in MODELS.values()))
    assert {"datasource", "hostname", "gpu", "namespace", "team"} <= every
    assert not _variables(MODELS["gpumeter-node"]) - {"datasource", "cluster", "hostname", "gpu"}


def test_dashboards_link_to_each_other():
    for model in MODELS.values():
        (link,) = model["links"]
        assert link["type"] == "dashboards" and link["tags"] == ["gpumeter"]
        assert link["includeVars"] and link["keepTime"]


def test_data_links_open_existing_dashboards_with_their_variables():
    for uid, model in MODELS.items():
        for title, url in _links(model):
            parts = urlsplit(url)
            target = re.fullmatch(r"/d/([\w-]+)", parts.path)
            assert target, f"{uid} / {title}: {url}"
            target_uid = target.group(1)
            assert target_uid in MODELS, f"{uid} / {title}: unknown dashboard {target_uid}"
            assert "${datasource:queryparam}" in url and "${__url_time_range}" in url
            names = {k.removeprefix("var-") for k, _ in parse_qsl(parts.query) if k.startswith("var-")}
            assert names <= _variables(MODELS[target_uid]), f"{uid} / {title}: {url}"


def _targets(uid: str) -> set[str]:
    return {re.match(r"/d/([\w-]+)", url).group(1) for _, url in _links(MODELS[uid])}


def test_three_clicks_from_the_fleet_to_a_pod_and_its_cost():
    """Fleet → Node & GPU detail (the GPU, its throttle timeline, the pods on it and their MIG
    instances) → MIG & pods or Cost & chargeback of the pod's namespace."""
    assert "gpumeter-node" in _targets("gpumeter-fleet")
    assert {"gpumeter-mig", "gpumeter-cost"} <= _targets("gpumeter-node")
    assert {"gpumeter-node", "gpumeter-cost"} <= _targets("gpumeter-mig")
    node = MODELS["gpumeter-node"]
    titles = {p["title"]: p for p in panels(node)}
    assert titles["Clock event (throttle) reasons"]["type"] == "state-timeline"
    pods = titles["Pods holding these GPUs or their MIG instances"]
    assert "nvidia_gpu_allocation" in pods["targets"][0]["expr"]


def test_power_and_temperature_are_never_summed_over_mig_series():
    for model in MODELS.values():
        for panel in panels(model):
            for target in panel.get("targets", []):
                expr = target["expr"]
                if re.search(r"nvidia_gpu_(power|temperature|energy)", expr):
                    assert "nvidia_gpu_mig_info" not in expr and "nvidia_gpu_allocation" not in expr, expr


def test_configmaps_for_the_grafana_sidecar():
    kustomization = yaml.safe_load((DASHBOARD_CONFIGMAPS / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == sorted(f"{uid}.yaml" for uid in MODELS)
    for uid, model in MODELS.items():
        doc = yaml.safe_load((DASHBOARD_CONFIGMAPS / f"{uid}.yaml").read_text())
        assert doc["kind"] == "ConfigMap" and doc["apiVersion"] == "v1"
        assert doc["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert json.loads(doc["data"][f"{uid}.json"]) == model
        # a ConfigMap must stay under 1 MiB (and the sidecar's annotations far below)
        assert len((DASHBOARD_CONFIGMAPS / f"{uid}.yaml").read_bytes()) < 900_000


def _expand(text: str, env: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}", lambda m: env[m.group(1)], text)


def test_grafana_provisioning_for_the_local_stack():
    env = {"GPUMETER_ROOT": str(ROOT), "GPUMETER_PROMETHEUS_URL": "http://127.0.0.1:9090"}
    provisioning = ROOT / "deploy" / "grafana" / "provisioning"
    datasources = yaml.safe_load(_expand((provisioning / "datasources" / "gpumeter.yaml").read_text(), env))
    (source,) = datasources["datasources"]
    assert source["type"] == "prometheus" and source["url"] == env["GPUMETER_PROMETHEUS_URL"]
    providers = yaml.safe_load(_expand((provisioning / "dashboards" / "gpumeter.yaml").read_text(), env))
    (provider,) = providers["providers"]
    assert provider["type"] == "file"
    path = Path(provider["options"]["path"])
    assert path.resolve() == DASHBOARDS
    assert sorted(p.stem for p in path.glob("*.json")) == sorted(MODELS)
    assert os.path.isabs(provider["options"]["path"])


def _exprs(uid: str) -> str:
    return "\n".join(t["expr"] for p in panels(MODELS[uid]) for t in p.get("targets", []))


@pytest.mark.parametrize(
    ("scope", "uid"),
    [(Scope.DEVICE, "gpumeter-node"), (Scope.MIG, "gpumeter-mig"), (Scope.EXPORTER, "gpumeter-health")],
)
def test_every_series_of_the_catalog_has_its_dashboard(scope, uid):
    """Node & GPU detail shows every device series, MIG & pods every MIG series, health every
    exporter series (a counter may be shown through its recording rule)."""
    text = _exprs(uid)
    via_rule = {"nvidia_gpu_clocks_event_seconds_total": "uuid:nvidia_gpu_clocks_event_seconds:rate5m"}
    # a series counts as shown when its name, or its recording rule's, is in a query (the rule only
    # where there is one: a default of any string found in every query would pass everything)
    missing = [
        spec.name
        for spec in CATALOG
        if spec.scope is scope
        and not any(name in text for name in (spec.name, via_rule.get(spec.name)) if name)
    ]
    assert missing == []


def test_every_billing_series_is_shown():
    text = _exprs("gpumeter-cost") + _exprs("gpumeter-health")
    for series in contract.BILLING_SERIES:
        assert series.name in text, series.name


@pytest.mark.kubectl
def test_configmaps_render_with_kustomize():
    """The folder is a kustomize target of its own (deploy/kubernetes/base includes it)."""
    kubectl = require_binary("kubectl")
    result = subprocess.run(
        [kubectl, "kustomize", str(DASHBOARD_CONFIGMAPS)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    docs = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    assert sorted(doc["metadata"]["name"] for doc in docs) == sorted(f"{uid}-dashboard" for uid in MODELS)
    for doc in docs:
        ((name, text),) = doc["data"].items()
        assert json.loads(text) == MODELS[name.removesuffix(".json")]
