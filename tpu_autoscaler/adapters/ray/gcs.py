"""Ray's GCS as the autoscaler uses it, through Ray's own `GcsClient` and calls (the
ones Ray's autoscaler v2 uses): read `ClusterResourceState`, read why nodes died,
drain a node, report the autoscaling state that `ray status` shows. The simulator
provides the same calls on its simulated Ray, so the shell is tested against the same
surface."""

from __future__ import annotations

import itertools
import operator
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from ray.core.generated import autoscaler_pb2, gcs_pb2

from tpu_autoscaler.adapters.ray import wire
from tpu_autoscaler.adapters.ray.state import (
    NodeMemory,
    RayNode,
    RayState,
    copy_infeasible,
    from_message,
    node_of,
)
from tpu_autoscaler.core.demand import DemandRef

IDLE_TERMINATION = autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_IDLE_TERMINATION")
PREEMPTION = autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION")
DEAD = gcs_pb2.GcsNodeInfo.GcsNodeState.Value("DEAD")
_DEATH_REASONS = gcs_pb2.GcsNodeInfo.DESCRIPTOR.fields_by_name["death_info"].message_type
DEATH_REASON_NAMES = {v.number: v.name for v in _DEATH_REASONS.enum_types_by_name["Reason"].values}
"""`NodeDeathInfo.Reason` by number: `AUTOSCALER_DRAIN_PREEMPTED`, `UNEXPECTED_TERMINATION`, ..."""
DEATH_REASON_NUMBERS = {name: number for number, name in DEATH_REASON_NAMES.items()}


class GcsApi(Protocol):
    """The subset of `ray._raylet.GcsClient` the autoscaler calls, with Ray's names."""

    def get_cluster_resource_state(self) -> bytes:
        """A serialized `GetClusterResourceStateReply`."""
        ...

    def drain_node(
        self, node_id: str, reason: int, reason_message: str, deadline_timestamp_ms: int
    ) -> tuple[bool, str]:
        """(accepted, why not). An idle-termination drain is refused if the node has work."""
        ...

    def report_autoscaling_state(self, serialized_state: bytes) -> None: ...

    def get_all_node_info(
        self,
        timeout: float | None = None,
        node_selectors: Any = None,
        state_filter: int | None = None,
    ) -> Mapping[Any, Any]:
        """`GcsNodeInfo` messages by node id, those in `state_filter` only (`DEAD`)."""
        ...

    def resize_raylet_resource_instances(
        self, node_id: str, resources: dict[str, float]
    ) -> dict[str, float]:
        """Set a raylet's total CPU and memory after its pod was resized in place;
        the totals it now has."""
        ...


class GcsUnavailable(Exception):
    """The GCS did not answer; nothing read from it this round can be trusted."""


class RayGcsClient:
    """Ray's `GcsClient`, with our timeouts and Ray's errors mapped to ours."""

    def __init__(self, address: str, timeout_s: float = 10.0) -> None:
        from ray._raylet import GcsClient  # type: ignore[attr-defined]

        self.address = address
        self.timeout_s = timeout_s
        self._client: Any = GcsClient(address=address)

    def get_cluster_resource_state(self) -> bytes:
        try:
            reply: bytes = self._client.get_cluster_resource_state(timeout_s=self.timeout_s)
        except Exception as exc:
            raise GcsUnavailable(f"GCS {self.address}: reading cluster state: {exc}") from exc
        return reply

    def drain_node(
        self, node_id: str, reason: int, reason_message: str, deadline_timestamp_ms: int
    ) -> tuple[bool, str]:
        try:
            accepted, message = self._client.drain_node(
                node_id, reason, reason_message, deadline_timestamp_ms
            )
        except Exception as exc:
            raise GcsUnavailable(f"GCS {self.address}: draining node {node_id}: {exc}") from exc
        return bool(accepted), str(message or "")

    def report_autoscaling_state(self, serialized_state: bytes) -> None:
        try:
            self._client.report_autoscaling_state(serialized_state)
        except Exception as exc:
            raise GcsUnavailable(f"GCS {self.address}: reporting state: {exc}") from exc

    def get_all_node_info(
        self,
        timeout: float | None = None,
        node_selectors: Any = None,
        state_filter: int | None = None,
    ) -> Mapping[Any, Any]:
        try:
            infos: Mapping[Any, Any] = self._client.get_all_node_info(
                timeout=timeout or self.timeout_s,
                node_selectors=node_selectors,
                state_filter=state_filter,
            )
        except Exception as exc:
            raise GcsUnavailable(f"GCS {self.address}: reading nodes: {exc}") from exc
        return infos

    def resize_raylet_resource_instances(
        self, node_id: str, resources: dict[str, float]
    ) -> dict[str, float]:
        # Called as Ray's KubeRayIPPRProvider calls it (the raylet id in hex).
        try:
            totals = self._client.resize_raylet_resource_instances(node_id, resources)
        except Exception as exc:
            raise GcsUnavailable(f"GCS {self.address}: resizing raylet {node_id}: {exc}") from exc
        return {str(k): float(v) for k, v in dict(totals).items()}


