"""The exporter-toolkit web config, read strictly (gpumeter/web/, docs/security.md).

exporter-toolkit's own test configs and its documented sample (tests/data/exporter-toolkit, with
their source named there) are accepted and refused as exporter-toolkit does; where gpumeter
deliberately differs, the difference and its reason are listed here. Every refusal names the file,
the field and the value (a password hash never: it is shown as <hidden>)."""

from __future__ import annotations

import shutil
from pathlib import Path

import bcrypt
import pytest

from gpumeter.web import WebConfigError, load_web_config
from tests.support.certs import make_pki

TOOLKIT = Path(__file__).parent / "data" / "exporter-toolkit"

# exporter-toolkit's *.bad.* files and junk, and what gpumeter says of each (its ErrorMap in
# web/tls_config_test.go names the same faults: no such file, YAML error, invalid cert path, ...)
REFUSED = {
    "web_config_auth_clientCAs_invalid.bad.yml": "client_ca_file: cannot read it: No such file",
    "web_config_auth_clientCAs_missing.bad.yml": "client_ca_file: required with RequireAndVerifyClientCert",
    "web_config_auth_user_list_invalid.bad.yml": "basic_auth_users.john: expected a bcrypt hash",
    "web_config_headers_content_type_options.bad.yml": "X-Content-Type-Options: expected one of nosniff",
    "web_config_headers_extra_header.bad.yml": "headers.Content-Type: this header cannot be set",
    "web_config_headers_frame_options.bad.yml": "X-Frame-Options: expected one of deny, sameorigin",
    "web_config_junk.yml": "(top level): expected a mapping",
    "web_config_junk_key.yml": "tls_server_config.cert_filse: unknown key",
    "web_config_noAuth.bad.yml": "client_ca_file: a client CA needs a client_auth_type",
    "web_config_noAuth_certPath_empty.bad.yml": "cert_file: required when TLS is on",
    "web_config_noAuth_certPath_invalid.bad.yml": "cert_file: cannot read it: No such file",
    "web_config_noAuth_certPath_keyPath_empty.bad.yml": "cert_file: required when TLS is on",
    "web_config_noAuth_certPath_keyPath_invalid.bad.yml": "cert_file: cannot read it: No such file",
    "web_config_noAuth_cert_empty.bad.yml": "cert_file: required when TLS is on",
    "web_config_noAuth_inventedCiphers.bad.yml": "cipher_suites[0]: unknown cipher suite",
    "web_config_noAuth_inventedCurves.bad.yml": "curve_preferences[0]: expected one of CurveP256",
    "web_config_noAuth_keyPath_empty.bad.yml": "key_file: required when TLS is on",
    "web_config_noAuth_keyPath_invalid.bad.yml": "cert_file: cannot read it: No such file",
    "web_config_noAuth_key_empty.bad.yml": "key_file: required when TLS is on",
    "web_config_noAuth_wrongTLSVersion.bad.yml": "min_version: expected one of TLS10",
    # Deliberate difference: exporter-toolkit starts and then fails every handshake (no CA can verify
    # a client); gpumeter refuses at start, where the operator sees it.
    "web_config_noAuth.good.blocking.yml": "client_ca_file: required with RequireAndVerifyClientCert",
}
# *.bad.* files gpumeter accepts, and why
ACCEPTED = {
    # "bad" there only because Go's HTTP/2 needs an AES-128-GCM suite; gpumeter serves HTTP/1.1.
    "web_config_noAuth_noHTTP2Cipher.bad.yml",
    # "bad" at the handshake, not at start: tests/test_web.py checks its client is refused.
    "web_config_auth_client_san.bad.yaml",
}


def toolkit_files() -> list[str]:
    return sorted(p.name for p in TOOLKIT.iterdir() if p.suffix in (".yml", ".yaml"))


def test_every_bad_toolkit_config_has_a_verdict_here():
    bad = {name for name in toolkit_files() if ".bad." in name or "junk" in name}
    assert bad == (set(REFUSED) | ACCEPTED) - {"web_config_noAuth.good.blocking.yml"}


@pytest.mark.parametrize("name", toolkit_files())
def test_exporter_toolkit_configs_are_judged_as_exporter_toolkit_judges_them(name):
    path = TOOLKIT / name
    if name not in REFUSED:
        load_web_config(path)
        return
    with pytest.raises(WebConfigError) as raised:
        load_web_config(path)
    assert str(raised.value).startswith(f"{path}: ")
    assert REFUSED[name] in str(raised.value)


def test_the_documented_sample_reads_its_files_beside_it_from_any_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # cert_file: server.crt is relative to the config, not to here
    web = load_web_config(TOOLKIT / "docs-web-config.yml")
    assert web.tls.cert_file == TOOLKIT / "server.crt"
    assert sorted(web.basic_auth_users) == ["alice", "bob"]
    assert web.rate_limit == (1.0, 20)


