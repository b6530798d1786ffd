"""What the autoscaler's read keeps from one read to the next (the pods parsed per
resourceVersion and their specs, `Observer`; the nodes by their bytes as sent and the
gangs by message, `NodeMemory`; the node messages read off the wire, `wire`; the
replicas, `ReplicaMemo`) gives, read after read, what reading everything afresh
gives, whatever changed in between: a pod's status, its replica, its spec, pods gone
and back, a node's use and idle time, the removal marks, the pending gangs."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from ray.core.generated import autoscaler_pb2

from tpu_autoscaler.adapters.kube.observe import Observer
from tpu_autoscaler.adapters.kube.pods import Registrations, ReplicaMemo, parse_pods, replicas_of
from tpu_autoscaler.adapters.ray import wire
from tpu_autoscaler.adapters.ray.gcs import autoscaling_state, read_ray_state
from tpu_autoscaler.adapters.ray.state import NodeMemory, from_message
from tpu_autoscaler.adapters.snapshot_file import assemble
from tpu_autoscaler.core import labels
from tpu_autoscaler.core.demand import DemandRef
from tpu_autoscaler.core.problems import ManifestError
from tpu_autoscaler.core.snapshot import Replica
from tpu_autoscaler.manifest.loading import parse_raycluster
from tpu_autoscaler.manifest.shapes import derive_shapes
from tpu_autoscaler.shell import controller
from tpu_autoscaler.shell.controller import Autoscaler
from tpu_autoscaler.sim import gcs_state
from tpu_autoscaler.sim.cluster import SimulatedCluster
from tpu_autoscaler.sim.workload import load_workload
from tpu_autoscaler.testing.scenarios import SnapshotBuilder

CLUSTERS = Path(__file__).resolve().parent.parent / "examples" / "clusters"
GROUP = "tpu-v6e-group"


class _Api:
    """The API server and the GCS as far as a read asks them."""

    def __init__(self, raycluster: dict[str, Any], pods: list[dict[str, Any]], state: Any):
        self.raycluster = raycluster
        self.pods = pods
        self.state = state

    def get_raycluster(self, namespace: str, name: str) -> dict[str, Any]:
        # Decoded afresh at every get, as by a real client: `_change` edits the
        # RayCluster in place, and a reader keeps what it listed (`Observer`).
        return copy.deepcopy(self.raycluster)

    def list_pods(self, namespace: str, selector: Any = None) -> list[dict[str, Any]]:
        return list(self.pods)

    def get_cluster_resource_state(self) -> bytes:
        reply = autoscaler_pb2.GetClusterResourceStateReply()
        reply.cluster_resource_state.CopyFrom(self.state)
        return bytes(reply.SerializeToString())


def _world() -> _Api:
    """Three 4-host slices, the third not yet in Ray, and two pending gangs."""
    builder = SnapshotBuilder(yaml.safe_load((CLUSTERS / "v6e-4x4-multihost.yaml").read_text()))
    builder.replica(GROUP, 0, used={1: {"TPU": 4.0}}, idle_s=[50, 0, 50, 50])
    builder.replica(GROUP, 1, idle_s=20)
    builder.replica(GROUP, 2, running=False)
    builder.placement_group("pg-a", [{"TPU": 4.0}] * 2, "STRICT_SPREAD")
    builder.placement_group("", [{"CPU": 1.0}], "PACK")
    data = builder.build()
    for version, pod in enumerate(data["pods"]["items"]):
        pod["metadata"]["resourceVersion"] = str(version + 1)
    return _Api(data["raycluster"], data["pods"]["items"], copy.deepcopy(builder.state))


CHANGES = st.sampled_from(
    [
        "phase",
        "replica",
        "spec",
        "bind",
        "unversioned",
        "drop",
        "restore",
        "twice",
        "use",
        "idle",
        "renode",
        "restart",
        "join",
        "leave",
        "doomed",
        "gang",
        "none",
    ]
)


def _change(api: _Api, change: str, which: int, version: int, dropped: list[Any]) -> None:
    """One change to the world, as the API server would make it (a new object with a
    new resourceVersion) or the GCS would report it."""
    pods = api.pods
    at = which % len(pods) if pods else 0
    if change in ("phase", "replica", "spec", "bind", "unversioned") and pods:
        pod = copy.deepcopy(pods[at])
        pod["metadata"]["resourceVersion"] = str(version)
        if change == "unversioned":  # a pod listed without a version, its phase moved
            del pod["metadata"]["resourceVersion"]
            pod["status"]["phase"] = "Pending" if pod["status"]["phase"] == "Running" else "Running"
        elif change == "phase":
            running = pod["status"]["phase"] == "Running"
            pod["status"]["phase"] = "Pending" if running else "Running"
        elif change == "replica":
            other = pods[(at + 5) % len(pods)]["metadata"]["labels"]
            pod["metadata"]["labels"][labels.KUBERAY_REPLICA_NAME] = other[
                labels.KUBERAY_REPLICA_NAME
            ]
        elif change == "bind":  # the scheduler placed it: its spec changed, not its containers
            pod["spec"]["nodeName"] = f"node-{version}"
        else:
            pod["spec"]["containers"][0]["env"].append({"name": "X", "value": str(version)})
            pod["spec"]["nodeName"] = f"node-{version}"
        pods[at] = pod
    elif change == "twice" and pods:  # a pod listed twice, beside a newer version of itself
        pod = copy.deepcopy(pods[at])
        pod["metadata"]["resourceVersion"] = str(version)
        pods.insert(at + 1, pod)
    elif change == "drop" and pods:
        dropped.append(pods.pop(at))
    elif change == "restore" and dropped:
        pods.insert(at, dropped.pop())
    elif change in ("use", "idle") and api.state.node_states:
        node = api.state.node_states[which % len(api.state.node_states)]
        if change == "use":
            tpu = node.available_resources.get("TPU", 0.0)
            node.available_resources["TPU"] = 4.0 - tpu
        else:
            node.idle_duration_ms += 1000
    elif change == "renode" and api.state.node_states:  # a node now another pod's
        states = api.state.node_states
        node = states[which % len(states)]
        node.instance_id = states[(which + 1) % len(states)].instance_id
    elif change == "restart" and api.state.node_states:  # its raylet died and came back
        states = api.state.node_states
        node = states[which % len(states)]
        again = states.add()
        again.CopyFrom(node)
        again.node_id = bytes([version % 256]) * 28
        node.status = autoscaler_pb2.NodeStatus.DEAD
    elif change == "join" and api.state.node_states:  # a raylet joined, of a pod or none
        again = api.state.node_states.add()
        again.CopyFrom(api.state.node_states[which % len(api.state.node_states)])
        again.node_id = bytes([version % 256]) * 28
        again.instance_id = pods[at]["metadata"]["name"] if pods and which % 2 else ""
        if which % 3 == 0:  # listed dead already: a pod's live node stays its node
            again.status = autoscaler_pb2.NodeStatus.DEAD
    elif change == "leave" and api.state.node_states:  # the GCS forgot a node
        del api.state.node_states[which % len(api.state.node_states)]
    elif change == "doomed" and pods:
        spec = api.raycluster["spec"]["workerGroupSpecs"][0]
        doomed = spec.setdefault("scaleStrategy", {}).setdefault("workersToDelete", [])
        name = pods[at]["metadata"]["name"]
        doomed.remove(name) if name in doomed else doomed.append(name)
        api.raycluster["metadata"]["resourceVersion"] = str(version)
    elif change == "gang" and len(api.state.pending_gang_resource_requests) > 0:
        gangs = api.state.pending_gang_resource_requests
        first = autoscaler_pb2.GangResourceRequest()
        first.CopyFrom(gangs[0])
        del gangs[0]
        gangs.append(first)  # every gang's place in the list moves


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(CHANGES, st.integers(0, 40)), min_size=1, max_size=12))
def test_what_the_read_keeps_reads_as_reading_afresh(changes: list[tuple[str, int]]) -> None:
    api = _world()
    observer = Observer("default", api.raycluster["metadata"]["name"])
    nodes = NodeMemory()
    replicas = ReplicaMemo()
    dropped: list[Any] = []
    for version, (change, which) in enumerate([("none", 0), *changes], start=1000):
        _change(api, change, which, version, dropped)
        observed = observer.read(api)  # type: ignore[arg-type]
        afresh = parse_pods(copy.deepcopy(api.pods))
        assert list(observed.pods) == afresh
        assert observed.cluster == parse_raycluster(api.raycluster, "afresh")
        ray = read_ray_state(api, nodes)  # type: ignore[arg-type]
        assert ray == from_message(api.state)
        assert ray.message == api.state  # parsed whole from the reply when asked for
        sources = [(g.gang_id, g.source) for g in from_message(api.state).demand.gangs]
        assert [(g.gang_id, g.source) for g in ray.demand.gangs] == sources
        shapes = derive_shapes(observed.cluster)
        by_pod = replicas.nodes_by_pod(ray)
        assert by_pod == from_message(api.state).node_for_pod()
        kept = replicas_of(observed.cluster, shapes, list(observed.pods), by_pod, 50.0, replicas)
        assert kept == replicas_of(
            observed.cluster, shapes, afresh, from_message(api.state).node_for_pod(), 50.0
        )


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.lists(st.tuples(CHANGES, st.integers(0, 40)), min_size=1, max_size=4),
        min_size=1,
        max_size=8,
    )
)
def test_changes_between_two_reads_read_as_reading_afresh(
    rounds: list[list[tuple[str, int]]],
) -> None:
    """As above, with several changes between two reads: pods that come or go (the
    group laid out again) in the read where nodes are used or idle longer. The hosts
    carry their registration times, kept as the controller keeps them (those of the
    registered hosts read last): a replica kept from an earlier read has the times
    making it afresh gives (seen red with the times given as new to every host)."""
    api = _world()
    observer = Observer("default", api.raycluster["metadata"]["name"])
    nodes = NodeMemory()
    replicas = ReplicaMemo()
    dropped: list[Any] = []
    version = 1000
    first_seen: dict[str, float] = {}
    for changes in [[("none", 0)], *rounds]:
        for change, which in changes:
            version += 1
            _change(api, change, which, version, dropped)
        registrations = Registrations(dict(first_seen), float(version))
        observed = observer.read(api)  # type: ignore[arg-type]
        ray = read_ray_state(api, nodes)  # type: ignore[arg-type]
        shapes = derive_shapes(observed.cluster)
        by_pod = replicas.nodes_by_pod(ray)
        assert by_pod == from_message(api.state).node_for_pod()
        pods = list(observed.pods)
        kept = replicas_of(observed.cluster, shapes, pods, by_pod, 50.0, replicas, registrations)
        afresh = parse_pods(copy.deepcopy(api.pods))
        cluster = parse_raycluster(copy.deepcopy(api.raycluster), "afresh")
        assert kept == replicas_of(
            cluster,
            derive_shapes(cluster),
            afresh,
            from_message(api.state).node_for_pod(),
            50.0,
            registrations=registrations,
        )
        first_seen = {
            h.pod_name: h.registered_at_s
            for r in kept
            for h in r.hosts
            if h.registered and h.registered_at_s is not None
        }


def test_every_node_changed_between_two_reads_is_read() -> None:
    """Every node changes (each idle longer, one busy): each pod's node is the new one,
    looked up for the pods whose node changed alone (`NodeDelta`)."""
    api = _world()
    observer = Observer("default", api.raycluster["metadata"]["name"])
    nodes, memo = NodeMemory(), ReplicaMemo()
    for step in range(3):
        if step:
            for node in api.state.node_states:
                node.idle_duration_ms += 1000
            _change(api, "use", step, 0, [])
        observed = observer.read(api)  # type: ignore[arg-type]
        ray = read_ray_state(api, nodes)  # type: ignore[arg-type]
        by_pod = memo.nodes_by_pod(ray)
        assert memo.node_delta is not None or not step
        shapes = derive_shapes(observed.cluster)
        kept = replicas_of(observed.cluster, shapes, list(observed.pods), by_pod, 50.0, memo)
        afresh = from_message(api.state).node_for_pod()
        assert kept == replicas_of(observed.cluster, shapes, list(observed.pods), afresh, 50.0)


@pytest.mark.parametrize("joined", ["", "a live node's pod, dead", "its pod, dead", "a new pod"])
def test_nodes_gone_and_joined_in_one_read_are_each_pod_s_node(joined: str) -> None:
    """A node the GCS forgot and one that joined, between two reads: each pod's node
    is the one reading afresh finds, whatever pod the new one is of."""
    api = _world()
    memory, memo = NodeMemory(), ReplicaMemo()
    memo.nodes_by_pod(read_ray_state(api, memory))  # type: ignore[arg-type]
    states = api.state.node_states
    gone = states[2].instance_id
    del states[2]
    del states[-1]  # fewer nodes than before: not one new node in each one's place
    new = states.add()
    new.CopyFrom(states[0])
    new.node_id = b"n" * 28
    if joined:
        new.status = autoscaler_pb2.NodeStatus.DEAD
        new.instance_id = {"a live node's pod, dead": states[1].instance_id}.get(joined, gone)
    else:
        new.instance_id = "a-pod-without-a-node"
    if joined == "a new pod":
        new.instance_id = "another-pod"
    found = memo.nodes_by_pod(read_ray_state(api, memory))  # type: ignore[arg-type]
    assert found == from_message(api.state).node_for_pod()


def test_replicas_made_from_nodes_read_two_reads_ago_look_every_node_up() -> None:
    """Nodes read twice between two makings of the replicas: the last change alone
    is not all that changed since the replicas' nodes, so every node is looked up."""
    api = _world()
    observer = Observer("default", api.raycluster["metadata"]["name"])
    nodes, memo = NodeMemory(), ReplicaMemo()
    observed = observer.read(api)  # type: ignore[arg-type]
    shapes = derive_shapes(observed.cluster)
    pods = list(observed.pods)
    by_pod = memo.nodes_by_pod(read_ray_state(api, nodes))  # type: ignore[arg-type]
    replicas_of(observed.cluster, shapes, pods, by_pod, 50.0, memo)
    _change(api, "use", 0, 0, [])
    memo.nodes_by_pod(read_ray_state(api, nodes))  # type: ignore[arg-type]
    _change(api, "use", 5, 0, [])
    by_pod = memo.nodes_by_pod(read_ray_state(api, nodes))  # type: ignore[arg-type]
    kept = replicas_of(observed.cluster, shapes, pods, by_pod, 50.0, memo)
    afresh = from_message(api.state).node_for_pod()
    assert kept == replicas_of(observed.cluster, shapes, pods, afresh, 50.0)


