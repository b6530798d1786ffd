"""The read carries what it made of the pods from one round to the next and applies
only what changed (`Observer`: the parse of each pod object; `ReplicaMemo`: the
pods by group, the failed pods, the pods no replica holds, each group's partition
into replicas and its replicas). Whatever came, went, changed, moved or failed in
between, the snapshot assembled with the memos is the one assembled afresh."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tpu_autoscaler.adapters.kube.observe import Observer
from tpu_autoscaler.adapters.kube.pods import (
    PodChanges,
    ReplicaMemo,
    _partition,
    _pods_list,
    parse_pods,
)
from tpu_autoscaler.adapters.ray.state import from_message
from tpu_autoscaler.adapters.snapshot_file import assemble
from tpu_autoscaler.controlplane.clock import EventQueue
from tpu_autoscaler.controlplane.store import ObjectStore
from tpu_autoscaler.core import labels
from tpu_autoscaler.manifest.loading import parse_raycluster
from tpu_autoscaler.testing.scenarios import SnapshotBuilder

CLUSTERS = Path(__file__).resolve().parent.parent / "examples" / "clusters"
GROUP = "tpu-v6e-group"
SHUTDOWN = "Pod was terminated in response to imminent node shutdown."


class _Api:
    """The API server as far as a read asks it: the very pod objects it holds, as the
    simulated store lists them (a change is a new object)."""

    def __init__(self, raycluster: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        self.raycluster = raycluster
        self.pods = pods

    def get_raycluster(self, namespace: str, name: str) -> dict[str, Any]:
        return self.raycluster

    def list_pods(self, namespace: str, selector: Any = None) -> list[dict[str, Any]]:
        return list(self.pods)


def _world() -> tuple[_Api, Any]:
    """A head and four 4-host slices, the fourth not yet in Ray."""
    builder = SnapshotBuilder(yaml.safe_load((CLUSTERS / "v6e-4x4-multihost.yaml").read_text()))
    builder.head()
    builder.replica(GROUP, 0, idle_s=[50, 0, 50, 50])
    builder.replica(GROUP, 1, idle_s=20)
    builder.replica(GROUP, 2, idle_s=10)
    builder.replica(GROUP, 3, running=False)
    data = builder.build()
    for version, pod in enumerate(data["pods"]["items"]):
        pod["metadata"]["resourceVersion"] = str(version + 1)
    return _Api(data["raycluster"], data["pods"]["items"]), builder.state


CHANGES = st.sampled_from(
    [
        "phase",
        "fail",
        "terminate",
        "move",
        "unlabel",
        "drop",
        "restore",
        "add",
        "swap",
        "twice",
        "none",
    ]
)


def _change(api: _Api, change: str, which: int, version: int, dropped: list[Any]) -> None:
    """One change to the world as the API server makes it: a changed pod is a new
    object with a new resourceVersion; a list may hold the same objects elsewhere."""
    pods = api.pods
    if not pods:
        if dropped:
            pods.append(dropped.pop())
        return
    at = which % len(pods)
    pod = copy.deepcopy(pods[at])
    pod["metadata"]["resourceVersion"] = str(version)
    pod_labels = pod["metadata"]["labels"]
    if change == "phase":
        pod["status"]["phase"] = "Pending" if pod["status"]["phase"] == "Running" else "Running"
    elif change == "fail":  # a spot VM preempted: the kubelet fails the pod
        ready = {
            "type": "Ready",
            "status": "False",
            "lastTransitionTime": f"2026-01-01T00:00:{which:02d}Z",
        }
        pod["status"] |= {"phase": "Failed", "reason": "Terminated", "message": SHUTDOWN}
        pod["status"]["conditions"] = [ready]
    elif change == "terminate":
        pod["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    elif change == "move" and labels.KUBERAY_REPLICA_NAME in pod_labels:
        other = pods[(at + 5) % len(pods)]["metadata"]["labels"]
        if labels.KUBERAY_REPLICA_NAME in other:
            pod_labels[labels.KUBERAY_REPLICA_NAME] = other[labels.KUBERAY_REPLICA_NAME]
    elif change == "unlabel":  # a multi-host pod that cannot be tied to its slice
        pod_labels.pop(labels.KUBERAY_REPLICA_NAME, None)
        pod_labels.pop(labels.WEBHOOK_REPLICA_INDEX, None)
    elif change == "drop":
        dropped.append(pods.pop(at))
        return
    elif change == "restore":
        if dropped:
            pods.insert(at, dropped.pop())
        return
    elif change == "add":  # a pod of a new replica, listed in name order
        pod["metadata"]["name"] = f"{pod['metadata']['name']}-{version}"
        if which % 2:  # a replica without a creation time is timed from the read
            pod["metadata"].pop("creationTimestamp", None)
        if labels.KUBERAY_REPLICA_NAME in pod_labels:
            pod_labels[labels.KUBERAY_REPLICA_NAME] = f"{GROUP}-{version}"
        pods.insert(at, pod)
        return
    elif change == "swap":  # the same objects, listed in another order
        pods[at], pods[-1] = pods[-1], pods[at]
        return
    elif change == "twice":  # a pod listed twice, beside a newer version of itself
        pod["status"]["phase"] = "Pending" if pod["status"]["phase"] == "Running" else "Running"
        pods.insert(at + 1, pod)
        return
    else:
        return
    pods[at] = pod


def _fields(partition: Any) -> dict[str, Any]:
    """Its content (a look-up kept once made, `compare=False`, left out)."""
    return {f.name: getattr(partition, f.name) for f in dataclasses.fields(partition) if f.compare}


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(CHANGES, st.integers(0, 40)), min_size=1, max_size=14))
@example([("twice", 16), ("swap", 0)])  # a pod twice, its two listings' order changed
# A pod twice, each listing moved to the other's place (found by a random run: taken
# one place at a time, the second swap undid the first, keeping the old order).
@example([("twice", 14), ("add", 0), ("swap", 35), ("add", 0), ("swap", 36)])
def test_the_read_with_its_memos_is_the_read_afresh(changes: list[tuple[str, int]]) -> None:
    api, state = _world()
    observer = Observer("default", api.raycluster["metadata"]["name"])
    memo = ReplicaMemo()
    ray = from_message(state)
    dropped: list[Any] = []
    for version, (change, which) in enumerate([("none", 0), *changes], start=1000):
        _change(api, change, which, version, dropped)
        observed = observer.read(api)  # type: ignore[arg-type]
        afresh = parse_pods(copy.deepcopy(api.pods))
        assert list(observed.pods) == afresh
        now_s = float(version)
        kept = assemble(observed.cluster, list(observed.pods), ray, now_s, memo=memo)
        cluster = parse_raycluster(copy.deepcopy(api.raycluster), "afresh")
        assert kept.snapshot == assemble(cluster, afresh, ray, now_s).snapshot
        for group, made in memo.groups.items():
            pods = [p for p in afresh if p.metadata.labels.get(labels.KUBERAY_GROUP) == group]
            assert _fields(made.partition) == _fields(_partition(made.shape, pods))


def test_the_memos_are_used_and_follow_changes() -> None:
    """Not only equal: a read with nothing changed hands back the very pods and
    replicas; a failed pod is a preemption at once and the head a fixed host until
    it goes; a pod that comes makes its replica and leaves the others."""
    api, state = _world()
    observer = Observer("default", api.raycluster["metadata"]["name"])
    memo = ReplicaMemo()
    ray = from_message(state)

    def read() -> tuple[Any, Any]:
        observed = observer.read(api)  # type: ignore[arg-type]
        return observed, assemble(observed.cluster, list(observed.pods), ray, 50.0, memo=memo)

    first, loaded = read()
    again, reloaded = read()
    assert all(map(lambda a, b: a is b, first.pods, again.pods))
    assert all(map(lambda a, b: a is b, loaded.snapshot.replicas, reloaded.snapshot.replicas))
    assert [h.pod_name for h in loaded.snapshot.fixed_hosts] == ["tpu-v6e-16-head"]
    assert not loaded.snapshot.capacity_signals

    api.pods = list(reversed(api.pods))  # the same objects elsewhere: kept by object
    assert all(map(lambda a, b: a is b, reversed(first.pods), read()[0].pods))
    api.pods.reverse()

    _change(api, "fail", 3, 2000, [])
    failed = read()[1].snapshot
    assert [s.source for s in failed.capacity_signals] == [f"pod {api.pods[3]['metadata']['name']}"]

    head = next(p for p in api.pods if p["metadata"]["name"].endswith("-head"))
    api.pods.remove(head)
    assert read()[1].snapshot.fixed_hosts == ()
    api.pods.append(head)
    assert [h.pod_name for h in read()[1].snapshot.fixed_hosts] == ["tpu-v6e-16-head"]
    _change(api, "terminate", len(api.pods) - 1, 2500, [])  # the head, a new object in place
    assert read()[1].snapshot.fixed_hosts == ()
    api.pods[-1] = head
    assert [h.pod_name for h in read()[1].snapshot.fixed_hosts] == ["tpu-v6e-16-head"]

    before = read()[1].snapshot.replicas
    _change(api, "add", 5, 3000, [])
    after = read()[1].snapshot
    existing = [r for r in after.replicas if r.hosts]
    assert len(existing) == len([r for r in before if r.hosts]) + 1
    assert sum(any(r is b for b in before) for r in existing) == len(existing) - 1

    _change(api, "terminate", 6, 4000, [])
    draining = read()[1].snapshot
    assert sum(r.state.name == "DRAINING" for r in draining.replicas) == 1


def test_an_unversioned_pod_is_parsed_at_every_read_even_as_the_same_object() -> None:
    """Without a resourceVersion nothing says a pod is unchanged, not even being the
    object listed last read: it is parsed again at every read."""
    api, _ = _world()
    observer = Observer("default", api.raycluster["metadata"]["name"])
    pod = api.pods[1]
    del pod["metadata"]["resourceVersion"]
    for phase in ("Pending", "Running", "Pending"):
        pod["status"]["phase"] = phase  # changed where it lies: no version to tell
        assert observer.read(api).pods[1].status.phase == phase  # type: ignore[arg-type]


class _FreshApi(_Api):
    """A real client's lists: every pod decoded afresh, never an object listed before."""

    def list_pods(self, namespace: str, selector: Any = None) -> list[dict[str, Any]]:
        return copy.deepcopy(self.pods)


