"""gpumeter/web/ serving: basic auth that cannot be timed or crashed, client-certificate modes as
exporter-toolkit means them, headers and rate limit, the bounds on one connection, and the listen
address. Real sockets, real TLS (pyOpenSSL on the server, Python's ssl as the client)."""

from __future__ import annotations

import base64
import socket
import ssl
import time
from pathlib import Path

import bcrypt
import httpx
import pytest

from gpumeter.web import Limits, ListenError, guard, is_loopback, load_web_config, parse_listen, serve
from tests.support.certs import client_context, make_pki

TOOLKIT = Path(__file__).parent / "data" / "exporter-toolkit"


def hello(environ, start_response):
    body = f"hello over {environ['wsgi.url_scheme']}\n".encode()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]


@pytest.fixture
def served():
    """served(web=None, app=hello, limits=None) -> base URL; every server is closed after the test."""
    servers = []

    def start(web=None, app=hello, limits=None):
        server = serve(app, "127.0.0.1:0", web, limits=limits)
        servers.append(server)
        scheme = "https" if web is not None and web.tls is not None else "http"
        return f"{scheme}://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.close()


@pytest.fixture
def pki(tmp_path):
    return make_pki(tmp_path / "pki")


def web_config(tmp_path: Path, text: str):
    path = tmp_path / "web.yml"
    path.write_text(text)
    return load_web_config(path)


def users_config(tmp_path: Path, rounds: int = 4, **passwords: str):
    lines = "".join(
        f"  {user}: '{bcrypt.hashpw(pw.encode(), bcrypt.gensalt(rounds=rounds)).decode()}'\n"
        for user, pw in passwords.items()
    )
    return web_config(tmp_path, "basic_auth_users:\n" + lines)


# --- basic auth ---------------------------------------------------------------------------------


def test_basic_auth_lets_in_only_the_right_password(tmp_path, served):
    url = served(users_config(tmp_path, prometheus="s3cret")) + "/metrics"
    refused = httpx.get(url)
    assert refused.status_code == 401 and refused.headers["www-authenticate"].startswith("Basic")
    assert httpx.get(url, auth=("prometheus", "wrong")).status_code == 401
    assert httpx.get(url, auth=("nobody", "s3cret")).status_code == 401
    assert httpx.get(url, auth=("prometheus", "s3cret")).status_code == 200
    assert httpx.get(url, auth=("prometheus", "s3cret")).status_code == 200  # remembered
    assert httpx.get(url, auth=("prometheus", "wrong")).status_code == 401  # and still refuses others


@pytest.mark.parametrize(
    "header",
    [
        "Bearer abc",
        "Basic !!!not-base64!!!",
        "Basic " + base64.b64encode(b"no-colon").decode(),
        "Basic " + base64.b64encode(b"prometheus:" + b"x" * 73).decode(),  # over bcrypt's 72 bytes
        "Basic " + base64.b64encode(b"prometheus:" + "é".encode() * 40).decode(),  # 80 bytes of UTF-8
        "Basic " + base64.b64encode(b"\xff\xfe:\x00pw").decode(),
        "basic",
    ],
)
def test_malformed_and_overlong_credentials_get_401_not_500(tmp_path, served, header):
    url = served(users_config(tmp_path, prometheus="s3cret")) + "/metrics"
    assert httpx.get(url, headers={"Authorization": header}).status_code == 401


def test_a_72_byte_password_is_the_longest_that_works(tmp_path, served):
    password = "p" * 72
    url = served(users_config(tmp_path, prometheus=password)) + "/metrics"
    assert httpx.get(url, auth=("prometheus", password)).status_code == 200
    assert httpx.get(url, auth=("prometheus", password + "x")).status_code == 401


