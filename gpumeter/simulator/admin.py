"""The simulator's fault-injection endpoint, on its own port (never the metrics port).

``POST /faults`` with JSON ``{"fault": "overheat", "gpu": 0, ...params}`` injects a fault;
``DELETE /faults`` (optionally ``?gpu=N``) clears them; ``GET /faults`` lists the faults known.
``gpumeter simulate inject`` is the command-line client.

Only JSON is taken, and nothing from another site: a web page the operator has open could otherwise
POST a `text/plain` body here (a "simple" request, sent without a CORS preflight) and inject faults
into the fleet (issue 42). A POST must say ``Content-Type: application/json``, which a page can only
send cross-site after a preflight this endpoint never answers, and a request carrying an ``Origin``
(browsers add it) must come from this endpoint's own origin.

A page can still reach it through DNS rebinding: its own name re-pointed to 127.0.0.1 makes the
browser's requests same-origin, with ``Host: evil.example:PORT``. So the ``Host`` must name the
address the endpoint listens on: an IP address (the bound one, or any when it listens on every
address) or ``localhost``, with the port it listens on. A name that resolves to it is refused.
"""

from __future__ import annotations

import ipaddress
import json
from urllib.parse import parse_qs, urlsplit

from .device import FAULTS, SimulatedNode

__all__ = ["make_admin_app"]


def _host_refusal(environ, listen_host: str | None) -> str | None:
    """Why the request's ``Host`` does not name this endpoint's listen address, or None."""
    host = environ.get("HTTP_HOST", "")
    try:
        parts = urlsplit(f"//{host}")
        name, port = parts.hostname or "", parts.port
    except ValueError:
        return f"Host {host!r} is not an address"
    # no port: the default one, which a browser leaves out only when it is the one it connected to
    if port is not None and str(port) != str(environ.get("SERVER_PORT")):
        return f"Host {host!r} does not name this endpoint's port {environ.get('SERVER_PORT')}"
    if name == "localhost":
        return None
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return f"Host {host!r} is a name, not this endpoint's address (DNS rebinding); use the IP address"
    try:
        bound = ipaddress.ip_address(listen_host or "0.0.0.0")
    except ValueError:  # bound by name ("localhost"): its address is not known here
        return None
    if not bound.is_unspecified and address != bound:
        return f"Host {host!r} is not this endpoint's address {listen_host}"
    return None


def make_admin_app(node: SimulatedNode, listen_host: str | None = None):
    """``listen_host``: the IP address the endpoint is bound to (None: any), which ``Host`` must name."""

    def reply(start_response, status: str, body: dict):
        data = json.dumps(body).encode()
        start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(data)))])
        return [data]

    def app(environ, start_response):
        if environ.get("PATH_INFO") != "/faults":
            return reply(start_response, "404 Not Found", {"error": "use /faults"})
        method = environ["REQUEST_METHOD"]
        refused = _host_refusal(environ, listen_host)
        if refused is not None:
            return reply(start_response, "421 Misdirected Request", {"error": refused})
        origin = environ.get("HTTP_ORIGIN")
        if origin is not None and method != "GET" and urlsplit(origin).netloc != environ.get("HTTP_HOST"):
            return reply(
                start_response, "403 Forbidden", {"error": f"cross-site request from {origin!r} refused"}
            )
        media_type = environ.get("CONTENT_TYPE", "").split(";")[0].strip().lower()
        if method == "POST" and media_type != "application/json":
            return reply(
                start_response,
                "415 Unsupported Media Type",
                {"error": f"POST /faults takes Content-Type application/json (got {media_type!r})"},
            )
        if method == "GET":
            return reply(
                start_response,
                "200 OK",
                {"node": node.spec.name, "faults": list(FAULTS), "gpus": len(node.gpus)},
            )
        try:
            if method == "POST":
                length = int(environ.get("CONTENT_LENGTH") or 0)
                request = json.loads(environ["wsgi.input"].read(length) or b"{}")
                fault = request.pop("fault", None)
                gpu = request.pop("gpu", None)
                return reply(start_response, "200 OK", {"done": node.inject(fault, gpu, **request)})
            if method == "DELETE":
                gpu = parse_qs(environ.get("QUERY_STRING", "")).get("gpu", [None])[0]
                return reply(
                    start_response, "200 OK", {"done": node.clear(None if gpu is None else int(gpu))}
                )
        except (ValueError, TypeError, KeyError, json.JSONDecodeError) as exc:
            return reply(start_response, "400 Bad Request", {"error": str(exc)})
        return reply(start_response, "405 Method Not Allowed", {"error": method})

    return app
