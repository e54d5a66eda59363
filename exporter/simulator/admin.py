"""The simulator's fault-injection endpoint, on its own port (never the metrics port).

``POST /faults`` with JSON ``{"fault": "overheat", "gpu": 0, ...params}`` injects a fault;
``DELETE /faults`` (optionally ``?gpu=N``) clears them; ``GET /faults`` lists the faults known.
``gpumeter simulate inject`` is the command-line client.
"""

from __future__ import annotations

import json
from urllib.parse import parse_qs

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
