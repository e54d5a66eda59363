"""The exporter's real pynvml path over the stand-in library: series, faults and the error model."""

from __future__ import annotations

import time

import pytest
from prometheus_client import CollectorRegistry

from gpumeter.exporter.render import SnapshotCollector
from gpumeter.exporter.sampler import LOST_RETRY_FACTOR
from gpumeter.exporter.snapshot import Snapshot


def device_series(sim, gpu: int) -> set[str]:
    """Names of every series carrying gpu=<gpu> in the current exposition."""
    names = set()
    for line in sim.text().splitlines():
        if not line.startswith("#") and f'gpu="{gpu}"' in line:
            names.add(line.split("{", 1)[0])
    return names


def test_every_contract_series_is_present_on_an_h100_mig_node(simulate):
    sim = simulate("h100-mig")
    sim.sampler.sample_once()
    sim.sample()
    uuid = sim.node.gpus[0].spec.uuid
    base = {"gpu": "0", "uuid": uuid}
    assert sim.value("nvidia_gpu_up", **base) == 1
    assert 20 < sim.value("nvidia_gpu_temperature_celsius", **base) < 89
    assert sim.value("nvidia_gpu_temperature_threshold_celsius", **base, threshold="slowdown") == 89
    assert sim.value("nvidia_gpu_temperature_threshold_celsius", **base, threshold="gpu_max") == 87
    assert sim.value("nvidia_gpu_power_limit_watts", **base) == 700
    assert 72 <= sim.value("nvidia_gpu_power_watts", **base) <= 700
    assert sim.value("nvidia_gpu_energy_joules_total", **base) > 0
    assert sim.value("nvidia_gpu_memory_total_bytes", **base) == 81559 * 2**20
    assert sim.value("nvidia_gpu_clock_max_hz", **base, clock="sm") == 1980e6
    assert sim.value("nvidia_gpu_clocks_event_active", **base, reason="hw_thermal") == 0
    assert sim.value("nvidia_gpu_clocks_event_seconds_total", **base, reason="hw_thermal") == 0
    assert sim.value("nvidia_gpu_nvlink_up", **base, link="17") == 1
    assert sim.value("nvidia_gpu_nvlink_errors_total", **base, link="17", error_type="crc_flit") == 0
    assert sim.value("nvidia_gpu_ecc_errors_total", **base, error_type="uncorrected") == 0
    # MIG: seven 1g.10gb instances, GI ids 7..13, memory per instance
    mig = {**base, "gpu_instance_id": "7", "compute_instance_id": "0", "mig_profile": "1g.10gb"}
    assert sim.value("nvidia_gpu_mig_memory_total_bytes", **mig) == 10240 * 2**20
    info = [
        line
        for line in sim.text().splitlines()
        if line.startswith("nvidia_gpu_mig_info{") and 'gpu="0"' in line
    ]
    assert len(info) == 7 and all(
        'compute_slices="1"' in line and 'memory_slices="1"' in line for line in info
    )
    # GPM needs two samples: present from the second cycle on, as a 0..1 ratio
    assert 0 <= sim.value("nvidia_gpu_mig_sm_utilization_ratio", **mig) <= 1
    # Not in MIG mode's reach: whole-GPU utilization is absent, not 0
    assert sim.value("nvidia_gpu_utilization_ratio", **base) is None
    # Row remapping is not readable while MIG instances are active: absent
    assert sim.value("nvidia_gpu_remapped_rows_pending", **base) is None
    assert sim.value("gpumeter_exporter_nvml_up") == 1
    assert sim.value("gpumeter_exporter_collector_success", collector="nvlink") == 1
    assert sim.value("gpumeter_exporter_last_sample_timestamp_seconds") == sim.clock.now


def test_mig_utilization_absent_on_ampere_and_whole_gpu_utilization_present(simulate):
    sim = simulate("a100-mixed")
    sim.sampler.sample_once()
    sim.sample()
    text = sim.text()
    assert "nvidia_gpu_mig_sm_utilization_ratio{" not in text  # A100 has no GPM
    assert "nvidia_gpu_mig_info{" in text
    uuid = sim.node.gpus[2].spec.uuid
    assert 0 <= sim.value("nvidia_gpu_utilization_ratio", gpu="2", uuid=uuid) <= 1
    # 3g.20gb: 3 compute slices of 7, 4 memory slices of 8
    three = [
        line for line in text.splitlines() if line.startswith("nvidia_gpu_mig_info{") and "3g.20gb" in line
    ]
    assert len(three) == 2 and all(
        'compute_slices="3"' in line and 'memory_slices="4"' in line for line in three
    )


