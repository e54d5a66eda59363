"""`gpumeter demo` driven headless: the stack comes up on a month of backfilled history, an injected
fault reaches Alertmanager, billing has priced the month, last month's chargeback and fleet-health
reports exist, every capacity-dashboard query returns data (the stand-in kube-state-metrics is scraped),
and Ctrl-C stops it all."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpumeter.dashboards.build import GENERATED
from gpumeter.simulator.fleet import load_fleet
from tests.dashboards.promql import queries, substitute
from tests.installed.layout import free_offset as layout_free_offset
from tests.reports.focus_checks import KNOWN_VALIDATOR_FAILURES, rows_of, schema_problems, validate_12
from tests.reports.helpers import html_tables
from tests.support import loopback
from tests.support.servers import require_binary

ROOT = Path(__file__).parents[2]
FLEETS = ("h100-mig", "a100-mixed", "shared-modes")  # deploy/demo.py's


def free_offset() -> int:
    """A --port-offset whose every port is free, searched from 20000 (tests/installed/layout.py's from
    21000, so the two demos of one run do not pick the same)."""
    return layout_free_offset(start=20000)


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
@pytest.mark.focus_validator
@pytest.mark.slow
# the demo simulates and bills from the 1st of last month to now: 31 to 61 days by the calendar, the
# most at a month's end. Alone on a fast machine it is ready in 55 s and the test ends in 92 s; beside
# the other modules 160-260 s; on CI's slowest machine yet (2026-12-07, 3x slower) it ran past 840 s.
# The test waits for "stack ready" or the demo's own exit (it gives up on a process by itself,
# deploy/demo.py's READY_TIMEOUT_S): the timeout below only stops a hang, it times nothing, so it sits
# near CI's whole budget
@pytest.mark.timeout(1500)
def test_the_demo_stack_end_to_end(tmp_path):
    for tool in ("prometheus", "promtool", "prometheus-alertmanager"):
        require_binary(tool)
    workdir = tmp_path / "demo"
    offset = free_offset()  # ports 9090 + offset, ...
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpumeter", "demo", "--workdir", str(workdir), "--port-offset", str(offset)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )
    output: list[str] = []
    try:
        started = time.monotonic()
        for line in proc.stdout:
            output.append(f"[{time.monotonic() - started:4.0f} s] {line}")  # where a slow run spent it
            if "stack ready" in line:
                break
        assert any("stack ready" in line for line in output), "".join(
            [line for line in output if "%|" not in line][-40:]  # not the progress bars' redraws
        )
        prometheus, alertmanager = f"http://127.0.0.1:{9090 + offset}", f"http://127.0.0.1:{9093 + offset}"
        admin = f"http://127.0.0.1:{9836 + offset}"

        # billing priced the backfilled month: tenant and platform cost lines are exposed
        billing = loopback.get(f"http://127.0.0.1:{9840 + offset}/metrics", timeout=10).text
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
        result = loopback.get(
            f"{prometheus}/api/v1/query",
            params={
                "query": 'count(count_over_time(nvidia_gpu_allocation{hostname="gpu-h100-mig-01"}[30d]))'
            },
        ).json()
        assert int(result["data"]["result"][0]["value"][1]) >= 56

        # every way a GPU is shared is in Prometheus, live from the six exporters: exclusive and
        # time-sliced (a100-mixed), MIG (h100-mig), time-slicing, MPS and fractional grants (HAMi,
        # gpushare; read from the stand-in Kubernetes API) on shared-modes, and the vGPU host's VMs
        def sharing_values() -> set[str]:
            answer = loopback.get(
                f"{prometheus}/api/v1/query",
                params={"query": "count by (sharing) (nvidia_gpu_allocation)"},
                timeout=10,
            ).json()
            return {r["metric"]["sharing"] for r in answer["data"]["result"]}

        six = {"exclusive", "mig", "time_slicing", "mps", "fractional", "vgpu"}
        poll(sharing_values, lambda found: found == six, 90, "all six sharing values live")
        # and in the backfilled month
        month = loopback.get(
            f"{prometheus}/api/v1/query",
            params={"query": "count by (sharing) (count_over_time(nvidia_gpu_allocation[30d]))"},
            timeout=30,
        ).json()["data"]["result"]
        assert {r["metric"]["sharing"] for r in month} == six, month

        # per-process use on the shared GPUs, by pod: the processes collector maps each process's
        # cgroup to its pod through the stand-in Kubernetes API's pod list (device series carry no
        # hostname: the demo's scrape labels each exporter's instance with its node)
        def process_pods() -> set[tuple[str, str, str]]:
            answer = loopback.get(
                f"{prometheus}/api/v1/query",
                params={"query": 'nvidia_gpu_process_sm_utilization_ratio{pod!=""}'},
                timeout=10,
            ).json()
            return {
                (r["metric"]["instance"].split(":")[0], r["metric"]["namespace"], r["metric"]["pod"])
                for r in answer["data"]["result"]
            }

        expected_process_pods = {
            ("gpu-shared-ts-01", "data-eng", "etl-1"),  # time-sliced
            ("gpu-shared-mps-01", "inference", "server-0"),  # MPS (its first 18 h run from the start)
            ("gpu-shared-frac-01", "genai", "llm-serve"),  # HAMi grant
            ("gpu-shared-frac-01", "vision", "ocr"),  # gpushare grant
        }
        poll(process_pods, lambda found: expected_process_pods <= found, 90, "process series with pod names")

        if (ROOT / "reports" / "cli.py").exists():
            files = {p.suffix for p in (workdir / "reports").rglob("*") if p.is_file()}
            assert {".html", ".csv"} <= files, files
            # the fleet-health report for last month, over every GPU of both fleets
            health = list((workdir / "reports").glob("gpumeter-health-*.json"))
            assert len(health) == 1, sorted(p.name for p in (workdir / "reports").iterdir())
            doc = json.loads(health[0].read_text())
            gpus = sum(len(n.gpus) for f in FLEETS for n in load_fleet(f).nodes)
            assert doc["fleet"]["gpus"] == gpus and doc["fleet"]["gpu_hours_in_service"] > 0
            assert doc["fleet"]["mean_utilization"] is not None and 1 <= doc["fleet"]["maturity_level"] <= 5
            assert doc["teams"] and all(
                t["maturity_level"] for t in doc["teams"] if t["mean_utilization"] is not None
            )
            assert (workdir / "reports" / health[0].name.replace(".json", ".html")).exists()
            # the incidents deploy/demo.py puts in last month's history, worked out by hand (H = hours in the
            # month): H100 pool 15 GPUs (8 of h100-mig, 7 of shared-modes' four nodes), GPU 5 lost 2 h
            # (15H - 2 GPU-hours in service), 3 failures (XID 48 twice on GPU 3; XID 79 and the loss of GPU 5
            # count once), MTBF (15H - 2) / 3, 1.5 h HW thermal;
            # A100 pool: XID 31 (application), a 2-row remap (XID 63, hardware) pending, then a row-remap
            # failure (XID 64, critical): 1 failure in 6H GPU-hours. RMA: H100 GPU 3 and A100 GPU 2.
            start, end = (
                datetime.fromisoformat(doc["period"][k].replace("Z", "+00:00")) for k in ("start", "end")
            )
            hours = int((end - start).total_seconds()) // 3600
            pools = {p["pool"]: p for p in doc["pools"]}
            h100, a100 = pools["NVIDIA H100 80GB HBM3"], pools["NVIDIA A100-SXM4-40GB"]
            assert (h100["gpus"], h100["gpu_hours_in_service"], h100["failures"]) == (15, 15 * hours - 2, 3)
            assert h100["mtbf_hours"] == pytest.approx((15 * hours - 2) / 3, abs=1e-6)
            assert (h100["lost_gpus"], h100["lost_hours"], h100["thermal_slowdown_hours"]) == (1, 2.0, 1.5)
            assert h100["xid_events"] == {"critical": 3, "hardware": 0, "application": 0}
            assert a100["xid_events"] == {"critical": 1, "hardware": 1, "application": 1}
            assert (a100["failures"], a100["mtbf_hours"], a100["remapped_rows"]) == (1, 6 * hours, 2)
            assert a100["gpus_with_pending_remap_or_retirement"] == 1
            rma = sorted((c["node"], len(c["reasons"])) for c in doc["rma_candidates"])
            assert rma == [("gpu-a100-mixed-01", 2), ("gpu-h100-mig-01", 1)], doc["rma_candidates"]

            # the chargeback report shows how the pods held their GPUs: all six sharing modes, each with
            # the pods the demo's fleets give it (the vGPU host's VMs hold theirs as namespace = VM ID)
            (chargeback,) = (workdir / "reports").rglob("gpumeter-*-by-team.html")
            modes = {row[0]: row for row in html_tables(chargeback.read_text())["sharing-modes"][1:]}
            assert set(modes) == six, modes
            assert "data-eng/etl-1" in modes["time_slicing"][2] and "inference/server-0" in modes["mps"][2]
            assert "genai/llm-serve" in modes["fractional"][2] and modes["vgpu"][1] == "3"

            # billing read the global store: last month's cost per cluster, east's six nodes and west's H200
            # node, each tenant cost positive and together no more than the month's total
            (by_cluster,) = (workdir / "reports").rglob("gpumeter-*-by-cluster.csv")
            rows = list(csv.DictReader(by_cluster.read_text().splitlines()))
            tenants = {r["group"]: float(r["cost"]) for r in rows if r["line"] == "tenant"}
            assert set(tenants) == {"east", "west"} and min(tenants.values()) > 0, rows
            (total,) = [float(r["cost"]) for r in rows if r["group"] == "__total__"]
            assert sum(tenants.values()) <= total + 0.01, rows

            # last month, backfilled whole: data-platform's time-sliced A100 alone costs far over its 100
            (budget_csv,) = (workdir / "reports").rglob("*-budgets.csv")
            over = {r["team"]: r["over_budget"] for r in csv.DictReader(budget_csv.read_text().splitlines())}
            assert over["data-platform"] == "true", over

        # two clusters in one VictoriaMetrics (deploy/demo_clusters.py): east's six nodes and west's H200
        # node, each written by its own Prometheus with its external label, and vmalert's rule results
        # there one per cluster; the dashboards the demo built show the cluster variable
        victoria_metrics = f"http://127.0.0.1:{8428 + offset}"

        def clusters_of(promql: str) -> set[str]:
            answer = loopback.get(
                f"{victoria_metrics}/api/v1/query", params={"query": promql}, timeout=10
            ).json()
            return {r["metric"].get("cluster") for r in answer["data"]["result"]}

        both = {"east", "west"}
        poll(
            lambda: clusters_of("count by (cluster) (nvidia_gpu_info)"),
            both.__eq__,
            90,
            "both clusters' GPUs",
        )
        poll(
            lambda: clusters_of("cluster:nvidia_gpu_info:count"),
            both.__eq__,
            90,
            "vmalert's rules per cluster",
        )
        fleet = json.loads((workdir / "dashboards" / "gpumeter-fleet.json").read_text())
        cluster_variable = fleet["templating"]["list"][1]
        assert (cluster_variable["name"], cluster_variable["hide"]) == ("cluster", 0)

        # every query of the capacity dashboard returns data from the demo's Prometheus (pending demand,
        # waiting time and quota come from the stand-in kube-state-metrics; the rules need a few rounds)
        capacity = json.loads((GENERATED / "gpumeter-capacity.json").read_text())
        found = list(queries(capacity))
        assert len(found) >= 15

        def empty() -> list[str]:
            return [
                f.id
                for f in found
                if not loopback.get(
                    f"{prometheus}/api/v1/query", params={"query": substitute(f.expr)}, timeout=10
                ).json()["data"]["result"]
            ]

        poll(empty, lambda left: left == [], 120, "data for every capacity-dashboard query")

        # data-platform's forecast (a week of backfilled cost projected over the month) is over its
        # budget whatever the day of the month: the rule sees it (pending, for: 3h)
        poll(
            lambda: loopback.get(
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
            lambda: loopback.get(f"{alertmanager}/api/v2/alerts", timeout=5).json(),
            lambda a: any(x["labels"].get("alertname") == "GpuXidCritical" for x in a),
            120,
            "GpuXidCritical in Alertmanager",
        )
        critical = next(x for x in alerts if x["labels"]["alertname"] == "GpuXidCritical")
        assert critical["labels"]["gpu"] == "3" and critical["labels"]["xid"] == "79"
        # vmalert alerts over both clusters, and names east's
        assert critical["labels"]["cluster"] == "east"
        assert critical["annotations"]["description"].startswith("Cluster east: XID 79 on GPU 3 ")
        assert critical["labels"]["severity"] == "critical"
        assert all(
            x["labels"].get("gpu") in (None, "3")
            for x in alerts
            if x["labels"].get("hostname") == "gpu-h100-mig-01"
        ), alerts
    finally:
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole group
        try:
            rest, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            rest, _ = proc.communicate()
    assert proc.returncode == 0, "".join(output[-20:]) + rest
    assert "stopped" in rest
    # each process stopped on its own, in order (Prometheus flushing into a VictoriaMetrics still up)
    assert "did not stop" not in rest, rest
    time.sleep(0.5)
    assert processes_mentioning(str(workdir)) == []
    _check_the_demo_months_focus_exports(workdir, tmp_path / "focus")


def _check_the_demo_months_focus_exports(workdir: Path, out: Path) -> None:
    """FOCUS 1.3 split cost allocation on the demo's month, every sharing mode in it: the 1.3 file the demo wrote meets the 1.3
    definitions, and the month's 1.2 export, rendered from the demo's ledger as a consumer that has not
    moved would ask for it, passes the FinOps Foundation's validator but for the documented rule."""
    (focus13,) = (workdir / "reports").glob("gpumeter-*-focus-1.3.csv")
    assert schema_problems(focus13) == []
    _header, rows = rows_of(focus13)
    methods = {row["AllocatedMethodId"] for row in rows}
    # the splits of the demo's sharing modes each named (docs/reports.md, "FOCUS 1.3 split cost allocation")
    kinds = ("mig-slice-weight", "time-slicing-share", "mps-share", "fractional-grant", "vgpu-share")
    assert {f"gpumeter.{kind}" for kind in kinds} <= methods, methods
    period = focus13.name.removeprefix("gpumeter-").removesuffix("-focus-1.3.csv")
    database = f"sqlite:///{workdir / 'billing.sqlite'}"
    argv = ["report", "--db", database, "--period", period, "--by", "team", "--format", "focus"]
    argv += ["--focus-version", "1.2", "--out", str(out), "--no-record"]
    done = subprocess.run([sys.executable, "-m", "gpumeter", *argv], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    (focus12,) = out.glob("gpumeter-*-focus-1.2.csv")
    outcome = validate_12(focus12, out / "validator")
    print(f"\ndemo month {period}: {len(rows)} FOCUS 1.3 rows; focus-validator on 1.2: {outcome}")
    assert outcome.rules >= 500 and outcome.passed >= 100, outcome
    assert outcome.failed == KNOWN_VALIDATOR_FAILURES, outcome


@pytest.mark.prometheus
@pytest.mark.alertmanager
def test_ctrl_c_while_the_demo_starts_stops_it_without_a_traceback(tmp_path):
    """A terminal's Ctrl-C signals the whole process group, so the step running then (here the
    history simulation, a child `gpumeter`) gets it as well as the demo. Both stop without a
    traceback, the demo says it was interrupted and exits 130, and no process is left behind."""
    workdir = tmp_path / "demo"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpumeter",
            "demo",
            "--workdir",
            str(workdir),
            "--port-offset",
            str(free_offset()),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )
    output: list[str] = []
    try:
        for line in proc.stdout:
            output.append(line)
            if "simulating history" in line:
                break
        time.sleep(3)  # the simulation's own process is under way
        assert processes_mentioning(str(workdir)), "".join(output)
        os.killpg(proc.pid, signal.SIGINT)
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = "".join(output) + rest
    assert proc.returncode == 130, text
    assert "interrupted" in text and "Traceback" not in text, text
    time.sleep(0.5)
    assert processes_mentioning(str(workdir)) == []
