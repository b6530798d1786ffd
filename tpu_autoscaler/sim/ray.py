"""Ray in the simulator, as unforgiving as Ray 2.60: a head node (the driver's) and a
node per running pod with the resources and labels Ray derives from the pod's
environment; work placed the way Ray places it; the `ClusterResourceState` the GCS
would report. Read from Ray 2.60's sources, in rooms of their own:

- the nodes and the work they run (`sim/ray_model.py`);
- **label selectors** (`controlplane/selectors.py`): Ray's dict syntax parsed as the
  raylet parses it, IN / NOT_IN matched as `NodeLabelMatchesConstraint` matches them,
  hard constraints for tasks, actors and bundles, reported to the autoscaler with
  their operators;
- where work goes: tasks and actors by the hybrid policy, placement groups by their
  strategy (`sim/ray_placement.py`);
- when it runs: rounds over the queue, runs that end, retries, and idleness as the
  raylet counts it (`sim/ray_scheduler.py`);
- what the GCS reports (`sim/gcs_state.py`). The raylet reports at least 1 ms of
  idleness and the GCS reports IDLE only for a positive duration.

Not modelled: the head's object store and `node:<ip>` resources."""

from __future__ import annotations

import hashlib
import itertools
import operator
import random
from collections.abc import Callable, Mapping
from typing import Any

from ray.core.generated import autoscaler_pb2, gcs_pb2

from tpu_autoscaler.controlplane import gke
from tpu_autoscaler.core import labels
from tpu_autoscaler.core.shape import SliceShape
from tpu_autoscaler.sim import gcs_state
from tpu_autoscaler.sim.ray_model import Node, Work
from tpu_autoscaler.sim.ray_scheduler import RayScheduler

HEAD_GROUP = "headgroup"
"""KubeRay's `ray.io/group` of the head pod, which is its `RAY_NODE_TYPE_NAME`."""
HEAD_NODE_RESOURCE = "node:__internal_head__"
"""The resource Ray gives the head node only."""


_CACHED_DEAD_INFO = operator.attrgetter("cached_dead_info")
_NODE_ID = operator.attrgetter("node_id")


def _node_id(pod: str) -> bytes:
    return hashlib.sha1(pod.encode()).digest()[:28]