def test_unsupported_values_are_left_out_never_nan(simulate):
    sim = simulate("workstation")
    sim.sampler.sample_once()
    text = sim.text()
    assert "NaN" not in text
    uuid = sim.node.gpus[0].spec.uuid
    assert sim.value("nvidia_gpu_memory_temperature_celsius", gpu="0", uuid=uuid) is None  # no HBM sensor
    assert sim.value("nvidia_gpu_ecc_errors_total", gpu="0", uuid=uuid, error_type="corrected") is None
    assert "nvidia_gpu_nvlink_up{" not in text
    assert sim.value("nvidia_gpu_fan_speed_ratio", gpu="0", uuid=uuid) is not None
    assert (
        sim.value("nvidia_gpu_temperature_threshold_celsius", gpu="0", uuid=uuid, threshold="memory_max")
        is None
    )


def test_overheat_drives_temperature_over_slowdown_and_hw_thermal_throttle(simulate):
    sim = simulate("h100-mig")
    sim.sampler.sample_once()
    uuid = sim.node.gpus[3].spec.uuid
    before = sim.value("nvidia_gpu_temperature_celsius", gpu="3", uuid=uuid)
    sim.node.inject("overheat", 3, celsius=60)
    for _ in range(40):  # temperature follows with a 30 s lag
        sim.sample(5)
    labels = {"gpu": "3", "uuid": uuid}
    assert sim.value("nvidia_gpu_temperature_celsius", **labels) >= 89 > before
    assert sim.value("nvidia_gpu_clocks_event_active", **labels, reason="hw_thermal") == 1
    assert sim.value("nvidia_gpu_clocks_event_active", **labels, reason="sw_thermal") == 1
    assert sim.value("nvidia_gpu_clocks_event_seconds_total", **labels, reason="hw_thermal") > 0
    assert sim.value("nvidia_gpu_clock_hz", **labels, clock="sm") < 1980e6 / 2 + 1
    other = sim.node.gpus[2].spec.uuid
    assert sim.value("nvidia_gpu_clocks_event_active", gpu="2", uuid=other, reason="hw_thermal") == 0
    sim.node.clear(3)
    for _ in range(40):
        sim.sample(5)
    assert sim.value("nvidia_gpu_clocks_event_active", **labels, reason="hw_thermal") == 0


@pytest.mark.parametrize(
    "reason", ["hw_slowdown", "hw_thermal", "hw_power_brake", "sw_thermal", "sw_power_cap", "sync_boost"]
)
def test_each_throttle_reason_is_its_own_series(simulate, reason):
    sim = simulate("h200")
    sim.sampler.sample_once()
    sim.node.inject("throttle", 1, reason=reason)
    sim.sample(10)
    uuid = sim.node.gpus[1].spec.uuid
    active = {
        line.split('reason="')[1].split('"')[0]
        for line in sim.text().splitlines()
        if line.startswith("nvidia_gpu_clocks_event_active{") and uuid in line and line.endswith(" 1.0")
    }
    assert reason in active
    assert not active & ({"hw_slowdown", "hw_thermal", "hw_power_brake", "sw_thermal"} - {reason})
    if reason in ("hw_thermal", "hw_power_brake", "sw_thermal", "sw_power_cap", "sync_boost"):
        assert sim.value("nvidia_gpu_clocks_event_seconds_total", gpu="1", uuid=uuid, reason=reason) >= 9.9


