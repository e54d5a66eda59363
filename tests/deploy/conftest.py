"""Shared fixtures for the deployment tests: the kustomize targets rendered once per session with the
real kubectl, the tools from .venv-tools/ (tests/deploy/tools-venv.sh), a wheel built from the
checkout, and the image built by buildah (tests/deploy/image.py). A missing kubectl, tool or buildah
fails the test; nothing here is skipped."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.support import needs
from tests.support.servers import require_binary
from tests.support.wheel import build_wheel, wheel_names

from . import image

ROOT = Path(__file__).resolve().parents[2]
KUSTOMIZE = ROOT / "deploy" / "kubernetes"
TOOLS_VENV = Path(os.environ.get("TOOLS_VENV", ROOT / ".venv-tools"))

# Every overlay is a deployable target; the Alertmanager example is rendered and checked the same way.
OVERLAYS = sorted(p.parent.name for p in (KUSTOMIZE / "overlays").glob("*/kustomization.yaml"))
TARGETS = [f"overlays/{name}" for name in OVERLAYS] + ["alertmanager-example"]


def tool(name: str) -> str:
    needs.require("tools_venv")
    path = TOOLS_VENV / "bin" / name
    if not path.exists():
        pytest.fail(
            f"{path} is missing; run `bash tests/deploy/tools-venv.sh` (make test does) — never skipped",
            pytrace=False,
        )
    return str(path)


@dataclass
class Rendered:
    target: str
    path: Path
    docs: list[dict]

    def of_kind(self, kind: str) -> list[dict]:
        return [d for d in self.docs if d["kind"] == kind]

    def one(self, kind: str, name_prefix: str) -> dict:
        found = [d for d in self.of_kind(kind) if d["metadata"]["name"].startswith(name_prefix)]
        assert len(found) == 1, f"{self.target}: expected one {kind} {name_prefix}*, got {len(found)}"
        return found[0]


def render(target: str, out_dir: Path) -> Rendered:
    kubectl = require_binary("kubectl")
    result = subprocess.run(
        [kubectl, "kustomize", str(KUSTOMIZE / target)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, f"kubectl kustomize {target} failed:\n{result.stderr}"
    path = out_dir / (target.replace("/", "_") + ".yaml")
    path.write_text(result.stdout)
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    return Rendered(target, path, docs)


@pytest.fixture(scope="session")
def rendered(tmp_path_factory):
    """``rendered(target)`` -> Rendered, each target rendered once per session."""
    out_dir = tmp_path_factory.mktemp("rendered")
    cache: dict[str, Rendered] = {}

    def get(target: str) -> Rendered:
        if target not in cache:
            cache[target] = render(target, out_dir)
        return cache[target]

    return get


@pytest.fixture(scope="session")
def wheel_files(tmp_path_factory) -> set[str]:
    """The files a wheel built from the checkout installs: paths under site-packages, no dist-info."""
    wheel = build_wheel(tmp_path_factory.mktemp("wheel"))
    return {name for name in wheel_names(wheel) if ".dist-info/" not in name}


@pytest.fixture(scope="session")
def built_image() -> str:
    """The image `make image` builds (tests/deploy/image.py), built now if it is not: with every
    layer cached, a few seconds."""
    require_binary("buildah")
    require_binary("debootstrap")
    try:
        return image.build()
    except image.ImageError as error:
        pytest.fail(f"make image failed: {error}", pytrace=False)
