"""List this node's pods from the Kubernetes API: one authenticated GET, no client library.

``GET /api/v1/pods?fieldSelector=spec.nodeName=<node>`` with the service account's bearer token and
CA (in-cluster config: KUBERNETES_SERVICE_HOST/PORT and /var/run/secrets/kubernetes.io/serviceaccount).
The RBAC it needs is ``get``/``list`` on ``pods`` (deploy/kubernetes/base/rbac.yaml). Everything is
injectable (base URL, token and CA paths, httpx transport) so tests talk to a real stand-in server.
"""

from __future__ import annotations

import json
import os
import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx

__all__ = ["SERVICE_ACCOUNT_DIR", "KubeApiError", "PodLister"]

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")

# the reasons of gpumeter_exporter_kube_api_errors_total
UNREACHABLE, UNAUTHORIZED, FORBIDDEN, HTTP, MALFORMED = (
    "unreachable",
    "unauthorized",
    "forbidden",
    "http",
    "malformed",
)
REASONS = (UNREACHABLE, UNAUTHORIZED, FORBIDDEN, HTTP, MALFORMED)


class KubeApiError(Exception):
    """A pod list that did not come back; ``reason`` is one of REASONS."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


class PodLister:
    """This node's pods, as the API server's PodList items (plain dicts)."""

    def __init__(
        self,
        base_url: str,
        *,
        token_path: str | os.PathLike | None = None,
        ca_path: str | os.PathLike | None = None,
        timeout: float = 2.0,
        transport: httpx.BaseTransport | None = None,
    ):
        self.base_url = base_url.rstrip("/")
        self.token_path = Path(token_path) if token_path else None
        verify: bool | ssl.SSLContext = True
        if ca_path and Path(ca_path).exists():
            verify = ssl.create_default_context(cafile=str(ca_path))
        self._client = httpx.Client(timeout=timeout, verify=verify, transport=transport)

    @classmethod
    def in_cluster(
        cls,
        environ: Mapping[str, str] | None = None,
        service_account: str | os.PathLike = SERVICE_ACCOUNT_DIR,
        **kwargs: Any,
    ) -> PodLister:
        """The API server a pod reaches: KUBERNETES_SERVICE_HOST/PORT, the service account's token and CA."""
        environ = os.environ if environ is None else environ
        host, port = environ.get("KUBERNETES_SERVICE_HOST"), environ.get("KUBERNETES_SERVICE_PORT", "443")
        if not host:
            raise KubeApiError(UNREACHABLE, "not in a cluster: KUBERNETES_SERVICE_HOST is not set")
        if ":" in host:  # an IPv6 service address
            host = f"[{host}]"
        sa = Path(service_account)
        return cls(f"https://{host}:{port}", token_path=sa / "token", ca_path=sa / "ca.crt", **kwargs)

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if self.token_path is not None:
            # read on every call: the kubelet rotates bound service-account tokens in place
            try:
                token = self.token_path.read_text(encoding="utf-8").strip()
            except OSError as exc:
                raise KubeApiError(
                    UNAUTHORIZED, f"cannot read token {self.token_path}: {exc.strerror}"
                ) from None
            headers["Authorization"] = f"Bearer {token}"
        return headers

    def list_pods(self, node: str) -> list[dict[str, Any]]:
        url = f"{self.base_url}/api/v1/pods"
        try:
            response = self._client.get(
                url, params={"fieldSelector": f"spec.nodeName={node}"}, headers=self._headers()
            )
        except httpx.HTTPError as exc:
            raise KubeApiError(UNREACHABLE, f"{url}: {type(exc).__name__}: {exc}") from None
        if response.status_code == 401:
            raise KubeApiError(UNAUTHORIZED, f"{url}: 401 Unauthorized (service-account token refused)")
        if response.status_code == 403:
            raise KubeApiError(
                FORBIDDEN,
                f"{url}: 403 Forbidden (the ServiceAccount needs get/list on pods: {_status(response)})",
            )
        if response.status_code != 200:
            raise KubeApiError(HTTP, f"{url}: HTTP {response.status_code}: {_status(response)}")
        try:
            body = response.json()
            items = body["items"]
            if not isinstance(items, list):
                raise TypeError("items is not a list")
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise KubeApiError(MALFORMED, f"{url}: not a PodList: {exc}") from None
        return [item for item in items if isinstance(item, dict)]

    def close(self) -> None:
        self._client.close()


def _status(response: httpx.Response) -> str:
    """The message of a Kubernetes Status body, else the start of the body."""
    try:
        return str(response.json().get("message", ""))[:200]
    except (json.JSONDecodeError, ValueError, AttributeError):
        return response.text[:200]
