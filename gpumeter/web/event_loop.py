"""The event loop that serves a plain-HTTP listener's kept-alive scrapers from one thread (epoll), under
the same deadlines as the threaded path; anything but a complete GET/HEAD is handed to a thread."""

from __future__ import annotations

import io
import logging
import selectors
import socket
import threading
import time
from typing import TYPE_CHECKING, Any

from .wsgi import _MAX_HEADERS, _MAX_LINE, Limits, _answer, _Handler, _header_field, _wsgi_environ

if TYPE_CHECKING:
    from .server import Server

log = logging.getLogger("gpumeter.web")  # one logger for every listener, as before the split


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