class SimRay:
    """Raylets that join as pods run and leave as they go, the work they run (placed
    by `scheduler`), and the GCS as Ray's `GcsClient` offers it to autoscalers."""

    def __init__(
        self,
        now: Callable[[], float],
        schedule_after: Callable[[float, Callable[[], None]], None],
        rng: random.Random,
    ) -> None:
        self.now = now
        self.scheduler = RayScheduler(now, schedule_after, rng)
        self.dead: dict[str, Node] = {}
        """Nodes whose raylet is gone, by pod name, the newest last."""
        self._node_infos: dict[str, tuple[Node, int, Any]] = {}
        self._dead_listed: tuple[tuple[Node, ...], dict[bytes, Any]] = ((), {})
        """The dead nodes last listed by `get_all_node_info`, and their infos by id."""
        self._pods_by_id: dict[str, str] = {}
        """Pod names by node id (hex), as last mapped (`node_by_id`)."""
        self._ids = itertools.count()
        self.autoscaling_state: Any = None
        """The last state an autoscaler reported, as `ray status` would read it."""
        self.reported_demand: list[Work] | None = None
        """Pending work as the GCS last heard of it from the raylets (`report_demand`);
        None: the GCS sees the queues as they are."""
        self.gcs_parts = gcs_state.KeptState(self.scheduler.watch())
        """The GCS's last state by part, to build the next from the nodes that changed."""

    @property
    def head(self) -> Node | None:
        """The head node: the driver's, never a worker, not in `nodes`."""
        return self.scheduler.head

    @property
    def nodes(self) -> dict[str, Node]:
        """Worker nodes by pod name."""
        return self.scheduler.nodes

    @property
    def pending(self) -> list[Work]:
        return self.scheduler.pending

    @property
    def running(self) -> dict[str, Work]:
        return self.scheduler.running

    @property
    def finished(self) -> list[Work]:
        return self.scheduler.finished

    # --- nodes ---------------------------------------------------------------------

    def add_head(self, pod: str, resources: Mapping[str, float]) -> None:
        """The head node of `pod` (KubeRay's head pod): the group's CPUs and memory,
        Ray's head resource, labels from its environment (`ray.io/node-group`)."""
        node_id = _node_id(pod)
        self.scheduler.add_head(
            Node(
                pod=pod,
                group=HEAD_GROUP,
                labels={labels.RAY_NODE_GROUP: HEAD_GROUP, gcs_state.RAY_NODE_ID: node_id.hex()},
                total={**resources, HEAD_NODE_RESOURCE: 1.0},
                available={**resources, HEAD_NODE_RESOURCE: 1.0},
                idle_since_s=self.now(),
                node_id=node_id,
            )
        )

    def add_node(
        self,
        pod: Mapping[str, Any],
        shape: SliceShape,
        host_index: int,
        environment: Mapping[str, str] | None = None,
    ) -> None:
        """The raylet of `pod` joins, as host `host_index` of a slice of `shape`, named
        by its process's `TPU_NAME`: from `environment` (what the process finds,
        `gke.container_environment`) if the caller resolved it already, else from the
        pod's own variables (the device plugin sets no `TPU_NAME`)."""
        if environment is None:
            environment = gke.spec_environment(pod)
        slice_name = environment.get(labels.ENV_TPU_NAME)
        name = pod["metadata"]["name"]
        node_id = _node_id(name)
        if host_index < shape.hosts_per_replica:
            total = dict(shape.host_resources(host_index, slice_name))
            host_labels = dict(shape.host_labels(host_index, slice_name))
        else:
            # The webhook numbered a single-host pod past its slice (its counting bug):
            # Ray takes TPU_WORKER_ID as given, and only worker 0 gets the head resource.
            total = dict(shape.host_resources(0, slice_name))
            host_labels = dict(shape.host_labels(0, slice_name))
            host_labels[labels.RAY_TPU_WORKER_ID] = str(host_index)
            if shape.tpu is not None:
                total.pop(shape.tpu.head_resource, None)
        self.scheduler.add_node(
            Node(
                pod=name,
                group=shape.group,
                labels={**host_labels, gcs_state.RAY_NODE_ID: node_id.hex()},
                total=dict(total),
                available=dict(total),
                idle_since_s=self.now(),
                node_id=node_id,
            )
        )

    def remove_node(self, pod: str, death_reason: str = "", death_message: str = "") -> list[Work]:
        """The node's raylet is gone (for `death_reason`, Ray's `NodeDeathInfo.Reason`,
        kept if a drain set one); work on it is retried, as Ray retries tasks and
        reschedules placement groups. Returns the work that was running there."""
        node, hit = self.scheduler.remove_node(pod)
        if node is not None:
            if death_reason:
                node.death_reason, node.death_message = death_reason, death_message
            node.died_at_s = self.now()
            self.dead.pop(pod, None)  # newest last
            self.dead[pod] = node
        return hit

    # --- work ----------------------------------------------------------------------

    def node_by_id(self, node_id: str) -> Node | None:
        """The live worker node whose id is `node_id` (hex), the first in order if
        several are. Found through a map of ids, made again when it misses or is
        stale (nodes come and go, and tests add them by hand): a walk of every node
        per drain call was a large cluster's scale-down."""
        pod = self._pods_by_id.get(node_id)
        node = self.nodes.get(pod) if pod is not None else None
        if node is not None and node.node_id.hex() == node_id:
            return node
        self._pods_by_id = {}
        for n in self.nodes.values():
            self._pods_by_id.setdefault(n.node_id.hex(), n.pod)
        pod = self._pods_by_id.get(node_id)
        return self.nodes.get(pod) if pod is not None else None

    def submit(self, work: Work) -> None:
        self.scheduler.submit(work)

    def remove(self, work: Work) -> None:
        """`remove_placement_group` (or a cancelled task): pending, it is dropped;
        placed, its resources are returned. It does not count as finished."""
        self.scheduler.remove(work)

    def new_id(self, prefix: str) -> str:
        return f"{prefix}{next(self._ids)}"

    def _finish(self, work: Work) -> None:
        """`work` ends now (tests end work early)."""
        self.scheduler.finish(work)

    # --- the GCS, as Ray's GcsClient offers it to autoscalers ----------------------------

    def report_demand(self) -> None:
        """The raylets' periodic report of their queues reaching the GCS: until the
        next one, work placed since still shows as pending, and work submitted since
        does not show yet, while node resources are current."""
        self.reported_demand = list(self.pending)

    def get_cluster_resource_state(self) -> bytes:
        return self.gcs_parts.reply(*self._state_of())

    def drain_node(
        self, node_id: str, reason: int, reason_message: str, deadline_timestamp_ms: int
    ) -> tuple[bool, str]:
        """An idle-termination drain is accepted only by an idle node, as the raylet
        decides; an accepted node takes no new work."""
        node = self.node_by_id(node_id)
        if node is None:
            return True, ""  # gone already: nothing left to drain
        if node.busy:
            return False, "The node to be idle terminated is no longer idle."
        node.drain()
        return True, ""

    def report_autoscaling_state(self, serialized_state: bytes) -> None:
        self.autoscaling_state = autoscaler_pb2.AutoscalingState.FromString(serialized_state)

    def state_key(self) -> tuple[object, ...]:
        """What the state `get_cluster_resource_state` gives is made of, but the time:
        it changes when the state does, not as idle time passes (what the simulator
        compares to leave out rounds, `sim/quiet.py`)."""
        demand = self.pending if self.reported_demand is None else self.reported_demand
        return gcs_state.state_key(self.scheduler.live_nodes(), self.nodes, self.dead, demand)

    def get_all_node_info(
        self,
        timeout: float | None = None,
        node_selectors: Any = None,
        state_filter: int | None = None,
    ) -> dict[bytes, Any]:
        """`GcsNodeInfo` of each node (`state_filter`: of each in that state): a dead
        one with its `death_info` and end time, as the GCS keeps it."""
        infos = {}
        alive, dead = gcs_pb2.GcsNodeInfo.ALIVE, gcs_pb2.GcsNodeInfo.DEAD
        if state_filter is None or state_filter == alive:  # the live first, then the dead
            for node in self.nodes.values():
                infos[node.node_id] = self._node_info(node, alive)
        if state_filter is None or state_filter == dead:
            infos.update(self._dead_infos())
        return infos

    def _dead_infos(self) -> dict[bytes, Any]:
        """The dead nodes' `GcsNodeInfo`s by node id: of the newest dead nodes not live
        again, oldest first, as the GCS's state lists them (`KeptState.listed_dead`),
        made again only when that list changed (the autoscaler reads them every
        round; a Python step per dead node was most of a large cluster's read), each
        node's info kept on it."""
        listed = self.gcs_parts.listed_dead(self.nodes, self.dead)
        if listed is not self._dead_listed[0]:
            infos = list(map(_CACHED_DEAD_INFO, listed))
            missing = map(operator.is_, infos, itertools.repeat(None))
            for index in itertools.compress(itertools.count(), missing):
                infos[index] = self._dead_info(listed[index])
            self._dead_listed = (listed, dict(zip(map(_NODE_ID, listed), infos, strict=True)))
        return self._dead_listed[1]

    def _dead_info(self, node: Node) -> Any:
        """A dead node's `GcsNodeInfo`, kept on it (the caller reads, never writes, it)."""
        info = gcs_pb2.GcsNodeInfo(
            node_id=node.node_id,
            state=gcs_pb2.GcsNodeInfo.DEAD,
            instance_id=node.pod,
            node_type_name=node.group,
        )
        info.end_time_ms = int((node.died_at_s or 0.0) * 1000)
        reason = node.death_reason or "UNSPECIFIED"
        info.death_info.reason = info.death_info.Reason.Value(reason)
        info.death_info.reason_message = node.death_message
        node.cached_dead_info = info
        return info

    def _node_info(self, node: Node, state: int) -> Any:
        """A live node's `GcsNodeInfo`, made once per node (the caller reads, never
        writes, it)."""
        cached = self._node_infos.get(node.pod)
        if cached is not None and cached[0] is node and cached[1] == state:
            return cached[2]
        info = gcs_pb2.GcsNodeInfo(
            node_id=node.node_id, state=state, instance_id=node.pod, node_type_name=node.group
        )
        self._node_infos[node.pod] = (node, state, info)
        return info

    def state(self) -> Any:
        """`ClusterResourceState` for the autoscaler, built as the GCS builds it
        (`sim/gcs_state.py`)."""
        return autoscaler_pb2.ClusterResourceState.FromString(self._state_bytes())

    def _state_bytes(self) -> bytes:
        return b"".join(self.gcs_parts.parts(*self._state_of()))

    def _state_of(
        self,
    ) -> tuple[list[Node], dict[str, Node], dict[str, Node], list[Work], float]:
        """What the GCS's state is made of now: the live nodes, the worker nodes, the
        dead, the demand it heard of, the time."""
        demand = self.pending if self.reported_demand is None else self.reported_demand
        return self.scheduler.live_nodes(), self.nodes, self.dead, demand, self.now()