def test_the_toolkit_inline_key_and_certificate_load():
    web = load_web_config(TOOLKIT / "web_config_noAuth_tlsInline.good.yml")
    assert web.tls.cert_file is None and web.tls.cert_pem.startswith(b"-----BEGIN CERTIFICATE-----")


def write(tmp_path: Path, text: str, name: str = "web.yml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# A fixed salt: the hash names parametrized tests, which every pytest-xdist worker must collect alike.
HASH = bcrypt.hashpw(b"pw", b"$2b$04$rcqxf2hzhL87hM2QIUXFEe").decode()


@pytest.mark.parametrize(
    ("text", "field", "value"),
    [
        # a typo: a protection that silently did not apply
        (f"basic_auth_userz:\n  prometheus: '{HASH}'\n", "basic_auth_userz", "<hidden>"),
        ("tls_server_config:\n  cert_filse: server.crt\n", "tls_server_config.cert_filse", "server.crt"),
        ("http_server_config:\n  header: {}\n", "http_server_config.header", "<a mapping>"),
        ("rate_limit:\n  brust: 5\n", "rate_limit.brust", "5"),
    ],
)
def test_unknown_keys_are_refused_at_every_level(tmp_path, text, field, value):
    path = write(tmp_path, text)
    with pytest.raises(WebConfigError, match="unknown key") as raised:
        load_web_config(path)
    message = str(raised.value)
    assert message.startswith(f"{path}: {field}: ")
    if value == "<hidden>":
        assert HASH not in message
    else:
        assert value in message


@pytest.mark.parametrize(
    "hashed",
    [
        "plaintext",
        HASH[:-1],  # one character short
        HASH.replace("$04$", "$03$"),  # cost below bcrypt's 4
        HASH.replace("$04$", "$32$"),  # and above its 31
        HASH.replace("$2b$", "$2x$"),  # not a bcrypt version
        HASH[:-1] + "!",  # outside bcrypt's alphabet
        "12345",
    ],
)
def test_malformed_bcrypt_hashes_are_refused_at_start_without_echoing_them(tmp_path, hashed):
    path = write(tmp_path, f"basic_auth_users:\n  prometheus: '{hashed}'\n")
    with pytest.raises(
        WebConfigError, match=r"basic_auth_users\.prometheus: expected a bcrypt hash"
    ) as raised:
        load_web_config(path)
    assert "<hidden>" in str(raised.value) and hashed not in str(raised.value)


def test_htpasswd_and_go_hash_versions_are_accepted(tmp_path):
    users = {f"u{i}": HASH.replace("$2b$", version) for i, version in enumerate(("$2a$", "$2b$", "$2y$"))}
    path = write(tmp_path, "basic_auth_users:\n" + "".join(f"  {u}: '{h}'\n" for u, h in users.items()))
    assert load_web_config(path).basic_auth_users == {u: h.encode() for u, h in users.items()}


@pytest.fixture
def pki(tmp_path):
    return make_pki(tmp_path / "pki")


def tls(pki, extra: str = "") -> str:
    return f"tls_server_config:\n  cert_file: {pki.server_cert}\n  key_file: {pki.server_key}\n{extra}"


@pytest.mark.parametrize(
    ("extra", "field", "why"),
    [
        ("  client_auth_type: RequireAnyClientCerts\n", "client_auth_type", "expected one of NoClientCert"),
        ("  client_auth_type: RequireAndVerifyClientCert\n", "client_ca_file", "required with"),
        ("  client_ca_file: {ca}\n", "client_ca_file", "needs a client_auth_type that asks"),
        ("  client_allowed_sans: [a]\n", "client_allowed_sans", "needs a client_auth_type that asks"),
        (
            "  client_auth_type: RequireAnyClientCert\n  client_allowed_sans: []\n",
            "client_allowed_sans",
            "would refuse every client",
        ),
        ("  min_version: TLS13\n  max_version: TLS12\n", "min_version", "above max_version"),
        ("  max_version: SSL3\n", "max_version", "expected one of TLS10"),
        ("  cipher_suites: [TLS_RSA_WITH_RC4_128_SHA]\n", r"cipher_suites\[0\]", "unknown cipher suite"),
        ("  curve_preferences: [CurveP256, P-384]\n", r"curve_preferences\[1\]", "expected one of"),
        ("  prefer_server_cipher_suites: 'yes'\n", "prefer_server_cipher_suites", "expected a true or false"),
        ("  cert: inline\n", "cert", "either cert or cert_file"),
    ],
)
def test_contradictions_and_bad_values_in_tls_are_named(tmp_path, pki, extra, field, why):
    path = write(tmp_path, tls(pki, extra.format(ca=pki.ca)))
    with pytest.raises(WebConfigError, match=why) as raised:
        load_web_config(path)
    assert str(raised.value).startswith(f"{path}: tls_server_config.")
    assert f"tls_server_config.{field.replace(chr(92), '')}:" in str(raised.value)


def test_tls_settings_without_a_certificate_are_refused_not_served_as_plain_http(tmp_path):
    path = write(tmp_path, "tls_server_config:\n  min_version: TLS13\n")
    with pytest.raises(WebConfigError, match="min_version: TLS settings without cert_file and key_file"):
        load_web_config(path)


def test_missing_certificate_and_ca_files_are_named(tmp_path, pki):
    missing = tmp_path / "nowhere" / "server.pem"
    path = write(tmp_path, f"tls_server_config:\n  cert_file: {missing}\n  key_file: {pki.server_key}\n")
    with pytest.raises(WebConfigError, match=rf"cert_file: cannot read it: No such file .*{missing}"):
        load_web_config(path)
    path = write(
        tmp_path,
        tls(
            pki, f"  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: {tmp_path / 'ca.pem'}\n"
        ),
    )
    with pytest.raises(WebConfigError, match=r"client_ca_file: cannot read it: No such file"):
        load_web_config(path)


def test_a_key_that_does_not_match_the_certificate_is_refused(tmp_path, pki):
    path = write(
        tmp_path, f"tls_server_config:\n  cert_file: {pki.server_cert}\n  key_file: {pki.client_key}\n"
    )
    with pytest.raises(WebConfigError, match=rf"{path}: tls_server_config.key_file: does not match"):
        load_web_config(path)


def test_a_certificate_file_that_is_not_pem_is_named(tmp_path, pki):
    junk = write(tmp_path, "not a certificate\n", "junk.pem")
    path = write(tmp_path, f"tls_server_config:\n  cert_file: {junk}\n  key_file: {pki.server_key}\n")
    with pytest.raises(WebConfigError, match=r"tls_server_config.cert_file: not a PEM certificate"):
        load_web_config(path)


def test_an_empty_client_ca_file_is_refused(tmp_path, pki):
    empty = write(tmp_path, "", "ca.pem")
    path = write(
        tmp_path, tls(pki, f"  client_auth_type: VerifyClientCertIfGiven\n  client_ca_file: {empty}\n")
    )
    with pytest.raises(WebConfigError, match="client_ca_file: no PEM certificate"):
        load_web_config(path)


def test_a_web_config_that_is_not_utf8_names_the_file(tmp_path):
    path = tmp_path / "web.yml"
    path.write_bytes(b"basic_auth_users:\n  j\xf6rg: x\n")
    with pytest.raises(
        WebConfigError, match=rf"{path}: web config is not UTF-8 text \(byte 0xf6 at offset 21\)"
    ):
        load_web_config(path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("- a\n- b\n", r"\(top level\): expected a mapping"),
        ("42\n", r"\(top level\): expected a mapping"),
        ("basic_auth_users: [a, b]\n", "basic_auth_users: expected a mapping"),
        ("http_server_config:\n  http2: maybe\n", "http_server_config.http2: expected a true or false"),
        ("http_server_config:\n  headers:\n    Server: x\n", "headers.Server: this header cannot be set"),
        ("rate_limit:\n  interval: soon\n  burst: 1\n", "rate_limit.interval: expected a duration"),
        ("rate_limit:\n  interval: 1s\n  burst: -1\n", "rate_limit.burst: must not be negative"),
        ("rate_limit:\n  interval: 1s\n  burst: true\n", "rate_limit.burst: expected a whole number"),
        ("basic_auth_users: {\n", "malformed YAML"),
    ],
)
def test_other_bad_web_configs_are_named(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(WebConfigError, match=message) as raised:
        load_web_config(path)
    assert str(raised.value).startswith(f"{path}: ")


@pytest.mark.parametrize(
    ("interval", "seconds"), [("1s", 1.0), ("1m30s", 90.0), ("250ms", 0.25), ("1h", 3600.0), (0, None)]
)
def test_rate_limit_intervals_read_as_go_durations(tmp_path, interval, seconds):
    web = load_web_config(write(tmp_path, f"rate_limit:\n  interval: {interval}\n  burst: 3\n"))
    assert web.rate_limit == (None if seconds is None else (seconds, 3))


def test_an_empty_file_means_no_protection_as_in_exporter_toolkit(tmp_path):
    web = load_web_config(write(tmp_path, ""))
    assert web.tls is None and web.basic_auth_users == {} and web.rate_limit is None


def test_the_toolkit_server_files_can_move_with_their_config(tmp_path):
    """cert_file and key_file are resolved beside the config wherever it is copied."""
    for name in ("web_config_users.good.yml", "server.crt", "server.key"):
        shutil.copy(TOOLKIT / name, tmp_path / name)
    web = load_web_config(tmp_path / "web_config_users.good.yml")
    assert web.tls.key_file == tmp_path / "server.key" and len(web.basic_auth_users) == 4
