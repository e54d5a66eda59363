"""The event loop that serves plain-HTTP scrapers of an app answering from memory (the exporter's
/metrics; gpumeter/web/event_loop.py ``_EventLoop``): it must keep every promise the threaded path keeps —
deadlines for idle and stalled clients, http.server's refusals, bodies, HTTP/1.0 — and hold no
thread per connection, which is what it is for (docs/security.md)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from gpumeter.web import Limits, serve

BIG = b"x" * (8 << 20)  # far more than the kernel buffers of a client that does not read


def app(environ, start_response):
    path = environ["PATH_INFO"]
    if path == "/big":
        body = BIG
    elif environ["REQUEST_METHOD"] == "POST":
        body = b"posted " + environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
    else:
        body = f"{environ['REQUEST_METHOD']} {path} {environ['SERVER_PROTOCOL']}".encode()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]


@pytest.fixture
def server() -> Iterator:
    limits = Limits(read_timeout=1.0, write_timeout=1.0)
    listener = serve(app, "127.0.0.1:0", limits=limits, answers_from_memory=True, name="loop-test")
    try:
        yield listener
    finally:
        listener.close()


def connect(server) -> socket.socket:
    sock = socket.create_connection(server.server_address[:2], timeout=5)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def read_answers(
    sock: socket.socket, count: int, *, bodiless: frozenset[int] = frozenset()
) -> list[tuple[bytes, bytes]]:
    """``count`` answers (status line, body) off one connection, by their Content-Length. The
    answers numbered in ``bodiless`` (to HEAD requests) have no body whatever their Content-Length
    says: their header block is given as the body. Bytes read past one answer belong to the next."""
    data, answers = b"", []
    while len(answers) < count:
        end = data.find(b"\r\n\r\n")
        if end >= 0 and len(answers) in bodiless:
            answers.append((data[: data.find(b"\r\n")], data[: end + 4]))
            data = data[end + 4 :]
            continue
        if end >= 0:
            head = data[:end].decode("iso-8859-1").split("\r\n")
            length = int(
                next(line.split(":")[1] for line in head if line.lower().startswith("content-length"))
            )
            if len(data) >= end + 4 + length:
                answers.append((head[0].encode(), data[end + 4 : end + 4 + length]))
                data = data[end + 4 + length :]
                continue
        chunk = sock.recv(1 << 20)
        assert chunk, f"connection closed after {len(answers)} answers"
        data += chunk
    return answers


def closed_by_server(sock: socket.socket, within: float) -> bool:
    sock.settimeout(within)
    try:
        while chunk := sock.recv(1 << 20):
            del chunk
        return True
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def url(server, path: str = "/metrics") -> str:
    return f"http://127.0.0.1:{server.server_address[1]}{path}"


@pytest.mark.quiet  # an upper bound on wall-clock time: a loaded machine could fail it
def test_a_hundred_idle_connections_hold_no_threads_and_are_closed_at_the_read_timeout(server):
    threads = threading.active_count()
    idle = [connect(server) for _ in range(100)]
    try:
        time.sleep(0.3)
        assert threading.active_count() - threads < 5, "a thread per connection"
        started = time.perf_counter()
        assert httpx.get(url(server), timeout=5).text == "GET /metrics HTTP/1.1"
        assert time.perf_counter() - started < 0.5
        assert all(closed_by_server(sock, within=5) for sock in idle)  # read_timeout is 1 s
    finally:
        for sock in idle:
            sock.close()


def test_pipelined_requests_are_answered_in_order_on_one_connection(server):
    sock = connect(server)
    try:
        sock.sendall(
            b"".join(f"GET /{n} HTTP/1.1\r\nHost: x\r\n\r\n".encode() for n in range(5))
            + b"HEAD /h HTTP/1.1\r\n"
        )
        time.sleep(0.1)
        sock.sendall(b"Host: x\r\n\r\n")
        # the HEAD answer may come in the same read as the GETs': the reader keeps what follows each
        *answers, (status, head) = read_answers(sock, 6, bodiless=frozenset({5}))
        assert [body for _, body in answers] == [f"GET /{n} HTTP/1.1".encode() for n in range(5)]
        # HEAD: the headers of a GET, no body
        assert (
            status.startswith(b"HTTP/1.1 200")
            and head.endswith(b"\r\n\r\n")
            and b"Content-Length: 16" in head
        )
        sock.settimeout(0.2)
        try:
            extra = sock.recv(4096)  # b"" if the server closed the idle connection
        except TimeoutError:
            extra = b""
        assert extra == b"", extra  # and no body after it
    finally:
        sock.close()


@pytest.mark.parametrize(
    ("request_bytes", "status", "body"),
    [
        (b"POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello", b"200", b"posted hello"),
        (b"GET /old HTTP/1.0\r\n\r\n", b"200", b"GET /old HTTP/1.0"),
        (b"GET /lf HTTP/1.1\nHost: x\n\n", b"200", b"GET /lf HTTP/1.1"),
        (b"GET /folded HTTP/1.1\r\nX-A: 1\r\n  2\r\n\r\n", b"200", b"GET /folded HTTP/1.1"),
        (b"\x16\x03\x01\x02\x00garbage\r\n\r\n", b"400", None),
        (b"GET / HTTP/1.1\r\nX-Long: " + b"a" * 70000 + b"\r\n\r\n", b"431", None),
        (b"GET / HTTP/1.1\r\n" + b"".join(b"X-%d: 1\r\n" % n for n in range(101)) + b"\r\n", b"431", None),
    ],
    ids=["post-body", "http-1.0", "lf-only", "folded", "garbage", "long-header", "many-headers"],
)
def test_requests_the_loop_does_not_answer_itself_get_the_threaded_answer(
    server, request_bytes, status, body
):
    sock = connect(server)
    try:
        sock.sendall(request_bytes)
        sock.settimeout(5)
        reply = b""
        while b"\r\n\r\n" not in reply or (body is not None and not reply.endswith(body)):
            chunk = sock.recv(65536)
            if not chunk:
                break
            reply += chunk
        assert reply.split(b" ", 2)[1] == status, reply[:200]
        if body is not None:
            assert reply.endswith(body)
    finally:
        sock.close()
    assert httpx.get(url(server), timeout=5).status_code == 200


@pytest.mark.quiet  # an upper bound on wall-clock time: a loaded machine could fail it
def test_a_client_that_never_reads_holds_up_no_one_and_is_dropped_at_the_write_timeout(server):
    stalled = socket.socket()
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stalled.connect(server.server_address[:2])
    try:
        stalled.sendall(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n" * 3)
        time.sleep(0.2)
        for _ in range(20):
            started = time.perf_counter()
            assert httpx.get(url(server), timeout=5).status_code == 200
            assert time.perf_counter() - started < 0.5
        assert closed_by_server(stalled, within=5)  # write_timeout is 1 s
    finally:
        stalled.close()


@pytest.mark.quiet  # an upper bound on wall-clock time: a loaded machine could fail it
def test_a_client_reading_slowly_is_dropped_at_the_write_timeout_of_the_answer(server):
    """The answer must leave within write_timeout of its first byte, as on the threaded path: a
    client that keeps taking a trickle does not get a new deadline with each trickle. (The client
    cannot see the close while the kernel still delivers what was queued, so the loop's own
    connections are looked at.)"""
    slow = socket.create_connection(server.server_address[:2])
    held = server._loop._connections  # the connections the event loop holds
    try:
        slow.sendall(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
        slow.settimeout(0.05)
        started = time.monotonic()
        while time.monotonic() - started < 1 or (held and time.monotonic() - started < 8):
            with contextlib.suppress(TimeoutError, ConnectionResetError):
                slow.recv(16384)  # at most ~1.6 MB a second: the 8 MiB answer takes over 5 s
            time.sleep(0.01)
        elapsed = time.monotonic() - started
        assert not held, f"still held after {elapsed:.1f} s of trickle with write_timeout 1 s"
        assert elapsed < 3
    finally:
        slow.close()


def test_connection_close_is_honoured(server):
    sock = connect(server)
    try:
        sock.sendall(b"GET /bye HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        ((status, body),) = read_answers(sock, 1)
        assert status.startswith(b"HTTP/1.1 200") and body == b"GET /bye HTTP/1.1"
        assert closed_by_server(sock, within=2)
    finally:
        sock.close()


def test_closing_the_server_closes_the_connections_the_loop_holds():
    listener = serve(app, "127.0.0.1:0", answers_from_memory=True, name="loop-close")
    sock = connect(listener)
    try:
        sock.sendall(b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
        read_answers(sock, 1)
        listener.close()
        assert closed_by_server(sock, within=3)
    finally:
        sock.close()


def test_an_answer_that_breaks_costs_its_connection_not_the_loop():
    """An app answering with text instead of bytes breaks the answer outside the app's own error
    handling; the loop closes that connection and goes on serving the others."""

    def breaking(environ, start_response):
        start_response("200 OK", [("Content-Type", "text/plain")])
        return ["text, not bytes"] if environ["PATH_INFO"] == "/break" else [b"fine"]

    listener = serve(breaking, "127.0.0.1:0", answers_from_memory=True, name="loop-break")
    try:
        sock = connect(listener)
        try:
            sock.sendall(b"GET /break HTTP/1.1\r\nHost: x\r\n\r\n")
            assert closed_by_server(sock, within=3)
        finally:
            sock.close()
        assert httpx.get(url(listener, "/ok"), timeout=5).text == "fine"
    finally:
        listener.close()
