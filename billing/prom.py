"""A minimal Prometheus HTTP API client: instant (`/api/v1/query`) and range (`/api/v1/query_range`) queries.

Hand-rolled on purpose: the Python PromQL clients on PyPI are either unmaintained
(`prometheus-api-client` pulls in matplotlib/pandas stacks and has gone long stretches without
releases) or wrap far more than we need; billing needs two endpoints, exact error reporting, and an
injectable httpx transport for tests. The same API is served by Thanos, Mimir and VictoriaMetrics.
"""

from __future__ import annotations

from datetime import datetime
from typing import NamedTuple

import httpx


class PrometheusError(RuntimeError):
    """Prometheus could not answer a query (connection, HTTP or PromQL error)."""


class Sample(NamedTuple):
    labels: dict[str, str]
    value: float


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
        data = self._post(
            "/api/v1/query_range",
            promql,
            {"start": f"{start.timestamp():.3f}", "end": f"{end.timestamp():.3f}", "step": str(step_seconds)},
        )
        if data.get("resultType") != "matrix":
            raise PrometheusError(f"expected a range vector from {promql!r}, got {data.get('resultType')}")
        return [(item["metric"], item["values"]) for item in data["result"]]

    def _post(self, path: str, promql: str, params: dict[str, str]) -> dict:
        try:
            response = self._client.post(path, data={"query": promql, **params})
        except httpx.HTTPError as exc:
            raise PrometheusError(f"{self.base_url}: {type(exc).__name__}: {exc}") from exc
        try:
            body = response.json()
        except ValueError:
            raise PrometheusError(f"{self.base_url}: HTTP {response.status_code}: not JSON") from None
        if response.status_code != 200 or body.get("status") != "success":
            raise PrometheusError(
                f"{self.base_url}: HTTP {response.status_code}: {body.get('errorType')}: {body.get('error')} "
                f"(query {promql!r})"
            )
        return body["data"]
