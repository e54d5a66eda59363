"""A minimal Prometheus HTTP API client: instant (`/api/v1/query`) and range (`/api/v1/query_range`) queries.

Hand-rolled on purpose: the Python PromQL clients on PyPI are either unmaintained
(`prometheus-api-client` pulls in matplotlib/pandas stacks and has gone long stretches without
releases) or wrap far more than we need; billing needs two endpoints, exact error reporting, and an
injectable httpx transport for tests. The same API is served by Thanos, Mimir and VictoriaMetrics.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import datetime
from typing import NamedTuple

import httpx
import orjson


class PrometheusError(RuntimeError):
    """Prometheus could not answer a query (connection, HTTP or PromQL error)."""


class Sample(NamedTuple):
    labels: dict[str, str]
    value: float


# A range answer fetched, not yet decoded: calling it decodes it (PrometheusError if it is an error).
RangeAnswer = Callable[[], list[tuple[dict[str, str], list[list]]]]


class PrometheusClient:
    def __init__(
        self,
        base_url: str,
        *,
        transport: httpx.BaseTransport | None = None,
        timeout: float = 120.0,
        headers: dict[str, str] | None = None,
    ):
        self.base_url = base_url.rstrip("/")
        self.timeout, self.headers = timeout, dict(headers or {})
        self.reopenable = transport is None  # another process can open the same client (ingest workers)
        self._client = httpx.Client(
            base_url=self.base_url, transport=transport, timeout=timeout, headers=headers or {}
        )

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
            raise PrometheusError(f"expected an instant vector from {promql!r}, got {data.get('resultType')}")
        return [Sample(item["metric"], float(item["value"][1])) for item in data["result"]]

    def query_range(
        self, promql: str, start: datetime, end: datetime, step_seconds: int
    ) -> list[tuple[dict[str, str], list[list]]]:
        """Evaluate ``promql`` at start, start + step, ... ≤ end in one request (a range query).

        Each step is evaluated exactly as an instant query at that time would be; a series only has
        points at the steps where it has a value. Returned as Prometheus sends it, (labels,
        [[unix seconds, "value"], ...]) per series: the caller converts only what it keeps.
        """
        return self.fetch_range(promql, start, end, step_seconds)()

    def fetch_range(self, promql: str, start: datetime, end: datetime, step_seconds: int) -> RangeAnswer:
        """`query_range` in two halves: the request now, the answer's decoding when the returned
        function is called. Ingest waits on Prometheus in a thread and decodes in the one that
        builds the hours, so that only one thread runs Python at a time (docs/billing.md §6)."""
        params = {
            "start": f"{start.timestamp():.3f}",
            "end": f"{end.timestamp():.3f}",
            "step": str(step_seconds),
        }
        return functools.partial(
            self._range_result, promql, *self._fetch("/api/v1/query_range", promql, params)
        )

    def _range_result(
        self, promql: str, status: int, content: bytes
    ) -> list[tuple[dict[str, str], list[list]]]:
        data = self._decode(promql, status, content)
        if data.get("resultType") != "matrix":
            raise PrometheusError(f"expected a range vector from {promql!r}, got {data.get('resultType')}")
        return [(item["metric"], item["values"]) for item in data["result"]]

    def _post(self, path: str, promql: str, params: dict[str, str]) -> dict:
        return self._decode(promql, *self._fetch(path, promql, params))

    def _fetch(self, path: str, promql: str, params: dict[str, str]) -> tuple[int, bytes]:
        """(HTTP status, body): the body kept as bytes until it is decoded.

        Read as a stream, so the response never keeps the body itself: an httpx response is part of
        a reference cycle (with its decoder), and one that kept its body held a range answer's tens
        of megabytes until the cyclic collector next ran (issue 17: ~100 MiB of the 1,000-GPU month's
        peak once ingest paused the collector while decoding)."""
        try:
            request = self._client.build_request("POST", path, data={"query": promql, **params})
            response = self._client.send(request, stream=True)
            try:
                return response.status_code, b"".join(response.iter_bytes())
            finally:
                response.close()
        except httpx.HTTPError as exc:
            raise PrometheusError(f"{self.base_url}: {type(exc).__name__}: {exc}") from exc

    def _decode(self, promql: str, status: int, content: bytes) -> dict:
        try:
            body = orjson.loads(content)  # answers of a day run to megabytes: 3x json's speed
        except ValueError:
            raise PrometheusError(f"{self.base_url}: HTTP {status}: not JSON") from None
        if status != 200 or body.get("status") != "success":
            raise PrometheusError(
                f"{self.base_url}: HTTP {status}: {body.get('errorType')}: {body.get('error')} "
                f"(query {promql!r})"
            )
        return body["data"]


class ReplicaSetClient:
    """The replicas of one HA Prometheus pair (or more), queried side by side and merged.

    Billing's queries are per series, and a replica's external labels are not in its own answers,
    so both replicas answer with the same label sets; a series' value at a step is the largest any
    replica gives (billing then takes ``max by`` the labels it reads, gpumeter/contract.py
    HourQuery). A replica that missed scrapes (restarted, lost an hour) answers a smaller count or
    nothing for that hour, and the other replica's fills it. Both missing different parts of the
    same hour is not repaired: the larger part is billed (docs/billing.md §6.2). A replica that
    cannot answer fails the query, as one Prometheus would: the hour is retried later rather than
    billed from one replica that may itself have a gap.
    """

    def __init__(
        self, base_urls: list[str], *, timeout: float = 120.0, headers: dict[str, str] | None = None
    ):
        if len(base_urls) < 2:
            raise ValueError("a replica set needs two or more Prometheus URLs")
        self.replicas = [PrometheusClient(url, timeout=timeout, headers=headers) for url in base_urls]
        self.base_url = ",".join(client.base_url for client in self.replicas)
        self.timeout, self.headers = timeout, dict(headers or {})
        self.reopenable = True

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
        return self.fetch_range(promql, start, end, step_seconds)()

    def fetch_range(self, promql: str, start: datetime, end: datetime, step_seconds: int) -> RangeAnswer:
        """Every replica's answer fetched now, decoded and merged when the function is called."""
        fetched = [client.fetch_range(promql, start, end, step_seconds) for client in self.replicas]
        return functools.partial(self._merged, fetched)

    @staticmethod
    def _merged(fetched: list[RangeAnswer]) -> list[tuple[dict[str, str], list[list]]]:
        merged: dict[tuple, tuple[dict[str, str], dict[float, list]]] = {}
        for answer in fetched:
            for labels, points in answer():
                _, steps = merged.setdefault(tuple(sorted(labels.items())), (labels, {}))
                for point in points:
                    kept = steps.get(point[0])
                    if kept is None or float(point[1]) > float(kept[1]):
                        steps[point[0]] = point
        return [(labels, [steps[t] for t in sorted(steps)]) for labels, steps in merged.values()]


def open_client(
    url: str, *, timeout: float = 120.0, headers: dict[str, str] | None = None
) -> PrometheusClient | ReplicaSetClient:
    """The client for ``url``: one Prometheus (or Thanos, Mimir, VictoriaMetrics query URL), or,
    given comma-separated URLs, the replicas of an HA pair merged by :class:`ReplicaSetClient`."""
    urls = [part.strip() for part in url.split(",") if part.strip()]
    if len(urls) > 1:
        return ReplicaSetClient(urls, timeout=timeout, headers=headers)
    return PrometheusClient(url, timeout=timeout, headers=headers)


QueryClient = PrometheusClient | ReplicaSetClient  # what billing queries: one URL or a replica set
