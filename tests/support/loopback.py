"""The tests' HTTP requests to the servers they start on loopback, through one shared client.

httpx's module-level functions (``httpx.get``, ``httpx.post``) build a ``Client`` per call, and a client
builds an SSL context, loading certifi's CA bundle: 31 ms of CPU a request, even for plain HTTP. The
tests against real servers poll Prometheus, VictoriaMetrics and Alertmanager thousands of times: py-spy
found 28 % of the pytest workers' samples there in `make test` (2026-12-07), and
tests/clusters/test_live.py alone took 32.7 s of its process's CPU, 4.4 s through this module. One
client here builds its context once. It keeps no connection alive, as ``httpx.get`` kept none: every
request opens its own, so a server stopped and started on the same port between two requests is met
afresh.

The same keywords as httpx's functions, except a client's own (``verify``, ``cert``, ``transport``): a
test of TLS passes those to httpx itself.
"""

from __future__ import annotations

import httpx

_client = httpx.Client(limits=httpx.Limits(max_keepalive_connections=0))

get = _client.get
post = _client.post
put = _client.put
delete = _client.delete
request = _client.request
stream = _client.stream
