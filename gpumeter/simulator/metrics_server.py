"""A real HTTP server serving one Prometheus text exposition on ``/metrics``: what the stand-ins for
other projects' exporters (kube-state-metrics, volcano-scheduler) share. The body is made afresh on
every scrape, so a stand-in's state can change between scrapes as the real one's does."""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from gpumeter.process import stop_on_signals, wait_until_set

__all__ = [
    "CONTENT_TYPE",
    "ExpositionServer",
    "StandInServer",
    "label_text",
    "listen_address",
    "serve_until_signalled",
]
log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # client_golang's text format


def label_text(**labels: str) -> str:
    """``a="x",b="y"`` with the text format's escaping of backslash, double quote and newline."""

    def escape(value: str) -> str:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    return ",".join(f'{name}="{escape(value)}"' for name, value in labels.items())


class StandInServer(ThreadingHTTPServer):
    """The stand-ins' HTTP server: a thread per request that dies with the process, and a handler's
    error logged in one line. socketserver prints the traceback to stderr instead, where a client
    hanging up mid-answer (a scraper stopped, a test's timeout) lands in whatever else writes there."""

    daemon_threads = True

    def serve_forever(self, poll_interval: float = 0.05) -> None:
        # shutdown() waits for the next poll: socketserver's 0.5 s made each stop() take up to half a
        # second (the stand-in Kubernetes API's stop was 40 % of a `doctor --simulate`)
        super().serve_forever(poll_interval)

    def handle_error(self, request, client_address) -> None:
        error = sys.exc_info()[1]
        log.warning("error answering %s: %s: %s", client_address[0], type(error).__name__, error)


class ExpositionServer:
    """Serves ``body()`` on ``http://HOST:PORT/metrics`` from :meth:`start` until :meth:`stop`."""

    def __init__(
        self, body: Callable[[], str], listen: tuple[str, int] = ("127.0.0.1", 0), name: str = "stand-in"
    ):
        self._name = name

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404)
                    return
                data = body().encode()
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self._server = StandInServer(listen, Handler)
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self):
        self._thread = threading.Thread(target=self._server.serve_forever, name=self._name, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def listen_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (host defaults to 127.0.0.1); ValueError naming ``--listen`` and the value."""
    host, _, port = text.rpartition(":")
    if not port.isdigit():
        raise ValueError(f"--listen: expected HOST:PORT (value {text!r})")
    return host or "127.0.0.1", int(port)


def serve_until_signalled(
    command: str, listen: str, start: Callable[[], ExpositionServer], banner: str
) -> int:
    """A stand-in command's life: start the server (exit 1 naming the address if it cannot listen),
    print ``banner`` with its URL, serve until SIGINT/SIGTERM, stop."""
    stop = threading.Event()
    stop_on_signals(stop)
    try:
        server = start().start()
    except OSError as exc:
        print(f"{command}: listen {listen}: {exc.strerror}", file=sys.stderr)
        return 1
    host = listen_address(listen)[0]
    print(f"{banner} on http://{host}:{server.port}/metrics", flush=True)
    try:
        wait_until_set(stop)
    finally:
        server.stop()
    return 0
