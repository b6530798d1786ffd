"""The autoscaler's only credential on a real API server, as in production: a
ServiceAccount bound to the documented Role of `docs/rbac.yaml` (or a variant a test
makes of it), and a TokenRequest token for it, handed out once RBAC allows every verb
of the Role to the account."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from tpu_autoscaler.controlplane.real_kube import RealKube

RBAC_FILE = Path(__file__).parents[2] / "docs" / "rbac.yaml"
"""The documented Role and RoleBinding (in a source checkout, beside the package)."""
SERVICE_ACCOUNT = "tpu-autoscaler-sa"
RBAC_PROPAGATION_S = 15.0
TOKEN_LIFETIME_S = 24 * 3600


def documented_rbac(namespace: str, service_account: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The Role and RoleBinding of `docs/rbac.yaml`, namespace and subject substituted."""
    if not RBAC_FILE.is_file():
        raise FileNotFoundError(
            f"{RBAC_FILE}: the documented Role is read from a source checkout of tpu-autoscaler"
        )
    documents = [d for d in yaml.safe_load_all(RBAC_FILE.read_text()) if d]
    (role,) = [d for d in documents if d["kind"] == "Role"]
    (binding,) = [d for d in documents if d["kind"] == "RoleBinding"]
    if binding["roleRef"]["name"] != role["metadata"]["name"]:
        raise ValueError(f"{RBAC_FILE}: the RoleBinding does not bind the Role")
    role["metadata"]["namespace"] = namespace
    binding["metadata"]["namespace"] = namespace
    (subject,) = binding["subjects"]
    if subject["kind"] != "ServiceAccount":
        raise ValueError(f"{RBAC_FILE}: the RoleBinding's subject is not a ServiceAccount")
    subject.update(name=service_account, namespace=namespace)
    return role, binding


def grant(
    admin: client.ApiClient,
    real_kube: RealKube,
    role: dict[str, Any],
    binding: dict[str, Any],
    lifetime_s: int = TOKEN_LIFETIME_S,
) -> str:
    """Create the ServiceAccount, `role` and `binding`; a TokenRequest token for the
    account, returned once RBAC's cache allows every verb of `role` to it."""
    namespace = role["metadata"]["namespace"]
    core = client.CoreV1Api(admin)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": SERVICE_ACCOUNT}})
    rbac = client.RbacAuthorizationV1Api(admin)
    rbac.create_namespaced_role(namespace, role)
    rbac.create_namespaced_role_binding(namespace, binding)
    request = {"spec": {"expirationSeconds": lifetime_s}}
    answer = core.create_namespaced_service_account_token(SERVICE_ACCOUNT, namespace, request)
    token: str = answer.status.token
    if not token:
        raise RuntimeError(f"TokenRequest for {namespace}/{SERVICE_ACCOUNT} returned no token")
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
            if time.monotonic() > deadline:
                raise RuntimeError(f"RBAC never allowed {wanted} to {namespace}/{SERVICE_ACCOUNT}")
            time.sleep(0.1)
    return token
