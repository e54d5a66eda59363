"""What the rendered manifests must say: the exporter's placement and security posture, the scrape
job the alert rules expect, billing's database and replicas per overlay, and generated objects that
match their sources in the repository."""

from __future__ import annotations

import base64
import copy

import pytest
import yaml

from .conftest import KUSTOMIZE, OVERLAYS, ROOT

OVERLAY_TARGETS = [f"overlays/{name}" for name in OVERLAYS]


def _container(workload: dict) -> dict:
    containers = workload["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def _env(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container.get("env", [])}


def _secret_value(secret: dict, key: str) -> str:
    return base64.b64decode(secret["data"][key]).decode()


@pytest.mark.parametrize("target", OVERLAY_TARGETS)
def test_exporter_runs_on_gpu_nodes_only_and_tolerates_their_taints(rendered, target):
    spec = rendered(target).one("DaemonSet", "gpumeter-exporter")["spec"]["template"]["spec"]
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    keys = {(e["key"], e["operator"], tuple(e["values"])) for t in terms for e in t["matchExpressions"]}
    assert ("nvidia.com/gpu.present", "In", ("true",)) in keys
    assert {(t["key"], t["effect"]) for t in spec["tolerations"]} >= {
        ("nvidia.com/gpu", "NoSchedule"),
        ("nvidia.com/gpu", "NoExecute"),
    }
    assert spec["runtimeClassName"] == "nvidia"
    container = _container(rendered(target).one("DaemonSet", "gpumeter-exporter"))
    # the exporter must not take a GPU away from workloads
    resources = container["resources"]
    assert not any("nvidia.com" in k for part in resources.values() for k in part)
    assert _env(container)["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"


@pytest.mark.parametrize("target", OVERLAY_TARGETS)
def test_exporter_security_posture(rendered, target):
    daemonset = rendered(target).one("DaemonSet", "gpumeter-exporter")
    pod = daemonset["spec"]["template"]["spec"]
    container = _container(daemonset)
    security = container["securityContext"]
    assert security["privileged"] is False
    assert security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert "add" not in security["capabilities"]
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    # hostPID only where the process-usage component asks for it (its own test below)
    forbidden_here = (
        ("hostNetwork", "hostIPC")
        if target.endswith("process-usage")
        else ("hostNetwork", "hostPID", "hostIPC")
    )
    for forbidden in forbidden_here:
        assert not pod.get(forbidden)
    # the pod-resources folder, read-only: the only hostPath
    host_paths = {v["name"]: v["hostPath"] for v in pod["volumes"] if "hostPath" in v}
    assert host_paths == {"pod-resources": {"path": "/var/lib/kubelet/pod-resources", "type": "Directory"}}
    mount = next(m for m in container["volumeMounts"] if m["name"] == "pod-resources")
    assert mount == {"name": "pod-resources", "mountPath": "/var/lib/kubelet/pod-resources", "readOnly": True}
    assert _env(container)["GPUMETER_KUBELET_SOCKET"]["value"] == f"{mount['mountPath']}/kubelet.sock"
    assert _env(container)["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}


@pytest.mark.parametrize("target", OVERLAY_TARGETS)
def test_exporter_reads_only_pods_from_the_api_with_a_short_lived_token(rendered, target):
    """The pod lister (HAMi/gpushare grants, docs/pod-attribution.md §8): get/list pods, and for DRA
    (§8a) get/list ResourceSlices and ResourceClaims (no watch: it lists on a period), nothing else; a projected one-hour token
    rather than an automounted one, egress to the API server's ports only."""
    out = rendered(target)
    role = out.one("ClusterRole", "gpumeter-exporter-pods")
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
        {
            "apiGroups": ["resource.k8s.io"],
            "resources": ["resourceslices", "resourceclaims"],
            "verbs": ["get", "list"],
        },
    ]
    binding = out.one("ClusterRoleBinding", "gpumeter-exporter-pods")
    assert binding["roleRef"]["name"] == "gpumeter-exporter-pods"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "gpumeter-exporter", "namespace": "gpumeter"}
    ]
    daemonset = out.one("DaemonSet", "gpumeter-exporter")
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "gpumeter-exporter" and pod["automountServiceAccountToken"] is False
    (volume,) = (v for v in pod["volumes"] if v["name"] == "kube-api-access")
    token = next(
        s["serviceAccountToken"] for s in volume["projected"]["sources"] if "serviceAccountToken" in s
    )
    assert token == {"path": "token", "expirationSeconds": 3600}
    container = _container(daemonset)
    mount = next(m for m in container["volumeMounts"] if m["name"] == "kube-api-access")
    assert mount == {
        "name": "kube-api-access",
        "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
        "readOnly": True,
    }
    assert _env(container)["GPUMETER_KUBE_API"]["value"] == "in-cluster"
    (egress,) = out.one("NetworkPolicy", "gpumeter-exporter")["spec"]["egress"]
    assert egress == {"ports": [{"port": 443, "protocol": "TCP"}, {"port": 6443, "protocol": "TCP"}]}


