"""Type-check the package as it is installed: ``python -m tests.support.typecheck [mypy options]``.

The parts live in top-level folders and install as ``gpumeter.<part>`` (pyproject's package-dir), and
the editable install maps them with an import hook that mypy cannot follow. So this lays the package
out in build/typecheck as links into the work tree, built from package-dir itself, and runs mypy with
pyproject's [tool.mypy] over it; paths in mypy's report are turned back into work-tree paths.
"""

from __future__ import annotations

import shutil
import sys
import tomllib
from pathlib import Path

from mypy import api

ROOT = Path(__file__).resolve().parents[2]
TREE = ROOT / "build" / "typecheck"


def package_dirs() -> dict[str, Path]:
    """Import name -> folder in the work tree, from pyproject.toml."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    return {name: ROOT / folder for name, folder in setuptools["package-dir"].items()}


def lay_out(tree: Path = TREE) -> dict[Path, Path]:
    """Build the link tree; returns each linked path -> the work-tree path it stands for."""
    shutil.rmtree(tree, ignore_errors=True)
    links: dict[Path, Path] = {}
    for name, folder in sorted(package_dirs().items()):
        place = tree.joinpath(*name.split("."))
        if name.count(".") == 0:  # the package root: its own files, beside the part folders
            place.mkdir(parents=True)
            for entry in folder.iterdir():
                if entry.suffix in (".py", ".pyi") or entry.name == "py.typed":
                    (place / entry.name).symlink_to(entry)
        else:
            place.parent.mkdir(parents=True, exist_ok=True)
            place.symlink_to(folder, target_is_directory=True)
        links[place] = folder
    return links


def main(argv: list[str]) -> int:
    links = lay_out()
    stdout, stderr, status = api.run(["--config-file", str(ROOT / "pyproject.toml"), *argv])
    # Longest link first, so gpumeter/exporter/... is not rewritten as the package root's.
    for link, folder in sorted(links.items(), key=lambda pair: -len(str(pair[0]))):
        for form in (str(link), str(link.relative_to(ROOT))):
            stdout = stdout.replace(f"{form}/", f"{folder.relative_to(ROOT)}/")
    sys.stdout.write(stdout)
    sys.stderr.write(stderr)
    return status


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