def read_ray_state(gcs: GcsApi, memory: NodeMemory | None = None) -> RayState:
    """`memory`: what the last read parsed (`NodeMemory`): then only the nodes and
    gangs whose bytes changed since are parsed."""
    sent = gcs.get_cluster_resource_state()
    if memory is None:
        return from_message(_parsed(sent))
    return memory.read(sent)


def _parsed(sent: bytes) -> Any:
    reply = autoscaler_pb2.GetClusterResourceStateReply()
    reply.ParseFromString(sent)
    return reply.cluster_resource_state


_NODE_DEAD = autoscaler_pb2.NodeStatus.Value("DEAD")
_DEATH_REASON = operator.attrgetter("death_info.reason")
_INSTANCE_ID = operator.attrgetter("instance_id")


def read_live_nodes(gcs: GcsApi, pods: Collection[str]) -> dict[str, RayNode]:
    """The live Ray node of each of `pods` (by instance id) in the state the GCS
    reports now, the last listed where a pod has several, as
    `{n.instance_id: n for n in read_ray_state(gcs).nodes if not n.dead}` keeps it:
    the same read, but only those nodes parsed (a drain re-reads the GCS for the few
    hosts it drains, and parsing every node of a large cluster for them was most of
    the re-read). The nodes' instance ids are read in C (`wire.read_node_ids`), and
    the nodes of `pods` found among them in C."""
    listed = wire.read_node_ids(gcs.get_cluster_resource_state())
    wanted = set(pods)
    found: dict[str, RayNode] = {}
    hits = map(wanted.__contains__, map(_INSTANCE_ID, listed))
    for index in itertools.compress(itertools.count(), hits):
        ids = listed[index]
        if ids.status != _NODE_DEAD:
            found[ids.instance_id] = node_of(wire.whole_node(ids))
    return found


@dataclass(frozen=True)
class DeadNode:
    """A Ray node the GCS knows as dead, and why (`NodeDeathInfo`)."""

    pod: str
    """Its instance id: the pod it ran in."""
    group: str
    """Its node type: the worker group."""
    reason: str
    """`AUTOSCALER_DRAIN_PREEMPTED`, `UNEXPECTED_TERMINATION`, ..."""
    message: str
    died_at_s: float


def read_dead_nodes(gcs: GcsApi, reasons: Iterable[str] | None = None) -> list[DeadNode]:
    """The dead nodes the GCS still lists (Ray keeps the newest 1000), with the reason
    each died; only those that died for one of `reasons` if given."""
    wanted = None if reasons is None else {DEATH_REASON_NUMBERS[r] for r in reasons}
    infos: Iterable[Any] = gcs.get_all_node_info(state_filter=DEAD).values()
    if wanted is not None:  # the few that died for one of them, found in C
        infos = list(infos)
        hits = map(wanted.__contains__, map(_DEATH_REASON, infos))
        infos = itertools.compress(infos, hits)
    dead = []
    for info in infos:
        if info.state != DEAD:
            continue
        dead.append(
            DeadNode(
                info.instance_id,
                info.node_type_name,
                DEATH_REASON_NAMES.get(info.death_info.reason, ""),
                info.death_info.reason_message,
                info.end_time_ms / 1000.0,
            )
        )
    return dead