def test_an_unknown_user_costs_as_much_as_a_wrong_password(tmp_path):
    """No user enumeration by timing, shown without a clock: every refusal (a wrong password, an
    unknown user, a password over bcrypt's 72 bytes) runs exactly one real bcrypt check against a
    hash of the users' own cost, so each costs what a wrong password costs. Counted through the
    injected checker, which still runs bcrypt: a machine's load cannot change the verdict (the old
    test compared wall-clock medians and failed a clean clone's `make test` at load 15)."""
    cost = 5  # not bcrypt's default 12, so a dummy hash of a fixed cost would show
    web = users_config(tmp_path, rounds=cost, prometheus="s3cret")
    checks: list[tuple[bytes, bytes]] = []

    def counted(password: bytes, hashed: bytes) -> bool:
        checks.append((password, hashed))
        return bcrypt.checkpw(password, hashed)

    app = guard(hello, web, password_check=counted)

    def status(user: str, password: str) -> str:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        environ = {"PATH_INFO": "/metrics", "HTTP_AUTHORIZATION": f"Basic {token}", "wsgi.url_scheme": "http"}
        answered: list[str] = []
        app(environ, lambda status, headers, exc_info=None: answered.append(status))
        return answered[0]

    for user, password in (("prometheus", "guess"), ("mallory", "guess"), ("prometheus", "g" * 100)):
        checks.clear()
        assert status(user, password).startswith("401"), (user, len(password))
        assert len(checks) == 1, (user, len(password), checks)
        ((_, hashed),) = checks
        assert hashed.startswith(b"$2b$%02d$" % cost), (user, hashed)  # the users' cost, a real hash
    checks.clear()
    assert status("prometheus", "s3cret").startswith("200") and len(checks) == 1
    assert status("prometheus", "s3cret").startswith("200") and len(checks) == 1  # remembered: no new check


def test_healthz_answers_without_a_password_and_everything_else_asks(tmp_path, served):
    url = served(users_config(tmp_path, prometheus="s3cret"))
    assert httpx.get(url + "/healthz").status_code == 200
    assert httpx.get(url + "/").status_code == 401
    assert httpx.get(url + "/healthz/../metrics").status_code == 401


def test_configured_headers_are_on_every_answer_including_401(tmp_path, served):
    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4)).decode()
    web = web_config(
        tmp_path,
        "http_server_config:\n  headers:\n    X-Frame-Options: deny\n    X-Content-Type-Options: nosniff\n"
        f"basic_auth_users:\n  prometheus: '{hashed}'\n",
    )
    url = served(web)
    for answer in (httpx.get(url + "/metrics"), httpx.get(url + "/healthz")):
        assert answer.headers["x-frame-options"] == "deny"
        assert answer.headers["x-content-type-options"] == "nosniff"


def test_the_toolkit_users_log_in_with_the_toolkit_passwords(served):
    """exporter-toolkit's own users file and the passwords its tests use (TestUsers)."""
    url = served(load_web_config(TOOLKIT / "web_config_users_noTLS.good.yml")) + "/metrics"
    assert httpx.get(url, auth=("dave", "dave123")).status_code == 200
    assert httpx.get(url, auth=("carol", "carol123")).status_code == 200
    assert httpx.get(url, auth=("dave", "bad")).status_code == 401
    assert httpx.get(url, auth=("nonexistent", "nonexistent")).status_code == 401
    assert httpx.get(url).status_code == 401


# --- rate limit -----------------------------------------------------------------------------------


def test_rate_limit_allows_the_burst_then_429(tmp_path, served):
    url = served(web_config(tmp_path, "rate_limit:\n  interval: 1h\n  burst: 2\n"))
    assert [httpx.get(url + "/metrics").status_code for _ in range(3)] == [200, 200, 429]
    assert httpx.get(url + "/healthz").status_code == 200  # probes are not rate limited


def test_the_toolkit_one_second_limiter_with_no_burst_refuses(served):
    url = served(load_web_config(TOOLKIT / "web_config_rate_limiter_one_second.yaml"))
    assert httpx.get(url + "/metrics").status_code == 429


# --- client certificates ----------------------------------------------------------------------------

# client_auth_type -> whether a client gets in with (no certificate, one the CA signed, a self-signed
# stranger). Go's crypto/tls meanings, which exporter-toolkit passes through.
MODES = {
    "NoClientCert": (True, True, True),
    "RequestClientCert": (True, True, True),
    "RequireAnyClientCert": (False, True, True),
    "VerifyClientCertIfGiven": (True, True, False),
    "RequireAndVerifyClientCert": (False, True, False),
}


@pytest.mark.parametrize("mode", MODES)
def test_client_certificate_modes_mean_what_exporter_toolkit_means(tmp_path, pki, served, mode):
    ca = f"  client_ca_file: {pki.ca}\n" if "Verify" in mode else ""
    web = web_config(
        tmp_path,
        f"tls_server_config:\n  cert_file: {pki.server_cert}\n  key_file: {pki.server_key}\n"
        f"  client_auth_type: {mode}\n{ca}",
    )
    url = served(web) + "/metrics"
    outcome = []
    for identity in (None, "client", "stranger"):
        try:
            answer = httpx.get(url, verify=client_context(pki, identity), timeout=5)
            outcome.append(answer.status_code == 200 and answer.text == "hello over https\n")
        except httpx.HTTPError:
            outcome.append(False)
    assert tuple(outcome) == MODES[mode]


