"""The simulator's fault-injection endpoint, on its own port (never the metrics port).

``POST /faults`` with JSON ``{"fault": "overheat", "gpu": 0, ...params}`` injects a fault;
``DELETE /faults`` (optionally ``?gpu=N``) clears them; ``GET /faults`` lists the faults known.
``gpumeter simulate inject`` is the command-line client.

Only JSON is taken, and nothing from another site: a web page the operator has open could otherwise
POST a `text/plain` body here (a "simple" request, sent without a CORS preflight) and inject faults
into the fleet (issue 42). A POST must say ``Content-Type: application/json``, which a page can only
send cross-site after a preflight this endpoint never answers, and a request carrying an ``Origin``
(browsers add it) must come from this endpoint's own origin.
"""

from __future__ import annotations

import json
from urllib.parse import parse_qs, urlsplit

from .device import FAULTS, SimulatedNode

__all__ = ["make_admin_app"]


def make_admin_app(node: SimulatedNode):
    def reply(start_response, status: str, body: dict):
        data = json.dumps(body).encode()
        start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(data)))])
        return [data]

    def app(environ, start_response):
        if environ.get("PATH_INFO") != "/faults":
            return reply(start_response, "404 Not Found", {"error": "use /faults"})
        method = environ["REQUEST_METHOD"]
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
