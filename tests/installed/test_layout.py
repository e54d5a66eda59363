"""The installed package as the image runs it: tests/installed/layout.py (every user-facing command's
main path) as UID 10001, over this interpreter's virtual environment, which that user cannot write
(site-packages read-only), with HOME unwritable and an empty working directory of its own.

``make test`` runs the suite from the wheel installed into a fresh virtual environment of Debian's
Python, outside the checkout, so this is the wheel as a user gets it; tests/deploy runs the same
script inside the image ``make image`` builds. The Prometheus it reads holds a day of
``simulate history`` of the h100-mig fleet, backfilled here with promtool.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.support.servers import PrometheusServer, require_binary

LAYOUT = Path(__file__).resolve().parent / "layout.py"
UID = 10001  # the image's user (Dockerfile, the billing Deployment's runAsUser)


def backfilled_day() -> datetime:
    """The first day of last month: `billing serve`'s scheduled report renders last month."""
    first = datetime.now(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    return (first - timedelta(days=1)).replace(day=1)


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    day = backfilled_day()
    work = tmp_path_factory.mktemp("history")
    history = work / "day.om"
    argv = [sys.executable, "-m", "gpumeter", "simulate", "history", "--fleet", "h100-mig"]
    argv += ["--from", day.isoformat(), "--to", (day + timedelta(days=1)).isoformat(), "--out", str(history)]
    subprocess.run(argv, check=True, capture_output=True, cwd=work)
    data = work / "data"
    subprocess.run(
        [require_binary("promtool"), "tsdb", "create-blocks-from", "openmetrics", str(history), str(data)],
        check=True,
        capture_output=True,
    )
    with PrometheusServer(work / "prom", data_dir=data) as prom:
        yield prom, day


def _as_the_image_user(argv: list[str], work: Path) -> subprocess.CompletedProcess:
    if os.geteuid() != 0:
        pytest.fail(
            "the image-layout test switches to UID 10001: run it as root (CI and the dev machines are)"
        )
    venv_bin = str(Path(sys.executable).parent)
    env = {"PATH": f"{venv_bin}:/usr/bin:/bin", "HOME": "/nonexistent", "LANG": "C.UTF-8", "TZ": "UTC"}
    setpriv = [require_binary("setpriv"), f"--reuid={UID}", f"--regid={UID}", "--clear-groups"]
    return subprocess.run([*setpriv, *argv], env=env, cwd=work, capture_output=True, text=True, timeout=1500)


@pytest.mark.slow
@pytest.mark.prometheus
@pytest.mark.image_user
@pytest.mark.timeout(1800)
def test_every_command_runs_as_the_image_runs_it(prometheus):
    prom, day = prometheus
    package = Path(
        subprocess.check_output(
            [sys.executable, "-c", "import gpumeter; print(gpumeter.__file__)"], text=True
        ).strip()
    ).parent
    before = sorted(str(p) for p in package.rglob("*"))
    work = Path(tempfile.mkdtemp(prefix="gpumeter-layout-"))
    try:
        os.chown(work, UID, UID)
        argv = [sys.executable, str(LAYOUT), "--prometheus", prom.url, "--day", day.date().isoformat()]
        argv += [
            "--work",
            str(work),
            "--gpumeter",
            str(Path(sys.executable).parent / "gpumeter"),
            "--with-demo",
        ]
        result = _as_the_image_user(argv, work)
        print(result.stdout)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        assert "FAIL" not in result.stdout
        assert f"as uid {UID}," in result.stdout
    finally:
        shutil.rmtree(work, ignore_errors=True)
    assert sorted(str(p) for p in package.rglob("*")) == before, "something was written into the package"