def test_a_pod_listed_without_a_resource_version_is_parsed_at_every_read() -> None:
    """The pods parsed are kept by (name, resourceVersion): one listed without a
    version has nothing to be known by, and is parsed again at each read."""
    api = _world()
    observer = Observer("default", api.raycluster["metadata"]["name"])
    for phase in ("Pending", "Running", "Pending", "Running"):
        pod = copy.deepcopy(api.pods[0])
        pod["metadata"].pop("resourceVersion", None)
        pod["status"]["phase"] = phase
        api.pods[0] = pod
        observed = observer.read(api)  # type: ignore[arg-type]
        assert list(observed.pods) == parse_pods(copy.deepcopy(api.pods))
        assert observed.pods[0].status.phase == phase


@pytest.mark.parametrize(
    "change", ["value", "entry", "entry gone", "resources", "container", "no env", "same"]
)
def test_a_new_pod_s_containers_are_its_own_where_they_differ_from_the_last_parsed(
    change: str,
) -> None:
    """A pod first listed takes the parts of its containers listed as those of the
    last pod parsed whole (`Observer.sibling`), and its own where they differ: an env
    value, an entry more or less, its resources, a container more. Seen red with every
    env entry taken from the last pod's."""
    api = _world()
    observer = Observer("default", api.raycluster["metadata"]["name"])
    observer.read(api)  # type: ignore[arg-type]
    pod = copy.deepcopy(api.pods[1])
    pod["metadata"]["name"] += "-new"
    container = pod["spec"]["containers"][0]
    if change == "value":
        container["env"][-4]["value"] = "another"
    elif change == "entry":
        container["env"].insert(3, {"name": "X", "value": "1"})
    elif change == "entry gone":
        del container["env"][0]
    elif change == "resources":
        container["resources"]["limits"]["cpu"] = "7"
    elif change == "container":
        pod["spec"]["containers"].append({**copy.deepcopy(container), "name": "side"})
    elif change == "no env":
        del container["env"]
    api.pods.append(pod)
    observed = observer.read(api)  # type: ignore[arg-type]
    assert list(observed.pods) == parse_pods(copy.deepcopy(api.pods))


