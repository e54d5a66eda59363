"""HTTP serving: content negotiation, /healthz, basic auth and TLS from an exporter-toolkit web config;
settings from file, environment and flags; bad input named precisely."""

from __future__ import annotations

import argparse
import ssl
import subprocess
from pathlib import Path

import bcrypt
import httpx
import pytest

from gpumeter.exporter.config import ConfigError, add_arguments, resolve
from gpumeter.exporter.server import WebConfigError, load_web_config, make_app, serve
from gpumeter.exporter.simulator.fleet import FleetError, load_fleet, parse_fleet


class _Served:
    def __init__(self, server):
        self.server = server

    def shutdown(self):
        self.server.shutdown()
        self.server.server_close()


def start(sim, web=None):
    sim.sampler.sample_once()
    server = serve(make_app(sim.exporter.exposition, sim.exporter.health, web), "127.0.0.1:0", web)
    return _Served(server), server.server_address[1]


def test_text_and_openmetrics_by_content_negotiation(simulate):
    sim = simulate("workstation")
    server, port = start(sim)
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics")
        assert text.headers["content-type"].startswith("text/plain; version=0.0.4")
        assert "# EOF" not in text.text
        om = httpx.get(
            f"http://127.0.0.1:{port}/metrics",
            headers={"Accept": "application/openmetrics-text; version=1.0.0"},
        )
        assert om.headers["content-type"].startswith("application/openmetrics-text")
        assert om.text.rstrip().endswith("# EOF")
        assert "nvidia_gpu_energy_joules_total" in om.text
        raw = httpx.get(f"http://127.0.0.1:{port}/metrics", headers={"Accept-Encoding": "gzip"})
        assert raw.headers["content-encoding"] == "gzip"
        assert "nvidia_gpu_info" in raw.text  # httpx undid the gzip
    finally:
        server.shutdown()


def test_healthz_reports_a_stale_sampler(simulate):
    sim = simulate("workstation")
    sim.sampler.start()  # a running sampling thread whose samples stop coming
    server, port = start(sim)
    try:
        assert httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200
        sim.clock.advance(60)  # no sample for 12 intervals
        answer = httpx.get(f"http://127.0.0.1:{port}/healthz")
        assert answer.status_code == 503 and "old" in answer.text
    finally:
        server.shutdown()


def write_web_config(path: Path, password: str, tls: tuple[Path, Path] | None = None) -> Path:
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode().replace("$2b$", "$2y$", 1)
    text = f"basic_auth_users:\n  prometheus: '{hashed}'\n"
    if tls:
        text += f"tls_server_config:\n  cert_file: {tls[0]}\n  key_file: {tls[1]}\n"
    path.write_text(text)
    return path


def test_basic_auth_with_bcrypt_hashes(simulate, tmp_path):
    web = load_web_config(write_web_config(tmp_path / "web.yml", "s3cret"))
    server, port = start(simulate("workstation"), web)
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        assert httpx.get(url).status_code == 401
        assert httpx.get(url, auth=("prometheus", "wrong")).status_code == 401
        assert httpx.get(url, auth=("prometheus", "s3cret")).status_code == 200
        assert httpx.get(url, auth=("prometheus", "s3cret")).status_code == 200  # the remembered path
    finally:
        server.shutdown()


def test_tls_from_the_web_config(simulate, tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    web = load_web_config(write_web_config(tmp_path / "web.yml", "pw", tls=(cert, key)))
    server, port = start(simulate("workstation"), web)
    try:
        context = ssl.create_default_context(cafile=str(cert))
        answer = httpx.get(f"https://127.0.0.1:{port}/metrics", verify=context, auth=("prometheus", "pw"))
        assert answer.status_code == 200 and "nvidia_gpu_info" in answer.text
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2)
    finally:
        server.shutdown()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("basic_auth_users:\n  bob: plaintext\n", "basic_auth_users.bob: expected a bcrypt hash"),
        ("tls_server_config:\n  cert_file: a.pem\n", "tls_server_config.key_file: required"),
        (
            "tls_server_config:\n  cert_file: a\n  key_file: b\n  min_version: TLS99\n",
            "min_version: unknown value 'TLS99'",
        ),
        ("tls_server_config: [\n", "cannot read web config"),
    ],
)
def test_bad_web_configs_are_named(tmp_path, content, message):
    path = tmp_path / "web.yml"
    path.write_text(content)
    with pytest.raises(WebConfigError, match=message) as raised:
        load_web_config(path)
    assert str(path) in str(raised.value)


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
