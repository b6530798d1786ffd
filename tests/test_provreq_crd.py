"""What queued provisioning writes, judged by cluster-autoscaler's real
ProvisioningRequest CRD (`controlplane/crds/`, applied by `provreq_crd` with the
machinery that applies KubeRay's): our requests are admitted as written, the schema's
refusals are kube-apiserver's, the spec is immutable, and the status conditions the
simulated GKE writes are well-formed `metav1.Condition`s."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from tests.test_sim import V6E
from tpu_autoscaler.adapters.kube.provreq_objects import (
    CLASS_ANNOTATION,
    CONSUME_ANNOTATION,
    QUEUED_CLASS,
    parse_request,
    pod_template,
    provisioning_request,
    request_name,
)
from tpu_autoscaler.controlplane import kube120, provreq_crd
from tpu_autoscaler.controlplane.crd_errors import Invalid
from tpu_autoscaler.controlplane.provreq_store import ProvisioningObjects
from tpu_autoscaler.controlplane.store import ObjectStore
from tpu_autoscaler.core import labels
from tpu_autoscaler.core.capacity import CapacityProblem

GROUP = "tpu-v6e-group"


def _cluster_raw() -> dict[str, Any]:
    raw: dict[str, Any] = yaml.safe_load(V6E.read_text())
    raw["metadata"]["uid"] = "0b6c4f0e-1111-4c8e-9a55-2b0c1f3e7d10"
    return raw


def _request(name: str = "r-1", hosts: int = 4) -> dict[str, Any]:
    return provisioning_request(name, _cluster_raw(), GROUP, hosts)


def test_the_crd_is_cluster_autoscalers_with_both_served_versions() -> None:
    crd = provreq_crd.definition()
    assert crd["metadata"]["name"] == "provisioningrequests.autoscaling.x-k8s.io"
    assert [v["name"] for v in crd["spec"]["versions"] if v["served"]] == ["v1", "v1beta1"]
    assert provreq_crd.schema("v1") is not None and provreq_crd.schema("v2") is None


def test_a_kubernetes_1_20_server_needs_no_edit_of_it() -> None:
    """`kube120`'s two edits find nothing to change (no `default: ""`, the list-map key
    `type` is required), so the same document installs on the `kube_real` server."""
    edited, edits = kube120.for_kube_1_20(provreq_crd.definition())
    assert edits.defaults_dropped == () and edits.keys_required == ()
    assert edited == provreq_crd.definition()


def test_our_request_is_admitted_as_written() -> None:
    request = _request()
    assert provreq_crd.validate(request) == []
    stored = provreq_crd.admit(request)
    assert stored["spec"] == request["spec"]
    assert stored["spec"]["provisioningClassName"] == QUEUED_CLASS
    assert stored["spec"]["podSets"] == [{"podTemplateRef": {"name": "r-1"}, "count": 4}]
    assert stored["metadata"]["ownerReferences"][0]["kind"] == "RayCluster"


@given(
    cluster=st.from_regex(r"[a-z]([-a-z0-9]{0,30}[a-z0-9])?", fullmatch=True),
    group=st.from_regex(r"[a-zA-Z]([-_a-zA-Z0-9]{0,30}[a-zA-Z0-9])?", fullmatch=True),
    now_s=st.floats(0, 4e9),
    index=st.integers(0, 64),
)
def test_every_request_name_passes_the_crds_name_pattern(
    cluster: str, group: str, now_s: float, index: int
) -> None:
    name = request_name(cluster, group, now_s, index)
    raw = _cluster_raw()
    raw["metadata"]["name"] = cluster
    raw["spec"]["workerGroupSpecs"][0]["groupName"] = group
    assert provreq_crd.validate(provisioning_request(name, raw, group, 4)) == []


def test_request_names_differ_across_rounds_and_within_one() -> None:
    names = {request_name("c", "g", t, i) for t in (0.0, 0.001, 5.0) for i in range(3)}
    assert len(names) == 9


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda r: r["spec"]["podSets"][0].update(count=0), "spec.podSets[0].count"),
        (lambda r: r["spec"].update(provisioningClassName="Queued"), "spec.provisioningClassName"),
        (lambda r: r["spec"].update(podSets=[]), "spec.podSets"),
        (lambda r: r["spec"]["podSets"][0].pop("podTemplateRef"), "spec.podSets[0].podTemplateRef"),
    ],
)
def test_the_schema_refuses_what_kube_apiserver_refuses(change: Any, field: str) -> None:
    request = _request()
    change(request)
    with pytest.raises(Invalid) as refused:
        provreq_crd.admit(request)
    assert refused.value.kind == "ProvisioningRequest"
    assert refused.value.group == "autoscaling.x-k8s.io"
    assert field in {e.field for e in refused.value.errors}


def test_the_spec_is_immutable_and_the_status_is_the_subresources() -> None:
    stored = provreq_crd.admit(_request())
    changed = copy.deepcopy(stored)
    changed["spec"]["podSets"][0]["count"] = 8
    with pytest.raises(Invalid, match="Value is immutable"):
        provreq_crd.admit(changed, stored)
    with_status = {**stored, "status": {"conditions": []}}
    assert "status" not in provreq_crd.admit(with_status)
    bad = {"type": "Provisioned", "status": "Yes", "reason": "", "message": ""}
    with pytest.raises(Invalid) as refused:
        provreq_crd.admit_status({**stored, "status": {"conditions": [bad]}}, stored)
    fields = {e.field for e in refused.value.errors}
    assert {"status.conditions[0].status", "status.conditions[0].lastTransitionTime"} <= fields


def test_pod_template_is_the_groups_pods_consuming_the_request() -> None:
    raw = _cluster_raw()
    template = pod_template("r-1", raw, GROUP)
    spec = raw["spec"]["workerGroupSpecs"][0]["template"]["spec"]
    assert template["template"]["spec"] == spec  # resources, node selectors: GKE's sizing
    meta = template["template"]["metadata"]
    assert meta["annotations"][CONSUME_ANNOTATION] == "r-1"
    assert meta["annotations"][CLASS_ANNOTATION] == QUEUED_CLASS
    assert meta["labels"][labels.KUBERAY_GROUP] == GROUP
    assert template["metadata"]["name"] == "r-1"


def test_the_simulated_api_server_admits_requests_through_the_crd() -> None:
    objects = ProvisioningObjects(ObjectStore())
    stored = objects.create_provisioning_request("default", {**_request(), "junk": 1})
    assert "junk" not in stored and stored["metadata"]["resourceVersion"]
    bad = _request("r-2")
    bad["spec"]["podSets"][0]["count"] = 0
    with pytest.raises(Invalid):
        objects.create_provisioning_request("default", bad)
    assert [r["metadata"]["name"] for r in objects.list_provisioning_requests("default")] == ["r-1"]


@pytest.mark.parametrize(
    ("condition", "message", "problem"),
    [
        ("Failed", "no capacity", CapacityProblem.STOCKOUT),
        ("Failed", "Quota 'TPUS' exceeded", CapacityProblem.QUOTA),
        ("BookingExpired", "not consumed", CapacityProblem.TIMED_OUT),
        ("CapacityRevoked", "revoked", CapacityProblem.PREEMPTED),
    ],
)
def test_a_request_that_ended_says_what_went_wrong(
    condition: str, message: str, problem: CapacityProblem
) -> None:
    request = provreq_crd.admit(_request())
    at = "2026-12-04T10:00:00Z"
    request["status"] = {
        "conditions": [
            {
                "type": "Accepted",
                "status": "True",
                "reason": "A",
                "message": "",
                "lastTransitionTime": at,
            },
            {
                "type": condition,
                "status": "True",
                "reason": "R",
                "message": message,
                "lastTransitionTime": at,
            },
        ]
    }
    provreq_crd.admit_status(request, provreq_crd.admit(_request()))
    parsed = parse_request(request)
    assert parsed.problem == problem and parsed.group == GROUP and parsed.hosts == 4
    assert parsed.ended is not None and message in parsed.ended[1]
    request["status"]["conditions"][1]["status"] = "False"
    assert parse_request(request).problem is None
