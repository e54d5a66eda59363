"""The stand-in against real boards: what a real H200 (two of them) and a real H100 answered
(tests/data/real-gpu/, taken with tests/real_gpu/run.sh on a GPU node, docs/real-gpu.md) is what the
stand-in must answer for the simulated node that stands for each machine (fleets ``h200-vm`` and
``h100-vm``: one GPU passed through to a VM, driver 580).

Three views, each of data nobody here wrote: NVML's own answers to the calls the exporter and the model
table rely on (probe.py's board.json), ``gpumeter doctor``'s report (which function and field answered,
and with which code), and the exporter's /metrics on the real board (which series, and the board's static
facts in them).
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import pynvml as N
import pytest

from gpumeter.exporter import doctor
from gpumeter.exporter.app import build_exporter
from gpumeter.exporter.config import ExporterConfig
from gpumeter.exporter.nvml import NvmlSession
from gpumeter.simulator.device import SimulatedNode
from gpumeter.simulator.fleet import load_fleet
from gpumeter.simulator.nvml import SimulatedNvml
from tests.real_gpu.evidence import (
    BOARDS,
    FABRIC_SERIES_PREFIX,
    H100,
    H200,
    NEWER_THAN_RECORDING,
    exposition,
    json_of,
    nvidia_smi_q,
)
from tests.real_gpu.probe import board

T0 = 1_795_000_000.0

# What the exporter and the model table rely on, as probe.board() names it. Left out: what moves (clocks
# now, temperature, power, energy, memory used), identities (uuid, serial, PCI address), and functions the
# exporter never calls, which the stand-in does not implement (FUNCTION_NOT_FOUND).
BOARD_FACTS = (
    "name",
    "architecture",
    "enforced_power_limit",
    "fan",
    "gpm_support",
    "mig_mode",
    "max_mig_devices",
    "supported_clocks_event_reasons",
    "supported_event_types",
    "virtualization_mode",
    "nvlink_state",
    *(f"threshold_{t}" for t in ("shutdown", "slowdown", "mem_max", "gpu_max")),
    *(f"threshold_{t}" for t in ("acoustic_min", "acoustic_curr", "acoustic_max", "gps_curr")),
    *(f"max_clock_{c}" for c in ("graphics", "sm", "memory", "video")),
)


@pytest.fixture(params=list(BOARDS))
def real(request) -> tuple[Path, str]:
    """Each board with evidence: (its folder, the fleet of its machine's twin)."""
    return BOARDS[request.param]


@pytest.fixture
def stand_in(real):
    node = SimulatedNode(load_fleet(real[1]), None, clock=lambda: T0)
    session = NvmlSession(SimulatedNvml(node))
    session.start()
    yield N.nvmlDeviceGetHandleByIndex(0)
    session.stop()


def _plain(answer: dict) -> dict:
    return {str(k): v for k, v in answer.items()} if isinstance(answer, dict) else answer


@pytest.mark.parametrize("fact", BOARD_FACTS)
def test_the_stand_in_answers_what_the_real_board_answered(real, stand_in, fact: str):
    answered = json_of(real[0], "board.json")["devices"][0]
    simulated = board(stand_in)
    if fact == "nvlink_state":  # a dict of links, the JSON keys are strings
        assert _plain(simulated[fact]) == answered[fact]
    else:
        assert simulated[fact] == answered[fact], fact


@pytest.mark.parametrize("other", ["board-second-h200.json", "board-fourth-h200.json"])
def test_every_real_h200_agrees_on_the_facts(other: str):
    """Other H200s (other machines, same driver; the fourth asked with the exporter of a later day)
    gave the same board facts: they are the model's, not one board's."""
    first = json_of(H200, "board.json")["devices"][0]
    again = json_of(H200, other)["devices"][0]
    assert again["uuid"] != first["uuid"]  # another board indeed
    for fact in BOARD_FACTS:
        assert first[fact] == again[fact], fact


# nvmlMemory_v2's total and reserved bytes as each board answered them, written out here so that the
# file and the stand-in cannot agree on a wrong figure: the H200 reserves 615 MiB + 64 KiB, the H100 480 MiB.
MEMORY_V2 = {H200: (150_754_820_096, 644_939_776), H100: (85_520_809_984, 503_316_480)}


def test_memory_total_and_reserved_to_the_byte(real, stand_in):
    answered = json_of(real[0], "board.json")["devices"][0]["memory_v2"]["value"]
    simulated = board(stand_in)["memory_v2"]["value"]
    assert (
        (simulated["total"], simulated["reserved"])
        == (answered["total"], answered["reserved"])
        == MEMORY_V2[real[0]]
    )


def test_fields_answer_as_on_the_real_board(real, stand_in):
    """Every field id pynvml names, asked alone: the stand-in answers exactly the ones the real board
    answered; a field it refused, the stand-in refuses. The T.Limit fields carry the real offsets (both
    boards: shutdown 8 °C above GPU max, slowdown 2)."""
    answered = json_of(real[0], "board.json")["devices"][0]["fields"]
    simulated = board(stand_in)["fields"]
    exporter_fields = {int(a["what"].split()[1]) for a in _doctor_fields(json_of(real[0], "doctor.json"))}
    for field_id in sorted(exporter_fields):
        answered_real, answered_sim = "value" in answered[str(field_id)], "value" in simulated[str(field_id)]
        assert answered_sim == answered_real, (field_id, answered[str(field_id)], simulated[str(field_id)])
    tlimits = {fid: simulated[str(fid)]["value"] for fid in (193, 194, 195, 196)}
    assert (
        tlimits
        == {fid: answered[str(fid)]["value"] for fid in (193, 194, 195, 196)}
        == {
            193: -8,
            194: -2,
            195: 0,
            196: 0,
        }
    )


def _doctor_fields(report: dict) -> list[dict]:
    return [a for a in report["gpus"][0]["fields"] if a["what"].startswith("field ")]


def test_doctor_on_the_stand_in_reports_what_doctor_reported_on_the_real_board(real):
    reported = json_of(real[0], "doctor.json")
    node = SimulatedNode(load_fleet(real[1]), None, clock=time.time)
    simulated = doctor.diagnose(SimulatedNvml(node), privileged=True).as_dict()
    assert (simulated["nvml"], simulated["driver"], simulated["cuda"]) == (
        reported["nvml"],
        reported["driver"],
        reported["cuda"],
    )
    (sim_gpu,), (real_gpu,) = simulated["gpus"], reported["gpus"]

    def results(gpu: dict, key: str) -> dict[str, str]:
        return {a["what"]: a["result"] for a in gpu[key]}

    assert results(sim_gpu, "calls") == results(real_gpu, "calls")
    assert results(sim_gpu, "fields") == results(real_gpu, "fields")
    for key in ("name", "up", "mig", "xid_events", "gpm"):
        assert sim_gpu[key] == real_gpu[key], key
    smi = nvidia_smi_q(real[0], "nvidia-smi-q.txt")
    assert [v for k, v in smi.items() if k[-2:] == ("Fabric", "State")] == ["N/A"]
    fabric = [line for line in sim_gpu["not_exported"] if line.startswith(FABRIC_SERIES_PREFIX)]
    assert len(fabric) == 5, fabric  # the board has no fabric, and the stand-in answers so
    assert [line for line in sim_gpu["not_exported"] if line not in fabric] == real_gpu["not_exported"]


# --- the exporter's /metrics ------------------------------------------------------------------------------
IDENTITIES = {"uuid", "pci_bus_id", "hostname"}  # label values that name the machine, not the board
STATIC = (
    "nvidia_gpu_temperature_threshold_celsius",
    "nvidia_gpu_clock_max_hz",
    "nvidia_gpu_memory_total_bytes",
    "nvidia_gpu_memory_reserved_bytes",
    "nvidia_gpu_power_limit_watts",
)


def _shape(series: dict) -> dict:
    """Series with the machine's identities blanked: what a board of this model on this driver serves."""
    return {
        (name, tuple((k, "" if k in IDENTITIES else v) for k, v in labels)): value
        for (name, labels), value in series.items()
    }


def _simulated_exposition(fleet: str) -> dict:
    clock = [T0]
    node = SimulatedNode(load_fleet(fleet), None, clock=lambda: clock[0])
    config = ExporterConfig(
        listen="127.0.0.1:0", kubelet_socket=None, enable_collectors=("processes",), interval=1.0
    )
    exporter = build_exporter(config, clock=lambda: clock[0], library=SimulatedNvml(node), node=node)
    try:
        for _ in range(3):
            clock[0] += 1.0
            exporter.sampler.sample_once()
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in exporter.registry.collect()
            for s in family.samples
        }
    finally:
        exporter.sampler.stop()


