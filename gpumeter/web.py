"""HTTP serving for every gpumeter listener (the exporter's /metrics, billing's /metrics, the
simulator's fault-injection port), and the Prometheus exporter-toolkit web config read strictly.

The server is the standard library's WSGI server (prometheus-client's own has no basic auth and no
routes of ours), made fit to face a network (docs/security.md):

* one daemon thread per connection, so an idle, slow or hostile client holds a thread, never the
  accept loop; at most ``Limits.max_connections`` at once, and at most
  ``Limits.max_connections_per_client`` of them from one client, more are closed as they arrive;
* except for the exporter's plain-HTTP /metrics, whose answers are ready in memory: there one
  event-loop thread serves every kept-alive scraper (``_EventLoop``), under the same deadlines, and
  hands anything but a plain GET/HEAD to a thread;
* the TLS handshake runs in that thread under a deadline, not in the accept loop;
* the request (line, headers, body) must arrive within ``read_timeout`` and the answer leave within
  ``write_timeout``, so a slowloris or a client that never reads is dropped;
* a listen backlog of 1024: socketserver's 5 dropped SYNs under 20 concurrent scrapers, and each
  drop costs the client a 1 s retransmit.

The web config is exporter-toolkit's format (its docs/web-configuration.md). Unknown keys,
malformed bcrypt hashes, unreadable files and contradictions are refused at start, naming the file,
the field and the value: a typo must never serve without the protection it meant to add.

This module imports nothing from the parts; TLS (pyOpenSSL) and bcrypt load only when configured.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import ipaddress
import logging
import os
import re
import secrets
import select
import selectors
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from socketserver import ThreadingMixIn
from typing import Any
from urllib.parse import unquote
from wsgiref.handlers import format_date_time
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

__all__ = [
    "CLIENT_AUTH_TYPES",
    "Limits",
    "ListenError",
    "Server",
    "TlsSettings",
    "WebConfig",
    "WebConfigError",
    "guard",
    "is_loopback",
    "load_web_config",
    "parse_listen",
    "serve",
]

log = logging.getLogger(__name__)


class WebConfigError(ValueError):
    """A web config that cannot be used; the message names the file, the field and the value."""


class ListenError(ValueError):
    """A listen address that is malformed, or that cannot be bound (the message names it)."""


# --- the listen address -------------------------------------------------------------------------


def parse_listen(text: str, default_host: str = "0.0.0.0") -> tuple[str, int]:
    """``host:port``, ``:port`` (every interface) or ``[v6]:port`` -> (host, port)."""
    host, colon, port = str(text).strip().rpartition(":")
    if not colon:
        raise ListenError(f"{text!r}: expected host:port or :port")
    if host.startswith("[") != host.endswith("]"):
        raise ListenError(f"{text!r}: unbalanced brackets around the IPv6 address")
    host = host[1:-1] if host.startswith("[") else host
    if not port.isascii() or not port.isdigit() or int(port) > 65535:
        raise ListenError(f"{text!r}: the port must be a number from 0 to 65535")
    return host or default_host, int(port)


def is_loopback(host: str) -> bool:
    """Whether only this machine can reach ``host`` (an empty host means every interface)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


# --- the web config -----------------------------------------------------------------------------

# exporter-toolkit's client_auth_type -> (ask for a certificate, refuse a client without one,
# verify it against the client CA). The last three are Go's crypto/tls ClientAuthType meanings;
# "RequireClientCert" is exporter-toolkit's older spelling of RequireAnyClientCert.
_CLIENT_AUTH = {
    "NoClientCert": (False, False, False),
    "RequestClientCert": (True, False, False),
    "RequireAnyClientCert": (True, True, False),
    "RequireClientCert": (True, True, False),
    "VerifyClientCertIfGiven": (True, False, True),
    "RequireAndVerifyClientCert": (True, True, True),
}
CLIENT_AUTH_TYPES = tuple(_CLIENT_AUTH)

_TLS_VERSIONS = ("TLS10", "TLS11", "TLS12", "TLS13")

# Go's tls.CipherSuites() (the names exporter-toolkit accepts) -> OpenSSL's names. The TLS 1.3
# suites are accepted and, as in Go, not configurable: they apply to TLS 1.2 and older only.
_CIPHERS = {
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_AES_128_GCM_SHA256": None,
    "TLS_AES_256_GCM_SHA384": None,
    "TLS_CHACHA20_POLY1305_SHA256": None,
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
}
# Go's curve names -> OpenSSL's group names
_CURVES = {"CurveP256": "P-256", "CurveP384": "P-384", "CurveP521": "P-521", "X25519": "X25519"}

# http_server_config.headers: the only headers exporter-toolkit lets a config set, with the values
# it allows where it restricts them (None: any value).
_HEADERS: dict[str, tuple[str, ...] | None] = {
    "Strict-Transport-Security": None,
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": None,
    "Content-Security-Policy": None,
}

# Every key exporter-toolkit's docs/web-configuration.md documents, with the YAML type it takes.
_SCHEMA: dict[str, dict[str, Any]] = {
    "": {
        "tls_server_config": dict,
        "http_server_config": dict,
        "basic_auth_users": dict,
        "rate_limit": dict,
    },
    "tls_server_config": {
        "cert": str,
        "key": str,
        "client_ca": str,
        "cert_file": str,
        "key_file": str,
        "client_auth_type": str,
        "client_ca_file": str,
        "client_allowed_sans": list,
        "min_version": str,
        "max_version": str,
        "cipher_suites": list,
        "prefer_server_cipher_suites": bool,
        "curve_preferences": list,
    },
    "http_server_config": {"http2": bool, "headers": dict},
    "rate_limit": {"interval": (str, int), "burst": int},
}

# A bcrypt hash as htpasswd -B and Go's bcrypt write it: version, cost 4..31, 53 characters of salt
# and digest in bcrypt's base64 alphabet.
_BCRYPT = re.compile(r"\$2[aby]\$(0[4-9]|[12][0-9]|3[01])\$[./A-Za-z0-9]{53}")
# bcrypt reads at most 72 bytes of a password
_BCRYPT_MAX_PASSWORD = 72

_GO_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_GO_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


@dataclass(frozen=True)
class TlsSettings:
    """``tls_server_config``: where the certificate and key come from (a file, re-read when it
    changes, or inline PEM) and the handshake policy."""

    cert_file: Path | None
    key_file: Path | None
    cert_pem: bytes | None
    key_pem: bytes | None
    client_ca_pem: bytes | None
    client_auth_type: str = "NoClientCert"
    client_allowed_sans: tuple[str, ...] | None = None
    min_version: str = "TLS12"
    max_version: str = "TLS13"
    cipher_suites: tuple[str, ...] = ()
    prefer_server_cipher_suites: bool = True
    curve_preferences: tuple[str, ...] = ()
    source: str = "<web config>"


