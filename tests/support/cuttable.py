"""A TCP proxy on loopback that a test can cut: how a test loses its database mid-run.

`CuttableProxy(("127.0.0.1", 5432))` forwards every connection to PostgreSQL until `cut()`, which
drops the connections it carries (as a server that goes away does) and refuses new ones (the port no
longer listens), or `hold()`, after which new connections are accepted and never answered (a database
behind a network that lost its packets). Order, not a clock: a test cuts it where the code under test
has reached a known point.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator


class CuttableProxy:
    def __init__(self, upstream: tuple[str, int]):
        self.upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.05)  # the accept loop looks at `_mode` between tries
        self.port = self._listener.getsockname()[1]
        self._guard = threading.Lock()
        self._mode = "forward"
        self._open: list[socket.socket] = []  # every socket of a carried or held connection
        self.accepted = 0  # connections accepted, forwarded or held
        self.held = 0  # connections accepted while holding: never answered
        self._thread = threading.Thread(target=self._accept, name="cuttable-proxy", daemon=True)
        self._thread.start()

    def url(self, base: str) -> str:
        """``base`` (a SQLAlchemy URL naming 127.0.0.1:5432) pointed at this proxy instead."""
        host, port = self.upstream
        return base.replace(f"{host}:{port}", f"127.0.0.1:{self.port}")

    def cut(self) -> None:
        """Drop every connection and refuse new ones."""
        with self._guard:
            self._mode = "cut"
            open_, self._open = self._open, []
        self._listener.close()
        for sock in open_:
            _drop(sock)

    def hold(self) -> None:
        """Accept new connections and never answer them (those already carried go on)."""
        with self._guard:
            self._mode = "hold"

    def close(self) -> None:
        self.cut()
        self._thread.join()

    def _accept(self) -> None:
        while True:
            with self._guard:
                if self._mode == "cut":
                    return
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:  # closed by `cut`
                return
            with self._guard:
                if self._mode == "cut":
                    _drop(client)
                    return
                self.accepted += 1
                self._open.append(client)
                if self._mode == "hold":
                    self.held += 1
                    continue
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                _drop(client)
                continue
            with self._guard:
                self._open.append(server)
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=_pump, args=(source, sink), daemon=True).start()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    _drop(source)
    _drop(sink)


def _drop(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()


@contextlib.contextmanager
def cuttable(upstream: tuple[str, int]) -> Iterator[CuttableProxy]:
    """A `CuttableProxy` to ``upstream`` for as long as the block."""
    proxy = CuttableProxy(upstream)
    try:
        yield proxy
    finally:
        proxy.close()
