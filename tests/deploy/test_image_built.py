"""The image as `make image` builds it and as it runs: UID 10001 in an empty WORKDIR that is its own,
site-packages and HOME not writable. Every user-facing command runs inside it (tests/installed/layout.py
through tests/deploy/image.py), and it holds the same package as the wheel built from the same checkout."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.installed.history import backfilled_prometheus

from . import image

LAYOUT = Path(__file__).resolve().parents[1] / "installed" / "layout.py"
# The first test may build the image: cold, minutes (debootstrap and pip's downloads); warm, seconds.
pytestmark = [pytest.mark.buildah, pytest.mark.timeout(1800)]

LAYOUT_PROBE = """
import importlib.util, json, os, pathlib, sys

def writable(folder):
    try:
        (pathlib.Path(folder) / ".probe").touch()
    except OSError:
        return False
    return True

(package,) = importlib.util.find_spec("gpumeter").submodule_search_locations
print(json.dumps({
    "user": [os.getuid(), os.getgid()],
    "cwd": os.getcwd(),
    "cwd_entries": os.listdir("."),
    "home": os.environ.get("HOME"),
    "home_writable": writable(os.path.expanduser("~")),
    "package_writable": writable(package),
    "python": sys.version_info[:2],
    "mounted": pathlib.Path("/mnt/host/hello.txt").read_text(),
    "mount_writable": writable("/mnt/host"),
    "cwd_writable": writable("."),
}))
"""

PACKAGE_FILES = """
import importlib.util, os
(package,) = importlib.util.find_spec("gpumeter").submodule_search_locations
for folder, dirs, files in os.walk(package):
    dirs[:] = [d for d in dirs if d != "__pycache__"]  # compiled by the Dockerfile, not shipped
    for name in files:
        print(os.path.relpath(os.path.join(folder, name), os.path.dirname(package)))
"""


def test_commands_run_as_the_image_runs_them(built_image, tmp_path):
    (tmp_path / "hello.txt").write_text("from the host")
    tmp_path.chmod(0o755)  # pytest's 0700 would keep UID 10001 out of the mount
    result = image.run(
        ["python", "-c", LAYOUT_PROBE], mounts={tmp_path: "/mnt/host"}, image=built_image, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {
        "user": [10001, 10001],
        "cwd": "/var/lib/gpumeter",
        "cwd_entries": [],  # a fresh container: the working directory starts empty
        "home": "/nonexistent",
        "home_writable": False,
        "package_writable": False,
        "python": [3, 11],
        "mounted": "from the host",
        "mount_writable": False,
        "cwd_writable": True,
    }
    assert not (tmp_path / ".probe").exists()


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    with backfilled_prometheus(tmp_path_factory.mktemp("history")) as served:
        yield served


@pytest.mark.slow
@pytest.mark.prometheus
def test_every_command_runs_inside_the_image(built_image, prometheus, tmp_path):
    """tests/installed/layout.py, every user-facing command's main path, inside the image as UID
    10001 in its WORKDIR; the Prometheus it reads runs here, reached over the shared host network."""
    prom, day = prometheus
    shutil.copy(LAYOUT, tmp_path / "layout.py")  # a folder UID 10001 can read, whatever the checkout's modes
    tmp_path.chmod(0o755)
    (tmp_path / "layout.py").chmod(0o644)
    argv = ["python", "/mnt/layout/layout.py", "--prometheus", prom.url, "--day", day.date().isoformat()]
    argv += ["--work", "/var/lib/gpumeter"]  # the image's WORKDIR: empty in a fresh container, the user's own
    result = image.run(argv, mounts={tmp_path: "/mnt/layout"}, image=built_image, timeout=1500)
    print(result.stdout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "FAIL" not in result.stdout
    assert "as uid 10001," in result.stdout
    assert "/opt/gpumeter/lib/python3.11/site-packages/gpumeter read-only" in result.stdout


def test_the_image_installs_the_wheels_package(built_image, wheel_files):
    result = image.run(["python", "-c", PACKAGE_FILES], image=built_image, timeout=120)
    assert result.returncode == 0, result.stderr
    in_image = set(result.stdout.splitlines())
    assert in_image == wheel_files, {
        "only in the image": sorted(in_image - wheel_files)[:20],
        "only in the wheel": sorted(wheel_files - in_image)[:20],
    }
