"""Capacity signals with nothing but the Role of `docs/rbac.yaml`, against a real
kube-apiserver 1.20.2 with RBAC on: the service account's token lists the Events
about pods (the FailedScaleUp Events GKE's cluster-autoscaler records, here written
by the admin as it would) and the round reads them into the snapshot's signals;
what the Role does not grant on Events (another namespace's, a watch, a change, a
deletion) is refused with 403 Forbidden."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.realkube.endpoints import GROUP, NAME
from tests.realkube.service_account import SERVICE_ACCOUNT, documented_rbac, grant
from tests.realkube.test_rbac import HOSTS, World
from tpu_autoscaler.adapters.kube.capacity_events import POD_EVENTS, parse_events
from tpu_autoscaler.adapters.kube.client import KubernetesApi, RetryPolicy
from tpu_autoscaler.adapters.kube.observe import Observer
from tpu_autoscaler.adapters.ray.gcs import read_ray_state
from tpu_autoscaler.adapters.snapshot_file import assemble
from tpu_autoscaler.controlplane import gke_events
from tpu_autoscaler.core import labels
from tpu_autoscaler.core.capacity import CapacityProblem

pytestmark = pytest.mark.kube_real


def _pending_slice(world: World, replica: str) -> list[dict[str, Any]]:
    """KubeRay's pods of a replica whose VMs GKE could not get: created, unbound."""
    core = client.CoreV1Api(world.admin)
    made = []
    for host in range(HOSTS):
        pod = {
            "metadata": {
                "name": f"{replica}-{host}",
                "labels": {
                    labels.KUBERAY_CLUSTER: NAME,
                    labels.KUBERAY_GROUP: GROUP,
                    labels.KUBERAY_NODE_TYPE: "worker",
                    labels.KUBERAY_REPLICA_NAME: replica,
                    labels.KUBERAY_HOST_INDEX: str(host),
                },
            },
            "spec": {"containers": [{"name": "ray-worker", "image": "rayproject/ray:2.60.0"}]},
        }
        created = core.create_namespaced_pod(world.namespace, pod)
        made.append(world.admin.sanitize_for_serialization(created))
    return made


def test_the_documented_role_reads_failed_scale_ups_into_signals_and_no_more(
    real_kube: Any,  # RealKube (tests/realkube/cluster.py, moving to controlplane/real_kube.py)
    admin: client.ApiClient,
    namespace: str,
    account_client: Callable[[str], client.ApiClient],
) -> None:
    role, binding = documented_rbac(namespace, SERVICE_ACCOUNT)
    account = account_client(grant(admin, real_kube, role, binding))
    world = World(admin, namespace, account)
    world.demand_a_slice()
    assert world.step().applied
    pods = _pending_slice(world, "tpu-v6e-group-0")
    message = gke_events.failed_scale_up_message(gke_events.SCALE_UP_REASONS["stockout"])
    core = client.CoreV1Api(admin)
    for pod in pods:
        core.create_namespaced_event(
            namespace, gke_events.failed_scale_up(pod, message, world.clock.now)
        )

    kube = KubernetesApi(account, RetryPolicy(attempts=1), 30.0)
    listed = kube.list_events(namespace, POD_EVENTS)
    assert sorted(e["involvedObject"]["name"] for e in listed) == sorted(
        p["metadata"]["name"] for p in pods
    )
    observed = Observer(namespace, NAME).read(kube, events=True)
    assert observed.events_error is None
    loaded = assemble(
        observed.cluster,
        list(observed.pods),
        read_ray_state(world.ray),
        world.clock.now,
        events=parse_events(observed.events),
    )
    (signal,) = loaded.snapshot.capacity_signals
    assert (signal.group, signal.problem, signal.message) == (
        GROUP,
        CapacityProblem.STOCKOUT,
        message,
    )
    settled = world.step()
    assert settled.applied and settled.error is None, settled.error
    assert world.api_errors("list_events") == 0

    elsewhere = f"{namespace[:50]}-other"
    account_core = client.CoreV1Api(account)
    event_name = listed[0]["metadata"]["name"]
    attempts: dict[str, Callable[[], Any]] = {
        "list the Events of another namespace": lambda: account_core.list_namespaced_event(
            elsewhere, _preload_content=False
        ),
        "watch Events": lambda: account_core.list_namespaced_event(
            namespace, watch=True, timeout_seconds=1, _preload_content=False
        ),
        "change an Event": lambda: account_core.patch_namespaced_event(
            event_name, namespace, {"message": "nothing to see"}
        ),
        "delete an Event": lambda: account_core.delete_namespaced_event(event_name, namespace),
    }
    outcomes = {}
    for what, attempt in attempts.items():
        try:
            attempt()
        except ApiException as exc:
            reason = json.loads(exc.body).get("reason") if exc.body else exc.reason
            outcomes[what] = f"{exc.status} {reason}"
        else:
            outcomes[what] = "ALLOWED"
    assert outcomes == dict.fromkeys(attempts, "403 Forbidden")