@pytest.mark.parametrize("where", ["env", "resources"])
def test_a_new_pod_s_bad_container_part_is_refused_naming_it(where: str) -> None:
    """A bad part of a new pod's containers, next to parts as the last pod parsed had
    them, is refused as reading it afresh refuses it: naming the pod and the field."""
    api = _world()
    observer = Observer("default", api.raycluster["metadata"]["name"])
    observer.read(api)  # type: ignore[arg-type]
    bad = copy.deepcopy(api.pods[1])
    bad["metadata"]["name"] += "-bad"
    container = bad["spec"]["containers"][0]
    if where == "env":
        container["env"][2] = {"name": "X", "value": {"not": "a string"}}
    else:
        container["resources"]["limits"] = ["not", "a", "mapping"]
    api.pods.append(bad)
    with pytest.raises(ManifestError) as raised:
        observer.read(api)  # type: ignore[arg-type]
    with pytest.raises(ManifestError) as afresh:
        parse_pods([copy.deepcopy(bad)], f"pods of {observer.where}")
    assert raised.value.problems == afresh.value.problems
    field = "env[2].value" if where == "env" else "resources.limits"
    assert any(field in p.path for p in raised.value.problems)


def test_unchanged_objects_are_kept_not_made_again() -> None:
    """The memos are used, not only filled: a read with nothing changed hands back the
    same pods, nodes and replicas; one changed pod, node or mark makes its replica
    again and leaves the others."""
    api = _world()
    observer = Observer("default", api.raycluster["metadata"]["name"])
    nodes, memo = NodeMemory(), ReplicaMemo()

    def read() -> tuple[Any, ...]:
        observed = observer.read(api)  # type: ignore[arg-type]
        ray = read_ray_state(api, nodes)  # type: ignore[arg-type]
        shapes = derive_shapes(observed.cluster)
        last_nodes, same_nodes = memo.node_for_pod, ray.nodes is memo.ray_nodes
        by_pod = memo.nodes_by_pod(ray)
        # Kept while the nodes are: the very mapping at a read of the same reply.
        assert (by_pod is last_nodes) == same_nodes
        assert by_pod == ray.node_for_pod()
        made = replicas_of(observed.cluster, shapes, list(observed.pods), by_pod, 50.0, memo)
        return observed.pods, ray.nodes, made

    pods, ray_nodes, made = read()
    again = read()
    assert all(map(lambda a, b: a is b, pods, again[0]))
    busy = [n for n in ray_nodes if n.status == "RUNNING"]
    assert busy and all(any(n is m for m in again[1]) for n in busy)
    assert all(a is b for a, b in zip(made, again[2], strict=True) if a.hosts)

    changed = copy.deepcopy(api.pods[5])  # a host of the second slice
    changed["metadata"]["resourceVersion"] = "2000"
    changed["status"]["phase"] = "Pending"
    api.pods[5] = changed
    third = read()
    assert [a is b for a, b in zip(made, third[2], strict=True) if a.hosts] == [True, False, True]
    spec_before = pods[5].spec
    assert third[0][5] is not pods[5] and third[0][5].spec is spec_before  # spec as listed

    bound = copy.deepcopy(api.pods[5])
    bound["metadata"]["resourceVersion"] = "2001"
    bound["spec"]["nodeName"] = "node-5"
    api.pods[5] = bound
    rebound = read()[0][5]
    assert rebound.spec is not spec_before and rebound.spec.model_extra["nodeName"] == "node-5"
    assert rebound.spec.containers[0] is spec_before.containers[0]  # containers as listed
    api.pods[5] = changed  # back as it was (the spec parsed then is parsed again)
    third = read()

    node = api.state.node_states[0]  # an idle host of the first slice, idle a second longer
    assert node.status == autoscaler_pb2.NodeStatus.IDLE
    node.idle_duration_ms += 1000
    idled = node.instance_id
    fourth = read()
    holder = next(i for i, r in enumerate(third[2]) if idled in [h.pod_name for h in r.hosts])
    assert [a is b for a, b in zip(third[2], fourth[2], strict=True)] == [
        i != holder for i in range(len(third[2]))
    ]
    before_hosts, hosts = third[2][holder].hosts, fourth[2][holder].hosts
    # Only that host was made again: the others are the very hosts made before.
    assert [a is b for a, b in zip(before_hosts, hosts, strict=True)].count(False) == 1
    assert next(h for h in hosts if h.pod_name == idled).idle_s == node.idle_duration_ms / 1000
    cluster = parse_raycluster(copy.deepcopy(api.raycluster), "afresh")
    afresh = parse_pods(copy.deepcopy(api.pods))
    ray_afresh = from_message(api.state).node_for_pod()
    assert fourth[2] == replicas_of(cluster, derive_shapes(cluster), afresh, ray_afresh, 50.0)