@pytest.mark.parametrize("target", OVERLAY_TARGETS)
def test_exporter_probes_and_resources(rendered, target):
    container = _container(rendered(target).one("DaemonSet", "gpumeter-exporter"))
    assert container["args"] == ["exporter"]
    port = container["ports"][0]
    assert (port["name"], port["containerPort"]) == ("metrics", 9835)
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    resources = container["resources"]
    assert resources["requests"] == {"cpu": "50m", "memory": "96Mi"}
    # limit above the < 80 MiB resident target with room for the NVML library and scrape bursts
    assert resources["limits"]["memory"] == "192Mi"
    assert resources["limits"]["cpu"]


@pytest.mark.parametrize("target", OVERLAY_TARGETS)
def test_scrape_job_is_the_one_the_alert_rules_select(rendered, target):
    """Prometheus Operator names the job after the Service label that jobLabel names: the alert rules
    need up{job="gpumeter-exporter"}."""
    out = rendered(target)
    monitor = out.one("ServiceMonitor", "gpumeter-exporter")
    service = out.one("Service", "gpumeter-exporter")
    assert service["metadata"]["labels"][monitor["spec"]["jobLabel"]] == "gpumeter-exporter"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["endpoints"][0]["honorLabels"] is True
    assert [p["name"] for p in service["spec"]["ports"]] == ["metrics"]
    rules = yaml.safe_dump(out.one("PrometheusRule", "gpumeter")["spec"])
    assert 'up{job="gpumeter-exporter"}' in rules
    # target labels of the exporter pod itself must not land on series that have none of their own
    for monitor_name in ("gpumeter-exporter", "gpumeter-billing"):
        relabelings = out.one("ServiceMonitor", monitor_name)["spec"]["endpoints"][0]["relabelings"]
        drops = [r["regex"] for r in relabelings if r.get("action") == "labeldrop"]
        assert drops == ["(namespace|pod|container|service|endpoint)"], monitor_name
    billing_monitor = out.one("ServiceMonitor", "gpumeter-billing")
    billing_service = out.one("Service", "gpumeter-billing")
    assert billing_service["metadata"]["labels"][billing_monitor["spec"]["jobLabel"]] == "gpumeter-billing"


@pytest.mark.parametrize("target", OVERLAY_TARGETS)
def test_prometheusrule_is_the_generated_file(rendered, target):
    source = yaml.safe_load((KUSTOMIZE / "base" / "prometheusrule.yaml").read_text())
    assert rendered(target).one("PrometheusRule", "gpumeter")["spec"] == source["spec"]


