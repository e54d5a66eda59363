"""TLS: what a web config's tls_server_config may say (Go's names and their OpenSSL equivalents,
``TlsSettings``), and through pyOpenSSL (loaded only when configured) the context, rebuilt when the
certificate or key file changes, exporter-toolkit's client-certificate modes, and a socket whose every
read and write keeps the connection's deadline."""

from __future__ import annotations

import functools
import logging
import os
import select
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import WebConfigError

log = logging.getLogger("gpumeter.web")  # one logger for every listener, as before the split

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


@functools.lru_cache(maxsize=8)
def _private_key(pem: bytes):
    """The PEM's private key. Kept, by content: validating an RSA key is 0.1-0.3 s of CPU, and a
    reload after a certificate's renewal, or another listener of this process, usually brings the
    same key again."""
    from cryptography.hazmat.primitives import serialization

    return serialization.load_pem_private_key(pem, password=None)


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


def _read_pem(path: Path, field_path: str, fail) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise fail(field_path, str(path), f"cannot read it: {exc.strerror or exc}") from None


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
            key = _private_key(key_pem)
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
