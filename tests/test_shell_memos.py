"""What the round's shell keeps from one round to the next so that a round costs what
changed since the last (the resizer's pods that owe their raylet nothing, the hosts'
first-seen registration times, the hosts `ray status` lists as starting) gives what
working everything out afresh gives: after a change, a failed call, a re-read of the
same objects, and in a new process whose memory starts empty."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from ray.core.generated import autoscaler_pb2

from tests.factories import container, cpu_group, raycluster
from tests.test_parity_ippr import ippr_annotation, set_pod_size
from tpu_autoscaler.adapters.ray.gcs import (
    FailedHosts,
    GcsUnavailable,
    PendingHosts,
    StartingHost,
    autoscaling_state,
    starting_part,
)
from tpu_autoscaler.adapters.ray.state import RayState
from tpu_autoscaler.adapters.snapshot_file import LoadedSnapshot, build_snapshot
from tpu_autoscaler.core.capacity import CapacityStatus, GroupCapacity
from tpu_autoscaler.core.demand import Demand
from tpu_autoscaler.core.plan import Plan
from tpu_autoscaler.core.snapshot import ClusterSnapshot, Host, Replica, ReplicaState
from tpu_autoscaler.shell import resizer as resizer_module
from tpu_autoscaler.shell.announcer import Announcer
from tpu_autoscaler.shell.controller import Autoscaler
from tpu_autoscaler.shell.metrics import AutoscalerMetrics
from tpu_autoscaler.shell.resizer import Resizer
from tpu_autoscaler.testing.scenarios import SnapshotBuilder

# --- the resizer ----------------------------------------------------------------------


class _Kube:
    def __init__(self) -> None:
        self.annotated: list[tuple[str, dict[str, str]]] = []

    def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        self.annotated.append((name, annotations))


class _Gcs:
    def __init__(self) -> None:
        self.told: list[tuple[str, dict[str, float]]] = []
        self.down = False

    def resize_raylet_resource_instances(
        self, node_id: str, resources: dict[str, float]
    ) -> dict[str, float]:
        if self.down:
            raise GcsUnavailable("GCS down")
        self.told.append((node_id, resources))
        return resources


def _read(recorded: dict[str, Any] | None) -> LoadedSnapshot:
    """Two pods of a group that resizes in place, read afresh (new objects): the
    second grown to 4 CPUs by the kubelet, with `recorded` as its `ray.io/ippr-status`
    (None: never resized)."""
    cluster = raycluster(
        cpu_group("cpu", template={"spec": {"containers": [container("2", "8Gi")]}})
    )
    cluster["metadata"]["annotations"] = {"ray.io/ippr": ippr_annotation({"cpu": 8})}
    builder = SnapshotBuilder(cluster)
    builder.replica("cpu", 0)
    builder.replica("cpu", 1)
    if recorded is not None:
        set_pod_size(builder, 4, recorded)
    return build_snapshot(builder.build(), "test")


def _resizer() -> tuple[Resizer, _Kube, _Gcs]:
    kube, gcs = _Kube(), _Gcs()
    return Resizer(kube, gcs, "default", lambda: 0.0), kube, gcs  # type: ignore[arg-type]


UNDER_WAY = {"resizing-at": 1_700_000_000, "raylet-id": "ab"}


def test_a_pod_that_owed_nothing_and_changed_is_looked_at_again() -> None:
    resizer, kube, gcs = _resizer()
    resizer.sync(_read(None))
    resizer.sync(_read({"last-failed-at": 1_700_000_000}))  # a record, none under way
    assert not gcs.told and not kube.annotated
    grown = _read(UNDER_WAY)
    resizer.sync(grown)
    (pod,) = [p for p in grown.pods if p.metadata.annotations]
    assert gcs.told == [("ab", {"CPU": 4.0, "memory": 16.0 * 2**30})]
    assert [name for name, _ in kube.annotated] == [pod.name]


def test_a_raylet_not_told_is_told_at_the_next_round_of_the_same_pods() -> None:
    resizer, kube, gcs = _resizer()
    grown = _read(UNDER_WAY)
    gcs.down = True
    resizer.sync(grown)
    assert not gcs.told and not kube.annotated
    gcs.down = False
    resizer.sync(grown)  # the same objects: the owed pod is not taken as owing nothing
    assert len(gcs.told) == 1 and len(kube.annotated) == 1
    restarted, _, gcs_after_restart = _resizer()
    restarted.sync(grown)  # a new process: its memory empty, the pods read afresh
    assert len(gcs_after_restart.told) == 1


def test_pods_read_in_other_places_are_told_apart_by_object(monkeypatch: Any) -> None:
    """Pods are passed over first by place (the same object where it was last round),
    then by object: after the order changed, the pod that owed nothing is still passed
    over and the one that owed is looked at and told. Seen red with the second step
    dropped (every pod out of place looked at)."""
    resizer, kube, gcs = _resizer()
    grown = _read(UNDER_WAY)
    gcs.down = True
    resizer.sync(grown)
    gcs.down = False
    (owed,) = [p for p in grown.pods if p.metadata.annotations]
    others = [p for p in grown.pods if p is not owed]
    looked_at: list[str] = []
    before = resizer_module._raylet_owed

    def counting(pod: Any) -> str | None:
        looked_at.append(pod.name)
        return before(pod)

    monkeypatch.setattr(resizer_module, "_raylet_owed", counting)
    resizer.sync(replace(grown, pods=[owed, *others]))  # the order changed
    assert looked_at == [owed.name]
    assert len(gcs.told) == 1 and len(kube.annotated) == 1


def test_pods_read_as_last_round_are_not_looked_at(monkeypatch: Any) -> None:
    resizer, _, _ = _resizer()
    looked_at: list[str] = []
    owed = resizer_module._raylet_owed

    def counting(pod: Any) -> str | None:
        looked_at.append(pod.name)
        return owed(pod)

    monkeypatch.setattr(resizer_module, "_raylet_owed", counting)
    loaded = _read(None)
    resizer.sync(loaded)
    resizer.sync(loaded)
    assert len(looked_at) == len(loaded.pods) == 2
    for _ in range(3):
        resizer.sync(_read(None))  # every pod changed each time: the memo stays small
    assert len(resizer.owe_nothing) <= 2 * len(loaded.pods)


# --- registration times ---------------------------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _autoscaler(clock: _Clock) -> Autoscaler:
    return Autoscaler(None, None, "default", "c", clock=clock)  # type: ignore[arg-type]


def _replica(name: str, pods: tuple[tuple[str, bool], ...]) -> Replica:
    hosts = tuple(
        Host(pod, index, node_id=f"node-{pod}" if registered else None)
        for index, (pod, registered) in enumerate(pods)
    )
    return Replica("g", name, ReplicaState.RUNNING, hosts)


ROUND = st.lists(
    st.tuples(
        st.sampled_from(["r0", "r1", "r2", "r3"]),
        st.lists(
            st.tuples(st.sampled_from(["p0", "p1", "p2", "p3", "p4", "p5"]), st.booleans()),
            max_size=3,
        ).map(tuple),
        st.booleans(),
    ),
    max_size=4,
)
"""One read: replicas by name with their (pod, registered) hosts, each either the
object of the same name and hosts read before (as the replica memo keeps it) or a new
one; a pod may be in two replicas."""


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(ROUND, st.sampled_from(["ok", "failed", "replan", "restart"]))))
def test_registration_times_are_first_seen_times_however_rounds_end(
    rounds: list[tuple[list[tuple[str, tuple[tuple[str, bool], ...], bool]], str]],
) -> None:
    """The times kept and updated by what changed are the first-seen times a walk of
    every host every round gives: a host is new when no replica of the last read had
    it registered. A failed round keeps its read; a conflict reads again the same
    objects; a restart forgets all."""
    clock = _Clock()
    autoscaler = _autoscaler(clock)
    objects: dict[tuple[str, tuple[tuple[str, bool], ...]], Replica] = {}
    first_seen: dict[str, float] = {}
    for step, (read, ending) in enumerate(rounds):
        clock.now = float(step)
        if ending == "restart":
            autoscaler, first_seen, objects = _autoscaler(clock), {}, {}
        replicas = []
        for name, pods, same in read:
            key = (name, pods)
            if not same or key not in objects:
                objects[key] = _replica(name, pods)
            replicas.append(objects[key])
        for _ in range(2 if ending == "replan" else 1):
            timed = autoscaler._with_registration_times(tuple(replicas))
            seen: dict[str, float] = {}
            for replica in timed:
                for host in replica.hosts:
                    if host.registered:
                        at_s = seen.get(host.pod_name, first_seen.get(host.pod_name, clock.now))
                        assert host.registered_at_s == at_s, (step, host.pod_name)
                        seen[host.pod_name] = at_s
                    else:
                        assert host.registered_at_s is None
            assert autoscaler.memory.registered_at == seen
            first_seen = seen


def test_a_replica_read_twice_in_one_round_holds_its_hosts_once() -> None:
    """The same replica object twice in a read (new, then kept) is one holder of its
    hosts: once it goes, so do their times."""
    clock = _Clock()
    autoscaler = _autoscaler(clock)
    up = _replica("r", (("p", True),))
    for _ in range(2):
        timed = autoscaler._with_registration_times((up, up))
        assert [r.hosts[0].registered_at_s for r in timed] == [0.0, 0.0]
    clock.now = 5.0
    autoscaler._with_registration_times((_replica("s", (("q", True),)),))
    assert autoscaler.memory.registered_at == {"q": 5.0}
    assert autoscaler.memory.registered_holders == {"q": 1}


def test_a_host_that_left_ray_and_came_back_is_new() -> None:
    clock = _Clock()
    autoscaler = _autoscaler(clock)
    up = _replica("r", (("p", True),))
    assert autoscaler._with_registration_times((up,))[0].hosts[0].registered_at_s == 0.0
    clock.now = 5.0
    assert autoscaler._with_registration_times((up,))[0].hosts[0].registered_at_s == 0.0
    clock.now = 10.0
    autoscaler._with_registration_times((_replica("r", (("p", False),)),))
    clock.now = 15.0
    back = _replica("r", (("p", True),))
    assert autoscaler._with_registration_times((back,))[0].hosts[0].registered_at_s == 15.0
    clock.now = 20.0
    autoscaler._with_registration_times(())  # the replica gone: its host forgotten
    clock.now = 25.0
    assert autoscaler._with_registration_times((back,))[0].hosts[0].registered_at_s == 25.0


def _idled(replica: Replica, idle_s: float) -> Replica:
    """`replica` with its first host idle `idle_s` (what `_idled_again` makes)."""
    first, *others = replica.hosts
    return replace(replica, hosts=(replace(first, idle_s=idle_s), *others))


def test_a_replica_idled_from_last_rounds_takes_its_times_without_a_look(
    monkeypatch: Any,
) -> None:
    """A replica the memo made from one of last round's by idle times alone
    (`ReplicaMemo.idled`) takes that one's entry: no host looked at, the same times,
    held as before. Unless that one was given other times than it was read with: then
    its hosts are looked at and given their times."""
    clock = _Clock()
    autoscaler = _autoscaler(clock)
    timed_right = _replica("r", (("p", True), ("q", False)))
    timed_right = replace(
        timed_right,
        hosts=(replace(timed_right.hosts[0], registered_at_s=0.0), timed_right.hosts[1]),
    )
    untimed = _replica("s", (("u", True),))  # read without its time: given it here
    first = autoscaler._with_registration_times((timed_right, untimed))
    assert first[0] is timed_right and first[1] is not untimed
    clock.now = 5.0
    idled_right, idled_untimed = _idled(timed_right, 5.0), _idled(untimed, 5.0)
    made_from = {
        id(idled_right): (idled_right, timed_right),
        id(idled_untimed): (idled_untimed, untimed),
    }
    monkeypatch.setattr(autoscaler.memory.replicas, "idled", lambda: made_from)
    looked_at: list[str] = []
    entry = Autoscaler._registration_entry

    def look(replica: Replica, registered_at: dict[str, float], now: float) -> Any:
        looked_at.append(replica.name)
        return entry(replica, registered_at, now)

    monkeypatch.setattr(Autoscaler, "_registration_entry", staticmethod(look))
    timed = autoscaler._with_registration_times((idled_right, idled_untimed))
    assert timed[0] is idled_right and looked_at == ["s"]
    assert [r.hosts[0].registered_at_s for r in timed] == [0.0, 0.0]
    assert autoscaler.memory.registered_at == {"p": 0.0, "u": 0.0}
    assert autoscaler.memory.registered_holders == {"p": 1, "u": 1}


# --- ray status's starting hosts ------------------------------------------------------


class _ReportGcs:
    def __init__(self) -> None:
        self.reports: list[bytes] = []

    def report_autoscaling_state(self, state: bytes) -> None:
        self.reports.append(state)


class _Ports:
    def __init__(self) -> None:
        self.kube = None
        self.gcs = _ReportGcs()
        self.clock = lambda: 1000.0
        self.metrics = AutoscalerMetrics()


def _pending(name: str, registered: tuple[bool, ...]) -> Replica:
    hosts = tuple(
        Host(f"{name}-{i}", i, node_id=f"n-{name}-{i}" if up else None)
        for i, up in enumerate(registered)
    )
    return Replica("g", name, ReplicaState.PENDING, hosts, slice_name=f"slice-{name}")


def _starting(
    announcer: Announcer, replicas: tuple[Replica, ...], capacity: tuple[GroupCapacity, ...]
) -> list[tuple[str, str]]:
    """The hosts the report lists as starting (pod, details), as the GCS reads it."""
    shape = build_snapshot(SnapshotBuilder(_group_g()).build(), "t").snapshot.shapes[0]
    after = ClusterSnapshot((shape,), replicas, Demand(), 0.0)
    announcer.report(RayState((), Demand()), after, Plan(capacity=capacity))
    reported = autoscaler_pb2.AutoscalingState.FromString(announcer.ports.gcs.reports[-1])
    return [(p.instance_id, p.details) for p in reported.pending_instances]


def _group_g() -> dict[str, Any]:
    return raycluster(cpu_group("g"))


def test_starting_hosts_follow_their_replica_and_its_capacity_note() -> None:
    announcer = Announcer(_Ports(), "default", "default/c")  # type: ignore[arg-type]
    waiting = _pending("a", (True, False, False))
    assert _starting(announcer, (waiting,), ()) == [
        ("a-1", "slice slice-a: waiting for its hosts"),
        ("a-2", "slice slice-a: waiting for its hosts"),
    ]
    assert _starting(announcer, (waiting,), ()) == _starting(announcer, (waiting,), ())
    stocked_out = GroupCapacity("g", CapacityStatus.STOCKED_OUT, 0.0, reason="no v6e")
    noted = _starting(announcer, (waiting,), (stocked_out,))
    assert [pod for pod, _ in noted] == ["a-1", "a-2"]
    assert {details for _, details in noted} == {
        "slice slice-a: waiting for its hosts; stocked out since 1970-01-01T00:00:00Z: no v6e"
    }
    _starting(announcer, (waiting,), ())
    one_more = replace(waiting, hosts=(*waiting.hosts[:2], replace(waiting.hosts[2], node_id="x")))
    assert [pod for pod, _ in _starting(announcer, (one_more,), ())] == ["a-1"]
    fresh = Announcer(_Ports(), "default", "default/c")  # type: ignore[arg-type]
    assert _starting(fresh, (one_more,), ()) == _starting(announcer, (one_more,), ())
    assert len(announcer.starting) == 1


def test_starting_hosts_sent_as_parts_read_as_listed_in_the_state() -> None:
    """A state with the starting hosts' parts put after it (`starting_part`) reads as
    the state made with those hosts listed in it, in the same order."""
    hosts = [
        StartingHost("g", f"p-{i}", f"slice s-{i // 2}: waiting for its hosts") for i in range(5)
    ]
    pending = [PendingHosts("g", 4, 12.0)]
    failed = [FailedHosts("g", 4, "stocked out", 1.0, 2.0)]
    whole = autoscaling_state(RayState((), Demand()), 7, pending, hosts, (), failed)
    head = autoscaling_state(RayState((), Demand()), 7, pending, (), (), failed)
    sent = head.SerializeToString() + starting_part(hosts[:2]) + starting_part(hosts[2:])
    assert autoscaler_pb2.AutoscalingState.FromString(sent) == whole
    assert len(whole.pending_instances) == 5
