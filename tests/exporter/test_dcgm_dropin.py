"""dcgm-exporter as a drop-in: its command line (``-f FILE``, ``-a :9400``, its environment variables,
the hostname label spelling) and NVIDIA's own field lists and dashboard.

NVIDIA's files are test data under ``tests/data/dcgm-exporter/`` (README there names the commit);
nothing is fetched.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpumeter.exporter import config as exporter_config
from gpumeter.exporter.config import ConfigError, ExporterConfig
from gpumeter.exporter.dcgm_csv import CollectorsFileError, parse_collectors, read_collectors
from tests.support import loopback
from tests.support.servers import DUMP_ON_ABORT, free_port, stop_processes, wait_http_ok

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


SEED_003_CSV = Path(__file__).resolve().parents[1] / "data" / "seed-003" / "dcp-metrics-included.csv"
PROF_FIELDS = [
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_PROF_SM_ACTIVE",
    "DCGM_FI_PROF_SM_OCCUPANCY",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
]


@pytest.mark.parametrize(
    ("fleet", "node", "model"), [("v100-t4", "gpu-t4-01", "Tesla T4"), ("a100-pcie", None, "A100")]
)
def test_seed_003s_fields_nvml_cannot_serve_are_logged_once_each_with_who_can(
    simulate, caplog, monkeypatch, fleet, node, model
):
    from gpumeter.exporter import dcgm

    monkeypatch.setattr(dcgm, "_unserved", set())
    sim = simulate(fleet, node=node, naming="dcgm", collectors=str(SEED_003_CSV))
    with caplog.at_level(logging.WARNING, logger="gpumeter.exporter.dcgm"):
        for _ in range(3):
            sim.sample()
            sim.text()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    for field in PROF_FIELDS:  # no GPM before Hopper: each said once, naming the GPUs and DCGM
        said = [
            w for w in warnings if w.startswith(f"{field}, listed in the collectors file, is not served on ")
        ]
        assert len(said) == 1, warnings
        assert model in said[0] and "DCGM's profiling module does on Volta and later" in said[0]
    assert "DCGM_FI_DEV_GPU_TEMP" not in " ".join(warnings)  # a field every GPU served is not named


def test_hostname_label_spelled_as_asked(simulate):
    sim = simulate("h200", naming="dcgm", dcgm_hostname_label="hostname")
    sim.sample()
    text = sim.text()
    assert 'hostname="' in text and 'Hostname="' not in text


@pytest.mark.spawns
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
        text = loopback.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
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


# --- "Done when": NVIDIA's dashboard and field lists against a real Prometheus ----------------------
SEED_RULES = DATA.parent / "seed-003" / "gpu-alerts.rules.yaml"
# Fields of the CSVs NVML cannot answer at all (docs/dcgm-mode.md §1.2)
DCGM_ONLY = {"DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "DCGM_FI_DEV_VGPU_LICENSE_STATUS"}
# ... and what NVML does not answer on MIG-enabled GPUs, as dcgm-exporter shows them absent there too:
# utilization rates and the video engines (nvml.h, nvmlDeviceGetUtilizationRates: not on MIG-enabled
# GPUs; nvidia-smi prints N/A), the row remapper with active instances (nvmlDeviceGetRemappedRows).
NOT_ON_MIG = {
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_ENC_UTIL",
    "DCGM_FI_DEV_DEC_UTIL",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
}
FLEETS = {"hopper": "h200", "mig": "h100-mig"}
SEED_CSV = DATA.parent / "seed-003" / "dcp-metrics-included.csv"
# role -> (fleet, extra arguments): seed 003's DaemonSet runs with its own ConfigMap's CSV
STACK = {
    "hopper": ("h200", []),
    "mig": ("h100-mig", []),
    "seed": ("h200", ["-f", str(SEED_CSV)]),
}


@pytest.fixture(scope="module")
def dcgm_stack(tmp_path_factory):
    """A Hopper node (8 whole H200s) and a MIG node (8 H100s, 56 instances), both with pods from a
    stand-in kubelet, each served by its own `gpumeter exporter --naming dcgm` process (pynvml's library
    binding is per process) and scraped by a real Prometheus every second; and a third, Hopper node run
    as seed 003's DaemonSet runs dcgm-exporter (`-f` its ConfigMap's CSV), whose GPU 0 takes 100 NVLink
    CRC errors per second on link 0, injected through the simulator's fault endpoint."""
    from gpumeter.simulator.fleet import load_fleet
    from gpumeter.simulator.kubelet import StandInKubelet
    from tests.support.servers import PrometheusServer

    workdir = tmp_path_factory.mktemp("dcgm-stack")
    kubelets, processes, targets = [], [], {}
    prom = None
    stuck: list[str] = []
    try:
        for role, (fleet_name, extra) in STACK.items():
            fleet = load_fleet(fleet_name)
            sock = str(workdir / f"{role}.sock")
            kubelets.append(StandInKubelet(fleet, fleet.nodes[0].name, sock).start())
            port, admin = free_port(), free_port()
            argv = [
                sys.executable,
                "-m",
                "gpumeter",
                "exporter",
                "--naming",
                "dcgm",
                "-a",
                f"127.0.0.1:{port}",
            ]
            argv += ["--simulate", fleet_name, "--kubelet-socket", sock, "--interval", "1"]
            argv += ["--admin-listen", f"127.0.0.1:{admin}", *extra]
            log = workdir / f"{role}.log"
            with log.open("wb") as out:  # the child keeps its own descriptor
                proc = subprocess.Popen(argv, stdout=out, stderr=out, env={**os.environ, **DUMP_ON_ABORT})
            processes.append((proc, log))
            wait_http_ok(f"http://127.0.0.1:{port}/healthz", proc=processes[-1][0])
            targets[role] = f"127.0.0.1:{port}"
            if role == "seed":
                fault = {"fault": "nvlink_crc", "gpu": 0, "link": 0, "rate": 100}
                answer = loopback.post(f"http://127.0.0.1:{admin}/faults", json=fault, timeout=10)
                assert answer.status_code == 200, answer.text
        prom = PrometheusServer(
            workdir / "prom",
            scrape_targets={role: [t] for role, t in targets.items()},
            rule_files=[SEED_RULES],
        ).start()
        for role in FLEETS:  # GPM needs two samples, rate() two scrapes
            prom.wait_for(f'DCGM_FI_DEV_GPU_TEMP{{job="{role}"}}')
            prom.wait_for(f'DCGM_FI_PROF_SM_ACTIVE{{job="{role}"}}')
        prom.wait_for('rate(DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L0{job="seed"}[5m])')
        yield prom, targets
    finally:
        if prom is not None:
            prom.stop()
        try:
            stuck = stop_processes(processes)
        finally:
            for kubelet in kubelets:
                kubelet.stop()
    assert not stuck, "\n\n".join(stuck)  # after the tests, whose own failures come first


