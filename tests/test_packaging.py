"""What `pip install gpumeter` puts into site-packages: one top-level package, and all of the project.

The folders stay where the design puts them (exporter/, billing/, ...) and pyproject.toml maps each to
`gpumeter.<part>`. A wheel is built from the working tree and its file list checked: exactly one
top-level import name, every tracked file of every part inside it, nothing of tests/.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.support.wheel import build_wheel, wheel_names

pytestmark = pytest.mark.spawns  # the wheel is built and listed by child processes

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel_files(tmp_path_factory) -> list[str]:
    return wheel_names(build_wheel(tmp_path_factory.mktemp("wheel")))


def _tracked(*folders: str) -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", *folders],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    return [name for name in listed if (ROOT / name).is_file()]


def test_one_top_level_import_name(wheel_files):
    top = {name.split("/")[0] for name in wheel_files if not name.split("/")[0].endswith(".dist-info")}
    assert top == {"gpumeter"}


# The kustomize tree is applied from a checkout (`kubectl apply -k`); no code reads it at run time.
NOT_PACKAGED = ("deploy/kubernetes/",)


def test_every_part_is_installed_under_gpumeter_and_tests_are_not(wheel_files):
    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    installed = set(wheel_files)
    for package, folder in mapping.items():
        prefix = package.replace(".", "/")
        missing = [
            name
            for name in _tracked(folder)
            if not name.startswith(NOT_PACKAGED)
            and f"{prefix}/{name.removeprefix(folder + '/')}" not in installed
        ]
        assert not missing, f"{folder}/ files missing from the wheel under {prefix}/: {missing[:10]}"
    assert not [name for name in wheel_files if name.startswith(("tests/", "gpumeter/tests/"))]


def test_the_kustomize_tree_is_not_package_data(wheel_files):
    assert _tracked("deploy/kubernetes"), "the checkout has the tree"
    assert not [name for name in wheel_files if name.startswith("gpumeter/deploy/kubernetes/")]


def test_the_package_declares_itself_typed(wheel_files):
    assert "gpumeter/py.typed" in wheel_files


def test_console_command_points_into_the_package():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"gpumeter": "gpumeter.cli:main"}
    result = subprocess.run([sys.executable, "-m", "gpumeter", "--version"], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.startswith("gpumeter "), result