@dataclass(frozen=True)
class WebConfig:
    """A parsed exporter-toolkit web config. An empty one (no file, or an empty file) means plain
    HTTP with no authentication, as in exporter-toolkit."""

    tls: TlsSettings | None = None
    basic_auth_users: dict[str, bytes] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    rate_limit: tuple[float, int] | None = None  # (seconds between requests, burst)
    http2: bool = True  # accepted for compatibility; gpumeter serves HTTP/1.1 only
    source: str = "<web config>"


def _read_text(path: Path, what: str, error=WebConfigError) -> str:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise error(f"{path}: cannot read {what}: {exc.strerror or exc}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(
            f"{path}: {what} is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start})"
        ) from None


_KIND_NAMES = {dict: "mapping", list: "list", str: "string", int: "whole number", bool: "true or false"}
_KIND_NAMES.update({float: "number", type(None): "empty value"})


def _section(data: Any, where: str, fail: Callable[[str, Any, str], WebConfigError]) -> dict:
    """A mapping checked against the schema: unknown keys and wrong types are refused."""
    schema = _SCHEMA[where]
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise fail(where or "(top level)", data, "expected a mapping")
    out = {}
    for key, value in data.items():
        path = f"{where}.{key}" if where else str(key)
        if key not in schema:
            known = ", ".join(schema)
            shown = value if isinstance(value, str | int | float) else f"<a {_KIND_NAMES[type(value)]}>"
            raise fail(path, shown, f"unknown key (exporter-toolkit's keys here: {known})")
        if value is None:
            continue  # YAML's empty value: as Go reads it, the default
        kind = schema[key]
        if (isinstance(value, bool) and kind is not bool) or not isinstance(value, kind):
            kinds = kind if isinstance(kind, tuple) else (kind,)
            raise fail(path, value, f"expected a {' or '.join(_KIND_NAMES[k] for k in kinds)}")
        if kind is list and not all(isinstance(item, str) for item in value):
            raise fail(path, value, "expected a list of strings")
        out[key] = value
    return out


def _go_duration(value: str | int, path: str, fail) -> float:
    """Seconds from a Go duration ("1s", "1m30s", "500ms") or an integer of nanoseconds."""
    if isinstance(value, int):
        if value < 0:
            raise fail(path, value, "must not be negative")
        return value * 1e-9
    text = value.strip()
    if text == "0":
        return 0.0
    parts = _GO_DURATION.findall(text)
    if not parts or "".join(number + unit for number, unit in parts) != text:
        raise fail(path, value, "expected a duration such as 1s, 500ms or 1m30s")
    return sum(float(number) * _GO_UNITS[unit] for number, unit in parts)


def load_web_config(path: str | os.PathLike) -> WebConfig:
    """Parse and check an exporter-toolkit web config. Relative file names are relative to the
    config's own folder, as in exporter-toolkit. The certificate, key and client CA are loaded
    here, so a missing or broken one stops the start rather than the first scrape."""
    path = Path(path)
    source = str(path)

    def fail(field_path: str, value: Any, why: str) -> WebConfigError:
        secret = field_path.startswith("basic_auth_users") or field_path == "tls_server_config.key"
        shown = "<hidden>" if secret else value
        return WebConfigError(f"{source}: {field_path}: {why} (got {shown!r})")

    import yaml  # only with a web config file

    try:
        data = yaml.safe_load(_read_text(path, "web config"))
    except yaml.YAMLError as exc:
        raise WebConfigError(f"{source}: malformed YAML: {exc}") from None
    top = _section(data, "", fail)
    tls = _tls_settings(_section(top.get("tls_server_config"), "tls_server_config", fail), path, fail)
    http = _section(top.get("http_server_config"), "http_server_config", fail)
    headers = {}
    for name, value in (http.get("headers") or {}).items():
        where = f"http_server_config.headers.{name}"
        if name not in _HEADERS:
            raise fail(where, value, f"this header cannot be set; these can: {', '.join(_HEADERS)}")
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise fail(where, value, "expected a string")
        allowed = _HEADERS[name]
        if allowed is not None and str(value) not in allowed:
            raise fail(where, value, f"expected one of {', '.join(allowed)}")
        headers[str(name)] = str(value)
    rate = _section(top.get("rate_limit"), "rate_limit", fail)
    interval = _go_duration(rate.get("interval", 0), "rate_limit.interval", fail)
    burst = rate.get("burst", 0)
    if burst < 0:
        raise fail("rate_limit.burst", burst, "must not be negative")
    users = {}
    for user, hashed in _section_users(top.get("basic_auth_users"), fail).items():
        if not isinstance(hashed, str) or not _BCRYPT.fullmatch(hashed):
            raise fail(
                f"basic_auth_users.{user}",
                hashed,
                "expected a bcrypt hash such as htpasswd -nBC 10 '' writes ($2y$10$ and 53 characters)",
            )
        users[user] = hashed.encode()
    config = WebConfig(
        tls=tls,
        basic_auth_users=users,
        headers=headers,
        rate_limit=(interval, burst) if interval > 0 else None,
        http2=http.get("http2", True),
        source=source,
    )
    if tls is not None:
        _TlsContext(tls).build()  # every file readable, the key matching the certificate
    return config


def _section_users(data: Any, fail) -> dict[str, Any]:
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise fail("basic_auth_users", data, "expected a mapping of user name to bcrypt hash")
    users = {}
    for user, hashed in data.items():
        if isinstance(user, bool) or not isinstance(user, str | int) or str(user) == "":
            raise fail(f"basic_auth_users.{user}", hashed, "expected a user name")
        users[str(user)] = hashed
    return users


