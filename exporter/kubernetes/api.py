"""Read this node's pods (and DRA objects) from the Kubernetes API: authenticated GETs, no client library.

``GET /api/v1/pods?fieldSelector=spec.nodeName=<node>`` with the service account's bearer token and
CA (in-cluster config: KUBERNETES_SERVICE_HOST/PORT and /var/run/secrets/kubernetes.io/serviceaccount);
for Dynamic Resource Allocation the node's ``resource.k8s.io/v1`` ResourceSlices (same field selector)
and single ResourceClaims. The RBAC it needs is ``get``/``list`` on ``pods``, ``resourceslices`` and
``resourceclaims`` (deploy/kubernetes/base/exporter-rbac.yaml). Everything is
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
NOT_FOUND = "http"  # a 404 (a claim deleted meanwhile) counts as an HTTP error


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

    def _get(self, path: str, needs: str, params: dict[str, str] | None = None) -> dict[str, Any]:
        """One GET answered 200 with a JSON object; ``needs`` names the RBAC a 403 lacks."""
        url = f"{self.base_url}{path}"
        try:
            response = self._client.get(url, params=params, headers=self._headers())
        except httpx.HTTPError as exc:
            raise KubeApiError(UNREACHABLE, f"{url}: {type(exc).__name__}: {exc}") from None
        if response.status_code == 401:
            raise KubeApiError(UNAUTHORIZED, f"{url}: 401 Unauthorized (service-account token refused)")
        if response.status_code == 403:
            raise KubeApiError(
                FORBIDDEN, f"{url}: 403 Forbidden (the ServiceAccount needs {needs}: {_status(response)})"
            )
        if response.status_code == 404:
            raise KubeApiError(NOT_FOUND, f"{url}: 404 Not Found: {_status(response)}")
        if response.status_code != 200:
            raise KubeApiError(HTTP, f"{url}: HTTP {response.status_code}: {_status(response)}")
        try:
            body = response.json()
            if not isinstance(body, dict):
                raise TypeError("not a JSON object")
        except (json.JSONDecodeError, TypeError, ValueError) as exc:
            raise KubeApiError(MALFORMED, f"{url}: not a Kubernetes object: {exc}") from None
        return body

    def _items(self, path: str, needs: str, node: str, kind: str) -> list[dict[str, Any]]:
        body = self._get(path, needs, {"fieldSelector": f"spec.nodeName={node}"})
        items = body.get("items")
        if not isinstance(items, list):
            raise KubeApiError(MALFORMED, f"{self.base_url}{path}: not a {kind}: items is not a list")
        return [item for item in items if isinstance(item, dict)]

    def list_pods(self, node: str) -> list[dict[str, Any]]:
        return self._items("/api/v1/pods", "get/list on pods", node, "PodList")

    def list_resource_slices(self, node: str) -> list[dict[str, Any]]:
        """The node's ``resource.k8s.io/v1`` ResourceSlices (cluster-scoped; DRA devices)."""
        return self._items(
            "/apis/resource.k8s.io/v1/resourceslices",
            "get/list on resourceslices.resource.k8s.io",
            node,
            "ResourceSliceList",
        )

    def get_resource_claim(self, namespace: str, name: str) -> dict[str, Any]:
        """One ``resource.k8s.io/v1`` ResourceClaim (its allocation and sharing config)."""
        return self._get(
            f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}",
            "get on resourceclaims.resource.k8s.io",
        )

    def close(self) -> None:
        self._client.close()


def _status(response: httpx.Response) -> str:
    """The message of a Kubernetes Status body, else the start of the body."""
    try:
        return str(response.json().get("message", ""))[:200]
    except (json.JSONDecodeError, ValueError, AttributeError):
        return response.text[:200]