@pytest.mark.parametrize("target", OVERLAY_TARGETS)
def test_price_book_configmap_is_generated_from_the_shipped_book(rendered, target):
    out = rendered(target)
    configmap = out.one("ConfigMap", "gpumeter-pricebook-")
    shipped = (ROOT / "billing" / "pricebooks" / "default.yaml").read_text()
    assert configmap["data"]["default.yaml"] == shipped, (
        "run deploy/kubernetes/sync-sources.sh: the in-tree copy drifted from billing/pricebooks/default.yaml"
    )
    deployment = out.one("Deployment", "gpumeter-billing")
    container = _container(deployment)
    volume = next(v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "pricebook")
    assert volume["configMap"]["name"] == configmap["metadata"]["name"]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "pricebook")
    assert f"--prices={mount['mountPath']}/default.yaml" in container["args"]


def test_alertmanager_example_is_generated_from_the_repository_config(rendered):
    secret = rendered("alertmanager-example").one("Secret", "gpumeter-alertmanager-config")
    assert secret["metadata"]["name"] == "gpumeter-alertmanager-config"  # fixed: spec.configSecret
    shipped = (ROOT / "deploy" / "alertmanager" / "alertmanager.yml").read_text()
    assert _secret_value(secret, "alertmanager.yaml") == shipped, (
        "run deploy/kubernetes/sync-sources.sh: the in-tree copy drifted from deploy/alertmanager/alertmanager.yml"
    )


@pytest.mark.parametrize("target", OVERLAY_TARGETS)
def test_billing_security_posture_and_probes(rendered, target):
    deployment = rendered(target).one("Deployment", "gpumeter-billing")
    pod = deployment["spec"]["template"]["spec"]
    container = _container(deployment)
    assert container["args"][:2] == ["billing", "serve"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] >= 10000
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    # a database outage takes the pod out of the Service but does not restart it
    assert "tcpSocket" in container["livenessProbe"]
    data = next(m for m in container["volumeMounts"] if m["name"] == "data")
    assert container["workingDir"] == data["mountPath"] == "/var/lib/gpumeter"
    claim = next(v for v in pod["volumes"] if v["name"] == "data")["persistentVolumeClaim"]["claimName"]
    assert rendered(target).one("PersistentVolumeClaim", claim)


def test_sqlite_overlay_single_replica_on_the_data_volume(rendered):
    out = rendered("overlays/sqlite-single-replica")
    deployment = out.one("Deployment", "gpumeter-billing")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    ref = _env(_container(deployment))["GPUMETER_BILLING_DB"]["valueFrom"]["secretKeyRef"]
    url = _secret_value(out.one("Secret", ref["name"]), ref["key"])
    assert url == "sqlite:////var/lib/gpumeter/gpumeter-billing.db"
    assert out.one("PersistentVolumeClaim", "gpumeter-billing-data")["spec"]["accessModes"] == [
        "ReadWriteOnce"
    ]
    assert not out.of_kind("PodDisruptionBudget")


def test_postgresql_overlay_two_replicas_and_no_sqlite(rendered):
    out = rendered("overlays/postgresql")
    deployment = out.one("Deployment", "gpumeter-billing")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    ref = _env(_container(deployment))["GPUMETER_BILLING_DB"]["valueFrom"]["secretKeyRef"]
    secrets = out.of_kind("Secret")
    assert [s["metadata"]["name"] for s in secrets] == [ref["name"]]
    url = _secret_value(secrets[0], ref["key"])
    assert url.startswith("postgresql+psycopg://")
    for doc in (deployment, *secrets, *out.of_kind("ConfigMap")):
        text = yaml.safe_dump(doc) + "".join(
            _secret_value(doc, k) for k in doc.get("data", {}) if doc["kind"] == "Secret"
        )
        assert "sqlite" not in text.lower(), doc["metadata"]["name"]
    # two replicas share the reports volume, and keep one through drains
    assert out.one("PersistentVolumeClaim", "gpumeter-billing-data")["spec"]["accessModes"] == [
        "ReadWriteMany"
    ]
    assert out.one("PodDisruptionBudget", "gpumeter-billing")["spec"]["minAvailable"] == 1
    egress_ports = {
        p["port"]
        for rule in out.one("NetworkPolicy", "gpumeter-billing")["spec"]["egress"]
        for p in rule["ports"]
    }
    assert 5432 in egress_ports