def _tls_settings(tls: dict, config_path: Path, fail) -> TlsSettings | None:
    where = "tls_server_config"
    given = {key: value for key, value in tls.items() if value not in ("", [])}
    enabling = ("cert", "key", "client_ca", "cert_file", "key_file", "client_ca_file", "client_auth_type")
    if not any(key in given for key in enabling):
        if given:  # exporter-toolkit would quietly serve plain HTTP here
            first = next(iter(given))
            raise fail(f"{where}.{first}", given[first], "TLS settings without cert_file and key_file")
        return None
    pem: dict[str, bytes | None] = {}
    files: dict[str, Path | None] = {}
    for inline, named in (("cert", "cert_file"), ("key", "key_file"), ("client_ca", "client_ca_file")):
        if inline in given and named in given:
            raise fail(f"{where}.{inline}", "<inline PEM>", f"give either {inline} or {named}, not both")
        files[named] = (config_path.parent / given[named]) if named in given else None
        pem[inline] = given[inline].encode() if inline in given else None
    for inline, named in (("cert", "cert_file"), ("key", "key_file")):
        if files[named] is None and pem[inline] is None:
            raise fail(
                f"{where}.{named}", tls.get(named, ""), f"required when TLS is on (or {inline} inline)"
            )
    if files["client_ca_file"] is not None:
        pem["client_ca"] = _read_pem(files["client_ca_file"], f"{where}.client_ca_file", fail)
    auth = given.get("client_auth_type", "NoClientCert")
    if auth not in _CLIENT_AUTH:
        raise fail(f"{where}.client_auth_type", auth, f"expected one of {', '.join(CLIENT_AUTH_TYPES)}")
    asks = _CLIENT_AUTH[auth][0]
    if pem["client_ca"] is not None and not asks:
        raise fail(f"{where}.client_ca_file", str(files["client_ca_file"] or "<inline>"),
                   "a client CA needs a client_auth_type that asks for certificates")  # fmt: skip
    if auth == "RequireAndVerifyClientCert" and pem["client_ca"] is None:
        raise fail(f"{where}.client_ca_file", None, f"required with {auth}: no client could be verified")
    sans = tls.get("client_allowed_sans")
    if sans is not None:
        if not sans:
            raise fail(f"{where}.client_allowed_sans", sans, "an empty list would refuse every client")
        if not asks:
            raise fail(
                f"{where}.client_allowed_sans", sans, "needs a client_auth_type that asks for certificates"
            )
    versions = {}
    for key, default in (("min_version", "TLS12"), ("max_version", "TLS13")):
        versions[key] = given.get(key, default)
        if versions[key] not in _TLS_VERSIONS:
            raise fail(f"{where}.{key}", versions[key], f"expected one of {', '.join(_TLS_VERSIONS)}")
    if _TLS_VERSIONS.index(versions["min_version"]) > _TLS_VERSIONS.index(versions["max_version"]):
        raise fail(f"{where}.min_version", versions["min_version"], "is above max_version")
    for i, name in enumerate(given.get("cipher_suites", [])):
        if name not in _CIPHERS:
            raise fail(
                f"{where}.cipher_suites[{i}]", name, "unknown cipher suite (Go's tls.CipherSuites() names)"
            )
    for i, name in enumerate(given.get("curve_preferences", [])):
        if name not in _CURVES:
            raise fail(f"{where}.curve_preferences[{i}]", name, f"expected one of {', '.join(_CURVES)}")
    return TlsSettings(
        cert_file=files["cert_file"],
        key_file=files["key_file"],
        cert_pem=pem["cert"],
        key_pem=pem["key"],
        client_ca_pem=pem["client_ca"],
        client_auth_type=auth,
        client_allowed_sans=tuple(sans) if sans is not None else None,
        min_version=versions["min_version"],
        max_version=versions["max_version"],
        cipher_suites=tuple(given.get("cipher_suites", [])),
        prefer_server_cipher_suites=tls.get("prefer_server_cipher_suites", True),
        curve_preferences=tuple(given.get("curve_preferences", [])),
        source=str(config_path),
    )


def _read_pem(path: Path, field_path: str, fail) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise fail(field_path, str(path), f"cannot read it: {exc.strerror or exc}") from None


# --- TLS ------------------------------------------------------------------------------------------


class _TlsContext:
    """The pyOpenSSL context for new connections, rebuilt when the certificate or key file changes
    (so a rotated certificate is served without a restart, as exporter-toolkit does).

    pyOpenSSL rather than the ssl module: Python's ssl verifies every client certificate it asks
    for, so it cannot express RequestClientCert and RequireAnyClientCert (ask, accept any)."""

    def __init__(self, settings: TlsSettings):
        self.settings = settings
        self._lock = threading.Lock()
        self._stamp: tuple | None = None
        self._context = None

    def _files_stamp(self) -> tuple:
        stamp = []
        for path in (self.settings.cert_file, self.settings.key_file):
            try:
                info = path.stat() if path else None
                stamp.append((info.st_mtime_ns, info.st_size, info.st_ino) if info else None)
            except OSError:
                stamp.append("missing")
        return tuple(stamp)

    def current(self):
        stamp = self._files_stamp()
        if stamp != self._stamp:
            with self._lock:
                if stamp != self._stamp:
                    try:
                        self._context = self.build()
                    except WebConfigError as exc:
                        if self._context is None:
                            raise
                        log.error("keeping the previous TLS certificate: %s", exc)
                    self._stamp = stamp
        return self._context

    def build(self):
        from cryptography import x509
        from cryptography.hazmat.primitives import serialization
        from OpenSSL import SSL, crypto

        s = self.settings
        where = "tls_server_config"

        def fail(field_path: str, value: Any, why: str) -> WebConfigError:
            return WebConfigError(f"{s.source}: {where}.{field_path}: {why} (got {value!r})")

        cert_pem = s.cert_pem if s.cert_file is None else _read_pem(s.cert_file, "cert_file", fail)
        key_pem = s.key_pem if s.key_file is None else _read_pem(s.key_file, "key_file", fail)
        cert_name = ("cert_file", str(s.cert_file)) if s.cert_file else ("cert", "<inline PEM>")
        key_name = ("key_file", str(s.key_file)) if s.key_file else ("key", "<inline PEM>")
        try:
            chain = x509.load_pem_x509_certificates(cert_pem)
        except ValueError as exc:
            raise fail(*cert_name, f"not a PEM certificate: {exc}") from None
        try:
            key = serialization.load_pem_private_key(key_pem, password=None)
        except (ValueError, TypeError) as exc:
            raise fail(*key_name, f"not an unencrypted PEM private key: {exc}") from None
        context = SSL.Context(SSL.TLS_SERVER_METHOD)
        versions = dict(zip(_TLS_VERSIONS, (SSL.TLS1_VERSION, SSL.TLS1_1_VERSION, SSL.TLS1_2_VERSION, SSL.TLS1_3_VERSION), strict=True))  # fmt: skip
        context.set_min_proto_version(versions[s.min_version])
        context.set_max_proto_version(versions[s.max_version])
        context.set_options(SSL.OP_NO_COMPRESSION | SSL.OP_NO_RENEGOTIATION)
        if s.prefer_server_cipher_suites:
            context.set_options(SSL.OP_CIPHER_SERVER_PREFERENCE)
        try:
            context.use_certificate(chain[0])
            for extra in chain[1:]:
                context.add_extra_chain_cert(extra)
            context.use_privatekey(key)
            context.check_privatekey()
        except SSL.Error as exc:
            raise fail(*key_name, f"does not match the certificate: {exc}") from None
        legacy = [_CIPHERS[name] for name in s.cipher_suites if _CIPHERS[name]]
        if legacy:
            context.set_cipher_list(":".join(legacy).encode())
        elif s.cipher_suites:  # only TLS 1.3 suites named: Go then offers TLS 1.2 no cipher at all
            context.set_min_proto_version(SSL.TLS1_3_VERSION)
        if s.curve_preferences:
            _set_curves(context, [_CURVES[name] for name in s.curve_preferences], fail)
        asks, requires, verifies = _CLIENT_AUTH[s.client_auth_type]
        if asks:
            if verifies:
                if s.client_ca_pem is not None:
                    store = context.get_cert_store()
                    try:
                        authorities = x509.load_pem_x509_certificates(s.client_ca_pem)
                    except ValueError as exc:
                        raise fail(
                            "client_ca_file", "<client CA>", f"no PEM certificate in it: {exc}"
                        ) from None
                    for authority in authorities:
                        store.add_cert(crypto.X509.from_cryptography(authority))
                else:  # VerifyClientCertIfGiven without a CA: Go verifies against the system's roots
                    context.set_default_verify_paths()
            mode = SSL.VERIFY_PEER | (SSL.VERIFY_FAIL_IF_NO_PEER_CERT if requires else 0)
            context.set_verify(mode, _verifier(verifies, s.client_allowed_sans))
        else:
            context.set_verify(SSL.VERIFY_NONE)
        return context

    def accept(self, sock: socket.socket, timeout: float) -> _TlsSocket:
        """Handshake on an accepted socket within ``timeout`` seconds (in the connection's thread)."""
        from OpenSSL import SSL

        connection = SSL.Connection(self.current(), sock)
        connection.set_accept_state()
        wrapped = _TlsSocket(connection, sock)
        wrapped.settimeout(timeout)
        wrapped.do_handshake()
        if self.settings.client_allowed_sans is not None and connection.get_peer_certificate() is None:
            raise _TlsError("no client certificate, and client_allowed_sans is set")
        return wrapped


