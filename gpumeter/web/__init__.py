"""HTTP serving for every gpumeter listener (the exporter's /metrics, billing's /metrics, the
simulator's fault-injection port), and the Prometheus exporter-toolkit web config read strictly.

The server is the standard library's WSGI server (prometheus-client's own has no basic auth and no
routes of ours), made fit to face a network (docs/security.md):

* one daemon thread per connection, so an idle, slow or hostile client holds a thread, never the
  accept loop; at most ``Limits.max_connections`` at once, and at most
  ``Limits.max_connections_per_client`` of them from one client, more are closed as they arrive;
* except for the exporter's plain-HTTP /metrics, whose answers are ready in memory: there one
  event-loop thread serves every kept-alive scraper (``_EventLoop``), under the same deadlines, and
  hands anything but a plain GET/HEAD to a thread;
* the TLS handshake runs in that thread under a deadline, not in the accept loop;
* the request (line, headers, body) must arrive within ``read_timeout`` and the answer leave within
  ``write_timeout``, so a slowloris or a client that never reads is dropped;
* a listen backlog of 1024: socketserver's 5 dropped SYNs under 20 concurrent scrapers, and each
  drop costs the client a 1 s retransmit.

The web config is exporter-toolkit's format (its docs/web-configuration.md). Unknown keys,
malformed bcrypt hashes, unreadable files and contradictions are refused at start, naming the file,
the field and the value: a typo must never serve without the protection it meant to add.

The package, after exporter-toolkit's web/: ``config`` (the web config), ``tls``, ``auth`` (headers, rate
limit, basic auth), ``wsgi`` (one connection's HTTP under deadlines), ``event_loop``, ``server`` (``serve``),
``listen`` and ``errors``. Callers import from ``gpumeter.web`` itself. It imports nothing from the parts;
TLS (pyOpenSSL) and bcrypt load only when configured.
"""

from __future__ import annotations

from .auth import PasswordCheck, guard
from .config import WebConfig, load_web_config
from .errors import ListenError, WebConfigError
from .listen import is_loopback, parse_listen
from .server import Server, serve
from .tls import CLIENT_AUTH_TYPES, TlsSettings
from .wsgi import Limits

__all__ = [
    "CLIENT_AUTH_TYPES",
    "Limits",
    "ListenError",
    "PasswordCheck",
    "Server",
    "TlsSettings",
    "WebConfig",
    "WebConfigError",
    "guard",
    "is_loopback",
    "load_web_config",
    "parse_listen",
    "serve",
]
