"""The exporter-toolkit web config (its docs/web-configuration.md), read strictly: unknown keys, malformed
bcrypt hashes, unreadable files and contradictions are refused at start, naming the file, the field and
the value, since a typo must never serve without the protection it meant to add."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import WebConfigError
from .tls import (
    _CIPHERS,
    _CLIENT_AUTH,
    _CURVES,
    _TLS_VERSIONS,
    CLIENT_AUTH_TYPES,
    TlsSettings,
    _read_pem,
    _TlsContext,
)

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
    except (ValueError, OverflowError) as exc:  # PyYAML's readers raise these bare: a date 2026-13-01
        raise WebConfigError(f"{source}: a value YAML cannot read: {exc}") from None
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