def test_long_term_store_overlay_points_billing_at_the_store(rendered):
    """The long-term-store component: billing reads Thanos Query (the component's default URL, one
    of the stores its comments list) and may reach the stores' query ports; the rest is the
    postgresql overlay's."""
    out = rendered("overlays/postgresql-long-term-store")
    deployment = out.one("Deployment", "gpumeter-billing")
    assert deployment["spec"]["replicas"] == 2
    settings = out.one("ConfigMap", _config_map_of(deployment, "gpumeter-billing-settings"))
    assert settings["data"]["GPUMETER_PROMETHEUS_URL"] == "http://thanos-query.monitoring.svc:10902"
    assert settings["data"]["GPUMETER_REPORT_DIR"] == "/var/lib/gpumeter/reports"  # merged, not replaced
    egress_ports = {
        p["port"]
        for rule in out.one("NetworkPolicy", "gpumeter-billing")["spec"]["egress"]
        for p in rule["ports"]
    }
    assert {9090, 5432, 10902, 8080, 8428, 8481} <= egress_ports
    plain = rendered("overlays/postgresql")
    base_settings = plain.one(
        "ConfigMap", _config_map_of(plain.one("Deployment", "gpumeter-billing"), "gpumeter-billing-settings")
    )
    assert base_settings["data"]["GPUMETER_PROMETHEUS_URL"].endswith("prometheus.monitoring.svc:9090")


def test_process_usage_overlay_puts_only_the_exporter_in_the_host_pid_namespace(rendered):
    """The process-usage component (docs/pod-attribution.md §9): hostPID and the processes collector on
    the exporter, nothing else loosened; the plain overlays keep the exporter out of the host PID
    namespace."""
    out = rendered("overlays/postgresql-process-usage")
    daemonset = out.one("DaemonSet", "gpumeter-exporter")
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["hostPID"] is True
    assert not pod.get("hostNetwork") and not pod.get("hostIPC")
    container = pod["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["GPUMETER_ENABLE_COLLECTORS"] == "processes"
    assert env["GPUMETER_PROC_ROOT"] == "/proc"
    assert env["GPUMETER_KUBE_API"] == "in-cluster"  # the pod list names the processes' pods
    security = container["securityContext"]
    assert security["capabilities"]["drop"] == ["ALL"] and security["privileged"] is False
    assert security["readOnlyRootFilesystem"] is True and security["allowPrivilegeEscalation"] is False
    assert "CKV_K8S_17=" in daemonset["metadata"]["annotations"]["checkov.io/skip4"]
    plain = rendered("overlays/postgresql").one("DaemonSet", "gpumeter-exporter")
    assert "hostPID" not in plain["spec"]["template"]["spec"]


def test_large_fleet_overlay_gives_billing_two_cpus_three_gib_and_50_gib_and_changes_nothing_else(rendered):
    """The large-fleet component (docs/kubernetes.md, "Sizing"): a 10,000-GPU month's catch-up and
    report need more than the base's 1 CPU and 1 GiB, and its reports (~1.7 GB a month) more than the
    base's 10 GiB volume; every other object is the postgresql overlay's."""
    large, plain = rendered("overlays/postgresql-large-fleet"), rendered("overlays/postgresql")
    resources = _container(large.one("Deployment", "gpumeter-billing"))["resources"]
    assert resources == {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "3Gi"}}
    base = _container(plain.one("Deployment", "gpumeter-billing"))["resources"]
    assert base["limits"] == {"cpu": "1", "memory": "1Gi"}
    claim = "PersistentVolumeClaim", "gpumeter-billing-data"
    assert large.one(*claim)["spec"]["resources"] == {"requests": {"storage": "50Gi"}}
    assert plain.one(*claim)["spec"]["resources"] == {"requests": {"storage": "10Gi"}}
    assert large.one(*claim)["spec"]["accessModes"] == ["ReadWriteMany"]  # the overlay's, kept

    def without_billing_resources(docs: list[dict]) -> list[dict]:
        docs = copy.deepcopy(docs)
        for doc in docs:
            if doc["kind"] == "Deployment" and doc["metadata"]["name"] == "gpumeter-billing":
                del doc["spec"]["template"]["spec"]["containers"][0]["resources"]
            if doc["kind"] == "PersistentVolumeClaim":
                del doc["spec"]["resources"]
        return docs

    assert without_billing_resources(large.docs) == without_billing_resources(plain.docs)


