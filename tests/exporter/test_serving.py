"""HTTP serving of the exporter: content negotiation, /healthz, basic auth and TLS from an
exporter-toolkit web config, and staying available to scrapers while idle or hostile clients hold
connections; settings from file, environment and flags; bad input named
precisely, in one line and without a traceback (point 14)."""

from __future__ import annotations

import argparse
import base64
import logging
import signal
import socket
import subprocess
import sys
from pathlib import Path

import bcrypt
import httpx
import pytest

from gpumeter.cli import main as gpumeter_main
from gpumeter.exporter.config import ConfigError, add_arguments, resolve
from gpumeter.simulator.fleet import FleetError, load_fleet, parse_fleet
from gpumeter.web import WebConfigError
from tests.support import loopback
from tests.support.certs import client_context, make_pki
from tests.support.servers import free_port
from tests.support.sockets import still_open


def start(sim, web_config: Path | None = None):
    """The exporter as the command runs it (Exporter.start: web config, sampler, server)."""
    sim.exporter.config = type(sim.exporter.config)(
        **{**sim.exporter.config.__dict__, "web_config": str(web_config) if web_config else None}
    )
    sim.exporter.start()
    return sim.exporter.port


@pytest.fixture
def exporter(simulate):
    """exporter(fleet="workstation", web_config=None) -> (sim, port); stopped after the test."""
    started = []

    def make(fleet: str = "workstation", web_config: Path | None = None):
        sim = simulate(fleet)
        started.append(sim)
        return sim, start(sim, web_config)

    yield make
    for sim in started:
        sim.exporter.stop()


def test_text_and_openmetrics_by_content_negotiation(exporter):
    _, port = exporter()
    text = loopback.get(f"http://127.0.0.1:{port}/metrics")
    assert text.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert "# EOF" not in text.text
    om = loopback.get(
        f"http://127.0.0.1:{port}/metrics",
        headers={"Accept": "application/openmetrics-text; version=1.0.0"},
    )
    assert om.headers["content-type"].startswith("application/openmetrics-text")
    assert om.text.rstrip().endswith("# EOF")
    assert "nvidia_gpu_energy_joules_total" in om.text
    raw = loopback.get(f"http://127.0.0.1:{port}/metrics", headers={"Accept-Encoding": "gzip"})
    assert raw.headers["content-encoding"] == "gzip"
    assert "nvidia_gpu_info" in raw.text  # httpx undid the gzip


def test_healthz_reports_a_stale_sampler(exporter):
    sim, port = exporter()  # a running sampling thread whose samples stop coming
    assert loopback.get(f"http://127.0.0.1:{port}/healthz").status_code == 200
    sim.clock.advance(60)  # no sample for 12 intervals
    answer = loopback.get(f"http://127.0.0.1:{port}/healthz")
    assert answer.status_code == 503 and "old" in answer.text


def write_web_config(
    path: Path, password: str, tls: tuple[Path, Path] | None = None, extra: str = ""
) -> Path:
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode().replace("$2b$", "$2y$", 1)
    text = f"basic_auth_users:\n  prometheus: '{hashed}'\n"
    if tls:
        text += f"tls_server_config:\n  cert_file: {tls[0]}\n  key_file: {tls[1]}\n{extra}"
    path.write_text(text)
    return path


def test_basic_auth_with_bcrypt_hashes(exporter, tmp_path):
    _, port = exporter(web_config=write_web_config(tmp_path / "web.yml", "s3cret"))
    url = f"http://127.0.0.1:{port}/metrics"
    assert loopback.get(url).status_code == 401
    assert loopback.get(url, auth=("prometheus", "wrong")).status_code == 401
    assert loopback.get(url, auth=("prometheus", "s3cret")).status_code == 200
    assert loopback.get(url, auth=("prometheus", "s3cret")).status_code == 200  # the remembered path
    # the kubelet's probes carry no password: /healthz stays open (docs/security.md)
    assert loopback.get(f"http://127.0.0.1:{port}/healthz").status_code == 200


def test_a_password_over_72_bytes_gets_401_not_500(exporter, tmp_path):
    """bcrypt refuses passwords over 72 bytes; that was a 500 with a traceback."""
    _, port = exporter(web_config=write_web_config(tmp_path / "web.yml", "s3cret"))
    token = base64.b64encode(b"prometheus:" + b"x" * 100).decode()
    answer = loopback.get(f"http://127.0.0.1:{port}/metrics", headers={"Authorization": f"Basic {token}"})
    assert answer.status_code == 401


