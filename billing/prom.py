"""A minimal Prometheus HTTP API client: instant (`/api/v1/query`) and range (`/api/v1/query_range`) queries.

Hand-rolled on purpose: the Python PromQL clients on PyPI are either unmaintained
(`prometheus-api-client` pulls in matplotlib/pandas stacks and has gone long stretches without
releases) or wrap far more than we need; billing needs two endpoints, exact error reporting, and an
injectable httpx transport for tests. The same API is served by Thanos, Mimir and VictoriaMetrics.
"""

from __future__ import annotations

import functools
import ssl
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import NamedTuple

import httpx
import orjson

from gpumeter.billing.promjson import matrix_series
from gpumeter.billing.secrets import redact_url

# Defaults of `billing ingest` and `billing serve` (docs/billing.md §6.5): one request's whole answer
# within REQUEST_TIMEOUT seconds (a connection, every read and the body together, so an answer that
# trickles in is given up as one that hangs); every answer at most MAX_ANSWER_BYTES.
REQUEST_TIMEOUT = 120.0
# The 10,000-GPU bench's largest answer is a 24-hour run's allocation counts (~40,000 series, tens of
# MB); a run's points are bounded by IngestConfig.run_points, so no honest answer nears this.
MAX_ANSWER_BYTES = 512 << 20


class PrometheusError(RuntimeError):
    """Prometheus could not answer a query (connection, HTTP or PromQL error)."""


class PrometheusUnreachable(PrometheusError):
    """Prometheus did not answer at all (connection refused or reset, a request timed out or ran
    past the deadline): the next request would not be answered either."""


class BadAnswer(PrometheusError):
    """Prometheus answered, but not with what billing can turn into money: an answer of the wrong
    shape, a value that is not a finite number in its range, a label longer than billing keeps, an
    answer larger than the cap. The hour is refused like one Prometheus could not answer."""


@dataclass(frozen=True)
class Auth:
    """How billing authenticates to Prometheus, as Prometheus' own ``http_config`` offers it: a bearer
    token file, a basic-auth user with a password file, a TLS client certificate (and the CA that
    signs the server). Paths only, read when a client is opened: no secret is held in settings,
    printed or stored (docs/security.md). Plain values, so a worker process can be given them."""

    bearer_token_file: str | None = None
    basic_auth_user: str | None = None
    basic_auth_password_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    ca_file: str | None = None

    def client_options(self) -> dict:
        """httpx.Client keywords: its auth, headers and TLS context. Raises PrometheusError (one
        line, naming the file) when a file cannot be read."""
        options: dict = {}
        if self.bearer_token_file:
            token = _secret(self.bearer_token_file, "bearer token file")
            options["headers"] = {"Authorization": f"Bearer {token}"}
        if self.basic_auth_password_file or self.basic_auth_user:
            if not self.basic_auth_user:
                raise PrometheusError("a basic-auth password file needs a basic-auth user")
            password = (
                _secret(self.basic_auth_password_file, "basic-auth password file")
                if self.basic_auth_password_file
                else ""
            )
            options["auth"] = httpx.BasicAuth(self.basic_auth_user, password)
        if self.cert_file or self.ca_file:
            try:
                context = ssl.create_default_context(cafile=self.ca_file)
                if self.cert_file:
                    context.load_cert_chain(self.cert_file, self.key_file)
            except (OSError, ssl.SSLError) as exc:
                raise PrometheusError(f"TLS files for Prometheus cannot be used: {exc}") from None
            options["verify"] = context
        return options


def _secret(path: str, what: str) -> str:
    """A secret file's content, stripped of its trailing newline (as Prometheus reads one)."""
    try:
        return Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise PrometheusError(f"{path}: cannot read the {what}: {getattr(exc, 'strerror', exc)}") from None


class Sample(NamedTuple):
    labels: dict[str, str]
    value: float


# A range answer fetched, not yet decoded: calling it decodes it (PrometheusError if it is an error).
# a range answer's series, decoded as they are read where the answer's layout allows (billing/promjson.py)
RangeAnswer = Callable[[], Iterable[tuple[dict[str, str], list[list]]]]


