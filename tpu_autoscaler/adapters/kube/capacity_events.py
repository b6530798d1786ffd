"""What the cluster says about a worker group's capacity: Events that
cluster-autoscaler (GKE's build of it) records on a Pending pod when a scale-up for it
failed, the status the kubelet leaves on a pod whose node was shut down under it (a
spot VM preempted), and the reason the GCS gives for a dead Ray node. Each becomes a
`CapacitySignal` for the group; kept are the newest of each problem per group and, of
preemptions, the newest few hosts.

The words are upstream's, matched as they are written there:

- `FailedScaleUp` (Warning), GKE's cluster-autoscaler, package
  `k8s.io/gke-autoscaling/cluster-autoscaler/pkg/visibility/events`
  (`failedScaleUpReason`, `zonalErrorMessageTemplate`): "Node scale up in zones
  ZONES associated with this pod failed: REASONS. Pod is at risk of not being
  scheduled.", REASONS joined by ", " from `quotaExceededMessage` ("GCE quota
  exceeded"), `outOfResourcesMessage` ("GCE out of resources"), `ipSpaceExhaustedMessage`,
  `timeoutMessage` ("Some nodes in node group %q failed to appear in time"), the
  reservation and TPU configuration messages, and "Internal error"; cut to 250
  characters (`messageLengthLimit`).
- `NotTriggerScaleUp` (Normal), kubernetes/autoscaler
  `cluster-autoscaler/processors/status/eventing_scale_up_processor.go`: "pod didn't
  trigger scale-up: N REASON, ..." where a node group skipped after a failure reads
  "in backoff after failed scale-up" (`core/scaleup/orchestrator`: `BackoffReason`)
  and one at its size cap "max node group size reached".
- A preempted spot VM: on GKE >= 1.20 the kubelet's graceful node shutdown fails the
  pods on it (kubernetes `pkg/kubelet/nodeshutdown/nodeshutdown_manager_linux.go`:
  phase Failed, `nodeShutdownReason` "Terminated" since 1.22, "Shutdown" before,
  message "Pod was terminated in response to imminent node shutdown."). KubeRay
  deletes such a pod's replica within moments, so a round sees it only by chance.
- A Ray node drained for preemption dies with `NodeDeathInfo.Reason`
  `AUTOSCALER_DRAIN_PREEMPTED` (Ray `src/ray/protobuf/gcs.proto`), which the GCS
  keeps for its newest 1000 dead nodes."""

from __future__ import annotations

import itertools
import operator
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from pydantic import Field, ValidationError

from tpu_autoscaler.adapters.kube.pods import Pod, timestamp_s, worker_pod_prefix
from tpu_autoscaler.adapters.ray.gcs import DeadNode
from tpu_autoscaler.core import labels
from tpu_autoscaler.core.capacity import CapacityProblem, CapacitySignal
from tpu_autoscaler.manifest.model import K8sModel, ObjectMeta

FAILED_SCALE_UP: Final = "FailedScaleUp"
POD_EVENTS: Final = "involvedObject.kind=Pod"
"""The field selector the Events are listed with: only those about pods."""

OUT_OF_RESOURCES: Final = "GCE out of resources"
QUOTA_EXCEEDED: Final = "GCE quota exceeded"
FAILED_SCALE_UP_MESSAGE: Final = (
    "Node scale up in zones {zones} associated with this pod failed: {reasons}. "
    "Pod is at risk of not being scheduled."
)
"""GKE's `zonalErrorMessageTemplate`, as the simulator writes it."""
NODE_SHUTDOWN_REASONS: Final = frozenset({"Terminated", "Shutdown"})
NODE_SHUTDOWN_MESSAGES: Final = (
    "Pod was terminated in response to imminent node shutdown.",
    "Node is shutting, evicting pods",
)

MAX_SIGNALS: Final = 256
"""Signals kept for one snapshot at most (the newest)."""
PREEMPTIONS_KEPT: Final = 8
"""Preempted hosts kept per group (the newest): enough to tell a group that churns."""
PREEMPTED_DEATH: Final = "AUTOSCALER_DRAIN_PREEMPTED"
"""Ray's `NodeDeathInfo.Reason` of a node drained because its VM is being preempted."""
OWN_DRAIN_PREFIX: Final = "tpu-autoscaler:"
"""How this autoscaler's own drain messages begin (`shell/drain.py`)."""