@pytest.mark.parametrize(
    "text",
    [
        "basic_auth_userz:\n  prometheus: '{hash}'\n",  # the typo that served without auth
        "basic_auth_users:\n  prometheus: '{hash}'\ntls_server_config:\n  cert_filse: x.pem\n",
        "basic_auth_users:\n  prometheus: plaintext\n",
    ],
)
def test_a_web_config_the_exporter_cannot_honour_stops_the_start(simulate, tmp_path, text):
    """Fail closed: never serve without the protection the file asked for."""
    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4)).decode()
    path = tmp_path / "web.yml"
    path.write_text(text.format(hash=hashed))
    sim = simulate("workstation")
    with pytest.raises(WebConfigError, match=str(path)):
        start(sim, path)
    assert sim.exporter.servers == [] and not sim.exporter.sampler.running


@pytest.fixture
def pki(tmp_path):
    return make_pki(tmp_path / "pki")


def test_tls_from_the_web_config(exporter, tmp_path, pki):
    _, port = exporter(
        web_config=write_web_config(tmp_path / "web.yml", "pw", tls=(pki.server_cert, pki.server_key))
    )
    answer = httpx.get(
        f"https://127.0.0.1:{port}/metrics", verify=client_context(pki), auth=("prometheus", "pw")
    )
    assert answer.status_code == 200 and "nvidia_gpu_info" in answer.text
    with pytest.raises(httpx.HTTPError):
        loopback.get(f"http://127.0.0.1:{port}/metrics", timeout=2)


def test_a_tls_exporter_with_10_idle_connections_still_serves_metrics(exporter, tmp_path, pki):
    """The handshake once ran in the accept loop with no timeout, so one idle TCP connection froze
    every scrape and the liveness probe. Now each connection handshakes in its own thread: shown by
    order, not by a clock, as a scrape answered (a new TLS connection, as Prometheus without
    keep-alive) while the ten idle connections are still open. The measured time of a scrape is in
    docs/performance.md."""
    _, port = exporter(
        "h100-mig", write_web_config(tmp_path / "web.yml", "pw", tls=(pki.server_cert, pki.server_key))
    )
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(10)]
    try:
        answer = httpx.get(
            f"https://127.0.0.1:{port}/metrics",
            verify=client_context(pki),
            auth=("prometheus", "pw"),
            headers={"Accept-Encoding": "gzip"},
            timeout=30,
        )
        assert answer.status_code == 200 and "nvidia_gpu_mig_info" in answer.text
        assert all(still_open(sock) for sock in idle), "the idle connections were dropped before the scrapes"
        health = httpx.get(f"https://127.0.0.1:{port}/healthz", verify=client_context(pki), timeout=3)
        assert health.status_code == 200  # the liveness probe too
    finally:
        for sock in idle:
            sock.close()


def test_require_any_client_cert_takes_a_self_signed_client(exporter, tmp_path, pki):
    """RequireAnyClientCert asks for a certificate and takes any (Go's meaning);
    it used to verify it, refusing every certificate no configured CA had signed."""
    config = write_web_config(
        tmp_path / "web.yml",
        "pw",
        tls=(pki.server_cert, pki.server_key),
        extra="  client_auth_type: RequireAnyClientCert\n",
    )
    _, port = exporter(web_config=config)
    url = f"https://127.0.0.1:{port}/metrics"
    answer = httpx.get(url, verify=client_context(pki, "stranger"), auth=("prometheus", "pw"), timeout=5)
    assert answer.status_code == 200
    with pytest.raises(httpx.HTTPError):  # without a certificate: refused
        httpx.get(url, verify=client_context(pki), auth=("prometheus", "pw"), timeout=5)


def test_the_fault_port_warns_when_bound_beyond_loopback(simulate, caplog):
    sim = simulate("workstation", admin_listen="0.0.0.0:0")
    sim.exporter.start()
    try:
        warned = [
            r for r in caplog.records if r.levelno == logging.WARNING and "fault-injection" in r.message
        ]
        assert warned and "0.0.0.0:" in warned[0].message
    finally:
        sim.exporter.stop()
    caplog.clear()
    quiet = simulate("workstation", admin_listen="127.0.0.1:0")
    quiet.exporter.start()
    quiet.exporter.stop()
    assert not [r for r in caplog.records if "fault-injection" in r.message]


