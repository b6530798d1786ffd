"""In-place pod resize against a real kube-apiserver 1.20.2: the `pods/resize`
subresource does not exist there (it came with Kubernetes 1.33), so the project's
client gets NotFound for a pod that exists, and `run`'s resizer turns resizing off
(`shell/resizer.py`): groups named in `ray.io/ippr` then launch pods as without it."""

from __future__ import annotations

import pytest
from kubernetes import client

from tests.realkube.endpoints import pod
from tpu_autoscaler.adapters.kube.api import NotFound
from tpu_autoscaler.adapters.kube.client import KubernetesApi, RetryPolicy

pytestmark = pytest.mark.kube_real


def test_a_1_20_server_has_no_resize_subresource(admin: client.ApiClient, namespace: str) -> None:
    client.CoreV1Api(admin).create_namespaced_pod(namespace, pod(namespace, "grow-me", {"k": "v"}))
    kube = KubernetesApi(admin, RetryPolicy(attempts=1), 30.0)
    grow = [{"op": "replace", "path": "/spec/containers/0/resources/requests/cpu", "value": 2}]
    with pytest.raises(NotFound):
        kube.resize_pod(namespace, "grow-me", grow)
    # The pod is there and can still be annotated (the record Ray's provider keeps).
    kube.annotate_pod(namespace, "grow-me", {"ray.io/ippr-status": "{}"})
    stored = client.CoreV1Api(admin).read_namespaced_pod("grow-me", namespace)
    assert stored.metadata.annotations["ray.io/ippr-status"] == "{}"
