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
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from gpumeter.alerts import RULE_FILES
from tests.alerts.test_healthy_fleet import INSTANCE, JOB, _number, _series
from tests.real_gpu.evidence import BOARDS, exposition, json_of
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


def promtool(
    tmp_path: Path, values: dict, alert_names: list[str], slowdown_c: int
) -> subprocess.CompletedProcess:
    test = {
        "rule_files": [str(p.resolve()) for p in RULE_FILES],
        "evaluation_interval": f"{STEP_S}s",
        "tests": [
            {
                "interval": f"{STEP_S}s",
                "input_series": [
                    {"series": f'up{{instance="{INSTANCE}", job="{JOB}"}}', "values": f"1x{STEPS}"}
                ]
                + [
                    {"series": _series(name, labels), "values": " ".join(map(_number, series))}
                    for (name, labels), series in values.items()
                ],
                "alert_rule_test": [
                    {"eval_time": t, "alertname": name, "exp_alerts": []}
                    for t in EVAL_TIMES
                    for name in alert_names
                ],
                "promql_expr_test": [
                    # the data is seen: the joins on instance/uuid match, with the board's own thresholds
                    {
                        "expr": 'max(nvidia_gpu_temperature_threshold_celsius{threshold="slowdown"} '
                        "* on(instance, uuid) group_left() (nvidia_gpu_info * 0 + 1))",
                        "eval_time": "20m",
                        "exp_samples": [{"labels": "{}", "value": slowdown_c}],
                    },
                    {"expr": "max_over_time(ALERTS[50m])", "eval_time": "49m", "exp_samples": []},
                ],
            }
        ],
    }
    path = tmp_path / "real-board-test.yaml"
    path.write_text(yaml.safe_dump(test, sort_keys=False, width=1_000_000))
    return subprocess.run(
        [require_binary("promtool"), "test", "rules", str(path)], capture_output=True, text=True, timeout=240
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
