"""`record`'s slice launches against a real kube-apiserver 1.20.2: the `ReplicaUp` Event
the autoscaler writes with nothing but the Role of `docs/rbac.yaml` keeps its
annotations, and `record`'s field selector (the RayCluster's name and the reason,
both selectable fields of core/v1 Events) picks it and nothing else."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client

from tests.realkube.endpoints import NAME
from tests.realkube.service_account import SERVICE_ACCOUNT, documented_rbac, grant
from tests.realkube.test_rbac import World
from tpu_autoscaler.adapters.kube.client import KubernetesApi, RetryPolicy
from tpu_autoscaler.cli.record import launches_told
from tpu_autoscaler.record.history import SliceLaunch
from tpu_autoscaler.shell import events
from tpu_autoscaler.shell.readiness import ReplicaUp

pytestmark = pytest.mark.kube_real


def test_a_replica_up_event_written_under_the_role_is_read_back_by_record(
    real_kube: Any,
    admin: client.ApiClient,
    namespace: str,
    account_client: Callable[[str], client.ApiClient],
) -> None:
    role, binding = documented_rbac(namespace, SERVICE_ACCOUNT)
    world = World(admin, namespace, account_client(grant(admin, real_kube, role, binding)))
    autoscaler_kube = KubernetesApi(world.account, RetryPolicy(attempts=1), 30.0)
    raw = world.created
    up = ReplicaUp("tpu-v6e-group", "tpu-v6e-group-q7rcl", "tpu-v6e-16-0", 4, 1800.5, 1861, 1885)
    told = events.cluster_event(
        raw, events.REPLICA_UP, up.message(), "Normal", world.clock.now, up.annotations()
    )
    autoscaler_kube.create_event(namespace, told)
    # Not launches: another reason on the RayCluster, and the same reason elsewhere.
    other = events.cluster_event(
        raw, events.LAUNCH, "launching", "Normal", world.clock.now, up.annotations()
    )
    autoscaler_kube.create_event(namespace, other)
    elsewhere = {**raw, "metadata": {**raw["metadata"], "name": "another-cluster"}}
    autoscaler_kube.create_event(
        namespace,
        events.cluster_event(
            elsewhere, events.REPLICA_UP, up.message(), "Normal", world.clock.now, up.annotations()
        ),
    )

    launches = launches_told(KubernetesApi(admin, RetryPolicy(attempts=1), 30.0), namespace, NAME)
    assert launches == [
        SliceLaunch(
            slice_name="tpu-v6e-16-0",
            replica="tpu-v6e-group-q7rcl",
            group="tpu-v6e-group",
            first_pod_created_ms=1_800_500.0,
        )
    ]
