"""Where the exporter and the stand-in used to agree with each other but not with the driver.

Each test drives the exporter over a stand-in that now behaves as nvml.h, DCGM and the NVML change log
say the driver does; each failed on the exporter as it was before its fix.
"""

from __future__ import annotations

import argparse
import threading
import time
from concurrent import futures

import pynvml as N
import pytest
import yaml

from gpumeter.exporter.config import ConfigError, add_arguments, resolve
from gpumeter.simulator.fleet import FLEETS_DIR, parse_fleet
from tests.support import loopback


def test_1_thresholds_are_absolute_while_fields_193_196_read_tlimit_offsets(simulate):
    sim = simulate("h100-mig")
    sim.sampler.sample_once()
    # The stand-in answers fields 193-196 as the driver does: signed offsets from T.Limit.
    handle = N.nvmlDeviceGetHandleByIndex(0)
    fields = [
        N.NVML_FI_DEV_TEMPERATURE_SHUTDOWN_TLIMIT,
        N.NVML_FI_DEV_TEMPERATURE_SLOWDOWN_TLIMIT,
        N.NVML_FI_DEV_TEMPERATURE_GPU_MAX_TLIMIT,
        N.NVML_FI_DEV_TEMPERATURE_MEM_MAX_TLIMIT,
    ]
    offsets = [entry.value.siVal for entry in N.nvmlDeviceGetFieldValues(handle, fields)]
    # gpu_max 87 is T.Limit's zero on this model; a real H100 SXM5 answers -8/-2/0/0 (shutdown 95, slowdown
    # 89: tests/data/real-gpu/h100-580.159.04/board.json)
    assert offsets == [87 - 95, 87 - 89, 0, 0]
    base = {"gpu": "0", "uuid": sim.node.gpus[0].spec.uuid}
    slowdown = sim.value("nvidia_gpu_temperature_threshold_celsius", **base, threshold="slowdown")
    assert 80 <= slowdown <= 100
    assert slowdown == 89  # nvmlDeviceGetTemperatureThreshold(SLOWDOWN), as DCGM reads it
    for threshold, celsius in (("shutdown", 95), ("gpu_max", 87), ("memory_max", 95)):
        assert sim.value("nvidia_gpu_temperature_threshold_celsius", **base, threshold=threshold) == celsius


def dcgm_value(sim, name: str, gpu: str) -> float | None:
    for family in sim.exporter.registry.collect():
        for sample in family.samples:
            if sample.name == name and sample.labels.get("gpu") == gpu:
                return sample.value
    return None


def test_4_dcgm_thermal_violation_is_sw_thermal_time_as_dcgm_reads_field_75(simulate):
    sim = simulate("h200", naming="dcgm")
    sim.sampler.sample_once()
    sim.node.inject("throttle", 1, reason="sw_thermal")
    sim.node.inject("throttle", 2, reason="hw_thermal")
    sim.sample(10)
    # DCGM fills DCGM_FI_DEV_THERMAL_VIOLATION from NVML_FI_DEV_PERF_POLICY_THERMAL (75), which the stand-in
    # answers as the driver does: the SW-thermal counter (269).
    handle = N.nvmlDeviceGetHandleByIndex(1)
    perf_policy, sw_thermal = N.nvmlDeviceGetFieldValues(
        handle, [N.NVML_FI_DEV_PERF_POLICY_THERMAL, N.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN]
    )
    assert perf_policy.value.ullVal == sw_thermal.value.ullVal == 10e9
    assert dcgm_value(sim, "DCGM_FI_DEV_THERMAL_VIOLATION", "1") == 10e9  # ns of SW thermal slowdown
    assert dcgm_value(sim, "DCGM_FI_DEV_THERMAL_VIOLATION", "2") == 0  # HW thermal is not DCGM's field