def test_nvlink_crc_burst_on_numbered_and_high_links_and_link_down(simulate):
    sim = simulate("h100-mig")
    sim.sampler.sample_once()
    uuid = sim.node.gpus[5].spec.uuid
    sim.node.inject("nvlink_crc", 5, link=2, count=1000)
    sim.node.inject("nvlink_crc", 5, link=15, count=100)  # links 12-17 have no numbered field IDs
    sim.node.inject("nvlink_down", 5, link=7)
    sim.node.inject("nvlink_replay", 5, link=0, count=3)
    sim.sample()
    labels = {"gpu": "5", "uuid": uuid}
    assert sim.value("nvidia_gpu_nvlink_errors_total", **labels, link="2", error_type="crc_flit") == 700
    assert sim.value("nvidia_gpu_nvlink_errors_total", **labels, link="2", error_type="crc_data") == 300
    assert sim.value("nvidia_gpu_nvlink_errors_total", **labels, link="15", error_type="crc_flit") == 70
    assert sim.value("nvidia_gpu_nvlink_errors_total", **labels, link="0", error_type="replay") == 3
    assert sim.value("nvidia_gpu_nvlink_up", **labels, link="7") == 0
    assert sim.value("nvidia_gpu_nvlink_up", **labels, link="6") == 1


