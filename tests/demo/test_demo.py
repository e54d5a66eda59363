"""`gpumeter demo` driven headless: the stack comes up on a month of backfilled history, an injected
fault reaches Alertmanager, billing has priced the month, reports exist, and Ctrl-C stops it all."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.servers import require_binary

ROOT = Path(__file__).parents[2]
OFFSET = 20000  # ports 29090, 29093, ... clear of a developer's own running demo


def processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes that mention ``text`` (the demo's workdir is in all of them)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if text in cmdline:
            found.append(f"{pid}: {cmdline}")
    return found


def poll(fetch, predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = fetch()
            if predicate(last):
                return last
        except httpx.HTTPError as exc:
            last = exc
        time.sleep(1)
    raise AssertionError(f"{what} within {timeout}s; last: {last}")


@pytest.mark.prometheus
@pytest.mark.alertmanager
@pytest.mark.slow
def test_the_demo_stack_end_to_end(tmp_path):
    for tool in ("prometheus", "promtool", "prometheus-alertmanager"):
        require_binary(tool)
    workdir = tmp_path / "demo"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpumeter", "demo", "--workdir", str(workdir), "--port-offset", str(OFFSET)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    output: list[str] = []
    try:
        deadline = time.monotonic() + 420
        for line in proc.stdout:
            output.append(line)
            if "stack ready" in line or time.monotonic() > deadline:
                break
        assert any("stack ready" in line for line in output), "".join(output[-40:])
        prometheus, alertmanager = f"http://127.0.0.1:{9090 + OFFSET}", f"http://127.0.0.1:{9093 + OFFSET}"
        admin = f"http://127.0.0.1:{9836 + OFFSET}"

        # billing priced the backfilled month: tenant and platform cost lines are exposed
        billing = httpx.get(f"http://127.0.0.1:{9840 + OFFSET}/metrics", timeout=10).text
        tenant = [
            ln
            for ln in billing.splitlines()
            if ln.startswith("gpumeter_billing_cost_total{") and 'namespace="search-inference"' in ln
        ]
        assert tenant and float(tenant[0].rsplit(" ", 1)[1]) > 0, billing[:2000]
        assert 'namespace="__unallocated__"' in billing

        # the teams' budgets (deploy/demo-teams.yaml) are served beside each team's month-to-date cost
        families = {f.name: f.samples for f in text_string_to_metric_families(billing)}
        budgets = {s.labels["team"]: s.value for s in families["gpumeter_billing_team_budget"]}
        assert budgets == {
            "search": 25000.0,
            "research": 10000.0,
            "perception": 5000.0,
            "language": 2000.0,
            "data-platform": 100.0,
        }
        assert set(budgets) <= {
            s.labels["team"] for s in families["gpumeter_billing_team_month_to_date_cost"]
        }

        # the history is queryable: a month of allocations for the h100 node
        result = httpx.get(
            f"{prometheus}/api/v1/query",
            params={
                "query": 'count(count_over_time(nvidia_gpu_allocation{hostname="gpu-h100-mig-01"}[30d]))'
            },
        ).json()
        assert int(result["data"]["result"][0]["value"][1]) >= 56

        if (ROOT / "reports" / "cli.py").exists():
            files = {p.suffix for p in (workdir / "reports").rglob("*") if p.is_file()}
            assert {".html", ".csv"} <= files, files
            # last month, backfilled whole: data-platform's time-sliced A100 alone costs far over its 100
            (budget_csv,) = (workdir / "reports").rglob("*-budgets.csv")
            over = {r["team"]: r["over_budget"] for r in csv.DictReader(budget_csv.read_text().splitlines())}
            assert over["data-platform"] == "true", over

        # data-platform's forecast (a week of backfilled cost projected over the month) is over its
        # budget whatever the day of the month: the rule sees it (pending, for: 3h)
        poll(
            lambda: httpx.get(
                f"{prometheus}/api/v1/query",
                params={"query": 'ALERTS{alertname="GpuTeamBudgetForecastExceeded", team="data-platform"}'},
                timeout=5,
            ).json()["data"]["result"],
            bool,
            60,
            "GpuTeamBudgetForecastExceeded for data-platform in Prometheus",
        )

        # a fault reaches Alertmanager through Prometheus' rules
        inject = subprocess.run(
            [
                sys.executable,
                "-m",
                "gpumeter",
                "simulate",
                "inject",
                "--admin",
                admin,
                "xid",
                "--gpu",
                "3",
                "--set",
                "code=79",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        assert inject.returncode == 0, inject.stderr
        alerts = poll(
            lambda: httpx.get(f"{alertmanager}/api/v2/alerts", timeout=5).json(),
            lambda a: any(x["labels"].get("alertname") == "GpuXidCritical" for x in a),
            120,
            "GpuXidCritical in Alertmanager",
        )
        critical = next(x for x in alerts if x["labels"]["alertname"] == "GpuXidCritical")
        assert critical["labels"]["gpu"] == "3" and critical["labels"]["xid"] == "79"
        assert critical["labels"]["severity"] == "critical"
        assert all(
            x["labels"].get("gpu") in (None, "3")
            for x in alerts
            if x["labels"].get("hostname") == "gpu-h100-mig-01"
        ), alerts
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            rest, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            rest, _ = proc.communicate()
    assert proc.returncode == 0, "".join(output[-20:]) + rest
    assert "stopped" in rest
    time.sleep(0.5)
    assert processes_mentioning(str(workdir)) == []
