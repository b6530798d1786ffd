"""What the `kube_real` tests share to run the autoscaler as it runs in production: a
ServiceAccount holding only the documented Role of `docs/rbac.yaml` (or that Role less
one verb), a TokenRequest token for it once RBAC allows it, and a record of what a
client sent and what the server answered."""

from __future__ import annotations

import copy
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from tests.realkube.cluster import RealKube

RBAC_FILE = Path(__file__).parents[2] / "docs" / "rbac.yaml"
SERVICE_ACCOUNT = "tpu-autoscaler-sa"
RBAC_PROPAGATION_S = 15.0


def documented_rbac(namespace: str, service_account: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The Role and RoleBinding of `docs/rbac.yaml`, namespace and subject substituted."""
    documents = [d for d in yaml.safe_load_all(RBAC_FILE.read_text()) if d]
    (role,) = [d for d in documents if d["kind"] == "Role"]
    (binding,) = [d for d in documents if d["kind"] == "RoleBinding"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    role["metadata"]["namespace"] = namespace
    binding["metadata"]["namespace"] = namespace
    (subject,) = binding["subjects"]
    assert subject["kind"] == "ServiceAccount"
    subject.update(name=service_account, namespace=namespace)
    return role, binding


def role_verbs(role: dict[str, Any]) -> list[tuple[str, str]]:
    """(resource, verb) for every verb the Role grants, in the file's order."""
    return [
        (resource, verb)
        for rule in role["rules"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    ]


def without(role: dict[str, Any], resource: str, verb: str) -> dict[str, Any]:
    """`role` less one verb on one resource (a rule left with no verb dropped)."""
    stripped = copy.deepcopy(role)
    rules = []
    for rule in stripped["rules"]:
        if resource in rule["resources"]:
            rule["verbs"] = [v for v in rule["verbs"] if v != verb]
        if rule["verbs"]:
            rules.append(rule)
    stripped["rules"] = rules
    return stripped


def grant(
    admin: client.ApiClient, real_kube: RealKube, role: dict[str, Any], binding: dict[str, Any]
) -> str:
    """Create the ServiceAccount, `role` and `binding`; a TokenRequest token for the
    account, returned once RBAC's cache allows every verb of `role` to it."""
    namespace = role["metadata"]["namespace"]
    core = client.CoreV1Api(admin)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": SERVICE_ACCOUNT}})
    rbac = client.RbacAuthorizationV1Api(admin)
    rbac.create_namespaced_role(namespace, role)
    rbac.create_namespaced_role_binding(namespace, binding)
    request = {"spec": {"expirationSeconds": 3600}}
    answer = core.create_namespaced_service_account_token(SERVICE_ACCOUNT, namespace, request)
    token: str = answer.status.token
    assert token
    wanted = [
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    ]
    with real_kube.api_client(token) as as_account:
        authorization = client.AuthorizationV1Api(as_account)

        def allowed(group: str, resource: str, verb: str) -> bool:
            review = {
                "spec": {
                    "resourceAttributes": {
                        "namespace": namespace,
                        "group": group,
                        "resource": resource,
                        "verb": verb,
                    }
                }
            }
            answer = authorization.create_self_subject_access_review(review)
            return bool(answer.status.allowed)

        deadline = time.monotonic() + RBAC_PROPAGATION_S
        while not all(allowed(*w) for w in wanted):
            assert time.monotonic() < deadline, f"RBAC never allowed {wanted} to the account"
            time.sleep(0.1)
    return token


# --- what a client sent, and what came back -----------------------------------------------


@dataclass(frozen=True)
class Exchange:
    """One request a client sent and the status code of its answer."""

    method: str
    path: str
    body: Any
    status: int


def record_requests(api_client: client.ApiClient) -> list[Exchange]:
    """From now on, every request `api_client` sends and its answer's status, in order
    (a request that got no answer is recorded with status 0)."""
    sent: list[Exchange] = []
    rest = api_client.rest_client
    request = rest.request

    def recording(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        path = urllib.parse.urlsplit(url).path
        try:
            response = request(method, url, *args, **kwargs)
        except BaseException:
            sent.append(Exchange(method, path, kwargs.get("body"), 0))
            raise
        sent.append(Exchange(method, path, kwargs.get("body"), int(response.status)))
        return response

    rest.request = recording
    return sent
