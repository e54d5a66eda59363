"""The Prometheus that tests/installed/layout.py reads: a day of ``simulate history`` of the h100-mig
fleet, backfilled with promtool. Shared by the run over the wheel (tests/installed/test_layout.py) and
the run inside the image (tests/deploy/test_image_built.py)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

from tests.support.servers import PrometheusServer, require_binary


def backfilled_day() -> datetime:
    """The first day of last month: `billing serve`'s scheduled report renders last month."""
    first = datetime.now(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    return (first - timedelta(days=1)).replace(day=1)


@contextlib.contextmanager
def backfilled_prometheus(work: Path) -> Iterator[tuple[PrometheusServer, datetime]]:
    """A running Prometheus over :func:`backfilled_day`, and that day."""
    day = backfilled_day()
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