def test_a_reply_read_again_is_the_same_state_and_a_changed_one_is_read() -> None:
    """The last reply is kept with the state read from it: the same bytes again read
    as that very state; any change to them (one node's use, one gang's place, the
    state's version) is read, as reading afresh reads it."""
    api = _world()
    memory = NodeMemory()
    first = read_ray_state(api, memory)  # type: ignore[arg-type]
    assert read_ray_state(api, memory) is first  # type: ignore[arg-type]
    for change in ("use", "gang", "version"):
        if change == "version":
            api.state.cluster_resource_state_version += 1
        else:
            _change(api, change, 1, 0, [])
        again = read_ray_state(api, memory)  # type: ignore[arg-type]
        assert again is not first
        assert again == from_message(api.state) and again.message == api.state
        assert again.requests.cluster_resource_state_version == (
            api.state.cluster_resource_state_version
        )
        first = again


def test_the_infeasible_requests_copied_from_the_wire_are_ray_s_own() -> None:
    """What the autoscaler reports back as infeasible, read off the wire (gangs left
    as bytes), is each request as the GCS sent it, as from the parsed message."""
    api = _world()
    api.state.cluster_resource_state_version = 12
    gcs_state.add_task_demand(api.state, {"CPU": 2.0}, 3, {"ray.io/node-group": "tpu"})
    api.state.cluster_resource_constraints.add().resource_requests.add().count = 1
    refs = [
        (DemandRef("gang", 1), 1),
        (DemandRef("resource", 0), 3),
        (DemandRef("gang", 0), 1),
        (DemandRef("constraint", 0), 1),
    ]
    read = read_ray_state(api, NodeMemory())  # type: ignore[arg-type]
    parsed = from_message(api.state)
    from_wire = autoscaling_state(read, 3, (), (), refs)
    assert from_wire == autoscaling_state(parsed, 3, (), (), refs)
    assert from_wire.last_seen_cluster_resource_state_version == 12
    assert len(from_wire.infeasible_gang_resource_requests) == 2