_STOCKOUT_WORDS: Final = (
    OUT_OF_RESOURCES.lower(),
    "zone_resource_pool_exhausted",
    "resource pool exhausted",
    "stockout",
    "no capacity",
)
_QUOTA_WORDS: Final = (QUOTA_EXCEEDED.lower(), "quota")


class EventObject(K8sModel):
    kind: str = ""
    name: str = ""
    namespace: str | None = None


class EventSeries(K8sModel):
    count: int = 0
    last_observed_time: str | None = None


class CoreEvent(K8sModel):
    """A core/v1 Event, as far as a capacity signal needs it."""

    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    involved_object: EventObject = Field(default_factory=EventObject)
    reason: str = ""
    message: str = ""
    type: str = ""
    count: int | None = None
    first_timestamp: str | None = None
    last_timestamp: str | None = None
    event_time: str | None = None
    series: EventSeries | None = None

    @property
    def at_s(self) -> float | None:
        """When it was last said: `lastTimestamp`, else the series' last observation
        (events.k8s.io writers), else `eventTime`, else when it was first said."""
        for stamp in (
            self.last_timestamp,
            self.series.last_observed_time if self.series else None,
            self.event_time,
            self.first_timestamp,
            self.metadata.creation_timestamp,
        ):
            seconds = timestamp_s(stamp)
            if seconds is not None:
                return seconds
        return None


def capacity_problem(reason: str, message: str) -> CapacityProblem | None:
    """The problem an Event on a pod says its group has, or None if it says none: a
    failed scale-up out of resources is a stockout, over a quota a quota, any other
    (IP space, reservation, node timeout, internal error) a node pool that failed.
    `NotTriggerScaleUp` says none: its "in backoff after failed scale-up" repeats a
    failure the FailedScaleUp Event on the same pod already told, without saying which."""
    if reason != FAILED_SCALE_UP:
        return None
    text = message.lower()
    if any(word in text for word in _STOCKOUT_WORDS):
        return CapacityProblem.STOCKOUT
    if any(word in text for word in _QUOTA_WORDS):
        return CapacityProblem.QUOTA
    return CapacityProblem.NODE_POOL_FAILED


def _group_of_pod(pods: Iterable[Pod], groups: set[str]) -> dict[str, str]:
    found = {}
    for pod in pods:
        group = pod.metadata.labels.get(labels.KUBERAY_GROUP)
        if group in groups and pod.name:
            found[pod.name] = group
    return found


def _group_of_gone_pod(name: str, prefixes: Mapping[str, str]) -> str | None:
    """The group whose worker pods KubeRay names like `name` (the longest prefix: a
    group may be named like another's pods)."""
    matching = [
        (len(prefix), group)
        for group, prefix in prefixes.items()
        if name.startswith(prefix) and name[len(prefix) :] and "-" not in name[len(prefix) :]
    ]
    return max(matching)[1] if matching else None


def event_signals(
    events: Iterable[CoreEvent],
    pods: Sequence[Pod],
    groups: Iterable[str],
    cluster: str | None = None,
) -> list[CapacitySignal]:
    """A signal for each Event about a pod of one of `groups` that says something of
    its capacity: a pod listed in `pods`, by its `ray.io/group` label, or, given the
    RayCluster's name, one already gone, by the name KubeRay gave it. Events outlive
    their pod by an hour: a stockout told on the pods of a launch that was given back
    still holds the group back for the stockout hold."""
    named = set(groups)
    group_of: dict[str, str] | None = None  # made at the first Event about a pod
    prefixes = {g: worker_pod_prefix(cluster, g) for g in named} if cluster else {}
    signals = []
    for event in events:
        if event.involved_object.kind != "Pod":
            continue
        if group_of is None:
            group_of = _group_of_pod(pods, named)
        group = group_of.get(event.involved_object.name)
        if group is None and prefixes:
            group = _group_of_gone_pod(event.involved_object.name, prefixes)
        problem = capacity_problem(event.reason, event.message)
        at_s = event.at_s
        if group is None or problem is None or at_s is None:
            continue
        times = f" (x{event.count})" if event.count and event.count > 1 else ""
        source = f"Event {event.reason} on pod {event.involved_object.name}{times}"
        signals.append(CapacitySignal(group, problem, at_s, event.message, source))
    return signals


_PHASE = operator.attrgetter("status.phase")


