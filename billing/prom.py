"""A minimal Prometheus HTTP API client: instant queries (`/api/v1/query`) only.

Hand-rolled on purpose: the Python PromQL clients on PyPI are either unmaintained
(`prometheus-api-client` pulls in matplotlib/pandas stacks and has gone long stretches without
releases) or wrap far more than we need; billing needs one endpoint, exact error reporting, and an
injectable httpx transport for tests. The same API is served by Thanos, Mimir and VictoriaMetrics.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import httpx


class PrometheusError(RuntimeError):
    """Prometheus could not answer a query (connection, HTTP or PromQL error)."""


@dataclass(frozen=True)
class Sample:
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
        try:
            response = self._client.post(
                "/api/v1/query", data={"query": promql, "time": f"{at.timestamp():.3f}"}
            )
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
        data = body["data"]
        if data.get("resultType") != "vector":
            raise PrometheusError(f"expected an instant vector from {promql!r}, got {data.get('resultType')}")
        return [Sample(item["metric"], float(item["value"][1])) for item in data["result"]]
