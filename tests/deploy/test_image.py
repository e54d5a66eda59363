"""The container image: a slim multi-stage Dockerfile, non-root, with the runtime dependencies pinned
in requirements.lock. There is no Docker engine in CI, so the Dockerfile is linted (hadolint) and
checked for what matters, and the lock is checked against pyproject.toml."""

from __future__ import annotations

import json
import re
import subprocess
import tomllib

import pytest
from docker.utils.build import exclude_paths
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from .conftest import ROOT, tool
from .lock_runtime import closure, runtime_requirements

DOCKERFILE = ROOT / "Dockerfile"
LOCK = ROOT / "requirements.lock"


def _lock() -> dict[str, str]:
    pins = {}
    for line in LOCK.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, version = line.partition("==")
        assert sep and version and not re.search(r"[<>~;*,\s]", version), f"not an exact pin: {line}"
        pins[canonicalize_name(name)] = str(Version(version))
    return pins


@pytest.mark.tools_venv
def test_hadolint_passes():
    result = subprocess.run(
        [tool("hadolint"), "--format", "json", str(DOCKERFILE)], capture_output=True, text=True, timeout=60
    )
    findings = json.loads(result.stdout or "[]")
    assert result.returncode == 0 and not findings, "\n".join(
        f"{f['line']}: {f['code']} {f['message']}" for f in findings
    )


def test_dockerfile_is_slim_multistage_nonroot_with_the_gpumeter_entrypoint():
    text = DOCKERFILE.read_text()
    assert "ARG PYTHON_IMAGE=python:3.11-slim-bookworm" in text
    assert re.findall(r"^FROM (\S+)", text, re.M) == ["${PYTHON_IMAGE}", "${PYTHON_IMAGE}"]
    assert "AS build" in text and "COPY --from=build /opt/gpumeter /opt/gpumeter" in text
    users = re.findall(r"^USER (\S+)", text, re.M)
    assert users == ["10001:10001"]  # matches the billing Deployment's runAsUser
    assert 'ENTRYPOINT ["gpumeter"]' in text
    assert "-r requirements.lock" in text and "--no-deps" in text
    assert "COPY requirements.lock" in text
    assert re.search(r"^EXPOSE 9835 9402$", text, re.M)


def test_dockerignore_keeps_the_context_to_the_package():
    ignored = {
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {".git", ".venv", ".venv-*", "tests", "docs", "var", "deploy/kubernetes"} <= ignored
    assert not any(line.startswith("!") for line in ignored)
    # nothing the build needs is ignored: pyproject, the lock, every folder a package is mapped from
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    needed = {
        "pyproject.toml",
        "requirements.lock",
        "README.md",
        *setuptools["package-dir"].values(),
    }
    assert not needed & ignored, needed & ignored


@pytest.mark.spawns
def test_build_context_holds_the_wheels_package(wheel_files):
    """What .dockerignore lets into the build context under the folders pyproject maps into the
    package is exactly what the wheel installs: the image's `pip install .` builds the same package
    (tests/deploy/test_image_built.py compares the built image's files too)."""
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    folders = {
        folder: package.replace(".", "/")
        for package, folder in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
            "package-dir"
        ].items()
    }
    in_context = set()
    for path in exclude_paths(str(ROOT), patterns):  # Docker's own matcher (the Docker SDK)
        for folder, package in folders.items():
            if path.startswith(f"{folder}/") and (ROOT / path).is_file():
                in_context.add(f"{package}/{path.removeprefix(folder + '/')}")
    assert in_context == wheel_files, {
        "only in the build context": sorted(in_context - wheel_files)[:20],
        "only in the wheel": sorted(wheel_files - in_context)[:20],
    }


def test_lock_pins_every_runtime_dependency_within_its_range():
    pins = _lock()
    for requirement in runtime_requirements():
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement.name} missing from requirements.lock"
        assert requirement.specifier.contains(Version(pins[name]), prereleases=True), (
            f"{name}=={pins[name]} is outside pyproject's {requirement.specifier}"
        )
        for extra in requirement.extras:  # psycopg[binary] -> psycopg-binary
            assert canonicalize_name(f"{requirement.name}-{extra}") in pins


def test_lock_holds_no_development_tool():
    pins = _lock()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for text in project["optional-dependencies"]["dev"]:
        assert canonicalize_name(Requirement(text).name) not in pins


def test_lock_is_closed_under_the_installed_dependencies():
    """Every package the pinned ones need (in this environment) is pinned too: `pip install --no-deps
    -r requirements.lock` leaves nothing out (the Dockerfile then runs `pip check`)."""
    pins = _lock()
    needed = closure(runtime_requirements())
    assert set(needed) <= set(pins), set(needed) - set(pins)
