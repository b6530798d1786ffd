"""Snapshot files built from a few lines of description: replicas with busy or idle
hosts, and pending demand as Ray's GCS reports it. The upstream failures of the
brief are scenarios here; `python -m tpu_autoscaler.testing.scenarios DIR` writes them
as the files under `examples/snapshots/`."""

from __future__ import annotations

import copy
import hashlib
import inspect
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml
from google.protobuf.json_format import MessageToDict
from ray.core.generated import autoscaler_pb2

from tpu_autoscaler.controlplane import admitted_pod
from tpu_autoscaler.core import labels
from tpu_autoscaler.manifest.head import head_resources
from tpu_autoscaler.manifest.loading import load_raycluster, parse_raycluster
from tpu_autoscaler.manifest.shapes import derive_shapes
from tpu_autoscaler.sim import gcs_state

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


class SnapshotBuilder:
    def __init__(self, raycluster: Mapping[str, Any], now: datetime | None = None) -> None:
        self.raycluster = copy.deepcopy(dict(raycluster))
        self.cluster = parse_raycluster(self.raycluster, "scenario")
        shapes = derive_shapes(self.cluster)
        shapes.raise_for_errors()
        self.shapes = {s.group: s for s in shapes.shapes}
        self.now = now or datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
        self.pods: list[dict[str, Any]] = []
        self.state = autoscaler_pb2.ClusterResourceState()
        self.replica_counts: dict[str, int] = {}

    def replica(
        self,
        group: str,
        index: int,
        used: Mapping[int, Mapping[str, float]] | None = None,
        idle_s: float | Sequence[float] = 0.0,
        age_s: float = 600.0,
        running: bool = True,
        pods: int | None = None,
        multi_host_indexing: bool = True,
    ) -> SnapshotBuilder:
        """Replica `index` of `group`; `used[host]` is what work holds on that host;
        `pods`: only its first hosts exist (KubeRay mid-creation, or a host lost);
        without `multi_host_indexing` KubeRay (gate off) labels no replica and the TPU
        webhook numbers the pods itself, in the order they are made."""
        shape = self.shapes[group]
        created = (self.now - timedelta(seconds=age_s)).strftime("%Y-%m-%dT%H:%M:%SZ")
        idle = (
            [idle_s] * shape.hosts_per_replica if isinstance(idle_s, int | float) else list(idle_s)
        )
        for host in range(shape.hosts_per_replica if pods is None else pods):
            pod = admitted_pod.worker_pod(
                self.cluster.metadata.name,
                self.cluster.metadata.namespace,
                shape,
                index,
                host,
                created,
                phase="Running" if running else "Pending",
                multi_host_indexing=multi_host_indexing,
                raycluster=self.raycluster,
                existing=self.pods,
            )
            self.pods.append(pod)
            if running:
                node = gcs_state.node_state(pod, shape, host, (used or {}).get(host), idle[host])
                self.state.node_states.append(node)
        self.replica_counts[group] = self.replica_counts.get(group, 0) + 1
        return self

    def head(self, used: Mapping[str, float] | None = None) -> SnapshotBuilder:
        """The head pod, Running, and its Ray node with `used` taken (the head group's
        resources as Ray's KubeRay config reads them)."""
        name = f"{self.cluster.metadata.name}-head"
        created = (self.now - timedelta(seconds=3600)).strftime("%Y-%m-%dT%H:%M:%SZ")
        self.pods.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": name,
                    "namespace": self.cluster.metadata.namespace,
                    "creationTimestamp": created,
                    "labels": {
                        labels.KUBERAY_CLUSTER: self.cluster.metadata.name,
                        labels.KUBERAY_NODE_TYPE: "head",
                        labels.KUBERAY_GROUP: "headgroup",
                    },
                },
                "spec": {"containers": [{"name": "ray-head", "image": "rayproject/ray:2.60.0"}]},
                "status": {"phase": "Running"},
            }
        )
        node = self.state.node_states.add()
        node.node_id = hashlib.sha1(name.encode()).digest()[:28]
        node.instance_id = name
        node.ray_node_type_name = "headgroup"
        node.node_ip_address = "10.0.0.2"
        # Ray marks its head with this resource (`ray.autoscaler.v2.utils.is_head_node`).
        total = {**head_resources(self.cluster), "node:__internal_head__": 1.0}
        node.total_resources.update(total)
        for key, value in total.items():
            free = value - (used or {}).get(key, 0.0)
            if free > 0:
                node.available_resources[key] = free
        node.status = autoscaler_pb2.NodeStatus.RUNNING
        return self

    def tasks(
        self,
        resources: Mapping[str, float],
        count: int = 1,
        selector: Mapping[str, str] | None = None,
    ) -> SnapshotBuilder:
        gcs_state.add_task_demand(self.state, resources, count, selector)
        return self

    def placement_group(
        self,
        pg_id: str,
        bundles: Sequence[Mapping[str, float]],
        strategy: str = "PACK",
        selectors: Sequence[Mapping[str, str]] | None = None,
    ) -> SnapshotBuilder:
        gcs_state.add_gang_demand(
            self.state, pg_id, list(bundles), strategy, list(selectors) if selectors else None
        )
        return self

    def slice_placement_group_head(
        self, pod_type: str, num_slices: int = 1, pg_id: str = "spg"
    ) -> SnapshotBuilder:
        """Stage one of `ray.util.tpu.slice_placement_group`, as Ray 2.60 asks it."""
        selector = {"ray.io/tpu-worker-id": "0", "ray.io/tpu-pod-type": pod_type}
        return self.placement_group(
            pg_id, [{f"TPU-{pod_type}-head": 1.0}] * num_slices, "PACK", [selector] * num_slices
        )

    def request_resources(self, bundles: Sequence[Mapping[str, float]]) -> SnapshotBuilder:
        constraint = self.state.cluster_resource_constraints.add()
        for bundle in bundles:
            request = constraint.resource_requests.add()
            request.count = 1
            gcs_state.fill_request(request.request, bundle, None)
        return self

    def build(self) -> dict[str, Any]:
        cluster = copy.deepcopy(self.raycluster)
        for group in cluster["spec"]["workerGroupSpecs"]:
            group["replicas"] = self.replica_counts.get(group["groupName"], 0)
        return {
            "now": self.now.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "raycluster": cluster,
            "pods": {"apiVersion": "v1", "kind": "PodList", "items": self.pods},
            "ray_state": _sorted(MessageToDict(self.state, preserving_proto_field_name=True)),
        }


