"""Access to a listener: the web config's extra headers, its rate limit and basic auth against bcrypt
hashes (bcrypt loaded only when configured), as a WSGI wrapper (``guard``)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable

from .config import _BCRYPT_MAX_PASSWORD, WebConfig


class _TokenBucket:
    """exporter-toolkit's rate_limit (Go's rate.Limiter.Allow): one request per ``interval``
    seconds on average, bursts of up to ``burst``; a burst of 0 refuses everything."""

    def __init__(self, interval: float, burst: int, clock: Callable[[], float] = time.monotonic):
        self._interval, self._burst, self._clock = interval, burst, clock
        self._tokens = float(burst)
        self._last = clock()
        self._lock = threading.Lock()

    def allow(self) -> bool:
        with self._lock:
            now = self._clock()
            self._tokens = min(self._burst, self._tokens + (now - self._last) / self._interval)
            self._last = now
            if self._tokens >= 1:
                self._tokens -= 1
                return True
            return False


PasswordCheck = Callable[[bytes, bytes], bool]


class _BasicAuth:
    """Checks ``Authorization: Basic`` against the bcrypt hashes.

    * An unknown user is checked against a dummy hash of the users' own cost, so it takes as long
      as a wrong password and user names cannot be told apart by timing.
    * A password over bcrypt's 72 bytes is refused (401) after the same amount of work.
    * One bcrypt at a time (as exporter-toolkit): a flood of bad passwords costs one core, not all.
    * Credentials that passed are remembered (by SHA-256, never in clear), so scrapes stay cheap.
    """

    _REMEMBERED = 64

    def __init__(self, users: dict[str, bytes], check: PasswordCheck | None = None):
        import bcrypt

        # ``check(password, hashed)``: bcrypt's own unless a test counts the checks (the property
        # "every refusal costs one check at the users' cost" needs no clock).
        self._check: PasswordCheck = check or bcrypt.checkpw
        self._users = users
        costs = Counter(int(hashed[4:6]) for hashed in users.values())
        cost = max(costs, key=lambda c: (costs[c], c))
        self._dummy = bcrypt.hashpw(secrets.token_urlsafe(18).encode(), bcrypt.gensalt(rounds=cost))
        self._lock = threading.Lock()
        self._passed: set[bytes] = set()

    def allows(self, header: str | None) -> bool:
        credentials = _basic_credentials(header)
        if credentials is None:
            return False
        user, password = credentials
        remembered = hashlib.sha256(user.encode("utf-8", "surrogateescape") + b"\0" + password).digest()
        if remembered in self._passed:
            return True
        hashed = self._users.get(user)
        fits = len(password) <= _BCRYPT_MAX_PASSWORD
        with self._lock:
            try:
                matched = self._check(password if fits else b"", hashed or self._dummy)
            except ValueError:
                matched = False
        allowed = hashed is not None and fits and matched
        if allowed:
            if len(self._passed) >= self._REMEMBERED:
                self._passed.clear()
            self._passed.add(remembered)
        return allowed


def _basic_credentials(header: str | None) -> tuple[str, bytes] | None:
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(token.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    user, colon, password = decoded.partition(b":")
    if not colon:
        return None
    return user.decode("utf-8", "surrogateescape"), password


def guard(
    app,
    web: WebConfig,
    public_paths: Iterable[str] = ("/healthz",),
    *,
    password_check: PasswordCheck | None = None,
):
    """Wrap a WSGI app with the web config's headers, rate limit and basic auth. ``public_paths``
    skip the rate limit and the password (not TLS): the kubelet's probes carry no credentials.
    ``password_check(password, hashed) -> bool`` replaces bcrypt.checkpw (tests count the checks)."""
    extra_headers = list(web.headers.items())
    limiter = _TokenBucket(*web.rate_limit) if web.rate_limit else None
    auth = _BasicAuth(web.basic_auth_users, password_check) if web.basic_auth_users else None
    public = frozenset(public_paths)

    def guarded(environ, start_response):
        def respond(status, headers, exc_info=None):
            return start_response(status, [*headers, *extra_headers], exc_info)

        if environ.get("PATH_INFO") not in public:
            if limiter is not None and not limiter.allow():
                return _plain(respond, "429 Too Many Requests")
            if auth is not None and not auth.allows(environ.get("HTTP_AUTHORIZATION")):
                return _plain(respond, "401 Unauthorized", [("WWW-Authenticate", 'Basic realm="gpumeter"')])
        return app(environ, respond)

    return guarded


def _plain(start_response, status: str, headers: list | None = None) -> list[bytes]:
    body = status.split(" ", 1)[1].encode() + b"\n"
    start_response(
        status, [("Content-Type", "text/plain"), ("Content-Length", str(len(body))), *(headers or [])]
    )
    return [body]
