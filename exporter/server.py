"""HTTP serving: ``/metrics`` (text or OpenMetrics by content negotiation), ``/healthz``, and optional
TLS and basic auth from a web-config file in the Prometheus exporter-toolkit format.

The server is the standard library's WSGI server with one thread per request: prometheus-client's
own ``start_http_server`` cannot add routes or basic auth, and a scrape only copies cached bytes.
"""

from __future__ import annotations

import base64
import logging
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import bcrypt
import yaml

from .render import ExpositionCache

__all__ = ["WebConfig", "WebConfigError", "load_web_config", "make_app", "serve"]

log = logging.getLogger(__name__)

_TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
_CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "RequestClientCert": ssl.CERT_OPTIONAL,
    "RequireAnyClientCert": ssl.CERT_REQUIRED,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}


class WebConfigError(ValueError):
    pass


@dataclass(frozen=True)
class WebConfig:
    cert_file: str | None = None
    key_file: str | None = None
    client_ca_file: str | None = None
    client_auth_type: str = "NoClientCert"
    min_version: str = "TLS12"
    basic_auth_users: dict[str, bytes] = field(default_factory=dict)

    @property
    def tls(self) -> bool:
        return bool(self.cert_file)

    def ssl_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = _TLS_VERSIONS[self.min_version]
        context.load_cert_chain(self.cert_file, self.key_file)
        context.verify_mode = _CLIENT_AUTH[self.client_auth_type]
        if self.client_ca_file:
            context.load_verify_locations(self.client_ca_file)
        return context


def load_web_config(path: str | Path) -> WebConfig:
    """Parse an exporter-toolkit web config; errors name the file, field and value."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise WebConfigError(f"{path}: cannot read web config: {exc}") from None
    tls = data.get("tls_server_config") or {}
    users = data.get("basic_auth_users") or {}
    if not isinstance(tls, dict) or not isinstance(users, dict):
        raise WebConfigError(f"{path}: tls_server_config and basic_auth_users must be mappings")
    for key in ("cert_file", "key_file"):
        if tls and not tls.get(key):
            raise WebConfigError(f"{path}: tls_server_config.{key}: required when TLS is configured")
    auth_type = tls.get("client_auth_type", "NoClientCert")
    if auth_type not in _CLIENT_AUTH:
        raise WebConfigError(f"{path}: tls_server_config.client_auth_type: unknown value {auth_type!r}")
    if auth_type in ("RequireAndVerifyClientCert", "VerifyClientCertIfGiven") and not tls.get(
        "client_ca_file"
    ):
        raise WebConfigError(f"{path}: tls_server_config.client_ca_file: required for {auth_type}")
    min_version = tls.get("min_version", "TLS12")
    if min_version not in _TLS_VERSIONS:
        raise WebConfigError(f"{path}: tls_server_config.min_version: unknown value {min_version!r}")
    hashes = {}
    for user, hashed in users.items():
        if not isinstance(hashed, str) or not hashed.startswith(("$2a$", "$2b$", "$2y$")):
            raise WebConfigError(f"{path}: basic_auth_users.{user}: expected a bcrypt hash ($2y$...)")
        hashes[str(user)] = hashed.encode()
    return WebConfig(
        tls.get("cert_file"), tls.get("key_file"), tls.get("client_ca_file"), auth_type, min_version, hashes
    )


class _Auth:
    """bcrypt is slow on purpose: remember credentials that passed, so scrapes stay cheap."""

    def __init__(self, users: dict[str, bytes]):
        self._users = users
        self._good: set[bytes] = set()
        self._lock = threading.Lock()

    def allows(self, header: str | None) -> bool:
        if not self._users:
            return True
        if not header or not header.startswith("Basic "):
            return False
        token = header[6:].encode()
        with self._lock:
            if token in self._good:
                return True
        try:
            user, _, password = base64.b64decode(token).decode().partition(":")
        except ValueError:
            return False
        hashed = self._users.get(user)
        if hashed is None or not bcrypt.checkpw(password.encode(), hashed):
            return False
        with self._lock:
            self._good.add(token)
        return True


LANDING = b"""<html><head><title>gpumeter exporter</title></head><body><h1>gpumeter exporter</h1>
<p><a href="/metrics">Metrics</a> &middot; <a href="/healthz">Health</a></p></body></html>"""


def make_app(
    exposition: ExpositionCache, health: Callable[[], tuple[bool, str]], web: WebConfig | None = None
):
    auth = _Auth(web.basic_auth_users if web else {})

    def app(environ, start_response):
        if not auth.allows(environ.get("HTTP_AUTHORIZATION")):
            start_response(
                "401 Unauthorized",
                [("WWW-Authenticate", 'Basic realm="gpumeter"'), ("Content-Type", "text/plain")],
            )
            return [b"Unauthorized\n"]
        path = environ.get("PATH_INFO", "/")
        if path == "/metrics":
            gzip_ok = "gzip" in environ.get("HTTP_ACCEPT_ENCODING", "")
            body, content_type = exposition.render(environ.get("HTTP_ACCEPT"), gzip_ok)
            headers = [("Content-Type", content_type), ("Content-Length", str(len(body)))]
            if gzip_ok:
                headers.append(("Content-Encoding", "gzip"))
            start_response("200 OK", headers)
            return [body]
        if path == "/healthz":
            ok, reason = health()
            start_response("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain")])
            return [reason.encode() + b"\n"]
        if path == "/":
            start_response("200 OK", [("Content-Type", "text/html")])
            return [LANDING]
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"Not Found\n"]

    return app


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format, *args):  # scrapes every few seconds would flood the log
        log.debug("%s " + format, self.address_string(), *args)


def parse_listen(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    return host.strip("[]") or "0.0.0.0", int(port)


def serve(app, listen: str, web: WebConfig | None = None) -> WSGIServer:
    """Start serving in a background thread; returns the server (``shutdown()`` to stop)."""
    host, port = parse_listen(listen)
    server = make_server(host, port, app, server_class=_Server, handler_class=_QuietHandler)
    if web and web.tls:
        server.socket = web.ssl_context().wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, name=f"http-{port}", daemon=True).start()
    return server