def _sorted(value: Any) -> Any:
    """Protobuf maps iterate in no fixed order: sort them so files are reproducible."""
    if isinstance(value, dict):
        return {k: _sorted(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sorted(v) for v in value]
    return value


def _v6e_16(idle_timeout_s: int = 30) -> dict[str, Any]:
    cluster = load_raycluster(str(EXAMPLES / "clusters" / "v6e-4x4-multihost.yaml"))
    raw = cluster.model_dump(by_alias=True, exclude_none=True)
    raw["spec"]["autoscalerOptions"]["idleTimeoutSeconds"] = idle_timeout_s
    return dict(raw)


def busy_slice_with_idle_hosts() -> dict[str, Any]:
    """Upstream failure 1: an actor on host 1, the other three hosts idle past the
    timeout. Ray terminates the idle hosts and KubeRay deletes the busy slice."""
    return (
        SnapshotBuilder(_v6e_16())
        .replica("tpu-v6e-group", 0, used={1: {"TPU": 4.0}}, idle_s=[120, 0, 120, 120])
        .build()
    )


def sub_slice_launch() -> dict[str, Any]:
    """Upstream failure 2: two hosts' worth of TPU demand. Ray asks for two hosts and
    KubeRay floors 2 // 4 to zero replicas: nothing is launched."""
    return SnapshotBuilder(_v6e_16()).tasks({"TPU": 4.0}, count=2).build()


def slice_placement_group_on_empty_cluster() -> dict[str, Any]:
    """Upstream failure 3: stage one of slice_placement_group. Nodes not launched yet
    carry no `ray.io/tpu-worker-id` for Ray, so the head gang is infeasible."""
    return SnapshotBuilder(_v6e_16()).slice_placement_group_head("v6e-16").build()


def two_slice_heads() -> dict[str, Any]:
    """Upstream failure 4: Ray puts `TPU-v6e-16-head` on every host of the node type,
    so two head tasks look like half a slice; there is one head per slice."""
    return SnapshotBuilder(_v6e_16()).tasks({"TPU-v6e-16-head": 1.0}, count=2).build()


def idle_slice() -> dict[str, Any]:
    """Every host of the slice idle past the timeout: the whole slice goes."""
    return SnapshotBuilder(_v6e_16()).replica("tpu-v6e-group", 0, idle_s=120).build()


def stage_two_on_busy_slice() -> dict[str, Any]:
    """slice_placement_group's stage two, pinned to the slice its head holds, after Ray
    placed four {TPU: 4} tasks there first: Ray reports the gang infeasible, though it
    runs once the tasks end; nothing is launched for it (a new slice has another name)."""
    used = {host: {"TPU": 4.0} for host in range(4)}
    used[0] = {"TPU": 4.0, "TPU-v6e-16-head": 1.0}
    builder = SnapshotBuilder(_v6e_16()).replica("tpu-v6e-group", 0, used=used)
    slice_name = next(
        e["value"]
        for e in builder.pods[0]["spec"]["containers"][0]["env"]
        if e["name"] == labels.ENV_TPU_NAME
    )
    return builder.placement_group(
        "spg-workers",
        [{"CPU": 1.0, "TPU": 4.0}] * 4,
        "SPREAD",
        [{labels.RAY_TPU_SLICE_NAME: slice_name}] * 4,
    ).build()


def replica_being_created() -> dict[str, Any]:
    """KubeRay creates a replica's pods one API call at a time: 2 of the 4 exist, the
    newest a second old, for the 4 x {TPU: 4} that launched it. The replica is not
    broken: nothing is removed and nothing more launched."""
    return (
        SnapshotBuilder(_v6e_16())
        .replica("tpu-v6e-group", 0, age_s=1.0, running=False, pods=2)
        .tasks({"TPU": 4.0}, count=4)
        .build()
    )


def replica_lost_a_host() -> dict[str, Any]:
    """A running slice whose host 3 was deleted ten minutes after creation: a
    partial slice is unusable, so the replica goes whole (KubeRay would delete the
    rest of it too)."""
    return (
        SnapshotBuilder(_v6e_16())
        .replica("tpu-v6e-group", 0, age_s=600.0, pods=3, used={0: {"TPU": 4.0}})
        .build()
    )


def _mixed() -> dict[str, Any]:
    cluster = load_raycluster(str(EXAMPLES / "clusters" / "cpu-gpu-tpu.yaml"))
    return dict(cluster.model_dump(by_alias=True, exclude_none=True))


def mixed_group_choice() -> dict[str, Any]:
    """A head (its CPUs busy) beside CPU, GPU and TPU groups, all empty, and a
    {CPU: 1} task. It takes the small CPU group, as Ray scores groups: a GPU node is
    kept for GPU work, the 64-CPU node would be emptier, a TPU slice costs chips."""
    return SnapshotBuilder(_mixed()).head(used={"CPU": 4.0}).tasks({"CPU": 1.0}).build()


def mixed_tpu_and_cpu() -> dict[str, Any]:
    """Four {TPU: 4} tasks and a {CPU: 1} task: one whole v6e-16 slice, and the CPU
    task rides on it (the slice is launched anyway and its hosts have CPUs; Ray too
    packs every request that fits on the node it launches). Ray's own scheduler finds
    the TPU tasks infeasible (upstream failure 3) and launches a CPU node."""
    return (
        SnapshotBuilder(_mixed())
        .head(used={"CPU": 4.0})
        .tasks({"CPU": 1.0}, count=1)
        .tasks({"TPU": 4.0}, count=4, selector={"ray.io/tpu-pod-type": "v6e-16"})
        .build()
    )


def mixed_gpu_choice() -> dict[str, Any]:
    """Four {GPU: 1} tasks: four 1-GPU nodes, not one 8-GPU node (both would be as
    little used, and Ray then takes the first group in the RayCluster, then the
    other one it chose longest ago); six would take one 8-GPU node."""
    return SnapshotBuilder(_mixed()).head(used={"CPU": 4.0}).tasks({"GPU": 1.0}, 4).build()


def mixed_fits_on_head() -> dict[str, Any]:
    """Three {CPU: 1} tasks and the head has 3 free CPUs: they launch nothing (Ray
    packs existing nodes, the head included, before it launches); a {GPU: 1} task
    beside them still launches one 1-GPU node."""
    return (
        SnapshotBuilder(_mixed())
        .head(used={"CPU": 1.0})
        .tasks({"CPU": 1.0}, count=3)
        .tasks({"GPU": 1.0}, count=1)
        .build()
    )


def mixed_large_and_small() -> dict[str, Any]:
    """A {CPU: 48} task and twenty {CPU: 1}s, node by node as Ray: the 64-CPU node
    for the large task with sixteen small ones packed beside it, then a 4-CPU node
    for the last four."""
    return (
        SnapshotBuilder(_mixed())
        .head(used={"CPU": 4.0})
        .tasks({"CPU": 48.0}, count=1)
        .tasks({"CPU": 1.0}, count=20)
        .build()
    )


def mixed_ippr_grow() -> dict[str, Any]:
    """cpu-small may grow in place to 8 CPUs and 32G (`ray.io/ippr`); its one pod has 2
    CPUs in use. A {CPU: 6} task grows that pod to its maximum instead of launching a
    64-CPU node, and the {CPU: 4} task beside it launches one cpu-small pod counted at
    8 CPUs; Ray 2.60 decides the same."""
    cluster = _mixed()
    ippr = {"cpu-small": {"max-cpu": "8", "max-memory": "32G", "resize-timeout": 300}}
    cluster["metadata"]["annotations"] = {"ray.io/ippr": json.dumps({"groups": ippr})}
    builder = SnapshotBuilder(cluster).head(used={"CPU": 4.0})
    builder.replica("cpu-small", 0, used={0: {"CPU": 2.0}})
    return builder.tasks({"CPU": 6.0}).tasks({"CPU": 4.0}).build()


SCENARIOS: dict[str, Callable[[], dict[str, Any]]] = {
    "busy-slice-with-idle-hosts": busy_slice_with_idle_hosts,
    "sub-slice-launch": sub_slice_launch,
    "slice-placement-group-on-empty-cluster": slice_placement_group_on_empty_cluster,
    "two-slice-heads": two_slice_heads,
    "idle-slice": idle_slice,
    "stage-two-on-busy-slice": stage_two_on_busy_slice,
    "replica-being-created": replica_being_created,
    "replica-lost-a-host": replica_lost_a_host,
    "mixed-group-choice": mixed_group_choice,
    "mixed-gpu-choice": mixed_gpu_choice,
    "mixed-tpu-and-cpu": mixed_tpu_and_cpu,
    "mixed-fits-on-head": mixed_fits_on_head,
    "mixed-large-and-small": mixed_large_and_small,
    "mixed-ippr-grow": mixed_ippr_grow,
}


def write_all(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, build in SCENARIOS.items():
        path = directory / f"{name}.yaml"
        header = "# " + inspect.cleandoc(build.__doc__ or "").replace("\n", "\n# ") + "\n"
        path.write_text(header + yaml.safe_dump(build(), sort_keys=False))
        written.append(path)
    return written


if __name__ == "__main__":
    for written in write_all(Path(sys.argv[1] if len(sys.argv) > 1 else EXAMPLES / "snapshots")):
        print(written)
