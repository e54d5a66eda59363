"""The server for one listen address: a thread per connection under per-client and total limits, the
TLS handshake in that thread, or the event loop for answers ready in memory; ``serve()`` starts one."""

from __future__ import annotations

import ipaddress
import logging
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIServer

from .auth import guard
from .config import WebConfig
from .errors import ListenError
from .event_loop import _EventLoop
from .listen import _address, parse_listen
from .tls import _TlsContext
from .wsgi import Limits, _Handler

log = logging.getLogger("gpumeter.web")  # one logger for every listener, as before the split


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
    # how often serve_forever() looks for close(): it waits for the next look (socketserver's 0.5 s made
    # every stop of an exporter or billing serve take up to half a second); ten idle wake-ups a second
    STOP_POLL_S = 0.1

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

    @property
    def scheme(self) -> str:
        """How a client reaches it: https where its web config turns TLS on."""
        return "http" if self.tls is None else "https"

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
        target=server.serve_forever,
        args=(Server.STOP_POLL_S,),
        name=f"{name}-{server.server_address[1]}",
        daemon=True,
    ).start()
    return server
