"""The exporter's routes: ``/metrics`` (text or OpenMetrics by content negotiation, gzip when asked),
``/healthz`` and a landing page. Serving, TLS, basic auth and the web config are gpumeter.web's,
shared with billing's /metrics."""

from __future__ import annotations

from collections.abc import Callable

from .render import ExpositionCache

__all__ = ["LANDING", "make_app"]

LANDING = b"""<html><head><title>gpumeter exporter</title></head><body><h1>gpumeter exporter</h1>
<p><a href="/metrics">Metrics</a> &middot; <a href="/healthz">Health</a></p></body></html>"""


def make_app(exposition: ExpositionCache, health: Callable[[], tuple[bool, str]]):
    def app(environ, start_response):
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
