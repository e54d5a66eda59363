"""An hour of each real board (tests/data/real-gpu/, docs/real-gpu.md) through the real rule files: no
alert.

The exporter's /metrics on a real H200 and on a real H100 (driver 580, one GPU passed through to a VM) was
scraped idle, under a bf16 matrix-product load at the board's 700 W power limit (SW power cap active; the
H200 at 55 °C, the H100 at 62 °C) and after it. Here those three expositions, each held for its stretch
(10 min idle, 30 min load, 10 min after, 5 s apart), are promtool's input series, with the rule files
unchanged: no alert may fire or even be pending, since nothing was wrong with either board. This is the
check the simulator cannot give: the thresholds, the counters and the clock-event bits are the driver's
own, not ours (the critical temperature alert that once fired forever on a real H100 was exactly such a
case).

A control replays the same hour with the GPU at 90 °C during the load stretch (both boards' real slowdown
threshold is 89 °C) and expects GpuTemperatureAtSlowdown, so the quiet result is not for want of data.

The XIDs of four application faults on the real H200 (tests/data/real-gpu/h200-580.159.04/faults/xid.json,
taken with tests/real_gpu/xid.sh) go through the same rule files: the counters and last-seen timestamps
as the real exporter served them after each fault, seconds apart as they came, with the board's
nvidia_gpu_info. The driver's codes (31, 43, 13, 43) must fire GpuXidApplication only, each code for as
long as its window, and nothing of GpuXidCritical or GpuXidHardware.
"""

from __future__ import annotations

import itertools
import math
import subprocess
from pathlib import Path

import pytest
import yaml

from gpumeter.alerts import RULE_FILES
from tests.alerts.test_healthy_fleet import INSTANCE, JOB, _number, _series
from tests.real_gpu.evidence import BOARDS, H200, exposition, json_of, samples
from tests.support.servers import require_binary

STEP_S = 5
STRETCHES = (("metrics-idle.prom", 120), ("metrics-load.prom", 360), ("metrics-after.prom", 120))
STEPS = sum(steps for _, steps in STRETCHES)  # 600: 50 minutes
EVAL_TIMES = ("9m", "15m", "25m", "39m", "49m")
# the slowdown threshold each board's driver gave (board.json, threshold_slowdown)
SLOWDOWN_C = {"h200": 89, "h100": 89}


def timeline(board: Path, hot_load: bool = False) -> dict:
    """{(name, labels): [value per step]}; None where a series was not in that stretch's scrape."""
    keys = sorted({key for name, _ in STRETCHES for key in exposition(board, name)})
    values: dict = {key: [] for key in keys}
    for name, steps in STRETCHES:
        scraped = exposition(board, name)
        for key in keys:
            value = scraped.get(key)
            if hot_load and name == "metrics-load.prom" and key[0] == "nvidia_gpu_temperature_celsius":
                value = 90.0
            values[key] += [value] * steps
    for (name, _), series in values.items():
        if name.endswith("_timestamp_seconds"):  # a fresh sample every step on promtool's clock
            series[:] = [None if v is None else float(i * STEP_S) for i, v in enumerate(series)]
    return values


def _promtool_test(
    tmp_path: Path, file_name: str, step_s: int, steps: int, values: dict, **checks: list
) -> subprocess.CompletedProcess:
    """promtool's rule test over the real rule files: ``values`` as input series (with the target's
    ``up``) at ``step_s`` a step, and ``checks`` (alert_rule_test, promql_expr_test) as given."""
    test = {
        "rule_files": [str(p.resolve()) for p in RULE_FILES],
        "evaluation_interval": f"{step_s}s",
        "tests": [
            {
                "interval": f"{step_s}s",
                "input_series": [
                    {"series": f'up{{instance="{INSTANCE}", job="{JOB}"}}', "values": f"1x{steps}"}
                ]
                + [
                    {"series": _series(name, labels), "values": " ".join(map(_number, series))}
                    for (name, labels), series in values.items()
                ],
                **checks,
            }
        ],
    }
    path = tmp_path / file_name
    path.write_text(yaml.safe_dump(test, sort_keys=False, width=1_000_000))
    return subprocess.run(
        [require_binary("promtool"), "test", "rules", str(path)], capture_output=True, text=True, timeout=240
    )


def promtool(
    tmp_path: Path, values: dict, alert_names: list[str], slowdown_c: int
) -> subprocess.CompletedProcess:
    return _promtool_test(
        tmp_path,
        "real-board-test.yaml",
        STEP_S,
        STEPS,
        values,
        alert_rule_test=[
            {"eval_time": t, "alertname": name, "exp_alerts": []} for t in EVAL_TIMES for name in alert_names
        ],
        promql_expr_test=[
            # the data is seen: the joins on instance/uuid match, with the board's own thresholds
            {
                "expr": 'max(nvidia_gpu_temperature_threshold_celsius{threshold="slowdown"} '
                "* on(instance, uuid) group_left() (nvidia_gpu_info * 0 + 1))",
                "eval_time": "20m",
                "exp_samples": [{"labels": "{}", "value": slowdown_c}],
            },
            {"expr": "max_over_time(ALERTS[50m])", "eval_time": "49m", "exp_samples": []},
        ],
    )