def parse(*argv):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def test_flags_win_over_environment_over_file(tmp_path):
    config = tmp_path / "exporter.yml"
    config.write_text("interval: 10\nlisten: ':9000'\nnaming: dcgm\ndisable_collectors: [nvlink]\n")
    env = {"GPUMETER_INTERVAL": "7", "NODE_NAME": "node-a"}
    resolved = resolve(parse("--config", str(config), "--listen", ":9100"), env)
    assert resolved.interval == 7.0 and resolved.listen == ":9100" and resolved.naming == "dcgm"
    assert resolved.disable_collectors == ("nvlink",) and resolved.hostname == "node-a"
    assert resolve(parse("--kubelet-socket", ""), {}).kubelet_socket is None


@pytest.mark.parametrize(
    ("content", "env", "message"),
    [
        ("interval: fast\n", {}, "interval: cannot use 'fast'"),
        ("speed: 1\n", {}, "unknown option"),
        ("", {"GPUMETER_NAMING": "nvidia"}, "naming: must be native or dcgm"),
        ("", {"GPUMETER_INTERVAL": "-1"}, "interval: must be a finite number of seconds >= 0.1"),
    ],
)
def test_bad_settings_are_named(tmp_path, content, env, message):
    config = tmp_path / "exporter.yml"
    config.write_text(content)
    with pytest.raises(ConfigError, match=message):
        resolve(parse("--config", str(config)), env)


@pytest.mark.parametrize(
    ("fleet", "message"),
    [
        (
            {"nodes": [{"name": "n", "gpus": [{"model": "V100"}]}]},
            r"nodes\[0\].gpus\[0\].model: unknown GPU model",
        ),
        (
            {"nodes": [{"name": "n", "gpus": [{"model": "A100-SXM4-40GB", "mig": ["3g.20gb*3"]}]}]},
            r"nodes\[0\].gpus\[0\].mig: at most 2 instances of 3g.20gb",
        ),
        (
            {"nodes": [{"name": "n", "gpus": [{"model": "A100-SXM4-40GB", "mig": ["4g.20gb", "4g.20gb"]}]}]},
            "at most 1 instances",
        ),
        (
            {
                "nodes": [
                    {
                        "name": "n",
                        "gpus": [{"model": "H100-SXM5-80GB", "mig": ["4g.40gb", "3g.40gb", "1g.10gb"]}],
                    }
                ]
            },
            "layout needs 8 compute / 9 memory slices",
        ),
        (
            {"nodes": [{"name": "n", "gpus": [{"model": "RTX-6000-Ada", "mig": ["1g.10gb"]}]}]},
            "has no MIG support",
        ),
        (
            {
                "nodes": [{"name": "n", "gpus": [{"model": "H200-SXM-141GB"}]}],
                "pods": [{"namespace": "a", "name": "p", "node": "n", "devices": [{"gpu": 3}]}],
            },
            r"pods\[0\].devices\[0\].gpu: node n has GPUs 0..0 \(got 3\)",
        ),
        (
            {
                "nodes": [{"name": "n", "gpus": [{"model": "H200-SXM-141GB"}]}],
                "pods": [
                    {"namespace": "a", "name": "p", "node": "n", "devices": [{"gpu": 0}], "start": "soon"}
                ],
            },
            r"pods\[0\].start: expected a duration",
        ),
    ],
)
def test_bad_fleet_files_name_the_field_and_value(fleet, message):
    with pytest.raises(FleetError, match=message) as raised:
        parse_fleet(fleet, source="fleet.yaml")
    assert str(raised.value).startswith("fleet.yaml: ")


def test_a_malformed_fleet_file_names_the_file(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("nodes: [\n")
    with pytest.raises(FleetError, match=r"broken\.yaml: malformed YAML"):
        load_fleet(path)


def test_the_example_fleets_load_with_the_documented_shapes():
    h100 = load_fleet("h100-mig")
    assert len(h100.nodes[0].gpus) == 8 and all(len(g.mig) == 7 for g in h100.nodes[0].gpus)
    assert len(h100.pods) == 56
    a100 = load_fleet("a100-mixed")
    layout = [m.profile.name for m in a100.nodes[0].gpus[0].mig]
    assert layout == ["3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb"]
    assert [g.time_slicing for g in a100.nodes[0].gpus] == [1, 1, 1, 1, 4, 4]
    assert len(load_fleet("h200").nodes[0].gpus) == 8
    assert len(load_fleet("workstation").nodes[0].gpus) == 2


# --- errors without tracebacks --------------------------------------------------------------------


def run_exporter_command(capsys, *argv: str) -> tuple[int, str]:
    """``gpumeter exporter ARGV`` in process, for the cases that must stop at start."""
    code = gpumeter_main(["exporter", "--kubelet-socket", "", *argv])
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return code, err.strip()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("42\n", "expected a mapping of option: value, got a int (42)"),
        ("- listen: ':9835'\n", "expected a mapping of option: value, got a list ([{'listen': ':9835'}])"),
        ("listen: ':99999'\n", "listen: ':99999': the port must be a number from 0 to 65535"),
        ("1: x\n", "unknown option(s): 1"),
    ],
)
def test_a_config_file_of_the_wrong_shape_is_one_line_naming_it(tmp_path, capsys, content, message):
    path = tmp_path / "exporter.yml"
    path.write_text(content)
    code, err = run_exporter_command(capsys, "--config", str(path), "--simulate", "workstation")
    assert code == 2 and err == f"gpumeter exporter: {path}: {message}"