@pytest.mark.prometheus
@pytest.mark.slow
@pytest.mark.parametrize("role", list(FLEETS))
def test_every_panel_of_nvidias_dashboard_returns_data(dcgm_stack, role):
    prom, targets = dcgm_stack
    dashboard = json.loads((DATA / "dashboard-queries.json").read_text())
    assert prom.query(f'count(DCGM_FI_DEV_GPU_TEMP{{instance="{targets[role]}"}})')  # $instance's source
    checked = 0
    for panel in dashboard["panels"]:
        if role == "mig" and panel["panel"] == "GPU Utilization":
            continue  # NVML has no utilization rates on MIG GPUs; dcgm-exporter shows none either
        expr = panel["expr"].replace("$instance", targets[role]).replace("$gpu", ".*")
        assert prom.query(expr), (role, panel["panel"], expr)
        checked += 1
    assert checked == len(dashboard["panels"]) - (role == "mig")


@pytest.mark.prometheus
@pytest.mark.slow
@pytest.mark.parametrize("csv_name", ["default-counters.csv", "dcp-metrics-included.csv"])
@pytest.mark.parametrize("role", list(FLEETS))
def test_every_csv_field_nvml_answers_is_present_with_dcgms_type(dcgm_stack, role, csv_name):
    prom, targets = dcgm_stack
    metadata = loopback.get(f"{prom.url}/api/v1/metadata", timeout=10).json()["data"]
    rows = csv_fields(DATA / csv_name)
    expected_absent = DCGM_ONLY | (NOT_ON_MIG if role == "mig" else set())
    for name, kind in rows:
        present = prom.query(f'{name}{{instance="{targets[role]}"}}') if kind != "label" else None
        if kind == "label":
            assert prom.query(f'DCGM_FI_DEV_GPU_TEMP{{instance="{targets[role]}",{name}!=""}}'), name
        elif name in expected_absent:
            assert not present, (role, name)
        else:
            assert present, (role, name)
            assert metadata[name][0]["type"] == kind, (name, metadata[name])


@pytest.mark.prometheus
@pytest.mark.slow
def test_mig_node_pod_queries_of_dcgm_exporter_users_return_data(dcgm_stack):
    prom, targets = dcgm_stack
    mig = targets["mig"]
    assert prom.query(f'DCGM_FI_DEV_GPU_TEMP{{instance="{mig}",pod!=""}}')
    by_pod = prom.query(f'sum by (pod) (DCGM_FI_DEV_POWER_USAGE{{instance="{mig}",pod!=""}})')
    assert len(by_pod) > 1
    # per GPU instance: GPU_I_ID and GPU_I_PROFILE on every device field
    assert not prom.query(f'DCGM_FI_DEV_POWER_USAGE{{instance="{mig}",GPU_I_ID=""}}')