@pytest.mark.parametrize("board", list(BOARDS))
def test_the_recorded_hour_is_what_the_real_board_did(board: str):
    path, _ = BOARDS[board]
    values = timeline(path)
    power = values[
        next(k for k in values if k[0] == "nvidia_gpu_power_watts")
    ]  # idle 72-78 W, loaded at its 700 W limit
    assert power[0] < 100 and power[200] > 600
    capped = next(
        k for k in values if k[0] == "nvidia_gpu_clocks_event_active" and ("reason", "sw_power_cap") in k[1]
    )
    assert values[capped][0] == 0 and values[capped][200] == 1
    slowdown = next(
        k
        for k in values
        if k[0] == "nvidia_gpu_temperature_threshold_celsius" and ("threshold", "slowdown") in k[1]
    )
    assert set(values[slowdown]) == {SLOWDOWN_C[board]}
    assert json_of(path, "board.json")["devices"][0]["threshold_slowdown"]["value"] == SLOWDOWN_C[board]


@pytest.mark.prometheus
@pytest.mark.parametrize("board", list(BOARDS))
def test_a_real_board_idle_loaded_and_idle_again_fires_nothing(tmp_path: Path, alert_rules, board: str):
    result = promtool(
        tmp_path, timeline(BOARDS[board][0]), [r["alert"] for r in alert_rules], SLOWDOWN_C[board]
    )
    assert result.returncode == 0, (
        f"alerts on a healthy real {board}:\n{result.stdout[-6000:]}\n{result.stderr[-3000:]}"
    )
    assert "SUCCESS" in result.stdout + result.stderr


@pytest.mark.prometheus
@pytest.mark.parametrize("board", list(BOARDS))
def test_the_same_hour_with_the_gpu_at_its_slowdown_threshold_alerts(tmp_path: Path, alert_rules, board: str):
    result = promtool(
        tmp_path,
        timeline(BOARDS[board][0], hot_load=True),
        [r["alert"] for r in alert_rules],
        SLOWDOWN_C[board],
    )
    assert result.returncode != 0
    assert "alertname: GpuTemperatureAtSlowdown" in result.stdout + result.stderr


# --- four application faults on the real H200 ----------------------------------------------------------
FAULTS = H200 / "faults"
XID_STEP_S = 1  # the exporter sampled every second there (xid.py), the faults came 4-8 s apart
LEAD_S = 60  # a quiet minute before the first fault (metrics-before-faults.prom: no XID series)
XID_STEPS = 900  # 15 minutes: each XID's 5-minute window opens and closes
XID_SERIES = ("nvidia_gpu_xid_errors_total", "nvidia_gpu_xid_last_timestamp_seconds")
# the XID each fault raised, in the order they ran, as the kernel log named it (xid.json)
RAISED = {"illegal_address": 31, "trap": 43, "misaligned": 13, "torch_index_assert": 43}


def xid_timeline() -> tuple[dict, list[float]]:
    """({(name, labels): [value per 1 s step]}, each fault's time on promtool's clock): the XID series the
    real exporter served after each fault (xid.json's native_xid), from the moment it recorded that
    fault's XID (the one timestamp new in that scrape) until the next; the last held to the end. The
    timestamps are rebased onto promtool's clock, which starts LEAD_S (and a fraction) before the first
    fault."""
    scrapes, times, seen = [], [], set()
    for fault in json_of(FAULTS, "xid.json")["faults"].values():
        scraped = {
            k: v for k, v in samples("\n".join(fault["native_xid"]) + "\n").items() if k[0] in XID_SERIES
        }
        stamps = {v for k, v in scraped.items() if k[0] == "nvidia_gpu_xid_last_timestamp_seconds"}
        (new,) = stamps - seen
        seen = stamps
        scrapes.append(scraped)
        times.append(new)
    start = math.floor(times[0]) - LEAD_S  # a whole second, so the steps fall on the exporter's seconds
    keys = sorted({key for scraped in scrapes for key in scraped})
    values: dict = {key: [] for key in keys}
    for step in range(XID_STEPS):
        shown = [scraped for scraped, t in zip(scrapes, times, strict=True) if t <= start + step * XID_STEP_S]
        for key in keys:
            value = shown[-1].get(key) if shown else None
            if value is not None and key[0].endswith("_timestamp_seconds"):
                value -= start
            values[key].append(value)
    info = next(k for k in exposition(FAULTS, "metrics-after-faults.prom") if k[0] == "nvidia_gpu_info")
    values[info] = [1.0] * XID_STEPS
    return values, [t - start for t in times]


