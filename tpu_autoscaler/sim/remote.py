"""The autoscaler's two remote services as it meets them in the simulation: the
Kubernetes API and the GCS, each call taking simulated time while the world moves on."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from tpu_autoscaler.adapters.kube.api import KubeApi
from tpu_autoscaler.adapters.ray.gcs import PREEMPTION, GcsUnavailable
from tpu_autoscaler.controlplane.clock import EventQueue
from tpu_autoscaler.sim.ray import SimRay


class Wire:
    """The network between the autoscaler and its services: a call takes its
    latency of simulated time, during which the world moves on. One call at a time,
    as the autoscaler makes them: a call made while another elapses (from an event
    that ran meanwhile) does not elapse again, whichever service it goes to."""

    def __init__(self, events: EventQueue) -> None:
        self.events = events
        self._in_call = False

    def elapse(self, latency_s: float) -> None:
        if latency_s <= 0 or self._in_call:
            return
        self._in_call = True
        try:
            self.events.run_until(self.events.now_s + latency_s)
        finally:
            self._in_call = False


class _Remote:
    """A service the autoscaler calls over `wire`, each call taking `latency_s`."""

    def __init__(self, wire: Wire, latency_s: float) -> None:
        self.wire = wire
        self.latency_s = latency_s

    def _elapse(self) -> None:
        self.wire.elapse(self.latency_s)


class SimGcs(_Remote):
    """The GCS calls an autoscaler makes, on the simulated Ray."""

    def __init__(
        self,
        ray: SimRay,
        on_drained: Callable[[str], None],
        wire: Wire,
        latency_s: float = 0.0,
    ) -> None:
        super().__init__(wire, latency_s)
        self.ray = ray
        self.on_drained = on_drained
        self.drain_calls = 0
        self.drained: dict[str, None] = {}
        """The pods whose node accepted a drain (`on_drained` heard of it), until
        their node is gone or not retired: only `on_drained` retires a node (sets
        `exit_when_idle`, if it has work), so the retired nodes are among these."""

    def get_cluster_resource_state(self) -> bytes:
        self._elapse()
        # The retired nodes among those drained: a look at every node was a large
        # cluster's every read.
        nodes = self.ray.nodes
        ended = []
        for pod in list(self.drained):
            node = nodes.get(pod)
            if node is None or not node.exit_when_idle:
                del self.drained[pod]
            elif not node.busy:
                ended.append(pod)
        if len(ended) > 1:  # in the nodes' order, as they exit
            place = dict(zip(nodes, itertools.count()))
            ended.sort(key=place.__getitem__)
        for pod in ended:
            self.on_drained(pod)  # its work ended: the retired raylet exits
        return self.ray.get_cluster_resource_state()

    def drain_node(
        self, node_id: str, reason: int, reason_message: str, deadline_timestamp_ms: int
    ) -> tuple[bool, str]:
        self._elapse()
        self.drain_calls += 1
        node = self.ray.node_by_id(node_id)
        if reason == PREEMPTION and node is not None:
            node.drain()  # not refusable: no new work, exits when idle
            accepted, why = True, ""
        else:
            accepted, why = self.ray.drain_node(
                node_id, reason, reason_message, deadline_timestamp_ms
            )
        if accepted and node is not None:
            # Why the GCS will say it died, once its raylet exits.
            node.death_reason = (
                "AUTOSCALER_DRAIN_PREEMPTED" if reason == PREEMPTION else "AUTOSCALER_DRAIN_IDLE"
            )
            node.death_message = reason_message
            self.drained[node.pod] = None
            self.on_drained(node.pod)
        return accepted, why

    def resize_raylet_resource_instances(
        self, node_id: str, resources: dict[str, float]
    ) -> dict[str, float]:
        """The raylet takes the new totals; what is in use stays in use."""
        self._elapse()
        node = self.ray.node_by_id(node_id)
        if node is None:
            raise GcsUnavailable(f"no raylet {node_id}")
        for name, amount in resources.items():
            node.available[name] = (
                node.available.get(name, 0.0) + amount - node.total.get(name, 0.0)
            )
            node.total[name] = amount
        node.changed(fixed=True)
        self.ray.scheduler.schedule()  # the raylet places its queue on what it now has
        return dict(node.total)

    def report_autoscaling_state(self, serialized_state: bytes) -> None:
        self._elapse()
        self.ray.report_autoscaling_state(serialized_state)

    def get_all_node_info(
        self,
        timeout: float | None = None,
        node_selectors: Any = None,
        state_filter: int | None = None,
    ) -> dict[bytes, Any]:
        self._elapse()
        return self.ray.get_all_node_info(timeout, node_selectors, state_filter)


class AutoscalerApi(_Remote):
    """The API server as the autoscaler's client meets it: KubeRay creates pods and
    writes the status between the autoscaler's read and its patch. `store`: the
    simulated API server, or a client of a real one."""

    def __init__(self, store: KubeApi, wire: Wire, latency_s: float) -> None:
        super().__init__(wire, latency_s)
        self.store = store

    def get_raycluster(self, namespace: str, name: str) -> dict[str, Any]:
        self._elapse()
        return self.store.get_raycluster(namespace, name)

    def list_pods(
        self, namespace: str, selector: dict[str, str] | None = None
    ) -> list[dict[str, Any]]:
        self._elapse()
        return self.store.list_pods(namespace, selector)

    def patch_raycluster(
        self,
        namespace: str,
        name: str,
        operations: list[dict[str, Any]],
        resource_version: str | None,
    ) -> dict[str, Any]:
        self._elapse()
        return self.store.patch_raycluster(namespace, name, operations, resource_version)

    def resize_pod(
        self, namespace: str, name: str, operations: list[dict[str, Any]]
    ) -> dict[str, Any]:
        self._elapse()
        return self.store.resize_pod(namespace, name, operations)

    def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        self._elapse()
        self.store.annotate_pod(namespace, name, annotations)

    def create_event(self, namespace: str, event: dict[str, Any]) -> None:
        self.store.create_event(namespace, event)

    def list_events(
        self, namespace: str, field_selector: str | None = None
    ) -> list[dict[str, Any]]:
        self._elapse()
        return self.store.list_events(namespace, field_selector)
