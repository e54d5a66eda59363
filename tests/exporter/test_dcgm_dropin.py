"""dcgm-exporter as a drop-in: its command line (``-f FILE``, ``-a :9400``, its environment variables,
the hostname label spelling) and NVIDIA's own field lists and dashboard (issue 14).

NVIDIA's files are test data under ``tests/data/dcgm-exporter/`` (README there names the commit);
nothing is fetched.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from gpumeter.exporter import config as exporter_config
from gpumeter.exporter.config import ConfigError, ExporterConfig
from gpumeter.exporter.dcgm_csv import CollectorsFileError, parse_collectors, read_collectors
from tests.support.servers import free_port, wait_http_ok

DATA = Path(__file__).resolve().parents[1] / "data" / "dcgm-exporter"
DCP = DATA / "dcp-metrics-included.csv"
DEFAULT = DATA / "default-counters.csv"


def parse(argv: list[str], environ: dict[str, str] | None = None) -> ExporterConfig:
    parser = argparse.ArgumentParser()
    exporter_config.add_arguments(parser)
    return exporter_config.resolve(parser.parse_args(argv), environ or {})


def csv_fields(path: Path) -> list[tuple[str, str]]:
    """The (field, type) rows of a dcgm-exporter CSV, read here independently of exporter.dcgm_csv."""
    rows = []
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, kind, _help = (part.strip() for part in line.split(",", 2))
            rows.append((name, kind))
    return rows


def exposed(text: str) -> dict[str, str]:
    """family name -> type, from the # TYPE lines of a text exposition."""
    return {
        parts[2]: parts[3]
        for parts in (line.split() for line in text.splitlines() if line.startswith("# TYPE "))
    }


# --- the command line -----------------------------------------------------------------------------
def test_dcgm_exporter_flags_are_accepted_and_imply_dcgm_naming():
    config = parse(["-f", str(DCP), "-a", ":9400"])
    assert (config.collectors, config.listen, config.naming) == (str(DCP), ":9400", "dcgm")
    config = parse(["--collectors", str(DCP), "--address", "127.0.0.1:9400"])
    assert (config.collectors, config.listen, config.naming) == (str(DCP), "127.0.0.1:9400", "dcgm")
    assert parse([]).listen == ":9835" and parse([]).naming == "native"


def test_dcgm_exporter_environment_variables():
    env = {"DCGM_EXPORTER_COLLECTORS": str(DEFAULT), "DCGM_EXPORTER_LISTEN": ":9400"}
    config = parse([], env)
    assert (config.collectors, config.listen, config.naming) == (str(DEFAULT), ":9400", "dcgm")
    # gpumeter's own variable wins over dcgm-exporter's, and a flag over both
    assert parse([], {**env, "GPUMETER_LISTEN": ":9500"}).listen == ":9500"
    assert parse(["-a", ":9600"], {**env, "GPUMETER_LISTEN": ":9500"}).listen == ":9600"


def test_hostname_label_spelling():
    assert parse([]).dcgm_hostname_label == "Hostname"
    assert parse(["--dcgm-hostname-label", "hostname"]).dcgm_hostname_label == "hostname"
    with pytest.raises(ConfigError, match="dcgm_hostname_label: must be Hostname or hostname"):
        parse(["--dcgm-hostname-label", "HOSTNAME"])


def test_collectors_file_with_native_naming_is_refused():
    with pytest.raises(ConfigError, match="only --naming dcgm exports"):
        parse(["-f", str(DCP), "--naming", "native"])


@pytest.mark.parametrize(
    "text, message",
    [
        ("DCGM_FI_DEV_GPU_TEMP, gauge\n", "line 1: expected 3 fields"),
        ("# c\nDCGM_FI_DEV_GPU_TEMP, gaueg, GPU temperature\n", "line 2: DCGM_FI_DEV_GPU_TEMP: type must be"),
        ("# only comments\n\n", "no fields listed"),
        ('DCGM_FI_DEV_GPU_TEMP, gauge, "unterminated\n', "line 1"),
    ],
)
def test_malformed_collectors_file_is_one_line_naming_file_and_line(tmp_path, text, message):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message) as caught:
        parse(["-f", str(path)])
    assert str(path) in str(caught.value) and "\n" not in str(caught.value)