def _config_map_of(deployment: dict, prefix: str) -> str:
    """The generated (hash-suffixed) name of the ConfigMap ``prefix`` the billing container reads."""
    names = {
        source["configMapRef"]["name"]
        for source in _container(deployment).get("envFrom", [])
        if "configMapRef" in source
    } | {
        var["valueFrom"]["configMapKeyRef"]["name"]
        for var in _container(deployment).get("env", [])
        if "configMapKeyRef" in var.get("valueFrom", {})
    }
    (name,) = [n for n in names if n.startswith(prefix)]
    return name


def test_database_url_example_is_marked_as_an_example():
    text = (KUSTOMIZE / "overlays" / "postgresql" / "database.env").read_text()
    assert "EXAMPLE" in text and "CHANGE-ME" in text


@pytest.mark.parametrize("target", OVERLAY_TARGETS)
def test_references_resolve_and_one_image_serves_both(rendered, target):
    out = rendered(target)
    names = {(d["kind"], d["metadata"]["name"]) for d in out.docs}
    images = set()
    for workload in (*out.of_kind("Deployment"), *out.of_kind("DaemonSet")):
        pod = workload["spec"]["template"]["spec"]
        assert ("ServiceAccount", pod["serviceAccountName"]) in names
        for volume in pod["volumes"]:
            if "configMap" in volume:
                assert ("ConfigMap", volume["configMap"]["name"]) in names
            if "persistentVolumeClaim" in volume:
                assert ("PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"]) in names
        for container in pod["containers"]:
            images.add(container["image"])
            for env in container.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ("Secret", ref["name"]) in names
            for source in container.get("envFrom", []):
                assert ("ConfigMap", source["configMapRef"]["name"]) in names
    assert images == {"gpumeter:0.1.0"}


@pytest.mark.parametrize("target", OVERLAY_TARGETS)
def test_network_policies_cover_every_workload(rendered, target):
    out = rendered(target)
    selectors = [p["spec"]["podSelector"]["matchLabels"] for p in out.of_kind("NetworkPolicy")]
    for workload in (*out.of_kind("Deployment"), *out.of_kind("DaemonSet")):
        labels = workload["spec"]["template"]["metadata"]["labels"]
        assert any(s.items() <= labels.items() for s in selectors), workload["metadata"]["name"]


def test_dashboards_folder_is_a_resource_of_the_base():
    base = yaml.safe_load((KUSTOMIZE / "base" / "kustomization.yaml").read_text())
    assert "dashboards" in base["resources"]
    assert (KUSTOMIZE / "base" / "dashboards" / "kustomization.yaml").exists()


@pytest.mark.parametrize("target", OVERLAY_TARGETS)
def test_reports_land_on_the_data_volume(rendered, target):
    out = rendered(target)
    settings = out.one("ConfigMap", "gpumeter-billing-settings-")["data"]
    container = _container(out.one("Deployment", "gpumeter-billing"))
    data = next(m for m in container["volumeMounts"] if m["name"] == "data")
    assert settings["GPUMETER_REPORT_DIR"].startswith(data["mountPath"] + "/")
    assert settings["GPUMETER_PROMETHEUS_URL"].startswith("http://")