def test_a_node_without_its_idle_duration_is_its_bytes_but_for_that() -> None:
    """The key an IDLE node is found by whatever its idle time: nodes whose bytes
    differ only in their idle duration share it; any other difference tells them
    apart, the idle duration is read back."""
    base = _state_with(3, False).node_states[2]
    keys = set()
    for idle_ms in (0, 1, 999, 2**40):
        node = autoscaler_pb2.NodeState()
        node.CopyFrom(base)
        node.idle_duration_ms = idle_ms
        key, read_ms = wire.without_idle(node.SerializeToString())
        assert read_ms == idle_ms
        keys.add(key)
    assert len(keys) == 1
    for field, value in (("status", autoscaler_pb2.NodeStatus.RUNNING), ("instance_id", "b")):
        other = autoscaler_pb2.NodeState()
        other.CopyFrom(base)
        setattr(other, field, value)
        assert wire.without_idle(other.SerializeToString())[0] not in keys
    other.CopyFrom(base)
    other.available_resources["TPU"] = 1.0
    assert wire.without_idle(other.SerializeToString())[0] not in keys


def _state_with(nodes: int, extra: bool) -> Any:
    state = autoscaler_pb2.ClusterResourceState()
    state.cluster_resource_state_version = 7
    for index in range(nodes):
        node = state.node_states.add()
        node.node_id = bytes([index % 256]) * 28
        node.instance_id = f"pod-{index}-" + "x" * (index * 40)  # lengths of 1 to 3 bytes
        node.status = autoscaler_pb2.NodeStatus.IDLE
        node.idle_duration_ms = 2**40 + index
        node.total_resources["TPU"] = 4.0
        node.labels["k"] = "v" * index
    if extra:
        gcs_state.add_task_demand(state, {"CPU": 1.0}, 3)
        state.cluster_session_name = "session"
    return state