def wait_until(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False


def test_xids_are_counted_by_code_from_the_event_thread(simulate):
    sim = simulate("h100-mig")
    sim.sampler.sample_once()
    watcher = sim.sampler.xid_watcher
    uuid = sim.node.gpus[1].spec.uuid
    for code in (13, 13, 48):
        sim.node.inject("xid", 1, code=code)
    assert wait_until(lambda: sum(c for c, _ in watcher.counts(uuid).values()) == 3)
    sim.sample()
    assert sim.value("nvidia_gpu_xid_errors_total", gpu="1", uuid=uuid, xid="13") == 2
    assert sim.value("nvidia_gpu_xid_errors_total", gpu="1", uuid=uuid, xid="48") == 1
    assert (
        sim.value("nvidia_gpu_xid_last_timestamp_seconds", gpu="1", uuid=uuid, xid="48") == sim.clock.now - 5
    )
    assert (
        sim.value("nvidia_gpu_xid_errors_total", gpu="0", uuid=sim.node.gpus[0].spec.uuid, xid="13") is None
    )


def test_xid_79_counts_even_though_the_gpu_is_lost(simulate):
    sim = simulate("h100-mig")
    sim.sampler.sample_once()
    uuid = sim.node.gpus[4].spec.uuid
    sim.node.inject("xid", 4, code=79)
    assert wait_until(lambda: 79 in sim.sampler.xid_watcher.counts(uuid))
    sim.sample()
    assert sim.value("nvidia_gpu_up", gpu="4", uuid=uuid) == 0
    # the XID that reported the loss stays visible, also after re-discovery drops the handle
    assert sim.value("nvidia_gpu_xid_errors_total", gpu="4", uuid=uuid, xid="79") == 1
    sim.sample(61)
    assert sim.value("nvidia_gpu_xid_errors_total", gpu="4", uuid=uuid, xid="79") == 1


def test_ecc_and_row_remap_errors_on_a_whole_gpu(simulate):
    sim = simulate("a100-mixed")
    sim.sampler.sample_once()
    uuid = sim.node.gpus[2].spec.uuid
    labels = {"gpu": "2", "uuid": uuid}
    assert sim.value("nvidia_gpu_remapped_rows_pending", **labels) == 0
    sim.node.inject("ecc", 2, error_type="uncorrected", count=2)
    sim.node.inject("ecc", 2, error_type="corrected", count=40)
    sim.node.inject("row_remap", 2, kind="pending")
    sim.node.inject("row_remap", 2, kind="uncorrected", count=1)
    sim.node.inject("row_remap", 2, kind="failure")
    sim.sample()
    assert sim.value("nvidia_gpu_ecc_errors_total", **labels, error_type="uncorrected") == 2
    assert sim.value("nvidia_gpu_ecc_errors_total", **labels, error_type="corrected") == 40
    assert sim.value("nvidia_gpu_remapped_rows_pending", **labels) == 1
    assert sim.value("nvidia_gpu_remapped_rows_failure", **labels) == 1
    assert sim.value("nvidia_gpu_remapped_rows_total", **labels, error_type="uncorrected") == 1
    sim.node.clear(2)  # a GPU reset drains the pending remap
    sim.sample()
    assert sim.value("nvidia_gpu_remapped_rows_pending", **labels) == 0


def test_gpu_lost_between_two_samples_leaves_the_others_exported(simulate):
    sim = simulate("h100-mig")
    sim.sampler.sample_once()
    before = device_series(sim, 6)
    assert "nvidia_gpu_temperature_celsius" in before
    sim.node.inject("gpu_lost", 6)
    snapshot = sim.sample()
    uuid = sim.node.gpus[6].spec.uuid
    assert sim.value("nvidia_gpu_up", gpu="6", uuid=uuid) == 0
    # its other series vanish, its identity stays so that alerts can name it
    assert device_series(sim, 6) == {"nvidia_gpu_up", "nvidia_gpu_info"}
    for other in (0, 5, 7):
        assert "nvidia_gpu_temperature_celsius" in device_series(sim, other)
    assert all(c.success for c in snapshot.collectors)
    # after the periodic re-discovery it is still lost, and still labelled
    sim.sample(61)
    assert sim.value("nvidia_gpu_up", gpu="6", uuid=uuid) == 0
    sim.node.clear(6)  # back after a reset: its handles stay lost until NVML is initialised again,
    sim.sample(61)  # which a GPU lost already gets every LOST_RETRY_FACTOR re-discoveries, not each
    assert sim.value("nvidia_gpu_up", gpu="6", uuid=uuid) == 0
    sim.sample(61 * LOST_RETRY_FACTOR)
    assert sim.value("nvidia_gpu_up", gpu="6", uuid=uuid) == 1
    assert "nvidia_gpu_temperature_celsius" in device_series(sim, 6)


def test_nvml_missing_at_start_is_retried_and_self_metrics_keep_flowing(simulate):
    sim = simulate("workstation")
    sim.node.inject("nvml_unavailable")
    sim.sampler.sample_once()
    assert sim.value("gpumeter_exporter_nvml_up") == 0
    assert "nvidia_gpu_temperature_celsius" not in sim.text()
    assert sim.value("gpumeter_exporter_last_sample_timestamp_seconds") == sim.clock.now
    calls = sim.lib.calls["nvmlInitWithFlags"]
    sim.sample(0.5)  # inside the back-off: not retried yet
    assert sim.lib.calls["nvmlInitWithFlags"] == calls
    sim.node.inject("nvml_unavailable", clear=True)
    sim.sample(5)
    assert sim.value("gpumeter_exporter_nvml_up") == 1
    assert sim.value("nvidia_gpu_temperature_celsius", gpu="1", uuid=sim.node.gpus[1].spec.uuid) is not None


def test_nvml_failing_after_start_marks_nvml_down_without_crashing(simulate):
    sim = simulate("workstation")
    sim.sampler.sample_once()
    sim.node.inject("nvml_unavailable")
    sim.sample()
    assert sim.value("gpumeter_exporter_nvml_up") == 0
    assert sim.value("gpumeter_exporter_collector_success", collector="thermal") == 1
    sim.node.inject("nvml_unavailable", clear=True)
    sim.sample(5)
    assert sim.value("gpumeter_exporter_nvml_up") == 1


def test_mig_reconfigured_between_two_samples(simulate):
    sim = simulate("h100-mig")
    sim.sampler.sample_once()
    uuid = sim.node.gpus[2].spec.uuid
    sim.node.inject("mig_reconfigure", 2, layout=["3g.40gb", "3g.40gb"])
    sim.sample()
    lines = [
        line for line in sim.text().splitlines() if line.startswith("nvidia_gpu_mig_info{") and uuid in line
    ]
    assert len(lines) == 2
    assert {line.split('gpu_instance_id="')[1].split('"')[0] for line in lines} == {"1", "2"}
    assert all('mig_profile="3g.40gb"' in line and 'memory_slices="4"' in line for line in lines)
    big = {
        "gpu": "2",
        "uuid": uuid,
        "gpu_instance_id": "1",
        "compute_instance_id": "0",
        "mig_profile": "3g.40gb",
    }
    assert sim.value("nvidia_gpu_mig_memory_total_bytes", **big) == 40960 * 2**20
    sim.node.inject("mig_reconfigure", 2, layout=[])  # MIG disabled: whole-GPU utilization returns
    sim.sample()
    assert not [
        line for line in sim.text().splitlines() if line.startswith("nvidia_gpu_mig_info{") and uuid in line
    ]
    assert sim.value("nvidia_gpu_utilization_ratio", gpu="2", uuid=uuid) is not None


def test_an_unsupported_function_is_not_asked_again(simulate):
    sim = simulate("h200")
    sim.node.inject("unsupported", 0, function="nvmlDeviceGetPowerUsage")
    sim.sampler.sample_once()
    first = sim.lib.calls["nvmlDeviceGetPowerUsage"]
    assert first == 8  # once per GPU
    for _ in range(3):
        sim.sample()
    assert sim.lib.calls["nvmlDeviceGetPowerUsage"] == first + 3 * 7  # GPU 0 never again
    assert sim.value("nvidia_gpu_power_watts", gpu="0", uuid=sim.node.gpus[0].spec.uuid) is None
    assert sim.value("nvidia_gpu_power_watts", gpu="1", uuid=sim.node.gpus[1].spec.uuid) is not None


def test_an_older_driver_without_newer_symbols_falls_back_once(simulate):
    sim = simulate("h200", missing={"nvmlDeviceGetTemperatureV", "nvmlDeviceGetMemoryInfo_v2"})
    sim.sampler.sample_once()
    sim.sample()
    sim.sample()
    uuid = sim.node.gpus[0].spec.uuid
    assert sim.value("nvidia_gpu_temperature_celsius", gpu="0", uuid=uuid) is not None
    assert sim.value("nvidia_gpu_memory_used_bytes", gpu="0", uuid=uuid) is not None
    assert sim.value("nvidia_gpu_memory_reserved_bytes", gpu="0", uuid=uuid) is None  # v1 has no reserved
    assert sim.lib.calls["nvmlDeviceGetTemperature"] == 3 * 8
    # pynvml looked the missing symbol up once; nothing was asked of it afterwards
    assert sim.lib.calls["nvmlDeviceGetTemperatureV"] == 0


def test_fields_are_batched_into_one_call_per_device_per_cycle(simulate):
    sim = simulate("h100-mig")
    sim.sampler.sample_once()
    before = sim.lib.calls["nvmlDeviceGetFieldValues"]
    sim.sample()
    assert sim.lib.calls["nvmlDeviceGetFieldValues"] - before == 8
    assert sim.value("gpumeter_exporter_nvml_calls") == sim.sampler.session.calls


def test_a_scrape_never_calls_nvml(simulate):
    sim = simulate("h100-mig")
    sim.sampler.sample_once()
    # The XID thread's waits and the PCIe throughput reads run beside the sampler; not the scrape's calls.
    beside = ("nvmlEventSetWait_v2", "nvmlDeviceGetPcieThroughput")
    calls = sim.lib.total_calls() - sum(sim.lib.calls[name] for name in beside)
    for _ in range(10):
        sim.text()
    assert sim.lib.total_calls() - sum(sim.lib.calls[name] for name in beside) == calls


def test_registering_the_collector_does_not_collect():
    collected = []

    def snapshots():
        collected.append(1)
        return Snapshot.empty()

    CollectorRegistry(auto_describe=True).register(SnapshotCollector(snapshots))
    assert collected == []


def test_a_failing_collector_fails_alone(simulate):
    sim = simulate("h200")
    sim.sampler.sample_once()
    sim.node.gpus[0].unsupported.clear()

    def broken(*args, **kwargs):
        raise RuntimeError("bug")

    pcie = next(c for c in sim.sampler.collectors if c.name == "pcie")
    pcie.update = broken
    sim.sample()
    assert sim.value("gpumeter_exporter_collector_success", collector="pcie") == 0
    assert sim.value("gpumeter_exporter_collector_success", collector="thermal") == 1
    assert sim.value("nvidia_gpu_temperature_celsius", gpu="0", uuid=sim.node.gpus[0].spec.uuid) is not None


def test_collectors_can_be_disabled_and_unknown_names_are_refused(simulate):
    sim = simulate("h200", disable_collectors=("nvlink",))
    sim.sampler.sample_once()
    assert "nvidia_gpu_nvlink_up{" not in sim.text()
    assert sim.value("gpumeter_exporter_collector_success", collector="nvlink") is None
    with pytest.raises(ValueError, match="unknown collector"):
        simulate("h200", disable_collectors=("nvlinks",))


def test_a_healthy_rediscovery_keeps_nvml_and_the_xid_thread_up(simulate):
    sim = simulate("h200")
    sim.sampler.sample_once()
    inits, shutdowns = sim.lib.calls["nvmlInitWithFlags"], sim.lib.calls["nvmlShutdown"]
    sim.sample(61)  # past the re-discovery interval
    assert (sim.lib.calls["nvmlInitWithFlags"], sim.lib.calls["nvmlShutdown"]) == (inits, shutdowns)
    sim.node.inject("gpu_lost", 2)
    sim.sample()
    sim.sample(61)  # a lost GPU is worth starting over for
    assert sim.lib.calls["nvmlInitWithFlags"] == inits + 1
    # once: while it stays lost NVML and the XID thread stay up for the others (starting over every
    # minute dropped their XIDs each time), until LOST_RETRY_FACTOR re-discoveries have passed
    uuid = sim.node.gpus[0].spec.uuid
    for _ in range(LOST_RETRY_FACTOR - 2):
        sim.node.inject("xid", 0, code=31)
        sim.sample(61)
    assert sim.lib.calls["nvmlInitWithFlags"] == inits + 1
    assert wait_until(lambda: sim.sampler.xid_watcher.counts(uuid).get(31, (0,))[0] == LOST_RETRY_FACTOR - 2)
    sim.sample(61 * 2)
    assert sim.lib.calls["nvmlInitWithFlags"] == inits + 2  # looking for it again


def test_the_exposition_is_rendered_once_per_snapshot_for_the_formats_asked_for(simulate):
    sim = simulate("workstation")
    sim.sampler.sample_once()
    exposition = sim.exporter.exposition
    first, _ = exposition.render("application/openmetrics-text; version=1.0.0", gzip_ok=False)
    snapshot = sim.sample()
    exposition.prepare(snapshot)  # what the sampler thread does after publishing
    calls = []
    original = sim.exporter.registry.collect
    sim.exporter.registry.collect = lambda: calls.append(1) or original()
    second, content_type = exposition.render("application/openmetrics-text; version=1.0.0", gzip_ok=False)
    assert calls == [] and second != first and content_type.startswith("application/openmetrics-text")


def test_a_second_exporter_in_the_process_does_not_take_nvml_from_the_first(simulate, caplog):
    # pynvml binds one library per process (a module global). `make bench` builds a second in-process
    # exporter beside the first (the driver-cost cycles) and stops it: its nvmlShutdown went to the
    # library it had bound, and the first exporter's next cycle then called that shut-down library and
    # logged "NVML stopped answering: Uninitialized", leaving its own library's init count one too high.
    first = simulate("h100-mig")
    first.sample()
    second = simulate("h200")
    second.sample()
    second.exporter.stop()
    caplog.clear()
    reads = first.lib.calls["nvmlDeviceGetFieldValues"]
    first.sample()
    assert first.value("gpumeter_exporter_nvml_up") == 1
    assert "stopped answering" not in caplog.text
    assert first.lib.calls["nvmlDeviceGetFieldValues"] == reads + 8  # asked its own library
    assert second.lib.initialised == 0
    first.exporter.stop()
    assert first.lib.initialised == 0  # every init given back to the library it was taken from


def test_nvlink_split_crc_counters_are_read_only_where_they_can_have_moved(simulate):
    # Hopper answers no numbered FLIT field and links 12-17 have none at all: each such split is one
    # nvmlDeviceGetNvLinkErrorCounter call. A healthy cycle re-reads one link per GPU in turn, not all 18.
    sim = simulate("h100-mig")
    sim.sampler.sample_once()
    before = sim.lib.calls["nvmlDeviceGetNvLinkErrorCounter"]
    sim.sample()
    assert sim.lib.calls["nvmlDeviceGetNvLinkErrorCounter"] - before <= 2 * len(sim.node.gpus)
    # A link whose combined CRC count (field 163) moved is read again in the same cycle.
    uuid = sim.node.gpus[5].spec.uuid
    labels = {"gpu": "5", "uuid": uuid, "link": "15"}
    sim.node.inject("nvlink_crc", 5, link=15, count=100)
    sim.sample()
    assert sim.value("nvidia_gpu_nvlink_errors_total", **labels, error_type="crc_flit") == 70
    assert sim.value("nvidia_gpu_nvlink_errors_total", **labels, error_type="crc_data") == 30
    # A change the combined count does not show (nvml.h does not define it as the sum) still arrives
    # within one round of the 18 links.
    errors = sim.node.gpus[5].nvlink_errors[15]
    errors["crc_flit"] += 5
    errors["crc_data"] -= 5
    sim.sample()
    for _ in range(18):
        if sim.value("nvidia_gpu_nvlink_errors_total", **labels, error_type="crc_flit") == 75:
            break
        sim.sample()
    assert sim.value("nvidia_gpu_nvlink_errors_total", **labels, error_type="crc_flit") == 75
    assert sim.value("nvidia_gpu_nvlink_errors_total", **labels, error_type="crc_data") == 25


def test_the_slow_counters_are_read_on_their_own_cadence(simulate):
    """Energy and HW thermal / power-brake time cost a real H200 4.2 of its 4.4 ms of field reads
    (docs/real-gpu.md): by default they are read every counter_interval (30 s) and carried between, while
    every other field is read each cycle."""
    sim = simulate("h200", counter_interval=30.0)
    uuid = sim.node.gpus[1].spec.uuid
    labels = {"gpu": "1", "uuid": uuid}
    sim.sampler.sample_once()
    reads = []

    def energy_and_reads() -> tuple[float | None, int]:
        return sim.value("nvidia_gpu_energy_joules_total", **labels), sim.lib.calls[
            "nvmlDeviceGetFieldValues"
        ]

    first, calls = energy_and_reads()
    assert first is not None
    sim.node.inject("throttle", 1, reason="hw_thermal")
    for _ in range(5):  # 25 s: inside the counters' 30 s
        sim.sample(5)
        reads.append(energy_and_reads())
    assert {energy for energy, _ in reads} == {first}, "the energy counter was read again before 30 s"
    assert sim.value("nvidia_gpu_clocks_event_seconds_total", **labels, reason="hw_thermal") == 0
    # each cycle still asks the fast batch, once per GPU
    assert [n - calls for _, n in reads] == [8 * i for i in range(1, 6)]
    # the fast fields move every cycle: the active throttle bit and the HBM temperature
    assert sim.value("nvidia_gpu_clocks_event_active", **labels, reason="hw_thermal") == 1
    sim.sample(5)  # 30 s: due
    energy, n = energy_and_reads()
    assert energy > first
    assert n - reads[-1][1] == 2 * 8  # the fast and the slow batch
    assert sim.value("nvidia_gpu_clocks_event_seconds_total", **labels, reason="hw_thermal") >= 24.9


def test_counter_interval_zero_reads_every_counter_every_cycle(simulate):
    sim = simulate("h200", counter_interval=0.0)
    labels = {"gpu": "0", "uuid": sim.node.gpus[0].spec.uuid}
    sim.sampler.sample_once()
    energies = []
    for _ in range(3):
        sim.sample(5)
        energies.append(sim.value("nvidia_gpu_energy_joules_total", **labels))
    assert energies == sorted(energies) and len(set(energies)) == 3


def test_xids_still_queued_when_nvml_starts_over_are_counted(simulate):
    """A re-initialisation frees the event set: the XIDs it still held unread are read out first."""
    sim = simulate("h200")
    sim.sampler.sample_once()
    watcher, uuid = sim.sampler.xid_watcher, sim.node.gpus[1].spec.uuid
    watcher._stop.set()  # the reading thread stops after its slice: the next XID stays in the set
    watcher._thread.join(timeout=5)
    sim.node.inject("xid", 1, code=48)
    assert 48 not in watcher.counts(uuid)
    watcher.detach()  # what a re-discovery that starts NVML over does first
    assert watcher.counts(uuid)[48][0] == 1