def test_unreadable_collectors_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read collectors file"):
        parse(["-f", str(tmp_path / "missing.csv")])
    (tmp_path / "binary.csv").write_bytes(b"\xff\xfe")
    with pytest.raises(CollectorsFileError, match="not UTF-8"):
        read_collectors(str(tmp_path / "binary.csv"))


def test_parser_reads_nvidias_files_as_dcgm_exporter_does():
    for path in (DEFAULT, DCP):
        parsed = read_collectors(str(path))
        assert [(f.name, f.type) for f in parsed.fields] == csv_fields(path)
    # "DCGM_FI_DEV_DEC_UTIL ," in NVIDIA's file: trimmed, as dcgm-exporter trims every field
    assert read_collectors(str(DCP)).field("DCGM_FI_DEV_DEC_UTIL") is not None
    assert parse_collectors("A, gauge, x\nA, counter, y\n").fields[0].type == "gauge"


# --- exactly the listed fields --------------------------------------------------------------------
def test_only_the_listed_fields_are_exported_with_the_rows_type_and_help(simulate, tmp_path, caplog):
    path = tmp_path / "mine.csv"
    path.write_text(
        "# mine\n"
        "DCGM_FI_DEV_GPU_TEMP, gauge, Temperature per my CSV.\n"
        "DCGM_FI_DEV_POWER_USAGE, gauge, Power.\n"
        "DCGM_FI_DEV_NO_SUCH_FIELD, gauge, typo\n"
        "DCGM_FI_DEV_VGPU_LICENSE_STATUS, gauge, vGPU\n"
    )
    with caplog.at_level(logging.WARNING, logger="gpumeter.exporter.dcgm"):
        sim = simulate("h200", naming="dcgm", collectors=str(path))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "DCGM_FI_DEV_NO_SUCH_FIELD, DCGM_FI_DEV_VGPU_LICENSE_STATUS" in warnings[0]
    sim.sample()
    text = sim.text()
    dcgm_families = {n: t for n, t in exposed(text).items() if not n.startswith("gpumeter_")}
    assert dcgm_families == {"DCGM_FI_DEV_GPU_TEMP": "gauge", "DCGM_FI_DEV_POWER_USAGE": "gauge"}
    assert "# HELP DCGM_FI_DEV_GPU_TEMP Temperature per my CSV." in text
    # no DCGM_FI_DRIVER_VERSION label row in this file: no such label
    assert "DCGM_FI_DRIVER_VERSION=" not in text and 'Hostname="' in text


def test_hostname_label_spelled_as_asked(simulate):
    sim = simulate("h200", naming="dcgm", dcgm_hostname_label="hostname")
    sim.sample()
    text = sim.text()
    assert 'hostname="' in text and 'Hostname="' not in text


def test_gpumeter_exporter_f_dcp_metrics_included_a_9400_starts_and_exports_exactly_those(tmp_path):
    """The process, as a DaemonSet would start it: ``-f dcp-metrics-included.csv -a <port>``."""
    port = free_port()
    env = {**os.environ, "NODE_NAME": "gpu-node-1"}
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "gpumeter", "exporter", "-f", str(DCP), "-a", f"127.0.0.1:{port}"),
            *("--simulate", "h200", "--kubelet-socket", "", "--interval", "0.5"),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        wait_http_ok(f"http://127.0.0.1:{port}/healthz", proc=proc)
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    finally:
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=20)
    families = {n: t for n, t in exposed(text).items() if not n.startswith("gpumeter_")}
    listed = dict(csv_fields(DCP))
    assert set(families) <= set(listed), set(families) - set(listed)
    for name, kind in families.items():
        assert kind == listed[name], name
    # NVML answers these on an H200 node
    for name in (
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_SM_CLOCK",
    ):
        assert name in families
    # the fields NVML cannot answer are named in one warning line
    warned = [line for line in err.decode().splitlines() if "not exported" in line]
    assert len(warned) == 1 and "DCGM_FI_DEV_VGPU_LICENSE_STATUS" in warned[0], err.decode()[-2000:]
    assert 'DCGM_FI_DRIVER_VERSION="' in text  # the file's `label` row
