"""The real image, built here: the project's Dockerfile built by Debian's buildah on a base that
debootstrap makes from Debian's packages (registry base images cannot be pulled on the test
machines), and commands run inside it as the image runs them.

    python -m tests.deploy.image build                      # make image; prints the image's name
    python -m tests.deploy.image run [-v HOST:DIR] -- CMD   # CMD in a fresh container, as UID 10001

Stdlib only, so `make image` needs no virtual env. Everything lives under build/image/: the
debootstrap tarball (keyed by its inputs, so a second build skips the ~30 s debootstrap) and
buildah's storage (`--root`, never the machine's global /var/lib/containers), whose layer cache
makes an unchanged rebuild take seconds.

Both builds and runs use chroot isolation: this sandbox refuses the user namespaces that `podman
run` and buildah's default (oci) isolation need, while chroot isolation shares the host's network,
so the Dockerfile's `pip install` reaches PyPI and a command inside reaches servers on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tomllib
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STATE = ROOT / "build" / "image"
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
IMAGE = f"localhost/gpumeter:{VERSION}"
USER = "10001:10001"  # the Dockerfile's USER and the billing Deployment's runAsUser

# The base stands in for python:3.11-slim-bookworm: Debian's own Python 3.11 with what the
# Dockerfile's RUN lines call (`python -m venv`, groupadd/useradd from passwd).
SUITE = "bookworm"
MIRROR = os.environ.get("DEBIAN_MIRROR", "http://deb.debian.org/debian")
PACKAGES = ("python3", "python3-venv", "python-is-python3", "passwd")
# Debian's pip (the one python3-venv puts into a venv) trusts this bundle, not certifi's. The build
# borrows the host's for its RUN steps, so a TLS proxy the host trusts lets pip through; the bundle
# is bind-mounted, never written into a layer.
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


def _storage_driver() -> str:
    """overlay where the kernel mounts it over build/ (here: 1.5 min cold against vfs's 6, each
    vfs layer being a full copy of the tree); vfs, which works anywhere, otherwise.
    IMAGE_STORAGE_DRIVER overrides the choice."""
    chosen = os.environ.get("IMAGE_STORAGE_DRIVER")
    if chosen:
        return chosen
    # containers/storage mounts a test overlay when the driver starts, and refuses if it cannot.
    probe = subprocess.run([*_buildah_with("overlay"), "images", "-q"], capture_output=True)
    return "overlay" if probe.returncode == 0 else "vfs"


def _buildah_with(driver: str) -> list[str]:
    # A storage tree per driver: containers/storage refuses a root made by another driver.
    return [
        "buildah",
        "--root",
        str(STATE / f"storage-{driver}"),
        "--runroot",
        str(STATE / f"run-{driver}"),
        "--storage-driver",
        driver,
    ]


_driver: str | None = None


def buildah(*args: str) -> list[str]:
    """The buildah command line with this project's storage."""
    global _driver
    if _driver is None:
        _driver = _storage_driver()
    return [*_buildah_with(_driver), *args]


class ImageError(RuntimeError):
    """A step of the build failed; the message is one line naming it."""


