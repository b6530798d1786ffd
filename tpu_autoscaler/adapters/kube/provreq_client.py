"""`ProvisioningApi` over HTTP, on `KubernetesApi`'s retries and errors: our
ProvisioningRequests (`autoscaling.x-k8s.io/v1`) and PodTemplates, listed by label,
created, deleted. Names are chosen by the client, so a create resent after a lost
answer meets its first copy (409, counted as created) and a delete resent meets 404
(the adapter takes NotFound for done)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tpu_autoscaler.adapters.kube.client import KubernetesApi
from tpu_autoscaler.adapters.kube.provreq_objects import API_VERSION

_GROUP, _, _VERSION = API_VERSION.partition("/")
_PLURAL = "provisioningrequests"


class KubernetesProvisioningApi:
    def __init__(self, kube: KubernetesApi) -> None:
        self.kube = kube

    def list_provisioning_requests(
        self, namespace: str, selector: dict[str, str] | None = None
    ) -> list[dict[str, Any]]:
        body = self.kube._call(
            f"provisioningrequests in {namespace}",
            lambda: self.kube._objects.list_namespaced_custom_object(
                _GROUP,
                _VERSION,
                namespace,
                _PLURAL,
                label_selector=_selector(selector),
                _preload_content=False,
                _request_timeout=self.kube.timeout_s,
            ),
        )
        items: list[dict[str, Any]] = body.get("items") or []
        return items

    def create_provisioning_request(self, namespace: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        created: dict[str, Any] = self.kube._call(
            f"provisioningrequest {namespace}/{obj['metadata']['name']}",
            lambda: self.kube._objects.create_namespaced_custom_object(
                _GROUP,
                _VERSION,
                namespace,
                _PLURAL,
                dict(obj),
                _preload_content=False,
                _request_timeout=self.kube.timeout_s,
            ),
            created_if_exists=True,
        )
        return created or dict(obj)

    def delete_provisioning_request(self, namespace: str, name: str) -> None:
        self.kube._call(
            f"provisioningrequest {namespace}/{name}",
            lambda: self.kube._objects.delete_namespaced_custom_object(
                _GROUP,
                _VERSION,
                namespace,
                _PLURAL,
                name,
                _preload_content=False,
                _request_timeout=self.kube.timeout_s,
            ),
        )

    def list_pod_templates(
        self, namespace: str, selector: dict[str, str] | None = None
    ) -> list[dict[str, Any]]:
        body = self.kube._call(
            f"podtemplates in {namespace}",
            lambda: self.kube._core.list_namespaced_pod_template(
                namespace,
                label_selector=_selector(selector),
                _preload_content=False,
                _request_timeout=self.kube.timeout_s,
            ),
        )
        items: list[dict[str, Any]] = body.get("items") or []
        return items

    def create_pod_template(self, namespace: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        created: dict[str, Any] = self.kube._call(
            f"podtemplate {namespace}/{obj['metadata']['name']}",
            lambda: self.kube._post(f"/api/v1/namespaces/{namespace}/podtemplates", dict(obj)),
            created_if_exists=True,
        )
        return created or dict(obj)

    def delete_pod_template(self, namespace: str, name: str) -> None:
        self.kube._call(
            f"podtemplate {namespace}/{name}",
            lambda: self.kube._core.delete_namespaced_pod_template(
                name,
                namespace,
                _preload_content=False,
                _request_timeout=self.kube.timeout_s,
            ),
        )


def _selector(selector: Mapping[str, str] | None) -> str | None:
    return ",".join(f"{k}={v}" for k, v in (selector or {}).items()) or None