@pytest.mark.parametrize(
    ("name", "flag"),
    [("exporter.yml", "--config"), ("fleet.yaml", "--simulate"), ("web.yml", "--web-config")],
)
def test_files_that_are_not_utf8_are_named(tmp_path, capsys, name, flag):
    path = tmp_path / name
    path.write_bytes(b"nodes:\n  - name: n\xe9ud\n")
    argv = [flag, str(path)] + ([] if flag == "--simulate" else ["--simulate", "workstation"])
    code, err = run_exporter_command(capsys, *argv, "--listen", "127.0.0.1:0")
    assert code == 2 and str(path) in err and "UTF-8" in err and err.count("\n") == 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--listen", ":99999"], "--listen: listen: ':99999': the port must be a number from 0 to 65535"),
        (["--listen", "9835"], "--listen: listen: '9835': expected host:port or :port"),
        (
            ["--admin-listen", "127.0.0.1:http"],
            "--admin-listen: admin_listen: '127.0.0.1:http': the port must be a number",
        ),
        (["--simulate-node", "gpu-nope"], "simulate_node: no node 'gpu-nope' in "),
    ],
)
def test_bad_flags_are_one_line(capsys, argv, message):
    code, err = run_exporter_command(capsys, "--simulate", "workstation", *argv)
    assert code == 2 and err.startswith("gpumeter exporter: ") and message in err, err


def test_a_port_in_use_names_the_address(capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, err = run_exporter_command(capsys, "--simulate", "workstation", "--listen", f"127.0.0.1:{port}")
    assert code == 2
    assert err == f"gpumeter exporter: cannot listen on 127.0.0.1:{port}: Address already in use"


@pytest.mark.parametrize("missing", ["cert_file", "client_ca_file"])
def test_missing_certificate_files_are_named(tmp_path, capsys, pki, missing):
    gone = tmp_path / f"no-{missing}.pem"
    files = {"cert_file": pki.server_cert, "client_ca_file": pki.ca, missing: gone}
    path = tmp_path / "web.yml"
    path.write_text(
        f"tls_server_config:\n  cert_file: {files['cert_file']}\n  key_file: {pki.server_key}\n"
        f"  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: {files['client_ca_file']}\n"
    )
    code, err = run_exporter_command(
        capsys, "--simulate", "workstation", "--web.config.file", str(path), "--listen", "127.0.0.1:0"
    )
    assert code == 2
    assert err == (
        f"gpumeter exporter: {path}: tls_server_config.{missing}: cannot read it: "
        f"No such file or directory (got '{gone}')"
    )


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("trainer-{gpu}-{pod}", r"pods\[0\].name: only \{gpu\} may stand in braces here"),
        ("trainer-{gpu.__class__}", r"pods\[0\].name: only \{gpu\} may stand in braces here"),
        ("trainer-{gpu", r"pods\[0\].name: unbalanced brace"),
        ("trainer-}{gpu}", r"pods\[0\].name: unbalanced brace"),
    ],
)
def test_braces_in_fleet_pod_names_are_named_not_a_traceback(name, message):
    fleet = {
        "nodes": [{"name": "n", "gpus": [{"model": "H200-SXM-141GB", "count": 2}]}],
        "pods": [{"namespace": "a", "name": name, "node": "n", "devices": [{"gpu": "0-1"}]}],
    }
    with pytest.raises(FleetError, match=message) as raised:
        parse_fleet(fleet, source="fleet.yaml")
    assert str(raised.value).startswith("fleet.yaml: ")


def test_ranges_still_fill_pod_names():
    fleet = {
        "nodes": [{"name": "n", "gpus": [{"model": "H200-SXM-141GB", "count": 2}]}],
        "pods": [{"namespace": "a", "name": "job-{gpu}", "node": "n", "devices": [{"gpu": "0-1"}]}],
    }
    assert [p.name for p in parse_fleet(fleet).pods] == ["job-0", "job-1"]