def _check(command: Sequence[str], **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(command, text=True, **kwargs)
    if result.returncode != 0:
        detail = (result.stderr or "").strip().splitlines()[-1:] or ["its output is above"]
        raise ImageError(f"`{' '.join(command)}` exited {result.returncode}: {detail[0]}")
    return result


def _image_exists(name: str) -> bool:
    return subprocess.run(buildah("inspect", "--type", "image", name), capture_output=True).returncode == 0


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """One build at a time (pytest-xdist workers, a `make image` beside a test run): a second waits,
    then finds every layer cached."""
    STATE.mkdir(parents=True, exist_ok=True)
    with (STATE / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def base_image() -> str:
    """The debootstrap base, made once per set of inputs and kept as a tarball and as an image."""
    key = hashlib.sha256(json.dumps([SUITE, MIRROR, PACKAGES]).encode()).hexdigest()[:12]
    name = f"localhost/gpumeter-base:{SUITE}-{key}"
    if _image_exists(name):
        return name
    tarball = STATE / f"base-{SUITE}-{key}.tar"
    if not tarball.exists():
        rootfs = STATE / f"base-{SUITE}-{key}.rootfs"
        shutil.rmtree(rootfs, ignore_errors=True)
        print(f"image: debootstrap {SUITE} with {', '.join(PACKAGES)} from {MIRROR}", flush=True)
        _check(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(PACKAGES)}",
                SUITE,
                str(rootfs),
                MIRROR,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        # What the slim images leave out too: downloaded packages and the package lists.
        for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for path in (rootfs / cache).glob("*"):
                if path.is_file():
                    path.unlink()
        partial = tarball.with_suffix(".partial")
        _check(["tar", "--numeric-owner", "-C", str(rootfs), "-cf", str(partial), "."], capture_output=True)
        partial.rename(tarball)
        shutil.rmtree(rootfs)
    container = _check(buildah("from", "scratch"), capture_output=True).stdout.strip()
    try:
        _check(buildah("add", container, str(tarball), "/"), capture_output=True)
        _check(buildah("commit", "--quiet", container, name), capture_output=True)
    finally:
        subprocess.run(buildah("rm", container), capture_output=True)
    return name


def build() -> str:
    """Build the Dockerfile as CI's image would be built, on the debootstrap base; return its name."""
    for tool in ("buildah", "debootstrap"):
        if not (shutil.which(tool) or Path("/usr/sbin", tool).exists()):
            raise ImageError(f"{tool} is not installed; run `make tools` (Debian package {tool})")
    with _locked():
        base = base_image()
        volumes = ["--volume", f"{CA_BUNDLE}:{CA_BUNDLE}:ro"] if CA_BUNDLE.exists() else []
        _check(
            buildah(
                "build",
                "--isolation",
                "chroot",
                "--layers",  # the cache that makes a rebuild with an unchanged lock take seconds
                "--pull-never",
                *volumes,
                "--build-arg",
                f"PYTHON_IMAGE={base}",
                "--tag",
                IMAGE,
                "--file",
                str(ROOT / "Dockerfile"),
                str(ROOT),
            )
        )
    return IMAGE


def run(
    command: Sequence[str],
    *,
    mounts: dict[Path, str] | None = None,
    image: str = IMAGE,
    user: str = USER,
    timeout: float | None = None,
) -> subprocess.CompletedProcess:
    """``command`` in a fresh container of ``image`` as ``user``, in the image's WORKDIR (empty and
    the user's own), each of ``mounts`` (host directory -> path inside) read-only, the host's network.
    Output is captured; the container is removed afterwards."""
    name = f"gpumeter-run-{uuid.uuid4().hex[:12]}"
    _check(buildah("from", "--pull-never", "--quiet", "--name", name, image), capture_output=True)
    volumes = [arg for host, inside in (mounts or {}).items() for arg in ("--volume", f"{host}:{inside}:ro")]
    try:
        return subprocess.run(
            buildah(
                "run",
                "--isolation",
                "chroot",
                "--network",
                "host",
                "--user",
                user,
                *volumes,
                name,
                "--",
                *command,
            ),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    finally:
        subprocess.run(buildah("rm", name), capture_output=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.deploy.image", description=__doc__.split("\n\n")[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("build", help="build the image (make image)")
    run_parser = commands.add_parser("run", help=f"run a command in a fresh container as {USER}")
    run_parser.add_argument(
        "-v", "--volume", action="append", default=[], metavar="HOST:DIR", help="mount read-only"
    )
    run_parser.add_argument("argv", nargs="+", metavar="CMD")
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            print(build())
            return 0
        mounts = {Path(host).resolve(): inside for host, _, inside in (v.partition(":") for v in args.volume)}
        result = run(args.argv, mounts=mounts)
    except ImageError as error:
        print(f"image: {error}", file=sys.stderr)
        return 1
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
