"""Every gpumeter listener stays available while idle, slow and hostile clients hold connections
(docs/security.md): the exporter's /metrics in plain HTTP and in TLS with basic auth,
the simulator's fault-injection port, and billing's /metrics. Each is started as its command starts
it, and each faces the same clients:

* 10 idle TCP connections, then a scrape;
* a slowloris sending its headers a byte at a time, with scrapes going on beside it;
* garbage bytes, an oversized header line and too many headers, then a scrape;
* 50 concurrent clients: no error, and none waits for a SYN retransmit (socketserver's backlog of 5
  dropped SYNs, and each drop costs a client a 1 s retransmit).

Bounds are generous (a busy 2-core machine runs these), yet each fails on the code before the fix:
there the TLS exporter and billing hung behind one idle connection.
"""

from __future__ import annotations

import base64
import socket
import ssl
import struct
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import bcrypt
import httpx
import pytest

from tests.support.certs import client_context, make_pki
from tests.support.servers import free_port
from tests.support.sockets import still_open


@dataclass
class Listener:
    name: str
    url: str  # the path a scraper asks for
    client: dict = field(default_factory=dict)  # httpx options: verify, auth

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.url.split("://")[1].split("/")[0].split(":")
        return host, int(port)

    @property
    def tls(self) -> bool:
        return self.url.startswith("https")

    def get(self, timeout: float = 5.0) -> httpx.Response:
        return httpx.get(self.url, timeout=timeout, **self.client)


def web_config(tmp_path: Path) -> tuple[Path, dict]:
    pki = make_pki(tmp_path / "pki")
    hashed = bcrypt.hashpw(b"scrape", bcrypt.gensalt(rounds=4)).decode()
    path = tmp_path / "web.yml"
    path.write_text(
        f"tls_server_config:\n  cert_file: {pki.server_cert}\n  key_file: {pki.server_key}\n"
        f"basic_auth_users:\n  prometheus: '{hashed}'\n"
    )
    return path, {"verify": client_context(pki), "auth": ("prometheus", "scrape")}


@pytest.fixture(
    scope="module", params=["exporter", "exporter-tls", "simulator-faults", "billing", "billing-tls"]
)
def listener(request, tmp_path_factory) -> Iterator[Listener]:
    """Each listener started once for the module: every client below meets the one that the clients
    before it met (each test leaves the listener as a client would: its connections closed)."""
    kind = request.param
    tmp_path = tmp_path_factory.mktemp(kind)
    if kind.startswith("billing"):
        yield from _billing(tmp_path, tls=kind.endswith("tls"))
        return
    from gpumeter.exporter.app import build_exporter
    from gpumeter.exporter.config import ExporterConfig

    config: dict = {"admin_listen": "127.0.0.1:0"} if kind == "simulator-faults" else {}
    client: dict = {}
    if kind == "exporter-tls":
        path, client = web_config(tmp_path)
        config["web_config"] = str(path)
    exporter = build_exporter(
        ExporterConfig(simulate="h100-mig", listen="127.0.0.1:0", kubelet_socket=None, **config)
    ).start()
    try:
        if kind == "simulator-faults":
            yield Listener(kind, f"http://127.0.0.1:{exporter.servers[1].server_address[1]}/faults")
        else:
            scheme = "https" if kind == "exporter-tls" else "http"
            yield Listener(kind, f"{scheme}://127.0.0.1:{exporter.port}/metrics", client)
    finally:
        exporter.stop()