# --- simulate history writes label values as the live exporter does ---------------------------

WEIRD = 'team "a"\\b\nc'  # a double quote, a backslash and a newline


def weird_history() -> str:
    import io

    from gpumeter.simulator.history import write_history

    fleet = parse_fleet(
        {
            "nodes": [{"name": "n", "gpus": [{"model": "H200-SXM-141GB"}]}],
            "pods": [{"namespace": WEIRD, "name": "p", "node": "n", "devices": [{"gpu": 0}]}],
        }
    )
    out = io.StringIO()
    write_history([fleet], 1_790_000_000.0, 1_790_000_180.0, 60.0, out)
    return out.getvalue()


def test_history_escapes_label_values_as_the_live_exporter_does():
    from prometheus_client import CollectorRegistry
    from prometheus_client.core import GaugeMetricFamily
    from prometheus_client.openmetrics.exposition import generate_latest
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    text = weird_history()

    class One:
        def collect(self):
            family = GaugeMetricFamily("nvidia_gpu_allocation", "", labels=["namespace"])
            family.add_metric([WEIRD], 1.0)
            yield family

    registry = CollectorRegistry()
    registry.register(One())
    live = generate_latest(registry).decode()
    escaped = live[live.index('namespace="') : live.index("} ")]
    assert escaped in text  # the same bytes as the exporter's renderer writes
    namespaces = {
        sample.labels["namespace"]
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if "namespace" in sample.labels
    }
    assert namespaces == {WEIRD}  # and read back as they were


@pytest.mark.prometheus
def test_promtool_backfills_history_with_such_label_values(tmp_path):
    from tests.support.servers import require_binary

    promtool = require_binary("promtool")
    source = tmp_path / "history.om"
    source.write_text(weird_history())
    done = subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", str(source), str(tmp_path / "tsdb")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    (tmp_path / "tsdb" / "wal").mkdir()  # promtool's dump opens the head too
    dump = subprocess.run(
        [promtool, "tsdb", "dump", "--match", '{__name__="nvidia_gpu_allocation"}', str(tmp_path / "tsdb")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert dump.returncode == 0, dump.stderr
    assert 'namespace="team \\"a\\"\\\\b\\nc"' in dump.stdout, dump.stdout[:500]


def test_inject_takes_the_fault_port_as_host_and_port(simulate, capsys):
    """`simulate inject --admin HOST:PORT`, as its help says, and an http:// URL as before."""
    sim = simulate("workstation", admin_listen="127.0.0.1:0")
    sim.exporter.start()
    try:
        _metrics, admin = sim.exporter.servers  # the fault port is started after the metrics one
        host, port = admin.server_address[:2]
        assert gpumeter_main(["simulate", "inject", "--admin", f"{host}:{port}", "clear"]) == 0
        assert gpumeter_main(["simulate", "inject", "--admin", f"http://{host}:{port}/", "clear"]) == 0
        assert capsys.readouterr().err == ""
        # JSON has no NaN or infinity: refused naming the value (it was a traceback from the encoder)
        for value in ("nan", "1e400"):
            argv = ["simulate", "inject", "--admin", f"{host}:{port}", "overheat", "--gpu", "0", "--set"]
            assert gpumeter_main([*argv, f"celsius={value}"]) == 2
            err = capsys.readouterr().err
            assert (
                err
                == f"gpumeter simulate inject: --set celsius: not a finite number (value {float(value)!r})\n"
            )
    finally:
        sim.exporter.stop()


@pytest.mark.spawns
def test_the_start_line_names_https_when_the_web_config_turns_tls_on(tmp_path, pki):
    """The line an on-call engineer copies into curl: it said http:// over a TLS listener, which then
    answered the copied command with a handshake error."""
    port = free_port()
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {pki.server_cert}\n  key_file: {pki.server_key}\n")
    argv = ["--simulate", "workstation", "--listen", f"127.0.0.1:{port}", "--web.config.file", str(web)]
    process = subprocess.Popen(
        [sys.executable, "-m", "gpumeter", "exporter", *argv, "--kubelet-socket", ""],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lines = []
        while not any(line.startswith("gpumeter exporter: serving") for line in lines):
            line = process.stderr.readline()
            assert line, f"the exporter stopped before its start line: {''.join(lines)}"
            lines.append(line)
        assert lines[-1] == f"gpumeter exporter: serving https://127.0.0.1:{port}/metrics\n"
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate()