def test_2_init_count_back_to_zero_after_a_lost_gpu_recovery(simulate):
    sim = simulate("h100-mig")
    sim.sampler.sample_once()
    assert sim.lib.initialised == 1
    sim.node.inject("nvml_unavailable")  # NVML stops answering once
    sim.sample()
    assert sim.value("gpumeter_exporter_nvml_up") == 0
    sim.node.inject("nvml_unavailable", clear=True)
    sim.sample(5)
    assert sim.value("gpumeter_exporter_nvml_up") == 1
    assert sim.lib.initialised == 1  # the lost session's reference was released, not leaked
    uuid = sim.node.gpus[6].spec.uuid
    sim.node.inject("gpu_lost", 6)
    sim.sample()
    assert sim.value("nvidia_gpu_up", gpu="6", uuid=uuid) == 0
    sim.node.clear(6)  # back after a reset: only a real re-initialisation reaches it again
    sim.sample(61)
    assert sim.value("nvidia_gpu_up", gpu="6", uuid=uuid) == 1
    assert sim.lib.initialised == 1
    sim.sampler.stop()
    assert sim.lib.initialised == 0


def device_series(sim, gpu: int) -> set[str]:
    return {
        line.split("{", 1)[0]
        for line in sim.text().splitlines()
        if not line.startswith("#") and f'gpu="{gpu}"' in line
    }


@pytest.mark.parametrize(
    ("code", "function"),
    [(N.NVML_ERROR_UNKNOWN, "nvmlDeviceGetFieldValues"), (N.NVML_ERROR_RESET_REQUIRED, None)],
)
def test_3_one_gpus_error_is_that_gpus_alone(simulate, code, function):
    sim = simulate("h100-mig")
    sim.sampler.sample_once()
    params = {"code": code} | ({"function": function} if function else {})
    sim.node.inject("nvml_error", 2, **params)
    snapshot = sim.sample()
    assert sim.value("gpumeter_exporter_nvml_up") == 1
    for gpu in sim.node.gpus:
        labels = {"gpu": str(gpu.spec.index), "uuid": gpu.spec.uuid}
        assert sim.value("nvidia_gpu_up", **labels) == (0 if gpu.spec.index == 2 else 1)
    assert device_series(sim, 2) == {"nvidia_gpu_up", "nvidia_gpu_info"}
    assert "nvidia_gpu_temperature_celsius" in device_series(sim, 5)
    assert all(c.success for c in snapshot.collectors)  # the GPU failed, not a collector
    sim.node.clear(2)
    sim.sample()
    assert sim.value("nvidia_gpu_up", gpu="2", uuid=sim.node.gpus[2].spec.uuid) == 1
    assert "nvidia_gpu_temperature_celsius" in device_series(sim, 2)


def test_6_a_sleeping_nvlink_is_not_down(simulate):
    sim = simulate("h200")
    sim.sampler.sample_once()
    sim.node.inject("nvlink_sleep", 3, link=4)
    sim.node.inject("nvlink_down", 3, link=5)
    sim.sample()
    handle = N.nvmlDeviceGetHandleByIndex(3)
    states = N.nvmlDeviceGetFieldValues(
        handle, [(N.NVML_FI_DEV_NVLINK_GET_STATE, link) for link in (3, 4, 5)]
    )
    assert [s.value.uiVal for s in states] == [1, 2, 0]  # NVML_NVLINK_STATE_ACTIVE, _SLEEP, _INACTIVE
    labels = {"gpu": "3", "uuid": sim.node.gpus[3].spec.uuid}
    assert sim.value("nvidia_gpu_nvlink_up", **labels, link="3") == 1
    assert sim.value("nvidia_gpu_nvlink_up", **labels, link="4") == 1  # asleep, not down: no GpuNvlinkDown
    assert sim.value("nvidia_gpu_nvlink_up", **labels, link="5") == 0


