"""What the exporter's process loads is what its configuration uses (its resident memory is the goal): gRPC and protobuf only
with a kubelet socket, httpx only with --kube-api, YAML only with a file to read, never billing,
reports or dashboards. Each case runs in a fresh interpreter outside the checkout, as the image runs.
The resident cost of each is measured by ``python -m tests.bench`` (docs/performance.md)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# The command line's own path to a running exporter, stopped short of serving.
PROBE = """
import json, sys
from gpumeter.cli import build_parser
from gpumeter.exporter import config
argv = sys.argv[1:]
args = build_parser(argv).parse_args(argv)
resolved = config.resolve(args, environ={})
from gpumeter.exporter.app import build_exporter
if resolved.simulate:
    build_exporter(resolved).stop()
print(json.dumps(sorted(sys.modules)))
"""
NEVER = (
    "gpumeter.billing",
    "gpumeter.reports",
    "gpumeter.dashboards",
    "sqlalchemy",
    "jinja2",
    "plotly",
    "pandas",  # billing's and reports' columns: tens of MiB resident
    "numpy",
)
BASE = ["exporter", "--listen", "127.0.0.1:0", "--kubelet-socket", ""]


def loaded(tmp_path, *argv: str) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, cwd=tmp_path, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return {
        name.split(".")[0] if not name.startswith("gpumeter.") else name for name in json.loads(done.stdout)
    }


def parts(modules: set[str]) -> set[str]:
    return {m for m in modules if m in NEVER or any(m.startswith(n + ".") for n in NEVER)}


@pytest.mark.spawns
@pytest.mark.parametrize(
    ("extra", "present", "absent"),
    [
        ([], set(), {"grpc", "google", "httpx", "yaml", "OpenSSL", "bcrypt"}),
        (["--simulate", "h100-mig"], {"yaml"}, {"grpc", "google", "httpx", "OpenSSL", "bcrypt"}),
        (
            ["--simulate", "h100-mig", "--kubelet-socket", "/nonexistent/kubelet.sock"],
            {"grpc", "google"},
            {"httpx"},
        ),
        (["--simulate", "h100-mig", "--kube-api", "http://127.0.0.1:9"], {"httpx"}, {"grpc", "google"}),
    ],
    ids=["flags-only", "simulated", "kubelet-socket", "kube-api"],
)
def test_the_exporter_loads_only_what_its_configuration_uses(tmp_path, extra, present, absent):
    modules = loaded(tmp_path, *BASE, *extra)
    assert present <= modules, f"expected {sorted(present - modules)} to be loaded"
    assert not absent & modules, f"loaded without being configured: {sorted(absent & modules)}"
    assert not parts(modules), f"the exporter loaded {sorted(parts(modules))}"


@pytest.mark.spawns
def test_a_config_file_loads_yaml(tmp_path):
    config = tmp_path / "exporter.yaml"
    config.write_text("interval: 5\n")
    assert "yaml" in loaded(tmp_path, *BASE, "--config", str(config))