@pytest.mark.prometheus
@pytest.mark.slow
def test_injected_nvlink_crc_errors_make_seed_003s_rule_expression_return_data(dcgm_stack):
    prom, targets = dcgm_stack
    rules = yaml.safe_load(SEED_RULES.read_text())["groups"][0]["rules"]
    [rule] = [r for r in rules if r["alert"] == "NVLinkErrorRateHigh"]
    assert rule["expr"] == "rate(DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L0[5m]) > 10"  # seed 003, as is
    # rate() over [5m] divides the increase by 300 s: with 70 FLIT errors/s it passes 10 after ~45 s of data
    result = prom.wait_for(rule["expr"], timeout=150)
    assert {(r["metric"]["instance"], r["metric"]["gpu"]) for r in result} == {(targets["seed"], "0")}
    assert 10 < float(result[0]["value"][1]) <= 100 * 0.7 * 1.1  # 70 % of 100 CRC errors/s are FLIT ones
    # seed 003's DaemonSet gets exactly its CSV's fields (Hopper, whole GPUs: NVML answers all 16)
    names = {
        r["metric"]["__name__"] for r in prom.query('count by (__name__) ({job="seed", __name__=~"DCGM_.*"})')
    }
    assert names == {name for name, _kind in csv_fields(SEED_CSV)}
    # the alert itself goes pending through Prometheus' rule evaluation (`for: 2m` keeps it from firing)
    alerts = prom.wait_for('ALERTS{alertname="NVLinkErrorRateHigh"}')
    assert alerts[0]["metric"]["alertstate"] == "pending"
    # every seed-003 rule loads and evaluates against dcgm mode's names
    groups = loopback.get(f"{prom.url}/api/v1/rules", timeout=10).json()["data"]["groups"]
    health = {r["name"]: r["health"] for g in groups for r in g["rules"]}
    assert set(health) == {r["alert"] for r in rules}
    assert prom.wait_for(
        "count(ALERTS)",
        predicate=lambda _: all(
            r["health"] == "ok"
            for g in loopback.get(f"{prom.url}/api/v1/rules", timeout=10).json()["data"]["groups"]
            for r in g["rules"]
        ),
    )


# --- seed 003's rules, unchanged ------------------------------------------------------------------
@pytest.mark.prometheus
def test_seed_003_rules_pass_promtool_unit_tests_over_dcgm_names():
    from tests.support.servers import require_binary

    result = subprocess.run(
        [require_binary("promtool"), "test", "rules", "gpu-alerts-test.yaml"],
        cwd=SEED_RULES.parent,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0 and "SUCCESS" in result.stdout + result.stderr, (
        result.stdout + result.stderr
    )


def test_every_metric_seed_003_alerts_on_is_a_dcgm_mode_field():
    import re as regex

    from gpumeter.exporter.dcgm import FIELDS

    rules = yaml.safe_load(SEED_RULES.read_text())["groups"][0]["rules"]
    assert len(rules) == 6
    used = {name for rule in rules for name in regex.findall(r"DCGM_FI_[A-Z0-9_]+", rule["expr"])}
    assert used == {
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_THERMAL_VIOLATION",
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L0",
        "DCGM_FI_DEV_POWER_USAGE",
    }
    assert used <= set(FIELDS)


def test_per_link_nvlink_fields_when_listed_totals_by_default(simulate, tmp_path):
    default = simulate("h200", naming="dcgm")
    default.sample()
    families = exposed(default.text())
    assert families["DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"] == "counter"
    assert not any(regex_link(name) for name in families)
    path = tmp_path / "links.csv"
    path.write_text(
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L0, counter, link 0\n"
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_L17, counter, link 17\n"
        "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL, counter, total\n"
    )
    listed = simulate("h200", naming="dcgm", collectors=str(path))
    listed.node.inject("nvlink_crc", 0, link=0, count=1000)
    listed.sample()
    text = listed.text()
    assert {n for n in exposed(text) if n.startswith("DCGM_")} == {
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L0",
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_L17",
        "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
    }
    uuid = listed.node.gpus[0].spec.uuid
    flit = listed.value("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L0", **dcgm_labels(text, uuid))
    data_total = listed.value("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", **dcgm_labels(text, uuid))
    assert (flit, data_total) == (700, 300)  # the stand-in splits an injected burst 70/30 FLIT/DATA


def regex_link(name: str) -> bool:
    import re as regex

    return regex.fullmatch(r"DCGM_.+_L\d+", name) is not None


def dcgm_labels(text: str, uuid: str) -> dict[str, str]:
    import re as regex

    line = next(x for x in text.splitlines() if x.startswith("DCGM_") and f'UUID="{uuid}"' in x)
    return dict(regex.findall(r'(\w+)="([^"]*)"', line.split("{", 1)[1].rsplit("}", 1)[0]))
