"""Secrets never shown or stored, and Prometheus authentication as Prometheus' own http_config offers
it (issue 42, point 3).

A REAL Prometheus serves test_ingest_prometheus' history behind its own web config: TLS that
requires a client certificate signed by the test CA, and basic auth. `gpumeter billing ingest`
reaches it with the password from a file, the certificate from flags, a --prometheus-config file or
the environment, and bills the hand-computed totals. A password given in the URL is used, and is in
no ledger table and no line billing prints. A bearer token file is checked against a loopback
server that wants the token (Prometheus' web config has no bearer tokens of its own)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from datetime import timedelta

import bcrypt
import httpx
import pytest
import yaml
from sqlalchemy import inspect, text

from gpumeter.billing.ledger import open_ledger
from tests.billing import test_ingest_prometheus as history
from tests.support import servers
from tests.support.certs import client_context, make_pki
from tests.support.servers import AnswerHandler, PrometheusServer, answering

H0, EXPECTED_TOTAL, _by_namespace = history.H0, history.EXPECTED_TOTAL, history._by_namespace
tsdb, book = history.tsdb, history.book
END = H0 + timedelta(hours=3)
PASSWORD = "s3cret-Pa55"


class SecuredPrometheus(PrometheusServer):
    """A real Prometheus whose web config asks for a client certificate and basic auth."""

    def __init__(self, workdir, pki, **kwargs):
        web = workdir / "web.yml"
        workdir.mkdir(parents=True, exist_ok=True)
        hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
        web.write_text(
            yaml.safe_dump(
                {
                    "tls_server_config": {
                        "cert_file": str(pki.server_cert),
                        "key_file": str(pki.server_key),
                        "client_auth_type": "RequireAndVerifyClientCert",
                        "client_ca_file": str(pki.ca),
                    },
                    "basic_auth_users": {"billing": hashed},
                }
            )
        )
        super().__init__(workdir, extra_args=[f"--web.config.file={web}"], **kwargs)
        self.pki = pki
        self.url = f"https://127.0.0.1:{self.port}"

    def start(self) -> SecuredPrometheus:
        self._process = servers._Process(self._argv, self.workdir / "prometheus.log")
        context = client_context(self.pki, "client")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(
                    f"{self.url}/-/ready", auth=("billing", PASSWORD), verify=context, timeout=2
                ).is_success:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError((self.workdir / "prometheus.log").read_text()[-4000:])


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def secured(tsdb, tmp_path_factory, pki):
    root = tmp_path_factory.mktemp("secured")
    shutil.copytree(tsdb, root / "data")
    server = SecuredPrometheus(root / "prom", pki, data_dir=root / "data").start()
    yield server
    server.stop()


@pytest.fixture
def password_file(tmp_path):
    path = tmp_path / "password"
    path.write_text(PASSWORD + "\n")  # a trailing newline, as `echo` writes it: stripped
    return path


def _ingest(db: str, prometheus: str, prices, *extra: str, env: dict | None = None):
    argv = [sys.executable, "-m", "gpumeter", "billing", "ingest", "--db", db, "--prometheus", prometheus]
    argv += ["--prices", str(prices), "--from", H0.isoformat(), "--to", END.isoformat()]
    argv += ["--scrape-interval", "30", "--no-progress", "--workers", "1", *extra]
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})}
    )


def _billed(db: str) -> dict:
    ledger = open_ledger(db)
    try:
        return _by_namespace(ledger.lines(H0, END))
    finally:
        ledger.close()


def _every_cell(db: str) -> str:
    """Every row of every table of the ledger, as text."""
    ledger = open_ledger(db)
    try:
        with ledger.engine.connect() as conn:
            return "\n".join(
                repr(row)
                for table in inspect(conn).get_table_names()
                for row in conn.execute(text(f'SELECT * FROM "{table}"'))
            )
    finally:
        ledger.close()


def _tls(pki) -> list[str]:
    return [
        "--prometheus-cert-file",
        str(pki.client_cert),
        "--prometheus-key-file",
        str(pki.client_key),
        "--prometheus-ca-file",
        str(pki.ca),
    ]


def test_basic_auth_from_a_password_file_and_a_client_certificate_bill_the_hand_totals(
    secured, pki, password_file, book, tmp_path
):
    db = f"sqlite:///{tmp_path / 'ledger.db'}"
    auth = [
        "--prometheus-basic-auth-user",
        "billing",
        "--prometheus-basic-auth-password-file",
        str(password_file),
    ]
    done = _ingest(db, secured.url, book, *auth, *_tls(pki))
    assert done.returncode == 0, done.stderr
    assert _billed(db) == EXPECTED_TOTAL
    assert PASSWORD not in done.stderr + done.stdout + _every_cell(db)


def test_the_same_from_a_prometheus_http_config_file(secured, pki, password_file, book, tmp_path):
    config = tmp_path / "http_config.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "basic_auth": {"username": "billing", "password_file": str(password_file)},
                "tls_config": {
                    "cert_file": str(pki.client_cert),
                    "key_file": str(pki.client_key),
                    "ca_file": str(pki.ca),
                },
            }
        )
    )
    db = f"sqlite:///{tmp_path / 'ledger.db'}"
    done = _ingest(db, secured.url, book, "--prometheus-config", str(config))
    assert done.returncode == 0, done.stderr
    assert _billed(db) == EXPECTED_TOTAL


def test_the_same_from_the_environment(secured, pki, password_file, book, tmp_path):
    env = {
        "GPUMETER_PROMETHEUS_BASIC_AUTH_USER": "billing",
        "GPUMETER_PROMETHEUS_BASIC_AUTH_PASSWORD_FILE": str(password_file),
        "GPUMETER_PROMETHEUS_CERT_FILE": str(pki.client_cert),
        "GPUMETER_PROMETHEUS_KEY_FILE": str(pki.client_key),
        "GPUMETER_PROMETHEUS_CA_FILE": str(pki.ca),
    }
    db = f"sqlite:///{tmp_path / 'ledger.db'}"
    done = _ingest(db, secured.url, book, env=env)
    assert done.returncode == 0, done.stderr
    assert _billed(db) == EXPECTED_TOTAL


@pytest.mark.spawns
def test_an_inline_password_in_an_http_config_file_is_refused(book, tmp_path):
    config = tmp_path / "http_config.yml"
    config.write_text(yaml.safe_dump({"basic_auth": {"username": "billing", "password": PASSWORD}}))
    done = _ingest(
        f"sqlite:///{tmp_path / 'ledger.db'}", "http://127.0.0.1:1", book, "--prometheus-config", str(config)
    )
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"error: {config}: basic_auth.password: not a supported http_config key; name a password_file instead (value 'password')"
    ]
    assert PASSWORD not in done.stderr


def test_a_password_in_the_url_is_used_and_never_shown_or_stored(secured, pki, book, tmp_path):
    db = f"sqlite:///{tmp_path / 'ledger.db'}"
    host = secured.url.removeprefix("https://")
    done = _ingest(db, f"https://billing:{PASSWORD}@{host}", book, *_tls(pki))
    assert done.returncode == 0, done.stderr
    assert _billed(db) == EXPECTED_TOTAL
    # a wrong one: the 401 is printed and recorded, the password in neither
    wrong = _ingest(db, f"https://billing:{PASSWORD}x@{host}", book, *_tls(pki))
    assert wrong.returncode == 1
    assert "401" in wrong.stderr and f"https://billing:xxxxx@{host}" in wrong.stderr
    cells = _every_cell(db)
    assert "401" in cells  # the failed run is there, under the redacted URL
    assert PASSWORD not in wrong.stderr + wrong.stdout + cells + done.stderr + done.stdout


@pytest.mark.spawns
def test_a_password_in_the_database_url_is_never_printed(book, tmp_path):
    url = f"postgresql+psycopg://billing:{PASSWORD}@127.0.0.1:1/ledger?password={PASSWORD}&connect_timeout=1"
    done = _ingest(url, "http://127.0.0.1:1", book)
    assert done.returncode == 1
    assert len(done.stderr.splitlines()) == 1 and PASSWORD not in done.stderr, done.stderr
    assert "billing:xxxxx@127.0.0.1:1/ledger?connect_timeout=1&password=xxxxx" in done.stderr


@pytest.mark.spawns
def test_a_bearer_token_from_a_file(book, tmp_path):
    token = tmp_path / "token"
    token.write_text("tok-123\n")

    class WantsToken(AnswerHandler):
        def answer(self) -> None:
            if self.headers.get("Authorization") != "Bearer tok-123":
                self.send_json({"status": "error", "errorType": "unauthorized", "error": "no token"}, 401)
                return
            kind = "matrix" if self.path.endswith("query_range") else "vector"
            self.send_json({"status": "success", "data": {"resultType": kind, "result": []}})

    db = f"sqlite:///{tmp_path / 'ledger.db'}"
    with answering(WantsToken) as url:
        given = _ingest(db, url, book, "--prometheus-bearer-token-file", str(token))
        missing = _ingest(db, url, book)
    assert given.returncode == 0, given.stderr  # answered (with no series: nothing to bill)
    assert "had no series in Prometheus" in given.stderr
    assert missing.returncode == 1 and "HTTP 401" in missing.stderr
    assert "tok-123" not in given.stderr + missing.stderr + _every_cell(db)