@pytest.mark.parametrize("interval", ["inf", "nan", "0.05", "0", "-1"])
def test_9_an_interval_that_is_not_finite_or_under_gpms_100_ms_is_refused(interval):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    with pytest.raises(ConfigError, match=rf"interval: .*0\.1.*got '{float(interval)}'"):
        resolve(parser.parse_args(["--interval", interval]), {})
    assert resolve(parser.parse_args(["--interval", "0.1"]), {}).interval == 0.1


def test_9_healthz_fails_when_the_sampler_has_stopped(simulate):
    sim = simulate("workstation")
    sim.exporter.start()
    url = f"http://127.0.0.1:{sim.exporter.port}/healthz"
    assert loopback.get(url).status_code == 200
    sim.sampler.stop()  # the sampling thread is gone; the last sample is still fresh
    answer = loopback.get(url)
    assert answer.status_code == 503 and "sampler" in answer.text


TWO_COMPUTE_INSTANCES = {
    "seed": 5,
    "nodes": [
        {
            "name": "gpu-h100-ci-01",
            "gpus": [{"model": "H100-SXM5-80GB", "count": 1, "mig": ["3g.40gb:2c+1c", "3g.40gb"]}],
        }
    ],
    "pods": [
        {
            "namespace": "a",
            "name": "split",
            "node": "gpu-h100-ci-01",
            "devices": [{"gpu": 0, "gpu_instance_id": 1}],
            "utilization": 0.6,
        },
        {
            "namespace": "b",
            "name": "whole",
            "node": "gpu-h100-ci-01",
            "devices": [{"gpu": 0, "gpu_instance_id": 2}],
            "utilization": 0.3,
        },
    ],
}


def mig_lines(sim, name: str) -> list[dict[str, str]]:
    found = []
    for family in sim.exporter.registry.collect():
        found += [dict(s.labels, value=s.value) for s in family.samples if s.name == name]
    return found


def test_5_two_compute_instances_in_one_gpu_instance(simulate):
    sim = simulate(parse_fleet(TWO_COMPUTE_INSTANCES, "two-ci"))
    for _ in range(4):
        snapshot = sim.sample(5)
        assert all(c.success for c in snapshot.collectors), snapshot.collectors
    # One MIG device per compute instance, each with its own slices; the GPU instance's profile.
    info = {
        (m["gpu_instance_id"], m["compute_instance_id"]): m for m in mig_lines(sim, "nvidia_gpu_mig_info")
    }
    assert set(info) == {("1", "0"), ("1", "1"), ("2", "0")}
    assert [info[k]["compute_slices"] for k in (("1", "0"), ("1", "1"), ("2", "0"))] == ["2", "1", "3"]
    assert {m["mig_profile"] for m in info.values()} == {"3g.40gb"}
    assert {m["memory_slices"] for m in info.values()} == {"4"}
    assert len({m["mig_uuid"] for m in info.values()}) == 3
    # Memory belongs to the GPU instance: once per GPU instance, so sums match the GPU's own figure.
    totals = mig_lines(sim, "nvidia_gpu_mig_memory_total_bytes")
    assert sorted(m["gpu_instance_id"] for m in totals) == ["1", "2"]
    used = sum(m["value"] for m in mig_lines(sim, "nvidia_gpu_mig_memory_used_bytes"))
    assert used == sim.value("nvidia_gpu_memory_used_bytes", gpu="0", uuid=sim.node.gpus[0].spec.uuid)
    # GPM per GPU instance, between samples one interval apart (the stand-in refuses < 100 ms).
    util = {m["gpu_instance_id"]: m["value"] for m in mig_lines(sim, "nvidia_gpu_mig_sm_utilization_ratio")}
    assert set(util) == {"1", "2"}
    assert abs(util["1"] - 0.6) <= 0.05 and abs(util["2"] - 0.3) <= 0.05  # pods' load, +-5 % jitter
    # The same through fault injection: one 7g GPU instance split 4 + 3.
    sim.node.inject("mig_reconfigure", 0, layout=["7g.80gb:4c+3c"])
    sim.sample(5)
    info = mig_lines(sim, "nvidia_gpu_mig_info")
    assert sorted((m["gpu_instance_id"], m["compute_instance_id"], m["compute_slices"]) for m in info) == [
        ("0", "0", "4"),
        ("0", "1", "3"),
    ]


