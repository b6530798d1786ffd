"""Which of Ray's worker instances its v2 scheduler calls outdated, when its launch
config check is on (`disable_launch_config_check` false; Ray's KubeRay config reader
turns it off, so this never happens on KubeRay): an instance launched from another
`launch_config_hash` than its node type's now, or of a node type no longer
configured. The first kind become outdated replicas the policy removes whole; the
second belong to no group the policy knows, so they go back to Ray as they are."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

from ray.core.generated.instance_manager_pb2 import TerminationRequest

from tpu_autoscaler.adapters.ray.instances import host_name, instance_type


def outdated_hosts(request: Any, workers: Iterable[Any]) -> set[str]:
    """Hosts (pod names) launched from a config their node type no longer has."""
    if request.disable_launch_config_check:
        return set()
    found = set()
    for instance in workers:
        config = request.node_type_configs.get(instance_type(instance))
        wanted = config.launch_config_hash if config is not None else ""
        if wanted and instance.im_instance.launch_config_hash != wanted:
            found.add(host_name(instance))
    return found


def of_removed_types(request: Any, workers: Iterable[Any]) -> list[Any]:
    """Instances whose node type is configured no more."""
    if request.disable_launch_config_check:
        return []
    return [i for i in workers if instance_type(i) not in request.node_type_configs]


def termination(instance: Any) -> Any:
    """Ray's own termination of an instance of a node type configured no more."""
    im = instance.im_instance
    return TerminationRequest(
        id=str(uuid.uuid4()),
        instance_id=im.instance_id,
        ray_node_id=im.node_id,
        cause=TerminationRequest.Cause.OUTDATED,
        instance_type=im.instance_type,
        instance_status=im.status,
        details=f"node type {im.instance_type} is no longer configured",
    )
