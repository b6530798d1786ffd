"""GKE queued provisioning as the Kubernetes adapter writes and reads it: a slice's
capacity asked for with a `ProvisioningRequest` (cluster-autoscaler's API
`autoscaling.x-k8s.io/v1`, class `queued-provisioning.gke.io`) whose one pod set
refers to a `PodTemplate` of the group's pods, `count` = the slice's hosts; the
request's conditions read back; and the API both live in (`ProvisioningApi`, given by
the simulated API server and by `provreq_client.py`). docs/queued-provisioning.md
says how pods consume a request and what works with KubeRay 1.7."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

from tpu_autoscaler.adapters.kube.pods import timestamp_s
from tpu_autoscaler.core import labels
from tpu_autoscaler.core.capacity import ANNOTATION_PREFIX, CapacityProblem

API_VERSION: Final = "autoscaling.x-k8s.io/v1"
QUEUED_CLASS: Final = "queued-provisioning.gke.io"
CONSUME_ANNOTATION: Final = "autoscaling.x-k8s.io/consume-provisioning-request"
"""On a pod: the name of the request whose capacity it takes (cluster-autoscaler
`apis/provisioningrequest/autoscaling.x-k8s.io/v1/types.go`)."""
CLASS_ANNOTATION: Final = "autoscaling.x-k8s.io/provisioning-class-name"
"""On a pod, beside `CONSUME_ANNOTATION`: both are required."""
PROVISIONING_REQUESTED: Final = "ProvisioningRequested"
PROVISIONING_ENDED: Final = "ProvisioningRequestEnded"
"""Reasons of the Events recorded on the RayCluster for a request made, and for one
that ended (Failed, BookingExpired, CapacityRevoked) and was deleted."""
CLUSTER_LABEL: Final = ANNOTATION_PREFIX + "raycluster"
GROUP_LABEL: Final = ANNOTATION_PREFIX + "group"

FAILURES: Final = {
    "Failed": CapacityProblem.STOCKOUT,
    "BookingExpired": CapacityProblem.TIMED_OUT,
    "CapacityRevoked": CapacityProblem.PREEMPTED,
}
"""The conditions that end a request, and what each says about the group's capacity
(a `Failed` whose reason or message names a quota is `QUOTA`)."""


class ProvisioningApi(Protocol):
    """The calls queued provisioning makes, on top of `KubeApi`'s."""

    def list_provisioning_requests(
        self, namespace: str, selector: dict[str, str] | None = None
    ) -> list[dict[str, Any]]: ...

    def create_provisioning_request(
        self, namespace: str, obj: Mapping[str, Any]
    ) -> dict[str, Any]: ...

    def delete_provisioning_request(self, namespace: str, name: str) -> None: ...

    def list_pod_templates(
        self, namespace: str, selector: dict[str, str] | None = None
    ) -> list[dict[str, Any]]: ...

    def create_pod_template(self, namespace: str, obj: Mapping[str, Any]) -> dict[str, Any]: ...

    def delete_pod_template(self, namespace: str, name: str) -> None: ...


@dataclass(frozen=True, slots=True)
class QueuedRequest:
    """One of our ProvisioningRequests as read: for which group, how many hosts, and
    where it stands."""

    name: str
    group: str
    hosts: int
    created_s: float
    provisioned: bool
    ended: tuple[str, str, float] | None
    """The condition that ended it (type, message, when), if one has."""

    @property
    def problem(self) -> CapacityProblem | None:
        if self.ended is None:
            return None
        condition, message, _ = self.ended
        if condition == "Failed" and "quota" in message.lower():
            return CapacityProblem.QUOTA
        return FAILURES[condition]


def parse_request(raw: Mapping[str, Any]) -> QueuedRequest:
    meta = raw.get("metadata") or {}
    pod_sets = (raw.get("spec") or {}).get("podSets") or [{}]
    conditions = {c.get("type"): c for c in (raw.get("status") or {}).get("conditions") or [] if c}
    ended = None
    for kind in FAILURES:
        condition = conditions.get(kind)
        if condition is not None and condition.get("status") == "True":
            at_s = timestamp_s(condition.get("lastTransitionTime")) or 0.0
            text = f"{kind}: {condition.get('reason', '')}: {condition.get('message', '')}"
            ended = (kind, text, at_s)
            break
    provisioned = (conditions.get("Provisioned") or {}).get("status") == "True"
    return QueuedRequest(
        name=str(meta.get("name", "")),
        group=str((meta.get("labels") or {}).get(GROUP_LABEL, "")),
        hosts=int(pod_sets[0].get("count", 0)),
        created_s=timestamp_s(meta.get("creationTimestamp")) or 0.0,
        provisioned=provisioned,
        ended=ended,
    )


def request_name(cluster: str, group: str, now_s: float, index: int) -> str:
    """A name unique over time (milliseconds, base 36) and within a round (`index`),
    a DNS subdomain as the CRD's `podTemplateRef.name` pattern wants."""
    stamp = _base36(int(now_s * 1000))
    return f"{cluster}-{group}-q{stamp}{index}".lower().replace("_", "-")[:253]


def _base36(number: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    text = ""
    while True:
        number, digit = divmod(number, 36)
        text = digits[digit] + text
        if number == 0:
            return text


def owned_labels(cluster: str, group: str) -> dict[str, str]:
    return {CLUSTER_LABEL: cluster, GROUP_LABEL: group}


def pod_template(
    name: str,
    cluster_raw: Mapping[str, Any],
    group: str,
) -> dict[str, Any]:
    """The PodTemplate a request refers to: the group's pod template as the
    RayCluster has it (resources, node selectors, tolerations: what GKE sizes the
    nodes by), labelled as KubeRay labels the group's pods, with the consume
    annotations naming `name`; owned by the RayCluster, so it goes with it."""
    cluster_meta = cluster_raw.get("metadata") or {}
    cluster = str(cluster_meta.get("name", ""))
    spec = next(g for g in cluster_raw["spec"]["workerGroupSpecs"] if g.get("groupName") == group)
    template = copy.deepcopy(spec.get("template") or {})
    meta = template.setdefault("metadata", {})
    meta["labels"] = {
        **(meta.get("labels") or {}),
        labels.KUBERAY_CLUSTER: cluster,
        labels.KUBERAY_GROUP: group,
    }
    meta["annotations"] = {
        **(meta.get("annotations") or {}),
        CONSUME_ANNOTATION: name,
        CLASS_ANNOTATION: QUEUED_CLASS,
    }
    return {
        "apiVersion": "v1",
        "kind": "PodTemplate",
        "metadata": _metadata(name, cluster_meta, group),
        "template": template,
    }


def provisioning_request(
    name: str, cluster_raw: Mapping[str, Any], group: str, hosts: int
) -> dict[str, Any]:
    """The request for one slice: `hosts` pods of the PodTemplate named `name`."""
    return {
        "apiVersion": API_VERSION,
        "kind": "ProvisioningRequest",
        "metadata": _metadata(name, cluster_raw.get("metadata") or {}, group),
        "spec": {
            "provisioningClassName": QUEUED_CLASS,
            "podSets": [{"podTemplateRef": {"name": name}, "count": hosts}],
        },
    }


def _metadata(name: str, cluster_meta: Mapping[str, Any], group: str) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "labels": owned_labels(str(cluster_meta.get("name", "")), group),
    }
    if cluster_meta.get("uid"):
        meta["ownerReferences"] = [
            {
                "apiVersion": "ray.io/v1",
                "kind": "RayCluster",
                "name": cluster_meta.get("name", ""),
                "uid": cluster_meta["uid"],
            }
        ]
    return meta