@dataclass(frozen=True)
class DrainOutcome:
    accepted: tuple[str, ...]
    """Nodes now draining."""
    refused: tuple[tuple[str, str], ...]
    """(node, Ray's reason) for each node that would not drain."""

    @property
    def complete(self) -> bool:
        return not self.refused


def drain_nodes(gcs: GcsApi, node_ids: Iterable[str], reason_message: str) -> DrainOutcome:
    """Ask every node to drain for idle termination, stopping at the first refusal
    (work arrived on it, so the replica stays and asking the rest only costs them)."""
    accepted: list[str] = []
    for node_id in node_ids:
        ok, why = gcs.drain_node(node_id, IDLE_TERMINATION, reason_message, 0)
        if not ok:
            return DrainOutcome(tuple(accepted), ((node_id, why),))
        accepted.append(node_id)
    return DrainOutcome(tuple(accepted), ())


def retire_nodes(gcs: GcsApi, node_ids: Iterable[str], reason_message: str) -> None:
    """Drain nodes that may have work, which Ray cannot refuse: each takes no new
    work and its raylet exits once what runs there ends."""
    for node_id in node_ids:
        gcs.drain_node(node_id, PREEMPTION, reason_message, 0)


@dataclass(frozen=True)
class PendingHosts:
    group: str
    hosts: int
    requested_at_s: float


@dataclass(frozen=True)
class StartingHost:
    group: str
    pod: str
    details: str


@dataclass(frozen=True)
class FailedHosts:
    """Launches of a group that fail (stocked out, backing off): `ray status` lists
    them under "Recent failures" as LaunchFailed, `-v` adds the reason."""

    group: str
    hosts: int
    reason: str
    started_s: float
    failed_s: float


def starting_part(starting: Iterable[StartingHost]) -> bytes:
    """The `pending_instances` of `starting` (as `autoscaling_state` lists them), as a
    serialized `AutoscalingState` holding them alone: put after a serialized
    `AutoscalingState`, they are read as its own, listed after any it has (a parser
    merges what follows into the message: a repeated field's elements are appended).
    So the hosts of a replica that waits round after round are made into a message
    once, not every round (`Announcer.report`)."""
    state = autoscaler_pb2.AutoscalingState()
    _add_starting(state, starting)
    part: bytes = state.SerializeToString()
    return part


def _add_starting(state: Any, starting: Iterable[StartingHost]) -> None:
    for host in starting:
        instance = state.pending_instances.add()
        instance.instance_type_name = host.group
        instance.ray_node_type_name = host.group
        instance.instance_id = host.pod
        instance.details = host.details


def autoscaling_state(
    ray: RayState,
    version: int,
    requested: Iterable[PendingHosts],
    starting: Iterable[StartingHost],
    infeasible: Iterable[tuple[DemandRef, int]],
    failed: Iterable[FailedHosts] = (),
) -> Any:
    """The `AutoscalingState` Ray's own autoscaler reports, from our view: hosts asked
    for and not yet created, pods created and not yet Ray nodes, launches that fail
    with their reason, and the demand (as the GCS listed it: `infeasible` names its
    requests) that no group can ever serve, so `ray status` shows them (a task
    request once per unserved copy)."""
    state = autoscaler_pb2.AutoscalingState()
    state.autoscaler_state_version = version
    message = ray.requests
    if message is not None:
        state.last_seen_cluster_resource_state_version = message.cluster_resource_state_version
    for pending in requested:
        request = state.pending_instance_requests.add()
        request.instance_type_name = pending.group
        request.ray_node_type_name = pending.group
        request.count = pending.hosts
        request.request_ts = int(pending.requested_at_s)
    _add_starting(state, starting)
    for failure in failed:
        request = state.failed_instance_requests.add()
        request.instance_type_name = failure.group
        request.ray_node_type_name = failure.group
        request.count = failure.hosts
        request.reason = failure.reason
        request.start_ts = int(failure.started_s)
        request.failed_ts = int(failure.failed_s)
    if message is not None:
        copy_infeasible(message, infeasible, state)
    return state
