"""What the `kube_real` tests share to run the autoscaler as it runs in production: a
ServiceAccount holding only the documented Role of `docs/rbac.yaml` (or that Role less
one verb), a TokenRequest token for it once RBAC allows it, and a record of what a
client sent and what the server answered."""

from __future__ import annotations

import copy
import urllib.parse
from dataclasses import dataclass
from typing import Any

from kubernetes import client

from tpu_autoscaler.controlplane.real_rbac import SERVICE_ACCOUNT, documented_rbac, grant

__all__ = [
    "SERVICE_ACCOUNT",
    "Exchange",
    "documented_rbac",
    "grant",
    "record_requests",
    "role_verbs",
    "without",
]


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