def unverified_client(certificate: str | None = None) -> ssl.SSLContext:
    # exporter-toolkit's test CA carries anyExtendedKeyUsage, which OpenSSL refuses for a server
    # (Go accepts it); these tests are about the server's side of the handshake.
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    if certificate:
        context.load_cert_chain(TOOLKIT / f"{certificate}.pem", TOOLKIT / f"{certificate}.key")
    return context


@pytest.mark.parametrize(
    ("config", "admitted"),
    [("web_config_auth_client_san.good.yaml", True), ("web_config_auth_client_san.bad.yaml", False)],
)
def test_client_allowed_sans_from_the_toolkit_configs(served, config, admitted):
    url = served(load_web_config(TOOLKIT / config)) + "/metrics"
    try:
        ok = httpx.get(url, verify=unverified_client("client2_selfsigned"), timeout=5).status_code == 200
    except httpx.HTTPError:
        ok = False
    assert ok is admitted
    with pytest.raises(httpx.HTTPError):  # and a client without a certificate never gets in
        httpx.get(url, verify=unverified_client(), timeout=5)


def test_require_any_client_cert_takes_the_toolkit_self_signed_client(served):
    url = served(load_web_config(TOOLKIT / "tls_config_noAuth.requireanyclientcert.good.yml")) + "/metrics"
    assert httpx.get(url, verify=unverified_client("client_selfsigned"), timeout=5).status_code == 200


