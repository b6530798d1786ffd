"""The drain protocol: an idle replica goes only once every host of it has accepted
an idle drain through the GCS, so no work lands on a slice being deleted.

Ray 2.60 has no way to take back an accepted idle drain: the raylet exits at once
and its pod runs on without a Ray node. So the window is kept small (the GCS is read
again just before), worker 0 goes first (slice heads and multi-host jobs land there,
so it is the likeliest to refuse, before any harm is done), a replica whose hosts all
accepted is removed even if the patch must be re-planned (`drained`), and one a
later host of which refused is retired whole once its work ends (`retiring`)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from tpu_autoscaler.adapters.ray.gcs import drain_nodes, read_live_nodes, retire_nodes
from tpu_autoscaler.adapters.ray.state import RayNode
from tpu_autoscaler.adapters.snapshot_file import LoadedSnapshot
from tpu_autoscaler.core.plan import Plan, RemovalCause, Terminate
from tpu_autoscaler.core.snapshot import Host, Replica, ReplicaState
from tpu_autoscaler.shell import events
from tpu_autoscaler.shell.announcer import Ports

log = logging.getLogger("tpu_autoscaler")

RecordEvent = Callable[[dict[str, Any], str, str, events.EventType], None]


class Drainer:
    def __init__(self, ports: Ports, record_event: RecordEvent) -> None:
        self.ports = ports
        self.record_event = record_event
        self.retiring: dict[str, Terminate] = {}
        """Replicas broken by a partial drain, to remove once no host has work."""
        self.drained: dict[str, Terminate] = {}
        """Idle removals whose every host accepted a drain, until the patch lands."""

    def retiring_as_draining(self, loaded: LoadedSnapshot) -> tuple[Replica, ...]:
        """A replica some hosts of which accepted an idle drain before a sibling refused
        is broken: a drained host's pod stays up without a Ray node. Its other hosts
        were retired (no new work; their raylets exit when their work ends), so until
        then it counts as draining: no capacity, and not taken for unhealthy, which
        would kill the work that arrived."""
        retiring = self.retiring
        if not retiring:
            return loaded.snapshot.replicas
        replicas = []
        for replica in loaded.snapshot.replicas:
            if replica.name in retiring and any(h.registered for h in replica.hosts):
                replica = replace(replica, state=ReplicaState.DRAINING)
            replicas.append(replica)
        for name in set(retiring) - {r.name for r in replicas}:
            del retiring[name]
        return tuple(replicas)

    def with_owed(self, decided: Plan, loaded: LoadedSnapshot) -> Plan:
        """Removals whose hosts all drained earlier in this round stay in a re-plan,
        and retired replicas whose hosts have all exited are removed. A replica already
        listed for deletion (the patch landed, its answer was lost) is not removed
        twice, and one still retiring counts as listed (`retiring_as_draining`)."""
        if not self.retiring and not self.drained:
            return decided  # most rounds: nothing owed, no replica to look at
        owed = {**self.retiring, **self.drained}
        planned = {t.replica for t in decided.terminate}
        extra = tuple(
            owed[r.name]
            for r in loaded.snapshot.replicas
            if r.name in owed and r.name not in planned and r.state is not ReplicaState.DRAINING
        )
        return replace(decided, terminate=decided.terminate + extra) if extra else decided

    def drain(self, raw: dict[str, Any], decided: Plan, loaded: LoadedSnapshot) -> tuple[Plan, int]:
        """Drain every live host of each idle replica before its pods are deleted; a
        replica any host of which refuses (work arrived) stays. So does one planned
        away for a provisioning timeout a host of which joined Ray since the round
        read it, and then the gang siblings given back for its lateness. Returns the
        plan without those, and how many there were."""
        removals = [t for t in decided.terminate if t.idle and t.replica not in self.drained]
        timed_out = [t for t in decided.terminate if t.provisioning_timeout]
        if not removals and not timed_out:
            return decided, 0
        hosts = {r.name: r.hosts for r in loaded.snapshot.replicas}
        fresh = read_live_nodes(
            self.ports.gcs,
            {
                h.pod_name
                for removal in (*removals, *timed_out)
                for h in hosts.get(removal.replica, ())
            },
        )
        dropped = self._arrived_while_timing_out(raw, timed_out, hosts, fresh)
        if dropped:
            # The late slices the gang's idle ones were given back for have come:
            # the gang may run now; the next round looks again.
            removals = [t for t in removals if t.cause is not RemovalCause.GANG_INCOMPLETE]
            dropped |= {
                t.replica
                for t in decided.terminate
                if t.cause is RemovalCause.GANG_INCOMPLETE and t.replica not in self.drained
            }
        for removal in removals:
            ordered = sorted(hosts.get(removal.replica, ()), key=lambda h: h.host_index)
            live = [fresh[h.pod_name] for h in ordered if h.pod_name in fresh]
            busy = next((n for n in live if n.status not in ("IDLE", "DRAINING")), None)
            if busy is not None:
                refusal = (busy.node_id, "busy when re-read")
            else:
                outcome = drain_nodes(
                    self.ports.gcs,
                    [n.node_id for n in live],
                    f"tpu-autoscaler: slice {removal.replica} idle: {removal.reason}",
                )
                if outcome.complete:
                    self.drained[removal.replica] = removal
                    log.info(
                        "every live host of an idle replica accepted a drain",
                        extra={
                            "group": removal.group,
                            "replica": removal.replica,
                            "hosts": [h.host_index for h in ordered if h.pod_name in fresh],
                        },
                    )
                    continue
                refusal = outcome.refused[0]
                if outcome.accepted:
                    self._retire(removal, [n.node_id for n in live], outcome.accepted)
            dropped.add(removal.replica)
            node, why = refusal
            self._kept(raw, removal, f"node {node} would not drain ({why or 'busy'})")
        kept = tuple(t for t in decided.terminate if t.replica not in dropped)
        return replace(decided, terminate=kept), len(dropped)

    def _arrived_while_timing_out(
        self,
        raw: dict[str, Any],
        timed_out: list[Terminate],
        hosts: dict[str, tuple[Host, ...]],
        fresh: dict[str, RayNode],
    ) -> set[str]:
        """The replicas planned away for a provisioning timeout a host of which joined
        Ray since the round read it: the slice came, and work may be landing on it."""
        arrived: set[str] = set()
        for removal in timed_out:
            joined = [
                h.pod_name
                for h in hosts.get(removal.replica, ())
                if h.pod_name in fresh and not h.registered
            ]
            if not joined:
                continue
            arrived.add(removal.replica)
            self._kept(
                raw,
                removal,
                f"host(s) {', '.join(joined)} joined Ray while it was being removed "
                f"({removal.reason})",
            )
        return arrived

    def _kept(self, raw: dict[str, Any], removal: Terminate, why: str) -> None:
        """A planned removal the round keeps after all: counted, logged, and told in a
        DRAIN_REFUSED Event on the RayCluster."""
        self.ports.metrics.drains_refused.labels(removal.group).inc()
        message = f"kept replica {removal.replica} of {removal.group}: {why}"
        log.info(message, extra={"group": removal.group, "replica": removal.replica})
        self.record_event(raw, events.DRAIN_REFUSED, message, "Normal")

    def landed(self) -> None:
        """The round's patch landed: the drained replicas are on their way out."""
        self.drained.clear()

    def _retire(self, removal: Terminate, nodes: list[str], drained: tuple[str, ...]) -> None:
        rest = [n for n in nodes if n not in drained]
        retire_nodes(
            self.ports.gcs, rest, f"tpu-autoscaler: slice {removal.replica} lost hosts to a drain"
        )
        self.retiring[removal.replica] = replace(
            removal,
            cause=RemovalCause.UNHEALTHY,
            reason=f"{len(drained)} host(s) drained before a sibling refused; the rest retired "
            "and now without work",
        )
        log.warning(
            "hosts drained before a sibling refused; the slice is retired whole as its work ends",
            extra={"replica": removal.replica, "drained": list(drained), "retired": rest},
        )