def _billing(tmp_path: Path, tls: bool) -> Iterator[Listener]:
    from gpumeter.billing.config import Settings
    from gpumeter.service import serve

    settings = Settings(
        db=f"sqlite:///{tmp_path / 'ledger.db'}", prometheus="http://127.0.0.1:9", catchup_hours=1
    )
    port, stop = free_port(), threading.Event()
    web, client = web_config(tmp_path) if tls else (None, {})
    kwargs = {"web_config": str(web)} if web else {}
    thread = threading.Thread(
        target=serve, args=(settings, f"127.0.0.1:{port}", stop), kwargs=kwargs, name="billing", daemon=True
    )
    thread.start()
    listener = Listener(
        "billing-tls" if tls else "billing",
        f"{'https' if tls else 'http'}://127.0.0.1:{port}/metrics",
        client,
    )
    try:
        deadline = time.monotonic() + 30
        while True:  # until the service answers
            try:
                if listener.get(timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline and thread.is_alive(), "billing did not start"
            time.sleep(0.1)
        yield listener
    finally:
        stop.set()
        thread.join(20)


def scrape_seconds(listener: Listener, timeout: float = 3.0) -> float:
    start = time.perf_counter()
    answer = listener.get(timeout=timeout)
    assert answer.status_code == 200, (answer.status_code, answer.text[:200])
    return time.perf_counter() - start


def test_ten_idle_connections_do_not_delay_a_scrape(listener):
    """Shown by order, not by a clock: the scrape is answered while the ten idle connections are still
    open. A listener that served them one at a time would answer only once their read deadline had
    dropped them."""
    idle = [socket.create_connection(listener.address) for _ in range(10)]
    try:
        scrape_seconds(listener, timeout=30)
        assert all(still_open(sock) for sock in idle), "the idle connections were dropped before the scrape"
    finally:
        for sock in idle:
            sock.close()


def held_by_server(sock) -> bool:
    """Whether the server has sent nothing on ``sock``, not even the end of the stream: it still holds
    the connection, waiting for the rest of the request. (A TLS socket reads what came, so that the
    session tickets TLS 1.3 sends after the handshake are not taken for an answer.)"""
    sock.setblocking(False)
    try:
        sock.recv(1)  # an answer (a refusal) or the end of the stream: no longer held
        return False
    except (BlockingIOError, ssl.SSLWantReadError):
        return True
    except OSError:
        return False
    finally:
        sock.setblocking(True)


def test_a_slowloris_does_not_delay_others(listener):
    """Shown by order, not by a clock: each scrape is answered while the slowloris still holds its
    connection, its request unfinished. A listener that served one connection at a time would answer
    only once the read deadline had dropped the slowloris (the first scrape, at least, comes long before
    it; on a loaded machine a later one may not, and then the drip ends)."""
    with socket.create_connection(listener.address) as raw:
        slow = (
            listener.client["verify"].wrap_socket(raw, server_hostname="127.0.0.1") if listener.tls else raw
        )
        held = []
        try:
            slow.sendall(b"GET / HTTP/1.1\r\n")
            for byte in b"Host: slow\r\nX-Drip: 1":
                if not held_by_server(slow):
                    break  # dropped at its read deadline
                slow.send(bytes([byte]))
                scrape_seconds(listener, timeout=30)  # answered 200 (30 s: a hang, not a slow machine)
                held.append(held_by_server(slow))
        finally:
            slow.close()
    assert held and held[0], "the scrape was answered only once the slowloris was dropped"


@pytest.mark.parametrize(
    ("hostile", "answer"),
    [
        (b"\x00\xff garbage \x16\x03\x01\r\n\r\n", b"400"),
        (b"GET /metrics HTTP/1.1\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n", b"431"),
        (b"GET /metrics HTTP/1.1\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(150)) + b"\r\n", b"431"),
        (b"G" * 70_000 + b" / HTTP/1.1\r\n\r\n", b"414"),
    ],
    ids=["garbage", "70-kB-header", "150-headers", "70-kB-request-line"],
)
def test_hostile_requests_are_refused_and_the_listener_carries_on(listener, hostile, answer):
    with socket.create_connection(listener.address, timeout=10) as sock:
        try:
            sock.sendall(hostile)
            reply = sock.recv(200)
        except (ConnectionResetError, BrokenPipeError):
            reply = b""
    if listener.tls:
        assert not reply.startswith(b"HTTP/")  # no handshake, no HTTP
    else:
        assert answer in reply.split(b"\r\n")[0] or b"Error code: " + answer in reply, reply
    scrape_seconds(listener, timeout=30)  # it carries on: answers 200 (30 s: a hang, not a slow machine)


def retransmits(sock) -> int:
    """Segments the kernel sent again on this connection, SYNs included (tcp_info.tcpi_total_retrans)."""
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
    return struct.unpack_from("I", info, 100)[0]


def raw_scrape(listener: Listener) -> tuple[int, int]:
    """(segments retransmitted, HTTP status) of one scrape on a new connection, as Prometheus sends it.
    A dropped SYN (a full backlog) or a dropped handshake ACK shows as a retransmit on the client's
    side of the connection, whatever the load: counted by the kernel, not timed."""
    host, port = listener.address
    sock = socket.create_connection((host, port), timeout=30)
    stream = listener.client["verify"].wrap_socket(sock, server_hostname=host) if listener.tls else sock
    auth = ""
    if "auth" in listener.client:
        token = base64.b64encode(":".join(listener.client["auth"]).encode()).decode()
        auth = f"Authorization: Basic {token}\r\n"
    path = "/" + listener.url.split("/", 3)[3]
    try:
        # reads to the end of the stream, so it asks for the close (HTTP/1.1 keeps connections open)
        request = (
            f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nAccept-Encoding: gzip\r\n{auth}\r\n"
        )
        stream.sendall(request.encode())
        reply = b""
        while chunk := stream.recv(65536):
            reply += chunk
        resent = retransmits(stream)
    finally:
        stream.close()
    return resent, int(reply.split(b" ", 2)[1])


def test_fifty_concurrent_clients_get_every_answer_without_a_syn_retransmit(listener):
    """Rounds of 50 clients connecting at the same instant, 5 rounds: every scrape answered 200 and
    no connection waited for a SYN retransmit (the old backlog of 5 dropped them)."""
    rounds, clients = 5, 50
    barrier = threading.Barrier(clients)

    def client(_):
        results = []
        for _ in range(rounds):
            barrier.wait(timeout=60)
            results.append(raw_scrape(listener))
        return results

    with ThreadPoolExecutor(clients) as pool:
        results = [r for batch in pool.map(client, range(clients)) for r in batch]
    statuses = sorted({status for _, status in results})
    resent = [count for count, _ in results if count]
    assert len(results) == rounds * clients and statuses == [200], statuses
    assert resent == [], f"{len(resent)} connections retransmitted: a dropped SYN or handshake"
