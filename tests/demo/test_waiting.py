"""The demo's wait for a started process: what it says when the process never answers or exits, since
that message and its log's end are all a CI run's output shows of a demo that did not come up."""

from __future__ import annotations

import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gpumeter.deploy.demo import DemoError, Stack

pytestmark = pytest.mark.spawns  # a short-lived Python child each


def started(tmp_path, name: str, code: str) -> Stack:
    (tmp_path / "logs").mkdir()
    stack = Stack(tmp_path, {})
    stack.spawn(name, [sys.executable, "-c", code])
    return stack


def test_a_process_that_exits_ends_the_wait_with_its_log(tmp_path):
    stack = started(
        tmp_path, "exporter-0", "import sys; print('config: bad interval -1', flush=True); sys.exit(2)"
    )
    try:
        with pytest.raises(DemoError) as raised:
            stack.wait_http("exporter-0", "http://127.0.0.1:9/healthz", timeout=600)
    finally:
        stack.stop()
    message = str(raised.value)
    assert message.startswith("exporter-0 exited with 2; the end of ")
    assert "    config: bad interval -1" in message


class Unhealthy(BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"last sample is 42s old\n"
        self.send_response(503)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_a_process_that_never_gets_healthy_is_given_up_on_with_its_last_answer(tmp_path):
    server = ThreadingHTTPServer(("127.0.0.1", 0), Unhealthy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/healthz"
    stack = started(tmp_path, "west-exporter", "import time; print('sampling', flush=True); time.sleep(60)")
    try:
        with pytest.raises(DemoError) as raised:
            stack.wait_http("west-exporter", url, timeout=1)
    finally:
        stack.stop()
        server.shutdown()
        server.server_close()
    message = str(raised.value)
    assert message.startswith(
        f"west-exporter not ready at {url} after 1s; its last answer: HTTP 503 'last sample is 42s old'; "
        f"the end of {tmp_path / 'logs' / 'west-exporter.log'}:"
    ), message
    assert message.endswith("\n    sampling")
