"""A wheel built from the checkout as a fresh clone would build it.

Not in place: setuptools stages a build in the checkout's build/lib and packs whatever that holds, so
a file that pyproject.toml has since stopped shipping stays in every in-place build until build/lib is
removed by hand (the kustomize tree did). The files the checkout holds (tracked, and untracked but not
ignored) are copied to a scratch folder and the wheel is built there, without build isolation (the
dev env's setuptools, no download).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def checkout_files() -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split("\0")
    return [name for name in listed if name and (ROOT / name).is_file()]


def build_wheel(scratch: Path) -> Path:
    """Build the wheel under ``scratch`` (an empty folder) and return its path."""
    source = scratch / "source"
    for name in checkout_files():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, source / name)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(scratch),
            str(source),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = scratch.glob("gpumeter-*.whl")
    return wheel


def wheel_names(wheel: Path) -> list[str]:
    return zipfile.ZipFile(wheel).namelist()