def _set_curves(context, groups: list[str], fail) -> None:
    # pyOpenSSL has no public call for the group list (set_tmp_ecdh takes one NIST curve and not
    # X25519); OpenSSL's SSL_CTX_set1_curves_list, through the binding pyOpenSSL itself is built
    # on, is what Go's CurvePreferences means: these groups, in this order, and no others.
    from OpenSSL._util import lib

    setter = getattr(lib, "SSL_CTX_set1_curves_list", None)
    if setter is None or setter(context._context, ":".join(groups).encode()) != 1:
        raise fail("curve_preferences", groups, "this OpenSSL build cannot pin these curves")


def _verifier(verify: bool, allowed_sans: tuple[str, ...] | None):
    """OpenSSL's per-certificate callback: keep OpenSSL's verdict when the mode verifies, accept any
    chain when it only asks; check the client's SANs (exporter-toolkit's client_allowed_sans)."""

    def callback(connection, certificate, error, depth, ok) -> bool:
        if verify and not ok:
            return False
        if depth == 0 and allowed_sans is not None:
            try:
                return bool(_sans(certificate.to_cryptography()) & set(allowed_sans))
            except Exception:  # a malformed certificate: refused, and nothing raised into OpenSSL
                return False
        return True

    return callback


def _sans(certificate) -> set[str]:
    from cryptography import x509

    try:
        names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    found = set(names.get_values_for_type(x509.DNSName)) | set(names.get_values_for_type(x509.RFC822Name))
    found |= {str(ip) for ip in names.get_values_for_type(x509.IPAddress)}
    return found | set(names.get_values_for_type(x509.UniformResourceIdentifier))


class _TlsError(ConnectionError):
    """A TLS failure, as the socket errors the server already treats as a client going away."""


class _TlsSocket:
    """A pyOpenSSL connection behind the socket calls the HTTP handler makes (recv_into, sendall,
    settimeout). The socket is non-blocking and every call waits with poll() until its own
    deadline, so a timeout bounds a whole handshake or a whole sendall, as in Python's ssl."""

    _CHUNK = 64 * 1024

    def __init__(self, connection, sock: socket.socket):
        self._connection, self._sock = connection, sock
        self._timeout: float | None = None
        sock.setblocking(False)

    def settimeout(self, seconds: float | None) -> None:
        self._timeout = seconds

    def fileno(self) -> int:
        return self._sock.fileno()

    def _deadline(self) -> float | None:
        return None if self._timeout is None else time.monotonic() + self._timeout

    def _call(self, deadline: float | None, method, *args):
        from OpenSSL import SSL

        while True:
            try:
                return method(*args)
            except SSL.WantReadError:
                self._wait(select.POLLIN, deadline)
            except SSL.WantWriteError:
                self._wait(select.POLLOUT, deadline)
            except SSL.ZeroReturnError:
                raise
            except SSL.SysCallError as exc:
                code = exc.args[0] if exc.args else -1
                if code == -1:
                    raise SSL.ZeroReturnError() from None  # the peer closed without close_notify
                raise OSError(code, os.strerror(code)) from None
            except SSL.Error as exc:
                raise _TlsError(f"TLS: {exc}") from None

    def _wait(self, events: int, deadline: float | None) -> None:
        poller = select.poll()
        poller.register(self._sock, events)
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            raise TimeoutError("timed out")
        if not poller.poll(None if remaining is None else remaining * 1000):
            raise TimeoutError("timed out")

    def do_handshake(self) -> None:
        from OpenSSL import SSL

        try:
            self._call(self._deadline(), self._connection.do_handshake)
        except SSL.ZeroReturnError:
            raise _TlsError("the client closed the connection during the TLS handshake") from None

    def recv_into(self, buffer, nbytes: int = 0) -> int:
        from OpenSSL import SSL

        try:
            return self._call(self._deadline(), self._connection.recv_into, buffer, nbytes or None)
        except SSL.ZeroReturnError:
            return 0

    def sendall(self, data) -> None:
        from OpenSSL import SSL

        view = memoryview(data).cast("B")
        deadline = self._deadline()  # for the whole of data, as socket.sendall
        while view:
            try:
                sent = self._call(deadline, self._connection.send, view[: self._CHUNK])
            except SSL.ZeroReturnError:
                raise BrokenPipeError("the client closed the TLS connection") from None
            view = view[sent:]

    def close_notify(self) -> None:
        """Send TLS close_notify, without waiting for the client's (best effort)."""
        from OpenSSL import SSL

        try:
            self._connection.shutdown()
        except (SSL.Error, OSError):
            pass


# --- access: headers, rate limit, basic auth -----------------------------------------------------


class _TokenBucket:
    """exporter-toolkit's rate_limit (Go's rate.Limiter.Allow): one request per ``interval``
    seconds on average, bursts of up to ``burst``; a burst of 0 refuses everything."""

    def __init__(self, interval: float, burst: int, clock: Callable[[], float] = time.monotonic):
        self._interval, self._burst, self._clock = interval, burst, clock
        self._tokens = float(burst)
        self._last = clock()
        self._lock = threading.Lock()

    def allow(self) -> bool:
        with self._lock:
            now = self._clock()
            self._tokens = min(self._burst, self._tokens + (now - self._last) / self._interval)
            self._last = now
            if self._tokens >= 1:
                self._tokens -= 1
                return True
            return False


PasswordCheck = Callable[[bytes, bytes], bool]


