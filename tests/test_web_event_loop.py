"""The event loop that serves plain-HTTP scrapers of an app answering from memory (the exporter's
/metrics; gpumeter/web/event_loop.py ``_EventLoop``): it must keep every promise the threaded path keeps —
deadlines for idle and stalled clients, http.server's refusals, bodies, HTTP/1.0 — and hold no
thread per connection, which is what it is for (docs/security.md)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from gpumeter.web import Limits, serve
from tests.support import loopback

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


HANG = 30.0  # seconds to wait for what takes milliseconds: past it, a hang, not a slow machine


@pytest.fixture
def serving() -> Iterator:
    """serving(**limits) -> a listener on the event loop; every one is closed after the test."""
    listeners = []

    def start(**limits):
        listener = serve(app, "127.0.0.1:0", limits=Limits(**limits), answers_from_memory=True, name="loop")
        listeners.append(listener)
        return listener

    yield start
    for listener in listeners:
        listener.close()


def held_until_gone(listener) -> bool:
    """Whether the event loop lets go of every connection it holds within HANG seconds."""
    give_up = time.monotonic() + HANG
    while listener._loop._connections:
        if time.monotonic() > give_up:
            return False
        time.sleep(0.01)
    return True


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


def test_a_hundred_idle_connections_hold_no_threads_and_are_closed_at_the_read_timeout(server):
    threads = threading.active_count()
    idle = [connect(server) for _ in range(100)]
    try:
        # accepted in order: once a later connection is answered, the hundred are held
        assert loopback.get(url(server), timeout=HANG).text == "GET /metrics HTTP/1.1"
        assert threading.active_count() - threads < 5, "a thread per connection"
        assert all(closed_by_server(sock, within=HANG) for sock in idle)  # read_timeout is 1 s
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
    assert loopback.get(url(server), timeout=5).status_code == 200


def stall(listener) -> socket.socket:
    """A client that asks for three big answers and reads none, once the loop holds an answer for it
    that the client's buffers cannot take."""
    stalled = socket.socket()
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stalled.connect(listener.server_address[:2])
    stalled.sendall(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n" * 3)
    give_up = time.monotonic() + HANG
    while not any(c.pending is not None for c in list(listener._loop._connections.values())):
        assert time.monotonic() < give_up, "the loop never started the big answer"
        time.sleep(0.01)
    return stalled


def test_a_client_that_never_reads_holds_up_no_one_and_is_dropped_at_the_write_timeout(serving):
    """By order, not by timing the scrapes: twenty are answered while the loop still holds the stalled
    client's answer (a 60 s write deadline, far off), and on a 0.3 s one the stalled client is let go
    though it never read a byte."""
    patient = serving(read_timeout=60, write_timeout=60)
    stalled = stall(patient)
    try:
        with httpx.Client(timeout=HANG) as scraper:
            for _ in range(20):
                assert scraper.get(url(patient)).status_code == 200
            # still held, its answer still waiting for it: the scrapes did not wait for it to go
            assert any(c.pending is not None for c in list(patient._loop._connections.values()))
    finally:
        stalled.close()
    strict = serving(read_timeout=60, write_timeout=0.3)
    stalled = stall(strict)
    try:
        assert held_until_gone(strict), "a client that never reads held its connection"
        assert closed_by_server(stalled, within=HANG)
    finally:
        stalled.close()


def test_a_client_reading_slowly_is_dropped_at_the_write_timeout_of_the_answer(serving):
    """The answer must leave within write_timeout of its first byte, as on the threaded path: a
    client that keeps taking a trickle does not get a new deadline with each trickle. Shown by what
    the client got: dropped before it had the whole answer, which at this trickle takes seconds (a
    deadline renewed by each trickle would let it read to the end). (The client cannot see the close
    while the kernel still delivers what was queued, so the loop's own connections are looked at.)"""
    # 1 s: longer than the gaps between the loop's writes to this client (a third of a socket buffer
    # taken each time), so that a deadline renewed by each write would never fire; far shorter than the
    # whole answer's trickle
    listener = serving(read_timeout=60, write_timeout=1.0)
    slow = socket.create_connection(listener.server_address[:2])
    held = listener._loop._connections  # the connections the event loop holds
    received = 0
    try:
        slow.sendall(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
        slow.settimeout(0.05)
        give_up = time.monotonic() + 4 * HANG  # a hang guard: the trickle itself takes over 5 s
        # at most ~1.6 MB a second: the whole 8 MiB answer takes over 5 s
        while received < len(BIG) and time.monotonic() < give_up:
            try:
                chunk = slow.recv(16384)
            except TimeoutError:
                chunk = None
            except ConnectionResetError:
                break
            if chunk == b"":
                break  # the end of the stream: dropped, and everything it had sent read
            received += len(chunk or b"")
            if received and not held:
                break  # the loop has let go of the connection (the answer started, so it had it)
            time.sleep(0.01)
        assert received < len(BIG), f"read the whole answer ({received} bytes) by a trickle"
        assert not held, "the loop still holds the connection"
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
        assert loopback.get(url(listener, "/ok"), timeout=5).text == "fine"
    finally:
        listener.close()
