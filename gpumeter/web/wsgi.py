"""One connection's HTTP on a thread: the request read and the answer written under deadlines
(``Limits``), the WSGI environ, and the handler both the threaded path and the event loop's
hand-overs use."""

from __future__ import annotations

import io
import logging
import sys
import time
from dataclasses import dataclass
from urllib.parse import unquote
from wsgiref.handlers import format_date_time
from wsgiref.simple_server import WSGIRequestHandler

log = logging.getLogger("gpumeter.web")  # one logger for every listener, as before the split


@dataclass(frozen=True)
class Limits:
    """What one client may hold (docs/security.md). Scrapers send their request at once and read
    the answer at once; only a stalled or hostile client comes near these."""

    backlog: int = 1024
    max_connections: int = 512
    # One client (an IPv4 address, an IPv6 /64) holding every connection would shut every scraper out
    # (512 idle sockets from one address once did). A quarter of them: far more than a Prometheus pair or a 50-client benchmark opens from
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


def _header_field(line: str) -> tuple[str, str] | None:
    """(name, value) of a header line; None for a line that is not one (no colon, no name, or
    whitespace around the name), which both request parsers ignore."""
    name, colon, value = line.partition(":")
    if not colon or not name or name != name.strip():
        return None
    return name, value.strip()