class _BasicAuth:
    """Checks ``Authorization: Basic`` against the bcrypt hashes.

    * An unknown user is checked against a dummy hash of the users' own cost, so it takes as long
      as a wrong password and user names cannot be told apart by timing.
    * A password over bcrypt's 72 bytes is refused (401) after the same amount of work.
    * One bcrypt at a time (as exporter-toolkit): a flood of bad passwords costs one core, not all.
    * Credentials that passed are remembered (by SHA-256, never in clear), so scrapes stay cheap.
    """

    _REMEMBERED = 64

    def __init__(self, users: dict[str, bytes], check: PasswordCheck | None = None):
        import bcrypt

        # ``check(password, hashed)``: bcrypt's own unless a test counts the checks (the property
        # "every refusal costs one check at the users' cost" needs no clock).
        self._check: PasswordCheck = check or bcrypt.checkpw
        self._users = users
        costs = Counter(int(hashed[4:6]) for hashed in users.values())
        cost = max(costs, key=lambda c: (costs[c], c))
        self._dummy = bcrypt.hashpw(secrets.token_urlsafe(18).encode(), bcrypt.gensalt(rounds=cost))
        self._lock = threading.Lock()
        self._passed: set[bytes] = set()

    def allows(self, header: str | None) -> bool:
        credentials = _basic_credentials(header)
        if credentials is None:
            return False
        user, password = credentials
        remembered = hashlib.sha256(user.encode("utf-8", "surrogateescape") + b"\0" + password).digest()
        if remembered in self._passed:
            return True
        hashed = self._users.get(user)
        fits = len(password) <= _BCRYPT_MAX_PASSWORD
        with self._lock:
            try:
                matched = self._check(password if fits else b"", hashed or self._dummy)
            except ValueError:
                matched = False
        allowed = hashed is not None and fits and matched
        if allowed:
            if len(self._passed) >= self._REMEMBERED:
                self._passed.clear()
            self._passed.add(remembered)
        return allowed


