"""`gpumeter billing serve` as a listener (docs/security.md): loopback unless
asked, the exporter's web config (TLS, basic auth), /healthz open for probes but saying nothing of
the database's error, and bad input in one line (point 14). Threads and hostile clients are
tests/test_web_listeners.py's."""

from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path

import bcrypt
import httpx
import pytest
from sqlalchemy import create_engine

from gpumeter import service
from gpumeter.billing.cli import register
from gpumeter.billing.config import Settings
from gpumeter.billing.ledger import open_ledger
from gpumeter.cli import main as gpumeter_main
from gpumeter.service import build_app, serve
from tests.support import loopback
from tests.support.servers import free_port


def serve_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    service.register(register(parser.add_subparsers(dest="command")))  # as gpumeter.cli composes it
    return parser.parse_args(["billing", "serve", *argv])


def test_billing_listens_on_loopback_unless_asked():
    assert serve_args().listen == "127.0.0.1:9402"
    assert serve_args("--listen", ":9402").listen == ":9402"


def test_billing_takes_the_web_config_by_either_flag_name():
    assert serve_args("--web-config", "w.yml").web_config == "w.yml"
    assert serve_args("--web.config.file", "w.yml").web_config == "w.yml"
    assert serve_args().web_config is None


def run_billing(capsys, tmp_path: Path, *argv: str) -> tuple[int, str]:
    code = gpumeter_main(
        [
            "billing",
            "serve",
            "--db",
            f"sqlite:///{tmp_path / 'ledger.db'}",
            "--prometheus",
            "http://127.0.0.1:9",
            *argv,
        ]
    )
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return code, err.strip()


def test_a_web_config_billing_cannot_honour_stops_it_in_one_line(tmp_path, capsys):
    path = tmp_path / "web.yml"
    path.write_text("basic_auth_userz:\n  finance: x\n")
    code, err = run_billing(capsys, tmp_path, "--web.config.file", str(path), "--listen", "127.0.0.1:0")
    assert code == 2 and err.startswith(f"error: {path}: basic_auth_userz: unknown key") and "\n" not in err
    assert not (tmp_path / "ledger.db").exists()  # refused before the database was touched


@pytest.mark.parametrize(
    ("listen", "message"),
    [(":99999", "the port must be a number from 0 to 65535"), ("9402", "expected host:port or :port")],
)
def test_a_bad_listen_address_is_one_line(tmp_path, capsys, listen, message):
    code, err = run_billing(capsys, tmp_path, "--listen", listen)
    assert code == 2 and err == f"error: {listen!r}: {message}"


def test_a_team_map_that_is_not_utf8_is_named(tmp_path, capsys):
    teams = tmp_path / "teams.yaml"
    teams.write_bytes(b"namespaces:\n  ml: \xe9quipe\n")
    code, err = run_billing(capsys, tmp_path, "--teams", str(teams))
    # the convention of every billing input error: file, field, problem, value
    assert code == 2 and err == f"error: {teams}: (file): not UTF-8 text (value 'byte at offset 18')"


def test_healthz_needs_no_password_and_metrics_does(tmp_path):
    hashed = bcrypt.hashpw(b"finance", bcrypt.gensalt(rounds=4)).decode()
    path = tmp_path / "web.yml"
    path.write_text(f"basic_auth_users:\n  prometheus: '{hashed}'\n")
    settings = Settings(
        db=f"sqlite:///{tmp_path / 'ledger.db'}", prometheus="http://127.0.0.1:9", catchup_hours=1
    )
    port, stop = free_port(), threading.Event()
    thread = threading.Thread(
        target=serve,
        args=(settings, f"127.0.0.1:{port}", stop),
        kwargs={"web_config": str(path)},
        daemon=True,
    )
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                health = loopback.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
                if health.status_code == 200:  # 503 "starting" until the schedule is in place
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline and thread.is_alive()
            time.sleep(0.1)
        assert health.text == "ok\n"
        assert loopback.get(f"http://127.0.0.1:{port}/metrics").status_code == 401
        assert (
            loopback.get(f"http://127.0.0.1:{port}/metrics", auth=("prometheus", "finance")).status_code
            == 200
        )
    finally:
        stop.set()
        thread.join(20)
    assert not thread.is_alive()


def test_an_unhealthy_database_is_not_described_to_an_unauthenticated_client(tmp_path, caplog):
    ledger = open_ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    sqlite = ledger.engine
    # a real engine for a PostgreSQL nobody listens on: its error names host and port
    ledger.engine = create_engine(
        "postgresql+psycopg://billing@127.0.0.1:1/ledger", connect_args={"connect_timeout": 2}
    )
    try:
        with httpx.Client(
            transport=httpx.WSGITransport(app=build_app(ledger)), base_url="http://billing"
        ) as client:
            answer = client.get("/healthz")
    finally:
        ledger.engine.dispose()
        ledger.engine = sqlite
        ledger.close()
    assert answer.status_code == 503 and answer.text == "database unreachable\n"
    # the detail (host and port) is in the log, not in the answer
    assert '"127.0.0.1", port 1' in caplog.text and "127.0.0.1" not in answer.text