def test_the_exporter_on_the_stand_in_serves_the_series_it_served_on_the_real_board(real):
    served = _shape(exposition(real[0], "metrics-idle.prom"))
    simulated = _shape(_simulated_exposition(real[1]))
    board = (real[0] / "board.json").read_text()
    for name, answer in NEWER_THAN_RECORDING.items():
        assert f'"{answer}": {{\n    "value": ' in board, answer  # the board answered its call
        simulated = {key: value for key, value in simulated.items() if key[0] != name}
    # the exporter's own series about a collector written after the recording
    simulated = {key: value for key, value in simulated.items() if ("collector", "fabric") not in key[1]}
    assert sorted(set(simulated) - set(served)) == []
    assert sorted(set(served) - set(simulated)) == []
    for key, value in served.items():
        if key[0] in STATIC:
            assert simulated[key] == value, key


def test_the_exporter_on_the_real_board_agrees_with_nvidia_smi_there(real):
    """NVIDIA's own tool on the same board, after the load: the exporter's units and conversions hold
    (MiB, MHz, W; the throttle-time counters NVML gives in ns and nvidia-smi prints in µs)."""
    smi = nvidia_smi_q(real[0], "nvidia-smi-q-after.txt")
    gpu = next(k[0] for k in smi if k[0].startswith("GPU "))

    def printed(*path: str) -> float:
        return float(smi[(gpu, *path)].split()[0])

    served = {
        (name, dict(labels).get("clock") or dict(labels).get("reason") or ""): value
        for (name, labels), value in exposition(real[0], "metrics-after.prom").items()
    }
    mib = 1024 * 1024
    assert served[("nvidia_gpu_memory_total_bytes", "")] / mib == printed("FB Memory Usage", "Total")
    # nvidia-smi rounds the H200's reserved 615.06 MiB up (the H100's is 480 MiB whole)
    assert math.ceil(served[("nvidia_gpu_memory_reserved_bytes", "")] / mib) == printed(
        "FB Memory Usage", "Reserved"
    )
    for clock, key in (("graphics", "Graphics"), ("sm", "SM"), ("memory", "Memory"), ("video", "Video")):
        assert served[("nvidia_gpu_clock_max_hz", clock)] / 1e6 == printed("Max Clocks", key)
    assert served[("nvidia_gpu_power_limit_watts", "")] == printed(
        "GPU Power Readings", "Current Power Limit"
    )
    capped_us = printed("Clocks Event Reasons Counters", "SW Power Capping")
    assert capped_us > 20e6  # the load ran at the power cap for most of its 30 s
    # NVML counts ns (the H200: 30,209,610,752; the H100: 30,300,304,288); nvidia-smi truncates to µs
    assert int(served[("nvidia_gpu_clocks_event_seconds_total", "sw_power_cap")] * 1e6) == capped_us
    # the T.Limit offsets nvidia-smi prints are the absolute thresholds the exporter serves, on gpu_max = 0
    thresholds = {
        dict(labels)["threshold"]: value
        for (name, labels), value in exposition(real[0], "metrics-after.prom").items()
        if name == "nvidia_gpu_temperature_threshold_celsius"
    }
    assert thresholds["shutdown"] - thresholds["gpu_max"] == -printed(
        "Temperature", "GPU Shutdown T.Limit Temp"
    )
    assert thresholds["slowdown"] - thresholds["gpu_max"] == -printed(
        "Temperature", "GPU Slowdown T.Limit Temp"
    )
