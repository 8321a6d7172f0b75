"""`Api` against a real API server, with the credentials of the `kubernetes` client library:
the pod's service account in a cluster, else $KUBECONFIG (or ~/.kube/config).

Requests are plain JSON over the library's connection pool (its TLS, proxy and token
refresh), so the library's generated classes — whose patch content types change between
releases — are not involved: creates and updates are server-side applies
(`application/apply-patch+yaml`, field manager `fairpool-operator`, forced), status writes
are merge patches of the status subresource.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

from fairpool_operator.api import ApiError, Kind, Objects, kind_of, matches
from fairpool_operator.contract import FIELD_MANAGER


class KubernetesApi:
    """One namespace of a real API server."""

    def __init__(self, namespace: str, api_client: Any | None = None, timeout: float = 15.0):
        self.namespace = namespace
        self.client = api_client if api_client is not None else api_client_from_environment()
        self.timeout = timeout

    def get(self, kind: Kind, name: str) -> dict[str, Any] | None:
        try:
            return self._request("GET", kind.path(self.namespace, name))
        except ApiError as error:
            if error.status == 404:
                return None
            raise

    def list(self, kind: Kind, labels: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
        query = {}
        if labels:
            query["labelSelector"] = ",".join(f"{key}={value}" for key, value in labels.items())
        result = self._request("GET", kind.path(self.namespace), query=query)
        items = result.get("items") or []
        for item in items:  # list items come without apiVersion and kind
            item.setdefault("apiVersion", kind.api_version)
            item.setdefault("kind", kind.kind)
        return [item for item in items if matches(item, labels)]

    def create(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """By server-side apply, so that the operator owns the fields from the start (and a
        later apply drops the fields it no longer renders); a POST where the server cannot
        create by apply (kmock)."""
        try:
            return self.apply(body)
        except ApiError as error:
            if error.status != 404:
                raise
        path = kind_of(body).path(self.namespace)
        return self._request("POST", path, body, query={"fieldManager": FIELD_MANAGER})

    def apply(self, body: Mapping[str, Any]) -> dict[str, Any]:
        path = kind_of(body).path(self.namespace, body["metadata"]["name"])
        query = {"fieldManager": FIELD_MANAGER, "force": "true"}
        return self._request("PATCH", path, body, query, "application/apply-patch+yaml")

    def patch_status(self, kind: Kind, name: str, status: Mapping[str, Any]) -> dict[str, Any]:
        path = kind.path(self.namespace, name, "status")
        body = {"status": dict(status)}
        return self._request("PATCH", path, body, None, "application/merge-patch+json")

    def delete(self, kind: Kind, name: str) -> None:
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
        try:
            self._request("DELETE", kind.path(self.namespace, name), body)
        except ApiError as error:
            if error.status != 404:
                raise

    def nodes(self) -> Objects:
        items = self._request("GET", "/api/v1/nodes").get("items") or []
        for item in items:
            item.setdefault("apiVersion", "v1")
            item.setdefault("kind", "Node")
        return list(items)

    def serves(self, kind: Kind) -> bool:
        """From the API group's discovery document, which every authenticated client may
        read (no RBAC needed): a CRD that is installed and established is listed there."""
        root = "/api" if kind.api_version == "v1" else "/apis"
        try:
            found = self._request("GET", f"{root}/{kind.api_version}")
        except ApiError as error:
            if error.status in (404, 503):  # no such group, or its server is down
                return False
            raise
        return any(item.get("name") == kind.plural for item in found.get("resources") or [])

    def record_event(self, event: Mapping[str, Any]) -> None:
        path = f"/api/v1/namespaces/{self.namespace}/events"
        self._request("POST", path, event, query={"fieldManager": FIELD_MANAGER})

    def _request(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        query: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        configuration = self.client.configuration
        url = configuration.host.rstrip("/") + path
        if query:
            url += "?" + urlencode(query)
        headers = {"Accept": "application/json", "Content-Type": content_type}
        for setting in configuration.auth_settings().values():
            if setting.get("in") == "header" and setting.get("value"):
                headers[setting["key"]] = setting["value"]
        data = json.dumps(body).encode() if body is not None else None
        try:
            response = self.client.rest_client.pool_manager.request(
                method, url, body=data, headers=headers, timeout=self.timeout, retries=False
            )
        except Exception as error:  # urllib3's connection errors
            raise ApiError(0, f"API server unreachable: {error}") from None
        text = response.data.decode("utf-8", "replace")
        if response.status >= 400:
            try:
                message = json.loads(text).get("message", text)
            except (ValueError, AttributeError):
                message = text
            raise ApiError(response.status, str(message)[:500])
        result: dict[str, Any] = json.loads(text) if text else {}
        return result


def api_client_from_environment() -> Any:
    """A `kubernetes` ApiClient for the pod's service account, else the kubeconfig."""
    from kubernetes import client, config

    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    except config.ConfigException:
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=os.environ.get("KUBECONFIG"), client_configuration=configuration
        )
    return client.ApiClient(configuration)