def _basic_credentials(header: str | None) -> tuple[str, bytes] | None:
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(token.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    user, colon, password = decoded.partition(b":")
    if not colon:
        return None
    return user.decode("utf-8", "surrogateescape"), password


def guard(
    app,
    web: WebConfig,
    public_paths: Iterable[str] = ("/healthz",),
    *,
    password_check: PasswordCheck | None = None,
):
    """Wrap a WSGI app with the web config's headers, rate limit and basic auth. ``public_paths``
    skip the rate limit and the password (not TLS): the kubelet's probes carry no credentials.
    ``password_check(password, hashed) -> bool`` replaces bcrypt.checkpw (tests count the checks)."""
    extra_headers = list(web.headers.items())
    limiter = _TokenBucket(*web.rate_limit) if web.rate_limit else None
    auth = _BasicAuth(web.basic_auth_users, password_check) if web.basic_auth_users else None
    public = frozenset(public_paths)

    def guarded(environ, start_response):
        def respond(status, headers, exc_info=None):
            return start_response(status, [*headers, *extra_headers], exc_info)

        if environ.get("PATH_INFO") not in public:
            if limiter is not None and not limiter.allow():
                return _plain(respond, "429 Too Many Requests")
            if auth is not None and not auth.allows(environ.get("HTTP_AUTHORIZATION")):
                return _plain(respond, "401 Unauthorized", [("WWW-Authenticate", 'Basic realm="gpumeter"')])
        return app(environ, respond)

    return guarded


def _plain(start_response, status: str, headers: list | None = None) -> list[bytes]:
    body = status.split(" ", 1)[1].encode() + b"\n"
    start_response(
        status, [("Content-Type", "text/plain"), ("Content-Length", str(len(body))), *(headers or [])]
    )
    return [body]


# --- the server -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Limits:
    """What one client may hold (docs/security.md). Scrapers send their request at once and read
    the answer at once; only a stalled or hostile client comes near these."""

    backlog: int = 1024
    max_connections: int = 512
    # One client (an IPv4 address, an IPv6 /64) holding every connection would shut every scraper out
    # (issue 42). A quarter of them: far more than a Prometheus pair or a 50-client benchmark opens from
    # one address, and three quarters are left to everyone else.
    max_connections_per_client: int = 128
    handshake_timeout: float = 5.0
    read_timeout: float = 10.0  # the whole request, from the end of the handshake
    write_timeout: float = 30.0  # the whole answer


class _DeadlineReader(io.RawIOBase):
    """The request side of a connection: every read waits only until one deadline for the request."""

    def __init__(self, sock, deadline: float, already_read: bytes = b""):
        self._sock, self._deadline = sock, deadline
        self._already_read = already_read  # what the event loop read before handing the connection over

    def renew(self, deadline: float) -> None:
        """The next request on a kept-alive connection: it has until ``deadline`` to arrive."""
        self._deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self._already_read:
            count = min(len(buffer), len(self._already_read))
            buffer[:count] = self._already_read[:count]
            self._already_read = self._already_read[count:]
            return count
        remaining = self._deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("the request did not arrive within the read timeout")
        self._sock.settimeout(remaining)
        return self._sock.recv_into(buffer)


class _DeadlineWriter(io.RawIOBase):
    """The answer side: everything written must leave within ``timeout`` of the first write.

    Buffered until flush(): wsgiref writes the status line and each header separately, and one
    system call per answer instead of six is what lets 50 concurrent scrapers share the GIL."""

    def __init__(self, sock, timeout: float):
        self._sock, self._timeout = sock, timeout
        self._deadline: float | None = None
        self._pending = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        if self._deadline is None:
            self._deadline = time.monotonic() + self._timeout
        self._pending += data
        return len(data)

    def flush(self) -> None:
        if not self._pending or self._deadline is None:
            return
        remaining = self._deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("the client did not read the answer within the write timeout")
        self._sock.settimeout(remaining)
        data, self._pending = self._pending, bytearray()
        self._sock.sendall(data)
        self._deadline = None  # the next answer on a kept-alive connection has its own

    def close(self) -> None:
        try:
            self.flush()
        finally:
            super().close()


_MAX_LINE = 65536  # http.server's limits: a request or header line, and the number of headers
_MAX_HEADERS = 100
_date_cache: tuple[int, str] = (0, "")


def _http_date() -> str:
    global _date_cache
    now = int(time.time())
    if _date_cache[0] != now:  # formatted once a second, not once a request
        _date_cache = (now, format_date_time(now))
    return _date_cache[1]


def _wsgi_environ(server, command: str, target: str, version: str, headers, client_address, rfile) -> dict:
    path, _, query = target.partition("?")
    environ = dict(server.base_environ)
    environ.update(
        {
            "SERVER_PROTOCOL": version,
            "SERVER_SOFTWARE": _Handler.server_version,
            "REQUEST_METHOD": command,
            "PATH_INFO": unquote(path, "iso-8859-1"),
            "QUERY_STRING": query,
            "REMOTE_ADDR": client_address[0],
            "CONTENT_TYPE": "text/plain",
            "wsgi.version": (1, 0),
            "wsgi.url_scheme": "https" if server.tls is not None else "http",
            "wsgi.input": rfile,
            "wsgi.errors": sys.stderr,
            "wsgi.multithread": True,
            "wsgi.multiprocess": False,
            "wsgi.run_once": False,
        }
    )
    if server.tls is not None:
        environ["HTTPS"] = "on"
    for name, value in headers:
        key = name.upper().replace("-", "_")
        if key not in ("CONTENT_TYPE", "CONTENT_LENGTH"):
            key = "HTTP_" + key
            if key in environ:  # a repeated header: its values joined, as wsgiref does
                value = f"{environ[key]},{value}"
        environ[key] = value
    return environ


def _answer(
    app, environ: dict, command: str, keep_alive: bool, server_version: str
) -> tuple[bytes, str, int, bool]:
    """Run the app; its whole answer as the bytes to send, with a Content-Length (every answer is
    delimited, so the connection can stay open). Returns (bytes, status, body length, keep alive)."""
    answer: list = []
    body: list[bytes] = []

    def start_response(status: str, headers: list, exc_info=None):
        if exc_info and answer:
            raise exc_info[1].with_traceback(exc_info[2])
        answer[:] = [status, headers]
        return body.append

    try:
        result = app(environ, start_response)
        try:
            body.extend(result)
        finally:
            if hasattr(result, "close"):
                result.close()
        if not answer:
            raise RuntimeError("the app returned without calling start_response")
    except Exception:
        log.error("error answering %s", environ.get("PATH_INFO"), exc_info=True)
        answer[:] = ["500 Internal Server Error", [("Content-Type", "text/plain")]]
        body[:] = [b"A server error occurred.  Please contact the administrator."]
        keep_alive = False
    status, headers = answer
    content = b"".join(body)
    lines = [f"HTTP/1.1 {status}", f"Date: {_http_date()}", f"Server: {server_version}"]
    named = set()
    for name, value in headers:
        named.add(name.lower())
        lines.append(f"{name}: {value}")
    if "content-length" not in named:
        lines.append(f"Content-Length: {len(content)}")
    if not keep_alive:
        lines.append("Connection: close")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("iso-8859-1")
    return (head if command == "HEAD" else head + content), status, len(content), keep_alive


class _Handler(WSGIRequestHandler):
    server_version = "gpumeter"
    # HTTP/1.1 keep-alive: a scraper's next request reuses its connection (no accept, thread or TLS
    # handshake per scrape). Each request still has ``read_timeout`` to arrive, counted from the end of
    # the previous answer, so an idle kept-alive connection is closed after that long.
    protocol_version = "HTTP/1.1"

    def __init__(self, request, client_address, server, already_read: bytes = b""):
        self.already_read = already_read  # the start of the request, when the event loop hands it over
        super().__init__(request, client_address, server)

    def setup(self) -> None:
        self.connection = self.request
        limits: Limits = self.server.limits
        self.rfile = io.BufferedReader(
            _DeadlineReader(self.connection, time.monotonic() + limits.read_timeout, self.already_read)
        )
        self.wfile = _DeadlineWriter(self.connection, limits.write_timeout)

    def handle(self) -> None:
        self.close_connection = True
        self.handle_one_request()
        reader = self.rfile.raw
        while not self.close_connection:
            reader.renew(time.monotonic() + self.server.limits.read_timeout)
            self.handle_one_request()

    def handle_one_request(self) -> None:
        """One request, parsed here rather than by http.server and wsgiref: their email-based header
        parser and per-request header objects cost most of a scrape's CPU, and 50 scrapers share one
        GIL. Same limits and refusals as http.server: 414 for a request line over 64 KiB, 431 for a
        header line over 64 KiB or more than 100 headers, 400 for anything that is not HTTP/1.x."""
        self.close_connection = True
        line = self.rfile.readline(_MAX_LINE + 1)
        if not line:  # the client closed its kept-alive connection
            return
        self.raw_requestline = line
        self.requestline = self.request_version = self.command = ""
        if len(line) > _MAX_LINE:
            self.send_error(414)
            return
        headers: list[tuple[str, str]] = []
        while True:
            raw = self.rfile.readline(_MAX_LINE + 1)
            if len(raw) > _MAX_LINE:
                self.send_error(431, "Line too long")
                return
            if raw in (b"\r\n", b"\n", b""):
                break
            if len(headers) >= _MAX_HEADERS:
                self.send_error(431, "Too many headers")
                return
            text = raw.decode("iso-8859-1").rstrip("\r\n")
            if text[:1] in (" ", "\t") and headers:  # an obsolete folded line continues the last header
                name, value = headers[-1]
                headers[-1] = (name, f"{value} {text.strip()}")
                continue
            field = _header_field(text)
            if field is not None:
                headers.append(field)
        self.requestline = line.decode("iso-8859-1").rstrip("\r\n")
        words = self.requestline.split()
        if len(words) != 3 or words[2] not in ("HTTP/1.1", "HTTP/1.0"):
            self.request_version = "HTTP/1.0"  # so the refusal has a status line http.server can write
            self.send_error(400, "Bad request syntax" if len(words) != 3 else "Bad request version")
            return
        self.command, target, self.request_version = words
        environ = self._environ(target, headers)
        keep_alive = (
            self.request_version == "HTTP/1.1" and "close" not in environ.get("HTTP_CONNECTION", "").lower()
        )
        if environ.get("CONTENT_LENGTH") or "HTTP_TRANSFER_ENCODING" in environ:
            keep_alive = False  # a body the app may not read in full must not be taken for the next request
        if environ.get("HTTP_EXPECT", "").lower() == "100-continue" and self.request_version == "HTTP/1.1":
            self.wfile.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            self.wfile.flush()
        self._respond(environ, keep_alive)

    def _environ(self, target: str, headers: list[tuple[str, str]]) -> dict:
        return _wsgi_environ(
            self.server, self.command, target, self.request_version, headers, self.client_address, self.rfile
        )

    def _respond(self, environ: dict, keep_alive: bool) -> None:
        """Run the app and send its answer in one write (``_answer``)."""
        data, status, length, keep_alive = _answer(
            self.server.get_app(), environ, self.command, keep_alive, self.server_version
        )
        self.wfile.write(data)
        self.wfile.flush()
        self.close_connection = not keep_alive
        if log.isEnabledFor(logging.DEBUG):
            self.log_request(status.split(" ", 1)[0], length)

    def log_message(self, format, *args) -> None:  # a scrape every few seconds would flood the log
        log.debug("%s " + format, self.address_string(), *args)


class _Connection:
    """A plain-HTTP connection the event loop holds: what arrived, and what is still to leave."""

    __slots__ = ("address", "close_after", "pending", "read_deadline", "received", "sock", "write_deadline")

    def __init__(self, sock: socket.socket, address, read_deadline: float):
        self.sock, self.address = sock, address
        self.received = bytearray()
        self.pending: memoryview | None = None  # an answer the client has not taken in full yet
        self.read_deadline, self.write_deadline = read_deadline, 0.0
        self.close_after = False


_FAST_METHODS = frozenset({"GET", "HEAD"})
_BODY_HEADERS = frozenset({"content-length", "transfer-encoding", "expect"})


def _header_field(line: str) -> tuple[str, str] | None:
    """(name, value) of a header line; None for a line that is not one (no colon, no name, or
    whitespace around the name), which both request parsers ignore."""
    name, colon, value = line.partition(":")
    if not colon or not name or name != name.strip():
        return None
    return name, value.strip()


def _scrape_request(head: bytes) -> tuple[str, str, list[tuple[str, str]]] | None:
    """(method, target, headers) of a complete request head the event loop answers itself: an
    HTTP/1.1 GET or HEAD with no body, within http.server's limits. Anything else (None) goes to a
    thread, where ``_Handler`` answers or refuses it as it always has."""
    lines = head.decode("iso-8859-1").split("\r\n")
    if len(lines) > _MAX_HEADERS + 1 or any(len(line) > _MAX_LINE for line in lines):
        return None
    words = lines[0].split()
    if len(words) != 3 or words[0] not in _FAST_METHODS or words[2] != "HTTP/1.1":
        return None
    headers = []
    for line in lines[1:]:
        if line[:1] in (" ", "\t") or "\n" in line:  # folded or LF-only lines: the thread parses them
            return None
        field = _header_field(line)
        if field is None:
            continue  # ignored, as _Handler ignores it
        if field[0].lower() in _BODY_HEADERS:
            return None
        headers.append(field)
    return words[0], words[1], headers


class _EventLoop:
    """Serves a plain-HTTP listener's kept-alive scrapers from one thread.

    With a thread per connection, 50 scrapers are 50 threads waking on 2 cores, and each answer
    waits to take the GIL back from whichever thread holds it, often on the other core: at 50
    concurrent clients that, not the work, made the p99 (docs/performance.md). Here one thread
    waits on every connection with epoll and answers complete GET/HEAD requests in arrival order,
    so an answer never waits for more than the answers queued before it. Only for apps that answer
    from memory (the exporter's rendered exposition): a slow app would hold up every client.

    The limits are those of the threaded path: a request must arrive within ``read_timeout`` of
    the connection opening or of the previous answer, an answer must leave within
    ``write_timeout``; idle, slow and stalled clients cost a few hundred bytes here, not a thread.
    Requests it does not answer itself (bodies, HTTP/1.0, anything malformed or oversized) are
    handed with what was read so far to a thread running ``_Handler``, which answers or refuses
    them exactly as on the threaded path.
    """

    _SWEEP = 0.25  # seconds between checks of the deadlines

    def __init__(self, server: Server, name: str):
        self._server = server
        self._selector = selectors.DefaultSelector()
        self._wake_read, self._wake_write = socket.socketpair()
        self._wake_read.setblocking(False)
        self._wake_write.setblocking(False)
        self._selector.register(self._wake_read, selectors.EVENT_READ, None)
        self._arrivals: list[tuple[socket.socket, Any]] = []
        self._arrivals_lock = threading.Lock()
        self._connections: dict[socket.socket, _Connection] = {}
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=f"{name}-loop", daemon=True)
        self._thread.start()

    def add(self, sock: socket.socket, address) -> None:
        """A connection accepted by the server's accept loop (another thread)."""
        sock.setblocking(False)
        with self._arrivals_lock:
            self._arrivals.append((sock, address))
        self._wake()

    def stop(self) -> None:
        self._stopping = True
        self._wake()
        self._thread.join(2)

    def _wake(self) -> None:
        try:
            self._wake_write.send(b"\0")
        except OSError:  # the pipe is full: the loop is awake already
            pass

    def _run(self) -> None:
        limits = self._server.limits
        next_sweep = time.monotonic() + self._SWEEP
        try:
            while not self._stopping:
                for key, events in self._selector.select(self._SWEEP):
                    connection = key.data
                    if connection is None:
                        self._take_arrivals(limits)
                        continue
                    try:
                        if events & selectors.EVENT_WRITE:
                            self._write(connection)
                        else:
                            self._read(connection)
                    except Exception:  # a bug must cost one connection, never the loop that serves them all
                        log.exception("error serving %s; closing its connection", connection.address[0])
                        self._close(connection)
                now = time.monotonic()
                if now >= next_sweep:
                    next_sweep = now + self._SWEEP
                    self._sweep(now)
        finally:
            for connection in list(self._connections.values()):
                self._close(connection)
            self._selector.close()
            self._wake_read.close()
            self._wake_write.close()

    def _take_arrivals(self, limits: Limits) -> None:
        try:
            while self._wake_read.recv(4096):
                pass
        except BlockingIOError:
            pass
        with self._arrivals_lock:
            arrivals, self._arrivals = self._arrivals, []
        for sock, address in arrivals:
            connection = _Connection(sock, address, time.monotonic() + limits.read_timeout)
            self._connections[sock] = connection
            self._selector.register(sock, selectors.EVENT_READ, connection)

    def _read(self, connection: _Connection) -> None:
        try:
            chunk = connection.sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:  # the client closed its connection (or reset it)
            self._close(connection)
            return
        connection.received += chunk
        self._answer_received(connection)

    def _answer_received(self, connection: _Connection) -> None:
        """Answer every complete request received, in order, until an answer has to wait for the client."""
        while connection.pending is None and connection.sock in self._connections:
            received = connection.received
            end = received.find(b"\r\n\r\n")
            if end < 0:
                if len(received) > _MAX_LINE or b"\n\n" in received:  # oversized, or LF-only lines
                    self._hand_over(connection)
                return
            request = _scrape_request(bytes(received[:end]))
            if request is None:
                self._hand_over(connection)
                return
            del received[: end + 4]
            method, target, headers = request
            server = self._server
            environ = _wsgi_environ(
                server, method, target, "HTTP/1.1", headers, connection.address, io.BytesIO()
            )
            keep_alive = "close" not in environ.get("HTTP_CONNECTION", "").lower()
            data, *_, keep_alive = _answer(
                server.get_app(), environ, method, keep_alive, _Handler.server_version
            )
            self._send(connection, data, close_after=not keep_alive)

    def _send(self, connection: _Connection, data: bytes, close_after: bool) -> None:
        """Start sending an answer; what the client does not take at once waits for it in ``_write``."""
        try:
            sent = connection.sock.send(data)
        except BlockingIOError:
            sent = 0
        except OSError:
            self._close(connection)
            return
        if sent == len(data):
            self._answered(connection, close_after)
            return
        # The client takes the answer slowly: wait for it to read, without holding up anyone else. The
        # whole answer must leave within write_timeout of its first byte, however slowly it is read.
        connection.pending = memoryview(data)[sent:]
        connection.write_deadline = time.monotonic() + self._server.limits.write_timeout
        connection.close_after = close_after
        self._selector.modify(connection.sock, selectors.EVENT_WRITE, connection)

    def _write(self, connection: _Connection) -> None:
        """The client can take more of a pending answer."""
        pending = connection.pending
        assert pending is not None
        try:
            sent = connection.sock.send(pending)
        except BlockingIOError:
            return
        except OSError:
            self._close(connection)
            return
        if sent < len(pending):
            connection.pending = pending[sent:]
            return
        connection.pending = None
        self._selector.modify(connection.sock, selectors.EVENT_READ, connection)
        self._answered(connection, connection.close_after)
        if connection.sock in self._connections:
            self._answer_received(connection)  # requests the client sent while it was reading

    def _answered(self, connection: _Connection, close_after: bool) -> None:
        """An answer has left: close, or give the next request read_timeout to arrive."""
        if close_after:
            self._close(connection)
        else:
            connection.read_deadline = time.monotonic() + self._server.limits.read_timeout

    def _sweep(self, now: float) -> None:
        for connection in list(self._connections.values()):
            waiting_for = (
                connection.write_deadline if connection.pending is not None else connection.read_deadline
            )
            if now > waiting_for:  # a request that never came, or an answer never taken
                self._close(connection)

    def _hand_over(self, connection: _Connection) -> None:
        """Give the connection, with what was read of it, to a thread running ``_Handler``."""
        del self._connections[connection.sock]
        self._selector.unregister(connection.sock)
        connection.sock.setblocking(True)
        threading.Thread(
            target=self._server.serve_handed_over,
            args=(connection.sock, connection.address, bytes(connection.received)),
            daemon=True,
        ).start()

    def _close(self, connection: _Connection) -> None:
        if self._connections.pop(connection.sock, None) is None:
            return
        self._selector.unregister(connection.sock)
        self._server.shutdown_request(connection.sock)
        self._server.release_slot(connection.address)