def test_tls_versions_ciphers_and_curves_restrict_the_handshake(served):
    def handshake(config: str, tweak) -> bool:
        url = served(load_web_config(TOOLKIT / config)) + "/metrics"
        context = unverified_client()
        tweak(context)
        try:
            return httpx.get(url, verify=context, timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    def tls13_only(c):
        c.minimum_version = ssl.TLSVersion.TLSv1_3

    def tls12_chacha_only(c):
        c.maximum_version = ssl.TLSVersion.TLSv1_2
        c.set_ciphers("ECDHE-RSA-CHACHA20-POLY1305")

    def tls12_aes_gcm(c):
        c.maximum_version = ssl.TLSVersion.TLSv1_2
        c.set_ciphers("ECDHE-RSA-AES256-GCM-SHA384")

    # someCiphers: TLS 1.2 only, two ECDHE-RSA AES-GCM suites
    assert not handshake("web_config_noAuth_someCiphers.good.yml", tls13_only)
    assert not handshake("web_config_noAuth_someCiphers.good.yml", tls12_chacha_only)
    assert handshake("web_config_noAuth_someCiphers.good.yml", tls12_aes_gcm)
    # someCurves: TLS 1.3 with P-521 only
    assert not handshake("web_config_noAuth_someCurves.good.yml", lambda c: c.set_ecdh_curve("prime256v1"))
    assert handshake("web_config_noAuth_someCurves.good.yml", lambda c: c.set_ecdh_curve("secp521r1"))


def test_a_rotated_certificate_is_served_without_a_restart(tmp_path, pki, served):
    """cert-manager rewrites the files in place; the next connection gets the new certificate."""
    from cryptography import x509

    web = web_config(
        tmp_path, f"tls_server_config:\n  cert_file: {pki.server_cert}\n  key_file: {pki.server_key}\n"
    )
    host, port = served(web).removeprefix("https://").split(":")

    def served_serial(ca: Path) -> int:
        context = ssl.create_default_context(cafile=str(ca))
        with (
            socket.create_connection((host, int(port))) as raw,
            context.wrap_socket(raw, server_hostname=host) as tls,
        ):
            return x509.load_der_x509_certificate(tls.getpeercert(binary_form=True)).serial_number

    assert served_serial(pki.ca) == x509.load_pem_x509_certificate(pki.server_cert.read_bytes()).serial_number
    rotated = make_pki(tmp_path / "rotated")
    pki.server_key.write_bytes(rotated.server_key.read_bytes())
    pki.server_cert.write_bytes(rotated.server_cert.read_bytes())
    new_serial = x509.load_pem_x509_certificate(rotated.server_cert.read_bytes()).serial_number
    assert served_serial(rotated.ca) == new_serial


# --- the bounds on one connection ---------------------------------------------------------------------
# Each deadline is proved by order, never by timing the server: a connection is dropped while the client
# still holds it open (a deadline that never fired would keep it for HANG, and fail the test), and others
# are answered while it is held. The deadlines are small so that the tests wait a second at most, yet no
# smaller than a loaded machine needs to send a request after connecting (every client shares them).

HANG = 30.0  # seconds to wait for what takes milliseconds: past it, a hang, not a slow machine


def connect(url: str) -> socket.socket:
    host, port = url.split("://")[1].split(":")
    return socket.create_connection((host, int(port)), timeout=HANG)


def closed_by_server(sock: socket.socket, within: float = HANG) -> bool:
    """Whether the server closes ``sock`` within ``within`` seconds (reads and discards whatever it
    sends first)."""
    sock.settimeout(within)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        pass
    return True


def hung_up(sock: socket.socket) -> bool:
    """Whether the server has sent anything on ``sock`` yet, its end of the stream included."""
    sock.setblocking(False)
    try:
        sock.recv(1, socket.MSG_PEEK)
        return True
    except BlockingIOError:
        return False
    except OSError:
        return True
    finally:
        sock.setblocking(True)


def until_served(url: str) -> None:
    """Until ``url`` answers 200 (retrying a refused or dropped connection), counted to the answer's
    head: reading a large body (64 MiB below) on a loaded machine took seconds of its own."""
    give_up = time.monotonic() + HANG
    while True:
        try:
            with httpx.stream("GET", url, timeout=HANG) as answer:
                if answer.status_code == 200:
                    return
        except httpx.HTTPError:
            pass
        if time.monotonic() > give_up:
            raise AssertionError(f"{url} not served within {HANG} s")
        time.sleep(0.02)


def ask(sock: socket.socket) -> None:
    """A kept-alive GET on ``sock``, and its whole answer (``hello``'s)."""
    sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    answer = b""
    while not answer.endswith(b"hello over http\n"):
        chunk = sock.recv(65536)
        assert chunk, f"closed before the answer: {answer!r}"
        answer += chunk
    assert answer.startswith(b"HTTP/1.1 200"), answer


def test_a_slowloris_is_dropped_at_the_read_deadline_and_others_are_served_meanwhile(served):
    """The read deadline is the whole request's, not each read's: a client sending a header byte every
    20 ms is dropped with its request unfinished (a deadline renewed by each read would keep it for as
    long as it drips, here HANG). Others are answered between its bytes."""
    url = served(limits=Limits(read_timeout=1.0))
    with connect(url) as slow, httpx.Client(timeout=HANG) as scraper:
        slow.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        give_up = time.monotonic() + HANG  # far past the deadline
        while time.monotonic() < give_up:
            if hung_up(slow):
                break
            try:
                slow.send(b"a")
            except OSError:
                break  # the server hung up
            assert scraper.get(url + "/metrics").status_code == 200
            time.sleep(0.02)
        else:
            pytest.fail(f"the slowloris dripped for {HANG} s: its read deadline was renewed by each byte")
        assert closed_by_server(slow)


def test_a_kept_alive_connection_serves_several_scrapes_and_is_closed_when_idle(served):
    """HTTP/1.1 keep-alive: the second scrape reuses the connection (one accept for both), and an idle
    connection is closed read_timeout after its last answer; Connection: close is honoured."""
    url = served(limits=Limits(read_timeout=60))  # no deadline comes near this part
    with connect(url) as sock:
        stream = sock.makefile("rb")
        for _ in range(2):
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            assert stream.readline().startswith(b"HTTP/1.1 200")
            length = None
            while (line := stream.readline()) != b"\r\n":
                name, _, value = line.decode().partition(":")
                if name.lower() == "content-length":
                    length = int(value)
                assert name.lower() != "connection", line  # no Connection: close on a kept-alive answer
            assert stream.read(length) == b"hello over http\n"
    with connect(url) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert closed_by_server(sock)  # answered, then closed at once: not at the 60 s deadline
    idle = served(limits=Limits(read_timeout=1.0))
    with connect(idle) as sock:
        ask(sock)
        assert closed_by_server(sock), "an idle kept-alive connection outlived read_timeout"


def test_a_tls_client_that_never_handshakes_is_dropped_at_the_handshake_deadline(tmp_path, pki, served):
    web = web_config(
        tmp_path, f"tls_server_config:\n  cert_file: {pki.server_cert}\n  key_file: {pki.server_key}\n"
    )
    url = served(web, limits=Limits(handshake_timeout=1.0, read_timeout=60))
    mute = [connect(url) for _ in range(10)]
    try:
        answer = httpx.get(url + "/metrics", verify=client_context(pki), timeout=HANG)
        assert answer.status_code == 200  # while the ten hold their connections
        assert closed_by_server(mute[0])  # without a handshake deadline, held for ever
    finally:
        for sock in mute:
            sock.close()


def test_a_client_that_never_reads_the_answer_is_dropped_at_the_write_deadline(served):
    """With one connection allowed, the next client is served only once the stuck one is dropped
    (without a write deadline, never)."""
    big = b"x" * (64 << 20)  # far more than the socket buffers hold

    def huge(environ, start_response):
        start_response("200 OK", [("Content-Length", str(len(big)))])
        return [big]

    url = served(app=huge, limits=Limits(max_connections=1, write_timeout=1.0))
    with connect(url) as stuck:
        stuck.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        stuck.recv(1)  # the server is writing the answer this client will not read (or gave it up)
        until_served(url)
        stuck.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")


def test_connections_beyond_the_limit_are_closed_and_service_resumes(served):
    url = served(limits=Limits(max_connections=3, read_timeout=60))
    held = [connect(url) for _ in range(3)]
    try:
        for sock in held:
            ask(sock)  # accepted: each holds a slot
        with connect(url) as extra:
            assert closed_by_server(extra)  # closed at accept, not left hanging until the 60 s deadline
    finally:
        for sock in held:
            sock.close()
    until_served(url + "/metrics")


def connect_from(source: str, url: str) -> socket.socket:
    """A connection to ``url`` from the loopback address ``source`` (Linux routes all of 127/8 to lo)."""
    host, port = url.split("://")[1].split(":")
    sock = socket.socket()
    sock.bind((source, 0))
    sock.settimeout(HANG)
    sock.connect((host, int(port)))
    return sock


@pytest.mark.parametrize("answers_from_memory", [False, True], ids=["thread-per-connection", "event-loop"])
def test_one_client_holding_every_connection_leaves_room_for_the_scrapers(answers_from_memory):
    """512 idle sockets from one address filled every slot, and no scraper was
    served until they timed out. One client now gets its share; the others are closed at accept."""
    limits = Limits(read_timeout=60)  # the idle sockets are not dropped by a deadline during the test
    server = serve(hello, "127.0.0.1:0", limits=limits, answers_from_memory=answers_from_memory)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    hog = []
    try:
        hog = [connect_from("127.0.0.2", url) for _ in range(limits.max_connections)]
        with connect_from("127.0.0.3", url) as scraper:
            scraper.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            answer = b""
            while chunk := scraper.recv(65536):
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"hello over http\n")
        # Accepted in order: the scraper's answer means every hog connection has been kept or closed.
        still_open = 0
        for sock in hog:
            sock.settimeout(0.01)
            try:
                still_open += sock.recv(1) != b""
            except TimeoutError:
                still_open += 1  # held by the server, waiting for a request
            except ConnectionResetError:
                pass
        assert still_open == limits.max_connections_per_client
        for sock in hog:  # the hog's share frees as it closes: it connects again, up to its share
            sock.close()
        hog = []
        until_served(url + "/metrics")
    finally:
        for sock in hog:
            sock.close()
        server.close()


# --- the listen address ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        (":9835", ("0.0.0.0", 9835)),
        ("127.0.0.1:0", ("127.0.0.1", 0)),
        ("[::1]:9402", ("::1", 9402)),
        ("localhost:65535", ("localhost", 65535)),
    ],
)
def test_listen_addresses(text, parsed):
    assert parse_listen(text) == parsed


@pytest.mark.parametrize("text", [":99999", "9835", "host:port", ":-1", "[::1:80", ":", ":٣"])
def test_bad_listen_addresses_are_named(text):
    with pytest.raises(ListenError, match=r"port|host:port|brackets") as raised:
        parse_listen(text)
    assert repr(text) in str(raised.value)


def test_a_port_in_use_names_the_address():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(
            ListenError, match=rf"cannot listen on 127\.0\.0\.1:{port}: Address already in use"
        ):
            serve(hello, f"127.0.0.1:{port}")


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("10.0.0.5", False),
        ("", False),
    ],
)
def test_loopback_hosts(host, loopback):
    assert is_loopback(host) is loopback