class NotANumber(float):
    """A sample whose text is no number ("abc"): a NaN, so that billing refuses that reading's
    GPU-hour alone, as it does a NaN's (billing/refusals.py `screen_values`), not the whole answer;
    it names its text when the refusal says why."""

    __slots__ = ("text",)
    text: str

    def __new__(cls, text: str) -> NotANumber:
        value = super().__new__(cls, "nan")
        value.text = text
        return value

    def __repr__(self) -> str:
        return repr(self.text)


def reading(text: str) -> float:
    """``float(text)``, or a `NotANumber` for text that is not a number. Any other value (a list, an
    object, null) is an answer of the wrong shape and raises."""
    try:
        return float(text)
    except ValueError:
        if text.__class__ is not str:
            raise
        return NotANumber(text[:60])


class PrometheusClient:
    """``url`` may carry a user and password (``http://user:pass@host``): httpx sends them as basic
    auth, and only the redacted URL (`base_url`) is ever shown or stored.

    ``deadline``: a `time.monotonic` instant after which no request is started and none is waited
    on (a run's overall deadline, `billing ingest --deadline`). ``clock``: what the timeout of a whole
    answer and the deadline are read against (a test's own clock, so a trickled answer is given up
    without waiting for it in real time)."""

    def __init__(
        self,
        base_url: str,
        *,
        transport: httpx.BaseTransport | None = None,
        timeout: float = REQUEST_TIMEOUT,
        headers: dict[str, str] | None = None,
        auth: Auth | None = None,
        max_answer_bytes: int = MAX_ANSWER_BYTES,
        deadline: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.url = base_url.rstrip("/")
        self._clock = clock
        self.base_url = redact_url(self.url)  # what errors and the ledger's runs name
        self.timeout, self.headers, self.auth = timeout, dict(headers or {}), auth or Auth()
        self.max_answer_bytes, self.deadline = max_answer_bytes, deadline
        self.reopenable = transport is None  # another process can open the same client (ingest workers)
        options = self.auth.client_options()
        options["headers"] = {**options.get("headers", {}), **self.headers}
        self._client = httpx.Client(base_url=self.url, transport=transport, timeout=timeout, **options)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> PrometheusClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def query(self, promql: str, at: datetime) -> list[Sample]:
        """Evaluate an instant query at ``at``; an instant vector comes back as samples."""
        data = self._post("/api/v1/query", promql, {"time": f"{at.timestamp():.3f}"})
        if data.get("resultType") != "vector":
            raise BadAnswer(f"expected an instant vector from {promql!r}, got {data.get('resultType')!r}")
        try:
            return [Sample(item["metric"], reading(item["value"][1])) for item in _result(data)]
        except (TypeError, ValueError, KeyError, IndexError) as exc:
            raise BadAnswer(
                f"{self.base_url}: an answer of the wrong shape to {promql!r}: {_why(exc)}"
            ) from None

    def query_range(
        self, promql: str, start: datetime, end: datetime, step_seconds: int
    ) -> list[tuple[dict[str, str], list[list]]]:
        """Evaluate ``promql`` at start, start + step, ... ≤ end in one request (a range query).

        Each step is evaluated exactly as an instant query at that time would be; a series only has
        points at the steps where it has a value. Returned as Prometheus sends it, (labels,
        [[unix seconds, "value"], ...]) per series: the caller converts only what it keeps.
        """
        return list(self.fetch_range(promql, start, end, step_seconds)())

    def fetch_range(self, promql: str, start: datetime, end: datetime, step_seconds: int) -> RangeAnswer:
        """`query_range` in two halves: the request now, the answer's decoding when the returned
        function is called. Ingest waits on Prometheus in a thread and decodes in the one that
        builds the hours, so that only one thread runs Python at a time (docs/billing.md §6)."""
        params = {
            "start": f"{start.timestamp():.3f}",
            "end": f"{end.timestamp():.3f}",
            "step": str(step_seconds),
            # VictoriaMetrics' response cache moves the steps to multiples of the step (the hour's start,
            # not its last millisecond), and a run's last hour then comes back empty; `nocache` keeps
            # them where billing asks. Prometheus, Thanos and Mimir ignore it (docs/billing.md §2.3).
            "nocache": "1",
        }
        return functools.partial(
            self._range_result, promql, *self._fetch("/api/v1/query_range", promql, params)
        )

    def _range_result(
        self, promql: str, status: int, content: bytearray
    ) -> Iterable[tuple[dict[str, str], list[list]]]:
        """The answer's series, decoded one at a time as they are read (billing/promjson.py) where
        its layout allows, else decoded whole."""
        split = matrix_series(content) if status == 200 else None
        if split is not None:
            envelope, series = split
            if envelope.get("status") == "success" and envelope["data"].get("resultType") == "matrix":
                return self._checked(promql, series)
        data = self._decode(promql, status, content)
        if data.get("resultType") != "matrix":
            raise BadAnswer(f"expected a range vector from {promql!r}, got {data.get('resultType')!r}")
        try:  # the points' own shape and values are checked as they are read (billing/ingest/columns.py `_columns`)
            return [(item["metric"], item["values"]) for item in _result(data)]
        except (TypeError, KeyError) as exc:
            raise BadAnswer(
                f"{self.base_url}: an answer of the wrong shape to {promql!r}: {_why(exc)}"
            ) from None

    def _checked(self, promql: str, series) -> Iterator[tuple[dict[str, str], list[list]]]:
        try:
            yield from series
        except (orjson.JSONDecodeError, TypeError, KeyError) as exc:
            raise BadAnswer(
                f"{self.base_url}: an answer of the wrong shape to {promql!r}: {_why(exc)}"
            ) from None

    def _post(self, path: str, promql: str, params: dict[str, str]) -> dict:
        return self._decode(promql, *self._fetch(path, promql, params))

    def _fetch(self, path: str, promql: str, params: dict[str, str]) -> tuple[int, bytearray]:
        """(HTTP status, body): the body kept as bytes until it is decoded.

        Read as a stream, so the response never keeps the body itself: an httpx response is part of
        a reference cycle (with its decoder), and one that kept its body held a range answer's tens
        of megabytes until the cyclic collector next ran (issue 17: ~100 MiB of the 1,000-GPU month's
        peak once ingest paused the collector while decoding)."""
        started = self._clock()
        # the whole request within the timeout, and within the run's deadline: httpx's own timeout is
        # per read, so an answer trickled a few bytes at a time was waited on for ever (issue 42)
        until = started + self.timeout
        if self.deadline is not None:
            if started >= self.deadline:
                raise PrometheusUnreachable(
                    f"{self.base_url}: the run's deadline passed; query {promql!r} not sent"
                )
            until = min(until, self.deadline)
        try:
            request = self._client.build_request(
                "POST",
                path,
                data={"query": promql, **params},
                timeout=httpx.Timeout(max(0.001, until - started)),
            )
            response = self._client.send(request, stream=True)
            try:
                # one buffer grown in place: a list of chunks joined at the end held the answer twice
                body, size = bytearray(), 0
                for chunk in response.iter_bytes():
                    size += len(chunk)
                    if size > self.max_answer_bytes:
                        raise BadAnswer(
                            f"{self.base_url}: answer larger than {self.max_answer_bytes} bytes to {promql!r}; refused"
                        )
                    if self._clock() > until:
                        raise PrometheusUnreachable(
                            f"{self.base_url}: answer not complete within {until - started:g} s "
                            f"({size} bytes read) to {promql!r}; given up"
                        )
                    body += chunk
                return response.status_code, body
            finally:
                response.close()
        except httpx.TransportError as exc:  # refused, reset, timed out: nothing answers there
            raise PrometheusUnreachable(
                f"{self.base_url}: {type(exc).__name__}: {redact_url(str(exc))}"
            ) from exc
        except httpx.HTTPError as exc:
            raise PrometheusError(f"{self.base_url}: {type(exc).__name__}: {redact_url(str(exc))}") from exc

    def _decode(self, promql: str, status: int, content: bytes | bytearray) -> dict:
        try:
            body = orjson.loads(content)  # answers of a day run to megabytes: 3x json's speed
        except ValueError:
            raise PrometheusError(f"{self.base_url}: HTTP {status}: not JSON") from None
        if not isinstance(body, dict):
            raise BadAnswer(f"{self.base_url}: HTTP {status}: not a Prometheus answer (query {promql!r})")
        if status != 200 or body.get("status") != "success":
            # the server's own words, shown with repr so control characters cannot reach a terminal
            error = str(body.get("error"))[:500]
            raise PrometheusError(
                f"{self.base_url}: HTTP {status}: {body.get('errorType')!s:.100}: {error!r} (query {promql!r})"
            )
        data = body.get("data")
        if not isinstance(data, dict):
            raise BadAnswer(f"{self.base_url}: HTTP {status}: an answer without data (query {promql!r})")
        return data


def _result(data: dict) -> list:
    result = data.get("result")
    if not isinstance(result, list):
        raise TypeError(f"result is {type(result).__name__}, not a list")
    return result


def _why(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc!s:.200}"


class ReplicaSetClient:
    """The replicas of one HA Prometheus pair (or more), queried side by side and merged.

    Billing's queries are per series, and a replica's external labels are not in its own answers,
    so both replicas answer with the same label sets; a series' value at a step is the largest any
    replica gives (billing then takes ``max by`` the labels it reads, gpumeter/contract/
    HourQuery). A replica that missed scrapes (restarted, lost an hour) answers a smaller count or
    nothing for that hour, and the other replica's fills it. Both missing different parts of the
    same hour is not repaired: the larger part is billed (docs/billing.md §6.2). A replica that
    cannot answer fails the query, as one Prometheus would: the hour is retried later rather than
    billed from one replica that may itself have a gap.
    """

    def __init__(self, base_urls: list[str], **options):
        if len(base_urls) < 2:
            raise ValueError("a replica set needs two or more Prometheus URLs")
        self.replicas = [PrometheusClient(url, **options) for url in base_urls]
        self.url = ",".join(client.url for client in self.replicas)
        self.base_url = ",".join(client.base_url for client in self.replicas)
        first = self.replicas[0]
        self.timeout, self.headers, self.auth = first.timeout, first.headers, first.auth
        self.max_answer_bytes = first.max_answer_bytes
        self.reopenable = True

    @property
    def deadline(self) -> float | None:
        return self.replicas[0].deadline

    @deadline.setter
    def deadline(self, value: float | None) -> None:
        for client in self.replicas:
            client.deadline = value

    def close(self) -> None:
        for client in self.replicas:
            client.close()

    def __enter__(self) -> ReplicaSetClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def query(self, promql: str, at: datetime) -> list[Sample]:
        merged: dict[tuple, Sample] = {}
        for client in self.replicas:
            for sample in client.query(promql, at):
                key = tuple(sorted(sample.labels.items()))
                if key not in merged or sample.value > merged[key].value:
                    merged[key] = sample
        return list(merged.values())

    def query_range(
        self, promql: str, start: datetime, end: datetime, step_seconds: int
    ) -> list[tuple[dict[str, str], list[list]]]:
        return list(self.fetch_range(promql, start, end, step_seconds)())

    def fetch_range(self, promql: str, start: datetime, end: datetime, step_seconds: int) -> RangeAnswer:
        """Every replica's answer fetched now, decoded and merged when the function is called."""
        fetched = [client.fetch_range(promql, start, end, step_seconds) for client in self.replicas]
        return functools.partial(self._merged, fetched)

    @staticmethod
    def _merged(fetched: list[RangeAnswer]) -> list[tuple[dict[str, str], list[list]]]:
        merged: dict[tuple, tuple[dict[str, str], dict[float, list]]] = {}
        for answer in fetched:
            try:
                for labels, points in answer():
                    _, steps = merged.setdefault(tuple(sorted(labels.items())), (labels, {}))
                    for point in points:
                        kept = steps.get(point[0])
                        if kept is None or float(point[1]) > float(kept[1]):
                            steps[point[0]] = point
            except (TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:
                raise BadAnswer(f"a replica's range answer of the wrong shape: {_why(exc)}") from None
        return [(labels, [steps[t] for t in sorted(steps)]) for labels, steps in merged.values()]


def open_client(url: str, **options) -> PrometheusClient | ReplicaSetClient:
    """The client for ``url``: one Prometheus (or Thanos, Mimir, VictoriaMetrics query URL), or,
    given comma-separated URLs, the replicas of an HA pair merged by :class:`ReplicaSetClient`.
    ``options``: `PrometheusClient`'s (timeout, headers, auth, max_answer_bytes, deadline)."""
    urls = [part.strip() for part in url.split(",") if part.strip()]
    if len(urls) > 1:
        return ReplicaSetClient(urls, **options)
    return PrometheusClient(url, **options)


QueryClient = PrometheusClient | ReplicaSetClient  # what billing queries: one URL or a replica set