def _client_of(client_address) -> str:
    """Whose connection this is, for the per-client share: the IPv4 address, or the IPv6 /64 (one host
    is given a whole /64 and may connect from any address in it, RFC 4291 §2.5.4)."""
    host = client_address[0]
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:  # an IPv4 client of a dual-stack listener
            return str(address.ipv4_mapped)
        return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return str(address)


class Server(ThreadingMixIn, WSGIServer):
    """A WSGI server for one listen address; ``serve()`` builds and starts one, ``close()`` stops it."""

    daemon_threads = True
    block_on_close = False  # a stalled client must not hold up stopping
    allow_reuse_address = True

    def __init__(
        self,
        address: tuple[str, int],
        app,
        *,
        tls: _TlsContext | None = None,
        limits: Limits | None = None,
        event_loop: bool = False,
        name: str = "http",
    ):
        self.tls = tls
        self.limits = limits = limits or Limits()
        self._refused_logged = 0.0
        self.request_queue_size = limits.backlog
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self._slots = threading.BoundedSemaphore(limits.max_connections)
        self._per_client: Counter[str] = Counter()  # connections open, by _client_of
        self._per_client_lock = threading.Lock()  # taken by the accept loop and each closing thread
        super().__init__(address, _Handler)
        self.set_app(app)
        # TLS connections keep their thread: the handshake is CPU work that would hold up the loop.
        self._loop = _EventLoop(self, name) if event_loop and tls is None else None

    @property
    def address(self) -> str:
        host, port = self.server_address[:2]
        return _address(host, port)

    def verify_request(self, request, client_address) -> bool:
        client = _client_of(client_address)
        with self._per_client_lock:
            if self._per_client[client] >= self.limits.max_connections_per_client:
                why = f"{self.limits.max_connections_per_client} connections open from {client}"
            elif not self._slots.acquire(blocking=False):
                why = f"{self.limits.max_connections} connections open"
            else:
                self._per_client[client] += 1
                return True
        if time.monotonic() - self._refused_logged > 10:  # one line per 10 s, not one per connection
            self._refused_logged = time.monotonic()
            log.warning("%s on %s; closing new ones (from %s, ...)", why, self.address, client_address[0])
        return False

    def process_request(self, request, client_address) -> None:
        try:
            if self._loop is not None:
                request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as in finish_request
                self._loop.add(request, client_address)
            else:
                super().process_request(request, client_address)
        except BaseException:
            self.release_slot(client_address)
            raise

    def serve_handed_over(self, request, client_address, already_read: bytes) -> None:
        """In a thread of its own: a connection the event loop handed over, from what it had read."""
        try:
            self.RequestHandlerClass(request, client_address, self, already_read)
        except Exception:
            self.handle_error(request, client_address)
        finally:
            self.shutdown_request(request)
            self.release_slot(client_address)

    def release_slot(self, client_address) -> None:
        client = _client_of(client_address)
        with self._per_client_lock:
            self._per_client[client] -= 1
            if self._per_client[client] <= 0:
                del self._per_client[client]
        self._slots.release()

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.release_slot(client_address)

    def finish_request(self, request, client_address) -> None:
        """In the connection's own thread: the TLS handshake (bounded), then the request."""
        # Each answer leaves in one write, so Nagle's algorithm can only hold back its last segment until
        # the client's delayed ACK (tens of ms) on a kept-alive connection: send at once, as Go's net/http does.
        request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.tls is None:
            self.RequestHandlerClass(request, client_address, self)
            return
        connection = self.tls.accept(request, self.limits.handshake_timeout)
        try:
            self.RequestHandlerClass(connection, client_address, self)
        finally:
            connection.close_notify()

    def handle_error(self, request, client_address) -> None:
        error = sys.exc_info()[1]
        if isinstance(error, OSError):  # a client that stalled, went away or spoke nonsense
            log.debug("connection from %s dropped: %s", client_address[0], error or type(error).__name__)
        else:
            log.exception("error serving %s", client_address[0])

    def close(self) -> None:
        self.shutdown()
        if self._loop is not None:
            self._loop.stop()
        self.server_close()