def test_a_real_clients_list_keeps_the_parses_of_the_pods_still_listed_after_most_went() -> None:
    """With a real client pods are found by (name, resourceVersion); once most pods went,
    the parses of those gone are dropped and those of the pods still listed kept."""
    api, _ = _world()
    fresh = _FreshApi(api.raycluster, api.pods)
    observer = Observer("default", api.raycluster["metadata"]["name"])
    first = {pod.name: pod for pod in observer.read(fresh).pods}
    assert all(p is first[p.name] for p in observer.read(fresh).pods)
    fresh.pods = fresh.pods[:3]
    for _ in range(2):
        kept = observer.read(fresh).pods
        assert [p.name for p in kept] == [p["metadata"]["name"] for p in fresh.pods]
        assert all(p is first[p.name] for p in kept)
    assert set(observer.parsed_pods) == {p.name for p in kept}


STORE_OPS = st.tuples(
    st.sampled_from(["create", "bind", "phase", "annotate", "delete", "wait", "list"]),
    st.integers(0, 7),
)
SELECTIONS: list[dict[str, str] | None] = [None, {"c": "a"}, {"c": "a", "g": "x"}, {"c": "b"}]


def _stored_pod(index: int) -> dict[str, Any]:
    labels = {"c": "ab"[index % 2], "g": "xy"[index // 2 % 2]}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"p{index}", "namespace": "default", "labels": labels},
        "spec": {"containers": [{"name": "c"}]},
        "status": {"phase": "Pending"},
    }


def _selected(store: ObjectStore, selector: dict[str, str] | None) -> list[dict[str, Any]]:
    """What a list selects, from every pod stored: as the store listed before it kept lists."""
    stored = [store.pod(*key) for key in sorted(store.pod_keys())]
    return [
        pod
        for pod in stored
        if pod is not None
        and all(pod["metadata"]["labels"].get(k) == v for k, v in (selector or {}).items())
    ]


def _store_step(store: ObjectStore, clock: EventQueue, op: str, index: int) -> None:
    name = f"p{index}"
    stored = store.pod("default", name)
    if op == "create" and stored is None:
        store.create_pod(_stored_pod(index))
    elif op == "wait":
        clock.run_until(clock.now_s + 10.0 * index)  # graceful deletions end
    elif stored is None or op == "list":
        return
    elif op == "bind":
        store.bind_pod("default", name, f"node-{index}")
    elif op == "phase":
        store.set_pod_phase("default", name, "Running")
    elif op == "annotate":
        store.annotate_pod("default", name, {"a": str(clock.now_s)})
    elif op == "delete":
        store.delete_pod("default", name, grace_s=float(index))


@settings(max_examples=80, deadline=None)
@given(st.lists(STORE_OPS, min_size=1, max_size=40))
def test_a_kept_pod_list_lists_the_stored_pods(ops: list[tuple[str, int]]) -> None:
    """The simulated API server's kept lists (`ObjectStore.list_pods`), brought up to
    date by the pods written since, list the very pods stored, in order, for each
    selection; every list is a new one, and a list taken before keeps what it saw."""
    clock = EventQueue()
    store = ObjectStore(clock)
    taken: list[tuple[list[dict[str, Any]], list[dict[str, Any]]]] = []
    for op, index in ops:
        _store_step(store, clock, op, index)
        for selector in SELECTIONS:
            listed = store.list_pods("default", selector)
            assert listed is not store.list_pods("default", selector)
            expected = _selected(store, selector)
            assert len(listed) == len(expected)
            assert all(map(lambda a, b: a is b, listed, expected))
            if op == "list":
                taken.append((listed, copy.deepcopy(listed)))
    assert all(listed == seen for listed, seen in taken)


def test_a_kept_pod_list_stays_right_when_its_writes_are_forgotten() -> None:
    """Many writes between two lists (more than the store remembers one by one): the
    kept lists are brought up to date from their keys."""
    clock = EventQueue()
    store = ObjectStore(clock)
    for index in range(4):
        store.create_pod(_stored_pod(index))
    first = store.list_pods("default", {"c": "a"})
    for round_ in range(3):
        for index in range(1, 4):  # each written once, long before the list
            store.annotate_pod("default", f"p{index}", {"w": str(round_)})
        for write in range(1100):
            store.annotate_pod("default", "p0", {"w": f"{round_}-{write}"})
        for selector in SELECTIONS:
            expected = _selected(store, selector)
            assert all(map(lambda a, b: a is b, store.list_pods("default", selector), expected))
    assert [p["metadata"].get("annotations") for p in first] == [None, None]


class _StoreApi:
    """The simulated API server as a read asks it: its lists tell what changed since
    an earlier one (`PodList`), and another reader of the same selection (the
    simulator's sampler, KubeRay) lists between the reads."""

    def __init__(self, store: ObjectStore, name: str) -> None:
        self.store = store
        self.name = name

    def get_raycluster(self, namespace: str, name: str) -> dict[str, Any]:
        return self.store.get_raycluster(namespace, name)

    def list_pods(self, namespace: str, selector: Any = None) -> list[dict[str, Any]]:
        return self.store.list_pods(namespace, selector)


STORED_CHANGES = st.sampled_from(
    ["phase", "fail", "delete", "wait", "add", "annotate", "other-list", "many-writes", "none"]
)


def _stored_world() -> tuple[ObjectStore, EventQueue, _StoreApi, Any]:
    """`_world` held by the simulated API server."""
    api, state = _world()
    clock = EventQueue()
    store = ObjectStore(clock)
    store.create_raycluster(api.raycluster)
    for pod in api.pods:
        del pod["metadata"]["resourceVersion"]
        store.create_pod(pod)
    return store, clock, _StoreApi(store, api.raycluster["metadata"]["name"]), state


def _stored_change(store: ObjectStore, clock: EventQueue, change: str, which: int) -> None:
    """One change as the simulated world makes them, through the store."""
    selector = {labels.KUBERAY_CLUSTER: store.raycluster_keys()[0][1]}
    pods = store.list_pods("default", selector)
    if not pods:
        return
    pod = pods[which % len(pods)]
    name = pod["metadata"]["name"]
    if change == "phase":
        phase = "Pending" if pod["status"].get("phase") == "Running" else "Running"
        store.set_pod_phase("default", name, phase)
    elif change == "fail":
        store.set_pod_phase("default", name, "Failed", "Terminated", SHUTDOWN)
    elif change == "delete":  # graceful if bound: terminating, removed at `wait`
        store.delete_pod("default", name, grace_s=float(which % 3) * 5.0)
    elif change == "wait":
        clock.run_until(clock.now_s + 10.0)
    elif change == "add":  # a pod of a new replica (or a new single pod), before or after
        new = copy.deepcopy(pod)
        new["metadata"] = {
            "name": f"{'a' if which % 2 else 'z'}{which}-{name}",
            "namespace": "default",
            "labels": dict(pod["metadata"]["labels"]),
        }
        if labels.KUBERAY_REPLICA_NAME in new["metadata"]["labels"]:
            new["metadata"]["labels"][labels.KUBERAY_REPLICA_NAME] = f"{GROUP}-n{which}"
        if which % 3 == 0:  # of a group the cluster does not have: no replica's host
            new["metadata"]["labels"][labels.KUBERAY_GROUP] = "gone-group"
        if store.pod("default", new["metadata"]["name"]) is None:
            store.create_pod(new)
    elif change == "annotate":
        store.annotate_pod("default", name, {"seen": str(which)})
    elif change == "other-list":
        store.list_pods("default", selector)
    elif change == "many-writes":  # more than the store tells one by one
        for write in range(4 * len(pods) + 1100):
            store.annotate_pod("default", name, {"w": str(write)})


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(STORED_CHANGES, st.integers(0, 40)), min_size=1, max_size=16))
@example([("add", 1), ("delete", 3), ("wait", 0), ("fail", 2)])
@example([("many-writes", 0), ("phase", 1)])
def test_a_read_told_its_changes_is_the_read_afresh(changes: list[tuple[str, int]]) -> None:
    """The simulated API server's lists tell what changed since the last (`PodList`);
    the read then parses and places only those pods (`Observer._pods_told`) and the
    replica memo only those (`ReplicaMemo._told`). Whatever came, went or changed, the
    pods, the changes told and the snapshot are those of reading afresh, and the
    changes were told (the walk of every pod skipped) at every read but the first."""
    store, clock, api, state = _stored_world()
    observer = Observer("default", api.name)
    memo = ReplicaMemo()
    ray = from_message(state)
    last: dict[str, Any] = {}
    told = placed = 0
    for round_, (change, which) in enumerate([("none", 0), *changes]):
        _stored_change(store, clock, change, which)
        observed = observer.read(api)  # type: ignore[arg-type]
        raw = store.list_pods("default", {labels.KUBERAY_CLUSTER: api.name})
        afresh = parse_pods(copy.deepcopy(list(raw)))
        assert list(observed.pods) == afresh
        now = {p.name: p for p in observed.pods}
        assert observed.changes is not None
        if observed.changes.pods is not None:
            told += 1
            expected = {n for n in last.keys() | now.keys() if last.get(n) is not now.get(n)}
            assert {name for name, _, _ in observed.changes.pods} == expected
            assert all(last.get(n) is b and now.get(n) is a for n, b, a in observed.changes.pods)
        last = now
        now_s = 100.0 + round_
        kept = assemble(
            observed.cluster, list(observed.pods), ray, now_s, memo=memo, changes=observed.changes
        )
        cluster = parse_raycluster(copy.deepcopy(store.get_raycluster("default", api.name)), "a")
        assert kept.snapshot == assemble(cluster, afresh, ray, now_s).snapshot
        placed += memo.group_changes is not None
        held = [
            p
            for p in afresh
            if p.metadata.labels.get(labels.KUBERAY_NODE_TYPE, "worker") == "worker"
            and p.metadata.labels.get(labels.KUBERAY_GROUP) == GROUP
        ]
        assert memo.unheld == [p for p in afresh if not any(p is h for h in held)]
        assert memo.failed == [p for p in afresh if p.status.phase == "Failed"]
        for group, made in memo.groups.items():
            pods = [p for p in afresh if p.metadata.labels.get(labels.KUBERAY_GROUP) == group]
            # A group told its changes lists its pods at the first ask (`_GroupPods`):
            # as many as counted from the changes, and the pods listed.
            assert len(made.pods) == len(pods)
            assert _pods_list(made.pods) == pods
            assert _fields(made.partition) == _fields(_partition(made.shape, pods))
    forgotten = sum(change == "many-writes" for change, _ in changes)
    assert told >= len(changes) - forgotten
    assert placed >= len(changes) - 2 * forgotten


def test_a_read_told_its_changes_then_other_groups_held_finds_the_pods_no_replica_holds() -> None:
    """After reads told their changes (the memo's by-place lists then not kept), the
    same pods read with other groups held (a group gone from the spec) are walked:
    the pods no replica holds are those of the groups not held."""
    store, clock, api, _ = _stored_world()
    observer = Observer("default", api.name)
    memo = ReplicaMemo()
    for change, which in [("none", 0), ("add", 1), ("delete", 2), ("phase", 3)]:
        _stored_change(store, clock, change, which)
        observed = observer.read(api)  # type: ignore[arg-type]
        memo.pods_by_group(api.name, list(observed.pods), (GROUP,), observed.changes)
    assert memo.group_changes is not None  # the last read was told
    pods = list(observed.pods)
    held = (GROUP, "another-group")
    by_group = memo.pods_by_group(api.name, pods, held, PodChanges(memo.read, object(), ()))
    assert memo.unheld == [p for p in pods if p.metadata.labels.get(labels.KUBERAY_GROUP) != GROUP]
    assert by_group[GROUP] == [
        p for p in pods if p.metadata.labels.get(labels.KUBERAY_GROUP) == GROUP
    ]