def preemption_signals(pods: Sequence[Pod], groups: Iterable[str]) -> list[CapacitySignal]:
    """A signal for each pod of `groups` the kubelet failed because its node shut down
    (a spot VM preempted), at its Ready condition's last change."""
    named = set(groups)
    group_of: dict[str, str] | None = None  # made at the first failed pod
    signals = []
    # The failed pods picked in C: every round reads every pod, and few have failed.
    failed = map(operator.eq, map(_PHASE, pods), itertools.repeat("Failed"))
    for pod in itertools.compress(pods, failed):
        status = pod.status
        if (
            status.phase != "Failed"
            or status.reason not in NODE_SHUTDOWN_REASONS
            or not status.message.startswith(NODE_SHUTDOWN_MESSAGES)
        ):
            continue
        if group_of is None:
            group_of = _group_of_pod(pods, named)
        group = group_of.get(pod.name)
        if group is None:
            continue
        changes = [
            timestamp_s(c.last_transition_time) for c in status.conditions if c.type == "Ready"
        ]
        known = [t for t in changes if t is not None]
        at_s = max(known) if known else timestamp_s(pod.metadata.creation_timestamp)
        if at_s is None:
            continue
        message = f"the kubelet: {status.reason}: {status.message}"
        signals.append(
            CapacitySignal(group, CapacityProblem.PREEMPTED, at_s, message, f"pod {pod.name}")
        )
    return signals


def death_signals(dead: Iterable[DeadNode], groups: Iterable[str]) -> list[CapacitySignal]:
    """A signal for each dead Ray node of `groups` the GCS says was preempted
    (`AUTOSCALER_DRAIN_PREEMPTED`), unless this autoscaler drained it itself (its
    drains name it: the retirement of a partly drained slice is not capacity lost)."""
    named = set(groups)
    return [
        CapacitySignal(
            node.group,
            CapacityProblem.PREEMPTED,
            node.died_at_s,
            f"the GCS: {node.reason}" + (f": {node.message}" if node.message else ""),
            f"pod {node.pod}",
        )
        for node in dead
        if node.group in named
        and node.reason == PREEMPTED_DEATH
        and not node.message.startswith(OWN_DRAIN_PREFIX)
    ]


def kept_signals(signals: Iterable[CapacitySignal]) -> tuple[CapacitySignal, ...]:
    """What the snapshot keeps, newest first and at most `MAX_SIGNALS`: the newest
    signal of each problem of each group; of preemptions, which the policy counts,
    the newest `PREEMPTIONS_KEPT` hosts of each group, once each (a host's failed pod
    and its dead node are one preemption)."""
    newest: dict[tuple[str, CapacityProblem, str], CapacitySignal] = {}
    for signal in signals:
        host = signal.source if signal.problem is CapacityProblem.PREEMPTED else ""
        key = (signal.group, signal.problem, host)
        kept = newest.get(key)
        if kept is None or signal.at_s > kept.at_s:
            newest[key] = signal
    ordered = sorted(newest.values(), key=lambda s: (-s.at_s, s.group, s.source))
    preemptions: dict[str, int] = {}
    chosen = []
    for signal in ordered:
        if signal.problem is CapacityProblem.PREEMPTED:
            preemptions[signal.group] = preemptions.get(signal.group, 0) + 1
            if preemptions[signal.group] > PREEMPTIONS_KEPT:
                continue
        chosen.append(signal)
    return tuple(chosen[:MAX_SIGNALS])


def capacity_signals(
    events: Iterable[CoreEvent],
    pods: Sequence[Pod],
    groups: Iterable[str],
    dead: Iterable[DeadNode] = (),
    cluster: str | None = None,
    failed: Sequence[Pod] | None = None,
) -> tuple[CapacitySignal, ...]:
    """What Events, pods and the GCS's dead nodes say of the capacity of `groups` of
    the RayCluster named `cluster`. `failed`: the pods of `pods` whose phase is
    Failed, if the caller keeps them (`ReplicaMemo.failed`), the only ones a
    preemption is read from (each by its own labels)."""
    named = list(groups)
    return kept_signals(
        [
            *event_signals(events, pods, named, cluster),
            *preemption_signals(pods if failed is None else failed, named),
            *death_signals(dead, named),
        ]
    )


def parse_events(items: Iterable[Mapping[str, Any]]) -> list[CoreEvent]:
    """The Events as the API served them; one that does not parse (no writer checks
    what another wrote) is skipped, not fatal: it can only lose a signal."""
    parsed = []
    for item in items:
        try:
            parsed.append(CoreEvent.model_validate(item))
        except ValidationError:
            continue
    return parsed