def _alerts(uuid: str, xids: list[str]) -> list[dict]:
    labels = {"alertname": "GpuXidApplication", "alertstate": "firing", "severity": "info"}
    labels |= {"gpu": "0", "hostname": "real-gpu", "model": "NVIDIA H200", "uuid": uuid}
    return [
        {"labels": _series("ALERTS", tuple(sorted({**labels, "xid": xid}.items()))), "value": 1}
        for xid in xids
    ]


def xid_promtool(tmp_path: Path, values: dict, firing: dict[str, list[str]]) -> subprocess.CompletedProcess:
    """promtool over the XID timeline; ``firing``: eval time -> the XIDs GpuXidApplication fires for."""
    (uuid,) = {dict(labels)["uuid"] for (_, labels) in values}
    end = f"{(XID_STEPS - 1) * XID_STEP_S}s"
    return _promtool_test(
        tmp_path,
        "real-xid-test.yaml",
        XID_STEP_S,
        XID_STEPS,
        values,
        promql_expr_test=[
            {
                "expr": 'ALERTS{alertname="GpuXidApplication"}',
                "eval_time": t,
                "exp_samples": _alerts(uuid, xids),
            }
            for t, xids in firing.items()
        ]
        + [
            {
                "expr": f'max_over_time(ALERTS{{alertname=~"GpuXidCritical|GpuXidHardware"}}[{end}])',
                "eval_time": end,
                "exp_samples": [],
            },
            {  # the application XIDs' alert is the only XID alert, and it is info
                "expr": f'count_over_time(ALERTS{{alertname=~"GpuXid.*", severity!="info"}}[{end}])',
                "eval_time": end,
                "exp_samples": [],
            },
        ],
    )


def test_the_replayed_xids_are_what_the_real_exporter_counted():
    """xid.json: one event per fault (the misaligned write's three NVRM lines of XID 13 counted once),
    31 → 1, 43 → 1, 13 → 1, then 43 → 2, the faults 4-8 s apart; at the end what metrics-after-faults.prom
    says."""
    values, times = xid_timeline()
    assert LEAD_S <= times[0] < LEAD_S + 1 and all(3 < b - a < 10 for a, b in itertools.pairwise(times))

    def counted(step: int) -> dict[str, float]:
        return {
            dict(labels)["xid"]: series[step]
            for (name, labels), series in values.items()
            if name == "nvidia_gpu_xid_errors_total" and series[step] is not None
        }

    assert [counted(math.ceil(t)) for t in times] == [
        {"31": 1},
        {"31": 1, "43": 1},
        {"31": 1, "43": 1, "13": 1},
        {"31": 1, "43": 2, "13": 1},
    ]
    assert counted(LEAD_S - 1) == {}
    final = exposition(FAULTS, "metrics-after-faults.prom")
    assert counted(XID_STEPS - 1) == {
        dict(labels)["xid"]: v for (name, labels), v in final.items() if name == "nvidia_gpu_xid_errors_total"
    }
    assert not any(name == "nvidia_gpu_mig_xid_errors_total" for name, _ in final)
    assert [RAISED[f] for f in json_of(FAULTS, "xid.json")["faults"]] == [31, 43, 13, 43]


@pytest.mark.prometheus
def test_the_real_application_xids_fire_gpu_xid_application_only_and_only_for_its_window(tmp_path: Path):
    """faults/xid.json through the rule files. 31 at 60.7 s, 43 at 64.8 s, 13 at 69.5 s and 43 again at
    77.0 s (promtool's clock): GpuXidApplication, severity info, for each code from its first event until its
    newest is 5 minutes old; then nothing. GpuXidCritical and GpuXidHardware never fire."""
    values, times = xid_timeline()
    first_31, first_43, first_13, last_43 = times
    firing = {
        f"{LEAD_S - 1}s": [],
        f"{math.ceil(first_31) + 1}s": ["31"],
        f"{math.ceil(first_43) + 1}s": ["31", "43"],
        f"{math.ceil(first_13) + 1}s": ["13", "31", "43"],
        f"{math.ceil(last_43) + 1}s": ["13", "31", "43"],
        f"{math.floor(first_31) + 295}s": ["13", "31", "43"],  # 31's event is 295 s old
        f"{math.ceil(first_31) + 305}s": ["13", "43"],  # ... 305 s: its window has closed
        f"{math.ceil(first_13) + 305}s": ["43"],
        f"{math.ceil(last_43) + 305}s": [],
        "600s": [],
    }
    result = xid_promtool(tmp_path, values, firing)
    assert result.returncode == 0, f"{result.stdout[-6000:]}\n{result.stderr[-3000:]}"
    assert "SUCCESS" in result.stdout + result.stderr