def wait_for_xids(sim, uuid: str, total: int) -> None:
    deadline = time.monotonic() + 3
    while sum(c for c, _ in sim.sampler.xid_watcher.counts(uuid).values()) < total:
        assert time.monotonic() < deadline, sim.sampler.xid_watcher.counts(uuid)
        time.sleep(0.01)


def test_7_a_mig_instances_xid_is_attributed_to_it(simulate):
    sim = simulate("h100-mig")
    sim.sampler.start()
    uuid = sim.node.gpus[1].spec.uuid
    sim.node.inject("xid", 1, code=31, gpu_instance_id=9, compute_instance_id=0)
    sim.node.inject("xid", 1, code=43, gpu_instance_id=10)  # the GPU instance only
    sim.node.inject("xid", 1, code=48)  # the whole GPU
    wait_for_xids(sim, uuid, 3)
    sim.sample()
    base = {"gpu": "1", "uuid": uuid}
    for xid in ("31", "43", "48"):  # the GPU's count keeps every XID, as alerts read it
        assert sim.value("nvidia_gpu_xid_errors_total", **base, xid=xid) == 1
    instance = {**base, "mig_profile": "1g.10gb"}
    assert (
        sim.value(
            "nvidia_gpu_mig_xid_errors_total",
            **instance,
            gpu_instance_id="9",
            compute_instance_id="0",
            xid="31",
        )
        == 1
    )
    assert (
        sim.value(
            "nvidia_gpu_mig_xid_errors_total",
            **instance,
            gpu_instance_id="10",
            compute_instance_id="",
            xid="43",
        )
        == 1
    )
    assert 'xid="48"' not in "".join(
        line for line in sim.text().splitlines() if line.startswith("nvidia_gpu_mig_xid_errors_total{")
    )
    assert sim.value("gpumeter_exporter_mig_xids_visible") == 1


def test_7_an_unprivileged_exporter_says_it_misses_mig_instances_xids(simulate):
    data = yaml.safe_load((FLEETS_DIR / "h100-mig.yaml").read_text())
    data["nodes"][0]["exporter_privileged"] = False
    sim = simulate(parse_fleet(data, "unprivileged"))
    sim.sampler.start()
    uuid = sim.node.gpus[1].spec.uuid
    sim.node.inject("xid", 1, code=31, gpu_instance_id=9, compute_instance_id=0)  # withheld by NVML
    sim.node.inject("xid", 1, code=48)
    wait_for_xids(sim, uuid, 1)
    sim.sample()
    assert sim.value("gpumeter_exporter_mig_xids_visible") == 0
    assert sim.value("nvidia_gpu_xid_errors_total", gpu="1", uuid=uuid, xid="48") == 1
    assert sim.value("nvidia_gpu_xid_errors_total", gpu="1", uuid=uuid, xid="31") is None
    assert "nvidia_gpu_mig_xid_errors_total{" not in sim.text()


def test_8_pcie_byte_counters_where_the_driver_has_them(simulate):
    sim = simulate("h200")  # driver 560: fields 197/198 exist (NVML change log, v550 to v555)
    sim.sampler.sample_once()
    labels = {"gpu": "2", "uuid": sim.node.gpus[2].spec.uuid}
    before = {d: sim.value(f"nvidia_gpu_pcie_{d}_bytes_total", **labels) for d in ("tx", "rx")}
    sim.sample(5)
    for direction in ("tx", "rx"):
        after = sim.value(f"nvidia_gpu_pcie_{direction}_bytes_total", **labels)
        assert before[direction] is not None and after is not None, "no PCIe byte counter exported"
        assert after > before[direction]
        # the gauge is the counters' average over the interval, not a 20 ms window
        rate = sim.value(f"nvidia_gpu_pcie_{direction}_bytes_per_second", **labels)
        assert rate == pytest.approx((after - before[direction]) / 5)
    assert sim.lib.calls["nvmlDeviceGetPcieThroughput"] == 0


