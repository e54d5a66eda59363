"""Every kustomize target renders with the real kubectl, the output validates
against the Kubernetes schemas (kubernetes-validate), and checkov reports no failed check that is not
skipped in the manifest with a written reason."""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml

from .conftest import KUSTOMIZE, ROOT, TARGETS, tool

# Custom resources of the Prometheus Operator have no schema in kubernetes-validate's bundle (it
# carries the core API only), so they are checked by the structural checks below instead, kind by
# kind; every other document of the rendered file goes through the schema validation.
CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}

# The oldest Kubernetes minor still commonly run, and the newest in kubernetes-validate's bundle.
KUBERNETES_VERSIONS = ["1.30.0", "1.37.0"]


@pytest.mark.parametrize("target", TARGETS)
def test_target_renders(rendered, target):
    out = rendered(target)
    assert out.docs, f"{target} rendered nothing"
    for doc in out.docs:
        assert {"apiVersion", "kind", "metadata"} <= doc.keys(), doc
        if doc["kind"] not in ("Namespace", "ClusterRole", "ClusterRoleBinding"):  # cluster-scoped
            expected = "monitoring" if target == "alertmanager-example" else "gpumeter"
            assert doc["metadata"].get("namespace") == expected, (doc["kind"], doc["metadata"])


def test_every_overlay_is_covered():
    overlays = sorted(p.parent.name for p in (KUSTOMIZE / "overlays").glob("*/kustomization.yaml"))
    assert overlays == [
        "postgresql",
        "postgresql-large-fleet",
        "postgresql-long-term-store",
        "postgresql-process-usage",
        "sqlite-single-replica",
    ]
    assert [t for t in TARGETS if t.startswith("overlays/")] == [f"overlays/{o}" for o in overlays]


@pytest.mark.tools_venv
@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("target", TARGETS)
def test_core_objects_validate_against_kubernetes_schemas(rendered, target, version, tmp_path):
    out = rendered(target)
    core = [d for d in out.docs if d["kind"] not in CRD_KINDS]
    assert core
    path = tmp_path / "core.yaml"
    path.write_text(yaml.safe_dump_all(core, sort_keys=False))
    result = subprocess.run(
        [tool("kubernetes-validate"), "--strict", "--quiet", "-k", version, str(path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, f"{target} against Kubernetes {version}:\n{result.stdout}{result.stderr}"
    # --quiet prints only warnings and failures: a warning (unknown kind, deprecated API) is a failure here
    assert result.stdout.strip() == "", result.stdout


@pytest.mark.parametrize("target", TARGETS)
def test_custom_resources_are_well_formed(rendered, target):
    """The minimal structure the Prometheus Operator needs, in place of a schema."""
    out = rendered(target)
    services = {s["metadata"]["name"]: s for s in out.of_kind("Service")}
    for monitor in out.of_kind("ServiceMonitor"):
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        spec = monitor["spec"]
        assert set(spec) <= {"jobLabel", "selector", "namespaceSelector", "endpoints"}, set(spec)
        matched = [
            s
            for s in services.values()
            if spec["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()
        ]
        assert len(matched) == 1, f"{monitor['metadata']['name']} selects {len(matched)} Services"
        ports = {p["name"] for p in matched[0]["spec"]["ports"]}
        for endpoint in spec["endpoints"]:
            assert endpoint["port"] in ports
            assert endpoint["honorLabels"] is True
            assert endpoint["interval"].endswith("s")
    for rule in out.of_kind("PrometheusRule"):
        assert rule["apiVersion"] == "monitoring.coreos.com/v1"
        groups = rule["spec"]["groups"]
        assert groups
        for group in groups:
            assert group["name"] and group["rules"]
            for item in group["rules"]:
                assert ("alert" in item) != ("record" in item), item
                assert item["expr"]


def _checkov(directory: Path) -> dict:
    result = subprocess.run(
        [
            tool("checkov"),
            "--directory",
            str(directory),
            "--framework",
            "kubernetes",
            "--skip-download",
            "--output",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    # exit code 1 means failed checks; anything else non-zero is checkov itself failing
    assert result.returncode in (0, 1), result.stderr[-4000:]
    report = json.loads(result.stdout)
    reports = report if isinstance(report, list) else [report]
    return next(r for r in reports if r.get("check_type") == "kubernetes")


CHECK_KINDS = ("passed_checks", "failed_checks", "skipped_checks")


@pytest.fixture(scope="module")
def checkov_checks(rendered) -> dict[str, dict[str, list[dict]]]:
    """checkov's checks of every target, by target and kind: one run over a folder of all their
    manifests, since starting checkov is most of a run's cost (~4 s of CPU, six times before). Not
    ``--quiet``, which leaves the passed and the skipped checks out of the report."""
    with tempfile.TemporaryDirectory() as tmp:
        targets = {}
        for target in TARGETS:
            out = rendered(target)
            (Path(tmp) / out.path.name).write_text(out.path.read_text())
            targets[f"/{out.path.name}"] = target  # checkov's file_path, from the folder it was given
        report = _checkov(Path(tmp))
    assert report["summary"]["parsing_errors"] == 0, report["summary"]
    checks: dict[str, dict[str, list[dict]]] = {t: {kind: [] for kind in CHECK_KINDS} for t in TARGETS}
    for kind in CHECK_KINDS:
        for check in report["results"].get(kind, []):
            checks[targets[check["file_path"]]][kind].append(check)
    return checks


@pytest.mark.tools_venv
@pytest.mark.parametrize("target", TARGETS)
def test_checkov_has_no_unskipped_failure(checkov_checks, target):
    checks = checkov_checks[target]
    assert {c["resource"] for kind in CHECK_KINDS for c in checks[kind]}, (
        f"checkov checked nothing in {target}"
    )
    failed = checks["failed_checks"]
    assert not failed, "\n".join(f"{c['check_id']} {c['check_name']} on {c['resource']}" for c in failed)
    assert checks["passed_checks"]
    for skipped in checks["skipped_checks"]:
        reason = (skipped.get("check_result") or {}).get("suppress_comment", "")
        assert len(reason) >= 40, f"{skipped['check_id']} on {skipped['resource']}: no written reason"


def test_checkov_skips_are_the_documented_ones(rendered):
    """Every skip annotation in the manifests names a check and gives a reason; the set is the one
    docs/kubernetes.md explains, so a new skip cannot slip in unreviewed."""
    skips: dict[str, set[str]] = {}
    for target in TARGETS:
        for doc in rendered(target).docs:
            for key, value in (doc["metadata"].get("annotations") or {}).items():
                if key.startswith("checkov.io/skip"):
                    check, sep, reason = value.partition("=")
                    assert sep and "=" not in reason, f"{key}: checkov splits on the only '='"
                    assert len(reason) >= 40, f"{key}: {check} needs a written reason"
                    skips.setdefault(f"{doc['kind']}/{doc['metadata']['name']}", set()).add(check)
    assert skips == {
        # CKV_K8S_17 (host PID): only the process-usage overlay's exporter (components/process-usage)
        "DaemonSet/gpumeter-exporter": {"CKV_K8S_17", "CKV_K8S_23", "CKV_K8S_40", "CKV_K8S_43"},
        "Deployment/gpumeter-billing": {"CKV_K8S_35", "CKV_K8S_43"},
    }
    doc = (ROOT / "docs" / "kubernetes.md").read_text()
    for check in set().union(*skips.values()):
        assert check in doc, f"docs/kubernetes.md does not explain {check}"
