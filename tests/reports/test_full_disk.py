"""Reports onto a genuinely full filesystem: a tmpfs of a few kB, mounted here (root needed).

Before, `gpumeter report --out` ended in a 19-line traceback and left a cut-off HTML under its final
name; the scheduled job counted its failure but left a truncated HTML and a 0-byte health HTML in the
folder and logged "rendered 0 file(s)". Every file is now written to a temporary name beside its
final one and renamed when whole: a failure exits 1 with one line naming the path and the errno, no
file is left under a final name (nor a temporary one), and the job's log, result and
`gpumeter_billing_report_unwritten_files` say which files were not written.
"""

from __future__ import annotations

import errno
import logging
import os
import subprocess
import sys
from datetime import UTC, datetime

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpumeter import contract
from gpumeter.billing.config import Settings
from gpumeter.billing.ledger import open_ledger
from gpumeter.reports.schedule import ReportSchedule
from gpumeter.service import JOBS, build_app, monthly_report
from tests.reports.conftest import fill

pytestmark = pytest.mark.spawns  # `gpumeter report` runs as a process; mount and umount too

NOW = datetime(2026, 12, 1, 1, 0, tzinfo=UTC)
NAMES = ["gpumeter-2026-11-by-team.csv", "gpumeter-2026-11-by-team.html", "gpumeter-2026-11-lines.csv"]


@pytest.fixture
def full_disk(tmp_path):
    """A tmpfs of one 4 KiB page: the first report file of the month fills it."""
    if os.geteuid() != 0:
        pytest.fail(
            "this test mounts a small tmpfs (a genuinely full filesystem): run it as root", pytrace=False
        )
    mountpoint = tmp_path / "full"
    mountpoint.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4k,mode=0755", "tmpfs", str(mountpoint)], check=True)
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", "-l", str(mountpoint)], check=True)


@pytest.fixture
def ledger_url(tmp_path, worked_book):
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    ledger = open_ledger(url)
    fill(ledger, worked_book)
    ledger.close()
    return url


def _report(ledger_url: str, out) -> subprocess.CompletedProcess:
    """`gpumeter report` of November by team, as HTML and CSV, into ``out``: a process of its own, as users run it."""
    argv = [
        sys.executable,
        "-m",
        "gpumeter",
        "report",
        "--db",
        ledger_url,
        "--period",
        "2026-11",
        "--by",
        "team",
    ]
    argv += ["--format", "html,csv", "--out", str(out), "--no-record"]
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=120, env={**os.environ, "NO_COLOR": "1"}
    )


def test_report_onto_a_full_tmpfs_exits_1_in_one_line_and_leaves_no_file(full_disk, ledger_url):
    done = _report(ledger_url, full_disk)
    assert done.returncode == 1, done.stderr
    (line,) = done.stderr.splitlines()  # one line: no traceback
    assert line.startswith(f"error: {full_disk}/gpumeter-2026-11-") and f"[Errno {errno.ENOSPC}]" in line, (
        line
    )
    assert sorted(os.listdir(full_disk)) == []  # nothing under a final name, no temporary file left


def test_the_scheduled_job_onto_a_full_tmpfs_names_the_files_not_written(full_disk, ledger_url, caplog):
    JOBS.start(NOW, {})
    schedule = ReportSchedule(out_dir=str(full_disk), kinds="chargeback", formats="html,csv").as_dict()
    with caplog.at_level(logging.ERROR):
        message = monthly_report(Settings(db=ledger_url).as_dict(), schedule, now=NOW)
    assert "rendered 0 file(s)" in message and f"[Errno {errno.ENOSPC}]" in message, message
    in_order = ", ".join([NAMES[1], NAMES[0], NAMES[2]])  # as rendered: the HTML first
    assert "not written: " + in_order in message, message
    assert "not written: " + in_order in caplog.text and "Traceback" not in caplog.text
    assert sorted(os.listdir(full_disk / "2026-11")) == []

    ledger = open_ledger(ledger_url)
    try:
        body = b"".join(
            build_app(ledger, clock=lambda: NOW)(
                {"PATH_INFO": "/metrics", "REQUEST_METHOD": "GET"}, lambda *a: None
            )
        )
    finally:
        ledger.close()
    unwritten = sorted(
        (s.labels["task"], s.labels["file"])
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
        if s.name == contract.BILLING_REPORT_UNWRITTEN_FILES.name and s.value == 1
    )
    assert unwritten == [("chargeback_report", name) for name in NAMES]


def test_a_report_written_where_there_is_room_replaces_no_file_until_whole(tmp_path, ledger_url):
    """The same report in a roomy folder: every file whole, and nothing but them (no temporary names)."""
    out = tmp_path / "roomy"
    done = _report(ledger_url, out)
    assert done.returncode == 0, done.stderr
    assert sorted(os.listdir(out)) == sorted([*NAMES, "manifest.json"])
    assert (out / NAMES[1]).read_text().rstrip().endswith("</html>")
    assert oct((out / NAMES[1]).stat().st_mode & 0o777) == "0o644"