def test_8_stopping_waits_for_the_throughput_reads_in_flight_before_giving_nvml_back(simulate):
    # A read runs 20 ms on its pool thread (nvml.h: "a byte counter over a 20ms interval"). Stopping the
    # exporter gives its NVML reference back (nvmlShutdown); a read still running then would call a
    # library that is shut down (docs/nvml.md §12: UNINITIALIZED), and its threads would outlive the
    # exporter. Stop must wait for the reads in flight, then end the pool. Shown by order: every read is
    # held in the driver while stop() runs, and NVML is not shut down until they are let go.
    sim = simulate("h100-mig")
    release, in_flight, shut = threading.Event(), threading.Semaphore(0), threading.Event()

    def held(*args):
        in_flight.release()
        release.wait()

    sim.lib.hooks["nvmlDeviceGetPcieThroughput"] = held
    sim.lib.hooks["nvmlShutdown"] = lambda *args: shut.set()
    sim.sampler.sample_once()  # starts one read per GPU
    assert all(in_flight.acquire(timeout=30) for _ in sim.node.gpus), "a GPU's read was not started"
    stopper = threading.Thread(target=sim.sampler.stop)
    stopper.start()
    # a stop that did not wait would shut NVML down at once; one that waits cannot, whatever the load
    shut_with_reads_held = shut.wait(0.2)
    release.set()
    stopper.join(30)
    assert not stopper.is_alive()
    assert not shut_with_reads_held, "NVML was given back with reads in flight"
    assert shut.is_set()
    assert not [t.name for t in threading.enumerate() if t.name.startswith("pcie-throughput")]
    assert sim.lib.uninitialised_calls == {}, sim.lib.uninitialised_calls
    assert sim.lib.calls["nvmlDeviceGetPcieThroughput"] >= 8  # the reads did run


def test_8_the_sampling_cycle_does_not_wait_for_pcie_throughput(simulate):
    # h100-mig runs driver 550, before the byte counters: nvmlDeviceGetPcieThroughput, a 20 ms window per
    # call and two per GPU. Shown without a clock: every throughput read is held in the driver until the
    # test lets it go, and the cycle completes while they are all held; a read made on the cycle's own
    # thread is recorded, not held (held, it would hang the cycle instead of failing it).
    sim = simulate("h100-mig", counter_interval=30.0)  # as deployed
    cycle = threading.current_thread()
    release, in_flight = threading.Event(), threading.Semaphore(0)
    in_cycle: list[object] = []

    def held(*args):
        if threading.current_thread() is cycle:
            in_cycle.append(args)
            return
        in_flight.release()
        release.wait()

    sim.lib.hooks["nvmlDeviceGetPcieThroughput"] = held
    try:
        sim.sampler.sample_once()  # starts one read per GPU and returns with all eight held
        assert in_cycle == [], "the cycle read PCIe throughput itself"
        gpus = len(sim.node.gpus)
        assert all(in_flight.acquire(timeout=30) for _ in range(gpus)), "a GPU's read was not started"
    finally:
        release.set()
    pcie = next(c for c in sim.sampler.collectors if c.name == "pcie")
    futures.wait(list(pcie._reads.values()), timeout=30)  # the reads finish once let go
    sim.sample(5)  # publishes them, and starts the next
    assert in_cycle == []
    assert sim.lib.calls["nvmlDeviceGetPcieThroughput"] >= 2 * gpus
    assert sim.value("nvidia_gpu_pcie_tx_bytes_per_second", gpu="0", uuid=sim.node.gpus[0].spec.uuid) > 0
    assert "nvidia_gpu_pcie_tx_bytes_total{" not in sim.text()  # no counters on this driver: absent