def serve(
    app,
    listen: str | tuple[str, int],
    web: WebConfig | None = None,
    *,
    name: str = "http",
    limits: Limits | None = None,
    public_paths: Iterable[str] = ("/healthz",),
    answers_from_memory: bool = False,
) -> Server:
    """Bind ``listen`` and serve ``app`` from a background thread, with the web config's TLS,
    headers, rate limit and basic auth. Returns the server (``close()`` to stop).

    ``answers_from_memory``: the app answers at once from prepared state, so plain-HTTP scrapers
    are served from one event-loop thread (``_EventLoop``). Not with basic auth, whose bcrypt on a
    new password is tens of milliseconds the loop would make every client wait for."""
    host, port = parse_listen(listen) if isinstance(listen, str) else listen
    tls = _TlsContext(web.tls) if web is not None and web.tls is not None else None
    if tls is not None:
        tls.current()  # certificate problems stop the start, not the first scrape
    if web is not None:
        app = guard(app, web, public_paths)
    try:
        event_loop = answers_from_memory and not (web is not None and web.basic_auth_users)
        server = Server((host, port), app, tls=tls, limits=limits, event_loop=event_loop, name=name)
    except OSError as exc:
        raise ListenError(f"cannot listen on {_address(host, port)}: {exc.strerror or exc}") from None
    threading.Thread(
        target=server.serve_forever, name=f"{name}-{server.server_address[1]}", daemon=True
    ).start()
    return server