@given(st.integers(0, 300), st.booleans(), st.booleans())
def test_node_messages_off_the_wire_are_the_parsed_nodes(
    nodes: int, extra: bool, twice: bool
) -> None:
    reply = autoscaler_pb2.GetClusterResourceStateReply()
    reply.cluster_resource_state.CopyFrom(_state_with(nodes, extra))
    sent = reply.SerializeToString()
    if twice:  # a message field sent twice is merged: its node lists appended
        sent += sent
        reply.ParseFromString(sent)
    found = wire.node_messages(sent)
    assert found == [n.SerializeToString() for n in reply.cluster_resource_state.node_states]


def test_bytes_it_cannot_walk_are_refused() -> None:
    sent = _api_bytes()
    for broken in (sent[:-1], sent + b"\x0b"):  # cut short; a group's wire type
        with pytest.raises(wire.DecodeError):
            wire.node_messages(broken)
        with pytest.raises(wire.DecodeError):
            NodeMemory().read(broken)


def _api_bytes() -> bytes:
    reply = autoscaler_pb2.GetClusterResourceStateReply()
    reply.cluster_resource_state.CopyFrom(_state_with(3, True))
    return bytes(reply.SerializeToString())


@pytest.mark.parametrize(
    ("cluster_name", "workload_name"),
    [("v6e-4x4-multihost", "spot-preemption-storm"), ("v6e-4x4-spot-and-on-demand", "spot-churn")],
)
def test_registration_times_are_first_seen_times(
    cluster_name: str, workload_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every registered host of every read carries the time the autoscaler first saw
    it registered without a break (a host gone from Ray and back is new), as reading
    every host each round gives, though replicas read as last round are not walked.
    The replicas are made with their times: each is the very object `assemble` made
    (but those the drainer holds as draining), no host copied to be given its time."""
    first_seen: dict[str, float] = {}
    checked = 0
    read = Autoscaler._read
    made: list[tuple[Replica, ...]] = []

    def assembling(*args: Any, **kwargs: Any) -> Any:
        loaded = assemble(*args, **kwargs)
        made.append(loaded.snapshot.replicas)
        return loaded

    def checking(self: Autoscaler) -> Any:
        nonlocal first_seen, checked
        observed, loaded = read(self)
        now = self.clock()
        seen = {}
        assembled = made.pop()
        retiring = self.drainer.retiring
        assert len(assembled) == len(loaded.snapshot.replicas)
        for replica, by_assemble in zip(loaded.snapshot.replicas, assembled, strict=True):
            assert replica is by_assemble or replica.name in retiring
        for replica in loaded.snapshot.replicas:
            for host in replica.hosts:
                if host.registered:
                    seen[host.pod_name] = first_seen.get(host.pod_name, now)
                    assert host.registered_at_s == seen[host.pod_name], (now, host.pod_name)
                    checked += 1
        first_seen = seen
        return observed, loaded

    monkeypatch.setattr(Autoscaler, "_read", checking)
    monkeypatch.setattr(controller, "assemble", assembling)
    cluster = yaml.safe_load((CLUSTERS / f"{cluster_name}.yaml").read_text())
    workload = load_workload(str(CLUSTERS.parent / "workloads" / f"{workload_name}.yaml"))
    sim = SimulatedCluster(cluster, seed=3, capacity=workload.provisioning.capacity)
    sim.load(workload)
    sim.run(workload.last_end_s + 600.0)
    assert checked > 200


def _edit_raycluster(raw: dict[str, Any], edit: str) -> None:
    """One write to the RayCluster, as the operator (status), the autoscaler (replicas,
    removal marks) or a person (a template, the head, the resize annotation) makes it."""
    spec = raw["spec"]
    group = spec["workerGroupSpecs"][0]
    if edit == "status":
        raw.setdefault("status", {})["readyWorkerReplicas"] = len(str(raw["metadata"]))
    elif edit == "replicas":
        group["replicas"] = group.get("replicas", 0) + 1
    elif edit == "topology":  # a 2x2 slice: a new shape (and a host count it refuses)
        group["template"]["spec"]["nodeSelector"][labels.GKE_TPU_TOPOLOGY_SELECTOR] = "2x2"
    elif edit == "env":
        container = group["template"]["spec"]["containers"][0]
        container.setdefault("env", []).append({"name": "X", "value": "1"})
    elif edit == "head":
        spec["headGroupSpec"]["rayStartParams"]["num-cpus"] = "3"
    elif edit == "annotation":  # a bad resize annotation: a problem of the shapes
        raw["metadata"].setdefault("annotations", {})["ray.io/ippr"] = "{not json"
    elif edit == "bad":  # a template that does not parse: refused naming its field
        group["template"]["spec"]["containers"][0]["resources"] = {"limits": []}


@pytest.mark.parametrize(
    "edits",
    [
        ["status", "status", "replicas", "status"],
        ["replicas", "topology", "status"],
        ["status", "env", "env", "replicas"],
        ["head", "status", "head"],
        ["status", "annotation", "status", "replicas"],
    ],
)
def test_a_raycluster_written_again_reads_as_parsed_afresh(edits: list[str]) -> None:
    """The RayCluster's parse keeps the spec parsed before where listed the same
    (`Observer.cluster_spec`, `_with_parsed_parts`) and the shapes derived from that
    very spec (`ReplicaMemo.shapes_of`): after each write, the read's cluster and the
    snapshot's shapes are those of parsing and deriving afresh, and a write of the
    status alone keeps the spec's parse (seen red with either memo never made again:
    the spec compared as always equal, the shapes kept whatever the spec)."""
    api = _world()
    observer = Observer("default", api.raycluster["metadata"]["name"])
    memo = ReplicaMemo()
    ray = read_ray_state(api, NodeMemory())  # type: ignore[arg-type]
    before = None
    for version, edit in enumerate(["none", *edits], start=2000):
        _edit_raycluster(api.raycluster, edit)
        api.raycluster["metadata"]["resourceVersion"] = str(version)
        observed = observer.read(api)  # type: ignore[arg-type]
        afresh = parse_raycluster(copy.deepcopy(api.raycluster), "afresh")
        assert observed.cluster == afresh
        if before is not None and edit == "status":
            assert observed.cluster.spec is before.spec
        loaded = assemble(observed.cluster, list(observed.pods), ray, 50.0, memo=memo)
        assert loaded.shapes == derive_shapes(afresh)
        assert loaded.snapshot.shapes == derive_shapes(afresh).shapes
        before = observed.cluster


def test_a_raycluster_template_that_does_not_parse_is_refused_after_a_good_one() -> None:
    """A write that breaks a template the version before had right is parsed (the part
    listed otherwise is never taken from the parse before) and refused naming it."""
    api = _world()
    observer = Observer("default", api.raycluster["metadata"]["name"])
    observer.read(api)  # type: ignore[arg-type]
    _edit_raycluster(api.raycluster, "bad")
    api.raycluster["metadata"]["resourceVersion"] = "3000"
    with pytest.raises(ManifestError) as refused:
        observer.read(api)  # type: ignore[arg-type]
    assert "workerGroupSpecs[0].template.spec.containers[0].resources" in str(refused.value)
