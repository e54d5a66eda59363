"""Every collector on every simulated model and driver: series present where the driver answers, absent
(never NaN, never 0) where it refuses. What each model answers is its capability table
(gpumeter/simulator/models.py, with the evidence for each rule); these tests hold the exporter to it."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpumeter.simulator.fleet import parse_fleet
from gpumeter.simulator.models import (
    MODELS,
    capabilities,
    driver_branch,
    render_capabilities_markdown,
)

OLD_DRIVER, NEW_DRIVER = "525.147.05", "570.124.06"  # before ClocksEvent names (535); with margin (570)


def one_gpu(key: str, driver: str, mig: list[str] | None = None):
    group = {"model": key, "count": 1, "workload": {"pattern": "steady", "mean": 0.5}}
    if mig:
        group["mig"] = mig
    return parse_fleet({"seed": 7, "nodes": [{"name": "n", "driver_version": driver, "gpus": [group]}]}, key)


def names(sim) -> dict[str, int]:
    found: dict[str, int] = {}
    for line in sim.text().splitlines():
        if line and not line.startswith("#"):
            name = line.split("{", 1)[0].split(" ", 1)[0]
            found[name] = found.get(name, 0) + 1
    return found


@pytest.mark.parametrize("driver", [OLD_DRIVER, NEW_DRIVER])
@pytest.mark.parametrize("key", sorted(MODELS))
def test_series_present_where_the_driver_answers_absent_where_it_refuses(simulate, key, driver):
    model = MODELS[key]
    sim = simulate(one_gpu(key, driver))
    sim.sampler.sample_once()
    snapshot = sim.sample(5)
    text = sim.text()
    assert "NaN" not in text
    assert all(c.success for c in snapshot.collectors), snapshot.collectors
    found = names(sim)
    expected = {
        "nvidia_gpu_temperature_celsius": True,
        "nvidia_gpu_power_watts": True,
        "nvidia_gpu_energy_joules_total": True,
        "nvidia_gpu_utilization_ratio": True,  # whole GPU
        "nvidia_gpu_clocks_event_active": True,  # through the ...ThrottleReasons names before 535
        "nvidia_gpu_pcie_tx_bytes_per_second": True,
        "nvidia_gpu_pcie_tx_bytes_total": driver_branch(driver) >= 555,
        "nvidia_gpu_temperature_margin_celsius": driver_branch(driver) >= 570,
        "nvidia_gpu_memory_temperature_celsius": model.has_memory_temp,
        "nvidia_gpu_ecc_errors_total": model.has_ecc,
        "nvidia_gpu_remapped_rows_total": model.has_row_remap,
        "nvidia_gpu_retired_pages_total": model.has_retired_pages,
        "nvidia_gpu_retired_pages_pending": model.has_retired_pages,
        "nvidia_gpu_nvlink_up": model.nvlinks > 0,
        "nvidia_gpu_fan_speed_ratio": model.has_fan,
        "nvidia_gpu_mig_info": False,
    }
    assert {name: name in found for name in expected} == expected
    # Every link, every error type, however the GPU answers them (fields or the per-link function)
    assert found.get("nvidia_gpu_nvlink_errors_total", 0) == 4 * model.nvlinks
    thresholds = {
        "shutdown": model.shutdown_c,
        "slowdown": model.slowdown_c,
        "gpu_max": model.gpu_max_c,
        "memory_max": model.memory_max_c,
    }
    labels = {"gpu": "0", "uuid": sim.node.gpus[0].spec.uuid}
    for threshold, celsius in thresholds.items():
        assert sim.value("nvidia_gpu_temperature_threshold_celsius", **labels, threshold=threshold) == celsius
    if driver_branch(driver) >= 570:
        temperature = sim.value("nvidia_gpu_temperature_celsius", **labels)
        assert sim.value("nvidia_gpu_temperature_margin_celsius", **labels) == model.gpu_max_c - temperature


@pytest.mark.parametrize("key", sorted(k for k, m in MODELS.items() if m.supports_mig))
def test_mig_series_on_every_mig_model_and_gpm_only_from_hopper(simulate, key):
    model = MODELS[key]
    smallest = next(iter(model.mig_profiles))
    sim = simulate(one_gpu(key, NEW_DRIVER, [f"{smallest}*2"]))
    sim.sampler.sample_once()
    snapshot = sim.sample(5)
    assert all(c.success for c in snapshot.collectors), snapshot.collectors
    found = names(sim)
    assert found["nvidia_gpu_mig_info"] == 2
    assert found["nvidia_gpu_mig_memory_total_bytes"] == 2
    assert found.get("nvidia_gpu_mig_sm_utilization_ratio", 0) == (2 if model.has_gpm else 0)
    assert "nvidia_gpu_utilization_ratio" not in found  # not on a MIG-enabled GPU
    assert "nvidia_gpu_remapped_rows_total" not in found  # not with MIG instances active


def test_every_model_has_a_capability_table_with_evidence():
    for model in MODELS.values():
        table = dict(capabilities(model))
        assert table["evidence"], model.key
        assert (
            table["retired pages (fields 29-31)"] != table["row remapping (fields 142-145)"]
            or not model.has_ecc
        )


def test_docs_simulator_carries_the_current_capability_table():
    text = (Path(__file__).parents[2] / "docs" / "simulator.md").read_text()
    begin, end = "<!-- models:begin -->\n", "<!-- models:end -->"
    section = text[text.index(begin) + len(begin) : text.index(end)]
    assert section == render_capabilities_markdown(), (
        "docs/simulator.md is stale: paste `gpumeter docs models`"
    )
