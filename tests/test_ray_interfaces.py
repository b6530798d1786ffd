"""The provider and the policy behind Ray 2.60's own interfaces, each held to its
Ray contract on the simulator's API server and KubeRay operator, with the v6e 4x4
example (4 hosts per replica). Where it is cheap, Ray's own scheduler runs on the
same request, to show the upstream failure the contract test guards against."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from ray.autoscaler._private.event_summarizer import EventSummarizer
from ray.autoscaler._private.kuberay.autoscaling_config import (
    _derive_autoscaling_config_from_ray_cr,
)
from ray.autoscaler._private.node_launcher import BaseNodeLauncher
from ray.autoscaler._private.node_provider_availability_tracker import (
    NodeProviderAvailabilityTracker,
)
from ray.autoscaler._private.providers import _get_node_provider
from ray.autoscaler._private.util import ConcurrentCounter
from ray.autoscaler.node_provider import NodeProvider
from ray.autoscaler.tags import TAG_RAY_NODE_KIND, TAG_RAY_REPLICA_INDEX, TAG_RAY_USER_NODE_TYPE
from ray.autoscaler.v2.instance_manager.config import AutoscalingConfig
from ray.autoscaler.v2.instance_manager.node_provider import (
    ICloudInstanceProvider,
    LaunchNodeError,
    TerminateNodeError,
)
from ray.autoscaler.v2.scheduler import (
    IResourceScheduler,
    ResourceDemandScheduler,
    SchedulingRequest,
)
from ray.autoscaler.v2.schema import AutoscalerInstance
from ray.core.generated import autoscaler_pb2
from ray.core.generated.instance_manager_pb2 import Instance, NodeKind, TerminationRequest

from tpu_autoscaler.adapters.kube.api import Conflict, JsonPatch, KubeApi
from tpu_autoscaler.adapters.kube.client import KubernetesApi
from tpu_autoscaler.adapters.kube.guarded import MAX_REPLANS
from tpu_autoscaler.adapters.ray.node_types import shape_from_node_type
from tpu_autoscaler.adapters.ray.provider_cluster import KubeCluster
from tpu_autoscaler.adapters.ray.scheduler import SliceScheduler
from tpu_autoscaler.adapters.ray.v1_provider import SliceNodeProvider, default_kube_api
from tpu_autoscaler.adapters.ray.v2_provider import SliceCloudInstanceProvider
from tpu_autoscaler.controlplane import admitted_pod
from tpu_autoscaler.controlplane.clock import EventQueue
from tpu_autoscaler.controlplane.kuberay import KubeRayOperator
from tpu_autoscaler.controlplane.store import DEFAULT_GRACE_S, ObjectStore
from tpu_autoscaler.core import labels
from tpu_autoscaler.core.shape import SliceShape
from tpu_autoscaler.manifest.loading import parse_raycluster
from tpu_autoscaler.manifest.shapes import derive_shapes
from tpu_autoscaler.sim import gcs_state

ROOT = Path(__file__).parent.parent
V6E = ROOT / "examples/clusters/v6e-4x4-multihost.yaml"
NS = "default"
NAME = "tpu-v6e-16"
GROUP = "tpu-v6e-group"
HEAD_RESOURCE = "TPU-v6e-16-head"


def v6e(max_replicas: int = 2, idle_timeout_s: int = 60) -> dict[str, Any]:
    raw: dict[str, Any] = yaml.safe_load(V6E.read_text())
    raw["spec"]["workerGroupSpecs"][0]["maxReplicas"] = max_replicas
    raw["spec"]["autoscalerOptions"]["idleTimeoutSeconds"] = idle_timeout_s
    return raw


class Cluster:
    """The simulated API server with the v6e RayCluster, and KubeRay acting on it
    when told to (`reconcile`), as it would between autoscaler rounds."""

    def __init__(self, max_replicas: int = 2) -> None:
        self.events = EventQueue(seed=1)
        self.store = ObjectStore(self.events)
        self.store.create_raycluster(v6e(max_replicas))
        self.operator = KubeRayOperator(self.store, self.events, NS, NAME)
        self.store.watchers.append(self.operator.on_store_change)
        self.api = RacingApi(self.store, races=0)
        """The store as a KubeApi that counts our patches."""

    def reconcile(self, running: bool = True) -> None:
        """KubeRay's reconciles until it is done: pods created one call at a time,
        deleted ones gone after their grace period, the requeues in between."""
        self.operator.reconcile()
        self.events.run_until(self.events.now_s + 2 * DEFAULT_GRACE_S)
        if running:
            for pod in self.workers():
                if pod["status"]["phase"] == "Pending":
                    self.store.set_pod_phase(NS, pod["metadata"]["name"], "Running")

    def spec(self) -> dict[str, Any]:
        group: dict[str, Any] = self.store.get_raycluster(NS, NAME)["spec"]["workerGroupSpecs"][0]
        return group

    def workers(self) -> list[dict[str, Any]]:
        return self.store.list_pods(NS, {labels.KUBERAY_GROUP: GROUP})

    def replicas(self) -> dict[str, list[str]]:
        found: dict[str, list[str]] = {}
        for pod in self.workers():
            key = pod["metadata"]["labels"][labels.KUBERAY_REPLICA_NAME]
            found.setdefault(key, []).append(pod["metadata"]["name"])
        return found


class RacingApi:
    """The store, with another writer that changes the RayCluster between our read
    and our write `races` times: its annotations (the generation stays), or its spec
    with `spec`. Each of our resourceVersion-guarded patches then meets a Conflict."""

    def __init__(self, store: ObjectStore, races: int, spec: bool = False) -> None:
        self.store = store
        self.races = races
        self.spec = spec
        self.conflicts = 0
        self.patches = 0

    def get_raycluster(self, namespace: str, name: str) -> dict[str, Any]:
        return self.store.get_raycluster(namespace, name)

    def list_pods(
        self, namespace: str, selector: dict[str, str] | None = None
    ) -> list[dict[str, Any]]:
        return self.store.list_pods(namespace, selector)

    def patch_raycluster(
        self, namespace: str, name: str, operations: JsonPatch, resource_version: str | None
    ) -> dict[str, Any]:
        if self.races > 0:
            self.races -= 1
            # A different value each time: a write that changes nothing stores nothing.
            other = [
                {"op": "add", "path": "/metadata/annotations", "value": {"x": str(self.races)}}
            ]
            if self.spec:
                group = self.store.get_raycluster(namespace, name)["spec"]["workerGroupSpecs"][0]
                path = "/spec/workerGroupSpecs/0/maxReplicas"
                other = [{"op": "replace", "path": path, "value": group["maxReplicas"] + 1}]
            self.store.patch_raycluster(namespace, name, other, None)
        self.patches += 1
        try:
            return self.store.patch_raycluster(namespace, name, operations, resource_version)
        except Conflict:
            self.conflicts += 1
            raise

    def create_event(self, namespace: str, event: dict[str, Any]) -> None:
        self.store.create_event(namespace, event)

    def list_events(
        self, namespace: str, field_selector: str | None = None
    ) -> list[dict[str, Any]]:
        return self.store.list_events(namespace, field_selector)


# --- v2 provider: ICloudInstanceProvider ---------------------------------------------------


def test_v2_provider_is_a_ray_cloud_instance_provider() -> None:
    provider = SliceCloudInstanceProvider(Cluster().store, NS, NAME)
    assert isinstance(provider, ICloudInstanceProvider)
    assert provider.get_non_terminated() == {}
    assert provider.poll_errors() == []


@pytest.mark.parametrize(
    ("hosts", "replicas", "warned"), [(1, 1, True), (3, 1, True), (4, 1, False), (5, 2, True)]
)
def test_v2_launch_rounds_hosts_up_to_whole_replicas(
    hosts: int, replicas: int, warned: bool, caplog: pytest.LogCaptureFixture
) -> None:
    cluster = Cluster()
    provider = SliceCloudInstanceProvider(cluster.store, NS, NAME)
    with caplog.at_level(logging.WARNING):
        provider.launch({GROUP: hosts}, "req-1")
    assert cluster.spec()["replicas"] == replicas
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    if warned:
        assert any(f"{hosts} host(s) of {GROUP} rounded up to {replicas}" in w for w in warnings)
    else:
        assert not warnings
    assert provider.poll_errors() == []

    cluster.reconcile(running=False)
    instances = provider.get_non_terminated()
    assert len(instances) == replicas * 4
    assert {i.node_type for i in instances.values()} == {GROUP}
    assert {i.node_kind for i in instances.values()} == {NodeKind.WORKER}
    assert {i.request_id for i in instances.values()} == {"req-1"}
    assert not any(i.is_running for i in instances.values())
    cluster.reconcile()
    assert all(i.is_running for i in provider.get_non_terminated().values())

    # The reconciler may replay a request: it is carried out once.
    provider.launch({GROUP: hosts}, "req-1")
    assert cluster.spec()["replicas"] == replicas


def test_v2_launch_beyond_max_replicas_reports_the_hosts_left_out() -> None:
    cluster = Cluster(max_replicas=2)
    provider = SliceCloudInstanceProvider(cluster.store, NS, NAME)
    provider.launch({GROUP: 12, "no-such-group": 1}, "req-1")
    assert cluster.spec()["replicas"] == 2
    errors = {e.node_type: e for e in provider.poll_errors()}
    assert isinstance(errors[GROUP], LaunchNodeError)
    assert (errors[GROUP].count, errors[GROUP].request_id) == (4, "req-1")
    assert "maxReplicas" in str(errors[GROUP])
    assert errors["no-such-group"].count == 1
    assert provider.poll_errors() == []  # polling clears


def test_v2_new_replicas_carry_the_request_that_launched_them() -> None:
    cluster = Cluster(max_replicas=3)
    provider = SliceCloudInstanceProvider(cluster.store, NS, NAME)
    provider.launch({GROUP: 4}, "first")
    cluster.reconcile()
    provider.get_non_terminated()
    provider.launch({GROUP: 8}, "second")
    cluster.reconcile()
    by_request: dict[str | None, int] = {}
    for instance in provider.get_non_terminated().values():
        by_request[instance.request_id] = by_request.get(instance.request_id, 0) + 1
    assert by_request == {"first": 4, "second": 8}


def test_v2_terminate_of_one_pod_removes_its_whole_replica() -> None:
    cluster = Cluster()
    provider = SliceCloudInstanceProvider(cluster.store, NS, NAME)
    provider.launch({GROUP: 8}, "up")
    cluster.reconcile()
    replicas = cluster.replicas()
    doomed, kept = sorted(replicas)
    one = replicas[doomed][2]  # not worker 0: any host takes the slice with it

    provider.terminate([one], "down")
    spec = cluster.spec()
    assert spec["replicas"] == 1
    assert sorted(spec["scaleStrategy"]["workersToDelete"]) == sorted(replicas[doomed])
    assert provider.poll_errors() == []

    cluster.reconcile()
    assert cluster.replicas() == {kept: replicas[kept]}
    assert sorted(provider.get_non_terminated()) == sorted(replicas[kept])
    # A replayed request changes nothing; a pod already gone is not an error.
    provider.terminate([one], "down")
    provider.terminate([one], "again")
    assert cluster.spec()["replicas"] == 1
    assert provider.poll_errors() == []


def test_v2_terminate_keeps_deletes_the_operator_has_not_done() -> None:
    cluster = Cluster()
    provider = SliceCloudInstanceProvider(cluster.store, NS, NAME)
    provider.launch({GROUP: 8}, "up")
    cluster.reconcile()
    first, second = (pods for _, pods in sorted(cluster.replicas().items()))
    provider.terminate([first[0]], "a")
    provider.terminate([second[3], first[1]], "b")  # before KubeRay acted on "a"
    spec = cluster.spec()
    assert spec["replicas"] == 0
    assert sorted(spec["scaleStrategy"]["workersToDelete"]) == sorted(first + second)
    cluster.reconcile()
    assert cluster.workers() == []


def test_v2_conflict_is_reread_and_retried_once() -> None:
    cluster = Cluster()
    api = RacingApi(cluster.store, races=1)
    provider = SliceCloudInstanceProvider(api, NS, NAME)
    provider.launch({GROUP: 4}, "req")
    assert api.conflicts == 1
    assert cluster.spec()["replicas"] == 1
    assert provider.poll_errors() == []


def test_v2_absorbs_writes_that_leave_the_spec_as_the_controller_does() -> None:
    """Writes that do not move the generation (status, annotations), one between every
    read and patch: the same patch goes again guarded by the generation, without a
    re-plan, and lands."""
    cluster = Cluster()
    api = RacingApi(cluster.store, races=100)
    provider = SliceCloudInstanceProvider(api, NS, NAME)
    provider.launch({GROUP: 4}, "req")
    assert (api.conflicts, api.patches) == (1, 2)
    assert cluster.spec()["replicas"] == 1
    assert provider.poll_errors() == []


def test_v2_persistent_conflict_is_surfaced_by_poll_errors() -> None:
    cluster = Cluster()
    provider = SliceCloudInstanceProvider(cluster.store, NS, NAME)
    provider.launch({GROUP: 4}, "up")
    cluster.reconcile()
    pod = cluster.workers()[0]["metadata"]["name"]

    # Every patch of both requests meets a spec edit: each is re-planned as often as
    # the controller's are (adapters/kube/guarded.py).
    every_patch_of_two_requests = 2 * MAX_REPLANS
    racing = SliceCloudInstanceProvider(
        RacingApi(cluster.store, races=every_patch_of_two_requests, spec=True), NS, NAME
    )
    racing.launch({GROUP: 4}, "more")
    racing.terminate([pod], "down")
    errors = racing.poll_errors()
    launch = [e for e in errors if isinstance(e, LaunchNodeError)]
    terminate = [e for e in errors if isinstance(e, TerminateNodeError)]
    assert [(e.node_type, e.count, e.request_id) for e in launch] == [(GROUP, 4, "more")]
    assert [(e.cloud_instance_id, e.request_id) for e in terminate] == [(pod, "down")]
    assert isinstance(launch[0].__cause__, Conflict)
    assert cluster.spec()["replicas"] == 1
    # Failed requests are not remembered as done: the reconciler may retry them.
    racing.launch({GROUP: 4}, "more")
    assert cluster.spec()["replicas"] == 2


def test_v2_never_removes_a_pod_whose_slice_is_unknown() -> None:
    cluster = Cluster()
    provider = SliceCloudInstanceProvider(cluster.store, NS, NAME)
    provider.launch({GROUP: 4}, "up")
    cluster.reconcile()
    pod = cluster.workers()[0]
    # KubeRay < 1.6: no replica name; and the webhook, which labels only pods without
    # KubeRay's indices, left no `replicaIndex` either.
    del pod["metadata"]["labels"][labels.KUBERAY_REPLICA_NAME]
    assert labels.WEBHOOK_REPLICA_INDEX not in pod["metadata"]["labels"]
    provider.terminate([pod["metadata"]["name"]], "down")
    (error,) = provider.poll_errors()
    assert isinstance(error, TerminateNodeError)
    assert "partial slice" in str(error)
    assert cluster.spec()["replicas"] == 1


@given(st.lists(st.integers(1, 12), min_size=1, max_size=4))
def test_v2_launches_never_make_a_partial_slice(launches: list[int]) -> None:
    cluster = Cluster(max_replicas=6)
    provider = SliceCloudInstanceProvider(cluster.store, NS, NAME)
    asked = 0
    for index, hosts in enumerate(launches):
        provider.launch({GROUP: hosts}, f"req-{index}")
        cluster.reconcile()
        asked += hosts
    refused = sum(e.count for e in provider.poll_errors())
    replicas = cluster.replicas()
    assert all(len(pods) == 4 for pods in replicas.values())
    assert len(replicas) == min(6, sum(-(-h // 4) for h in launches))
    # Every host asked for was launched or reported.
    assert len(replicas) * 4 + refused >= asked


# --- v1 provider: NodeProvider, loaded as Ray loads an external provider --------------------

_APIS: dict[str, KubeApi] = {}


def store_api(provider_config: Mapping[str, Any]) -> KubeApi:
    """The `kube_api` factory the tests name in the provider config."""
    return _APIS[provider_config["cluster_name"]]


@pytest.fixture
def v1() -> Iterator[tuple[Cluster, SliceNodeProvider, dict[str, Any]]]:
    cluster = Cluster()
    cluster.api = RacingApi(cluster.store, races=0)
    _APIS[NAME] = cluster.api
    # KubeRay's own generated autoscaling config, with our provider in place of its own.
    config = _derive_autoscaling_config_from_ray_cr(v6e())
    config["provider"].update(
        type="external",
        module="tpu_autoscaler.adapters.ray.v1_provider.SliceNodeProvider",
        cluster_name=NAME,
        kube_api="tests.test_ray_interfaces.store_api",
    )
    provider = _get_node_provider(config["provider"], config["cluster_name"], use_cache=False)
    assert isinstance(provider, SliceNodeProvider)
    assert isinstance(provider, NodeProvider)
    yield cluster, provider, config
    del _APIS[NAME]


def _update(
    provider: NodeProvider,
    config: dict[str, Any],
    launch: int = 0,
    terminate: tuple[str, ...] = (),
) -> list[str] | None:
    """One StandardAutoscaler update as it calls the provider: list nodes, back off if
    unsafe, read tags and IPs, terminate, launch in the foreground, post-process."""
    nodes = provider.non_terminated_nodes({})
    if not provider.safe_to_scale():
        return None
    for node in nodes:
        provider.node_tags(node)
        provider.internal_ip(node)
    if terminate:
        provider.terminate_nodes(list(terminate))
    if launch:
        launcher = BaseNodeLauncher(
            provider=provider,
            pending=ConcurrentCounter(),
            event_summarizer=EventSummarizer(),
            node_provider_availability_tracker=NodeProviderAvailabilityTracker(),
        )
        launcher.pending.inc(GROUP, launch)
        launcher.launch_node(config, launch, GROUP)
    provider.post_process()
    return list(nodes)


def test_v1_create_node_launches_whole_replicas(
    v1: tuple[Cluster, SliceNodeProvider, dict[str, Any]], caplog: pytest.LogCaptureFixture
) -> None:
    cluster, provider, config = v1
    with caplog.at_level(logging.WARNING):
        assert _update(provider, config, launch=1) == []
    assert cluster.spec()["replicas"] == 1  # KubeRay's provider would write 1 host: 0 slices
    assert any(
        "1 host(s) of tpu-v6e-group rounded up to 1" in r.getMessage() for r in caplog.records
    )
    # Ray asks again before KubeRay made the pods: nothing more is launched.
    _update(provider, config, launch=1)
    assert cluster.spec()["replicas"] == 1

    cluster.reconcile()
    nodes = _update(provider, config, launch=5)
    assert nodes is not None and len(nodes) == 4
    tags = [provider.node_tags(n) for n in nodes]
    assert {t[TAG_RAY_USER_NODE_TYPE] for t in tags} == {GROUP}
    assert len({t[TAG_RAY_REPLICA_INDEX] for t in tags}) == 1
    assert all(provider.is_running(n) for n in nodes)
    assert cluster.spec()["replicas"] == 2  # 1 + 5 hosts rounded up, capped at maxReplicas 2


def test_v1_terminate_node_removes_its_whole_replica(
    v1: tuple[Cluster, SliceNodeProvider, dict[str, Any]],
) -> None:
    cluster, provider, config = v1
    _update(provider, config, launch=8)
    cluster.reconcile()
    replicas = cluster.replicas()
    doomed, kept = sorted(replicas)
    _update(provider, config, terminate=(replicas[doomed][1],))
    spec = cluster.spec()
    assert spec["replicas"] == 1
    assert sorted(spec["scaleStrategy"]["workersToDelete"]) == sorted(replicas[doomed])
    # Ray backs off until KubeRay has deleted the named pods.
    assert _update(provider, config) is None
    cluster.reconcile()
    assert sorted(_update(provider, config) or []) == sorted(replicas[kept])
    assert all(provider.node_tags(n)[TAG_RAY_NODE_KIND] == "worker" for n in replicas[kept])


def test_v1_launch_and_terminate_in_one_update_are_one_patch(
    v1: tuple[Cluster, SliceNodeProvider, dict[str, Any]],
) -> None:
    cluster, provider, config = v1
    _update(provider, config, launch=4)
    cluster.reconcile()
    (old,) = cluster.replicas().values()
    patches = cluster.api.patches
    _update(provider, config, launch=4, terminate=(old[0],))
    assert cluster.api.patches == patches + 1
    spec = cluster.spec()
    assert spec["replicas"] == 1
    assert sorted(spec["scaleStrategy"]["workersToDelete"]) == sorted(old)
    cluster.reconcile()
    (new,) = cluster.replicas().values()
    assert not set(new) & set(old)


def test_v1_persistent_conflict_is_raised_not_dropped() -> None:
    cluster = Cluster()
    every_patch = MAX_REPLANS
    provider = SliceNodeProvider.from_kube_api(
        RacingApi(cluster.store, races=every_patch, spec=True), NS, NAME
    )
    provider.non_terminated_nodes({})
    provider.create_node({}, {TAG_RAY_USER_NODE_TYPE: GROUP}, 4)
    with pytest.raises(Conflict):
        provider.post_process()
    retried = SliceNodeProvider.from_kube_api(RacingApi(cluster.store, races=1), NS, NAME)
    retried.non_terminated_nodes({})
    retried.create_node({}, {TAG_RAY_USER_NODE_TYPE: GROUP}, 4)
    retried.post_process()
    assert cluster.spec()["replicas"] == 1


# --- scheduler: IResourceScheduler ------------------------------------------------------------


def _shape() -> SliceShape:
    shape = derive_shapes(parse_raycluster(v6e(), "t")).shape(GROUP)
    assert shape is not None
    return shape


def _request(
    raw: dict[str, Any],
    instances: list[AutoscalerInstance],
    state: Any,
) -> SchedulingRequest:
    """As Ray's reconciler builds it (`Reconciler._scale_cluster`), from the config
    Ray's KubeRay reader derives from the RayCluster."""
    config = AutoscalingConfig(_derive_autoscaling_config_from_ray_cr(raw), skip_content_hash=True)
    return SchedulingRequest(
        node_type_configs=config.get_node_type_configs(),
        max_num_nodes=config.get_max_num_nodes(),
        resource_requests=state.pending_resource_requests,
        gang_resource_requests=state.pending_gang_resource_requests,
        cluster_resource_constraints=state.cluster_resource_constraints,
        current_instances=instances,
        idle_timeout_s=config.get_idle_timeout_s(),
        pending_idle_timeout_s=config.get_pending_idle_timeout_s(),
        disable_launch_config_check=config.disable_launch_config_check(),
    )


def _head() -> AutoscalerInstance:
    im = Instance(
        instance_id="im-head",
        cloud_instance_id="head-pod",
        instance_type="headgroup",
        status=Instance.RAY_RUNNING,
        node_kind=NodeKind.HEAD,
        node_id="ff" * 28,
    )
    node = autoscaler_pb2.NodeState(
        node_id=bytes.fromhex("ff" * 28),
        instance_id="head-pod",
        ray_node_type_name="headgroup",
        status=autoscaler_pb2.NodeStatus.RUNNING,
    )
    node.total_resources["CPU"] = 4
    return AutoscalerInstance(cloud_instance_id="head-pod", ray_node=node, im_instance=im)


def _slice(
    replica_index: int, busy_host: int | None = None, idle_s: float = 120.0
) -> list[AutoscalerInstance]:
    """One running v6e-16 slice as Ray sees it: four RAY_RUNNING instances whose Ray
    nodes carry the TPU labels and resources Ray derives on each host."""
    shape = _shape()
    instances = []
    for host in range(4):
        pod = admitted_pod.worker_pod(NAME, NS, shape, replica_index, host, "2026-01-01T00:00:00Z")
        used = {"TPU": 4.0, "CPU": 1.0} if host == busy_host else None
        node = gcs_state.node_state(pod, shape, host, used=used, idle_s=idle_s)
        name = pod["metadata"]["name"]
        im = Instance(
            instance_id=f"im-{name}",
            cloud_instance_id=name,
            instance_type=GROUP,
            status=Instance.RAY_RUNNING,
            node_kind=NodeKind.WORKER,
            node_id=node.node_id.hex(),
        )
        instances.append(AutoscalerInstance(cloud_instance_id=name, ray_node=node, im_instance=im))
    return instances


def _slice_head_demand(slices: int = 1) -> Any:
    """Stage one of `slice_placement_group(topology="4x4", accelerator_version="v6e")`."""
    state = autoscaler_pb2.ClusterResourceState()
    selector = {labels.RAY_TPU_WORKER_ID: "0", labels.RAY_TPU_POD_TYPE: "v6e-16"}
    gcs_state.add_gang_demand(
        state, "slice-heads", [{HEAD_RESOURCE: 1.0}] * slices, "STRICT_SPREAD", [selector] * slices
    )
    return state


SCHEDULERS = {
    "node types only": lambda: SliceScheduler(clock=lambda: 1000.0),
    "with RayCluster": lambda: SliceScheduler(raycluster=v6e(), clock=lambda: 1000.0),
}


def test_node_type_config_carries_the_slice_shape() -> None:
    """What Ray's KubeRay reader builds (hosts, `TPU-v6e-16-head` on every host) gives
    back the shape the RayCluster has: 4 hosts per replica, head on worker 0 only."""
    config = AutoscalingConfig(
        _derive_autoscaling_config_from_ray_cr(v6e()), skip_content_hash=True
    )
    derived = shape_from_node_type(config.get_node_type_configs()[GROUP], 60.0)
    expected = _shape()
    assert derived.tpu == expected.tpu
    assert (derived.hosts_per_replica, derived.min_replicas, derived.max_replicas) == (4, 0, 2)
    assert derived.resources_per_host == expected.resources_per_host
    assert derived.group_labels == expected.group_labels
    assert derived.host_resources(0)[HEAD_RESOURCE] == 1
    assert HEAD_RESOURCE not in derived.host_resources(1)


@pytest.mark.parametrize("make", SCHEDULERS.values(), ids=SCHEDULERS.keys())
def test_scheduler_launches_a_whole_slice_for_slice_placement_group_heads(make: Any) -> None:
    request = _request(v6e(), [_head()], _slice_head_demand())
    scheduler = make()
    assert isinstance(scheduler, IResourceScheduler)
    reply = scheduler.schedule(request)
    assert [(r.instance_type, r.count) for r in reply.to_launch] == [(GROUP, 4)]
    assert not reply.infeasible_gang_resource_requests
    # Upstream failure 3: Ray finds the head demand infeasible and launches nothing.
    ray = ResourceDemandScheduler(event_logger=None).schedule(request)
    assert not ray.to_launch
    assert len(ray.infeasible_gang_resource_requests) == 1


@pytest.mark.parametrize("make", SCHEDULERS.values(), ids=SCHEDULERS.keys())
def test_scheduler_never_terminates_a_busy_slice(make: Any) -> None:
    request = _request(v6e(idle_timeout_s=30), [_head(), *_slice(0, busy_host=1)], _no_demand())
    assert make().schedule(request).to_terminate == []
    # Upstream failure 1: Ray terminates the three idle hosts, worker 0 among them,
    # and KubeRay then deletes the whole busy slice.
    ray = ResourceDemandScheduler(event_logger=None).schedule(request)
    assert len(ray.to_terminate) == 3


@pytest.mark.parametrize("make", SCHEDULERS.values(), ids=SCHEDULERS.keys())
def test_scheduler_terminates_an_idle_slice_whole(make: Any) -> None:
    instances = _slice(0)
    request = _request(v6e(idle_timeout_s=30), [_head(), *instances], _no_demand())
    reply = make().schedule(request)
    assert sorted(t.instance_id for t in reply.to_terminate) == sorted(
        i.im_instance.instance_id for i in instances
    )
    assert {t.cause for t in reply.to_terminate} == {TerminationRequest.Cause.IDLE}
    assert {t.instance_status for t in reply.to_terminate} == {Instance.RAY_RUNNING}
    assert all(t.ray_node_id and t.idle_duration_ms == 120_000 for t in reply.to_terminate)


@pytest.mark.parametrize("make", SCHEDULERS.values(), ids=SCHEDULERS.keys())
def test_scheduler_launches_one_replica_for_two_tpu_bundles(make: Any) -> None:
    state = autoscaler_pb2.ClusterResourceState()
    gcs_state.add_task_demand(state, {"TPU": 4.0}, 2)
    request = _request(v6e(), [_head()], state)
    reply = make().schedule(request)
    assert [(r.instance_type, r.count) for r in reply.to_launch] == [(GROUP, 4)]
    # Upstream failure 2: Ray asks for 2 hosts, which KubeRay's provider floors to
    # no replica at all; ours rounds them up to the one replica they need.
    ray = ResourceDemandScheduler(event_logger=None).schedule(request)
    assert [(r.instance_type, r.count) for r in ray.to_launch] == [(GROUP, 2)]
    cluster = Cluster()
    provider = SliceCloudInstanceProvider(cluster.store, NS, NAME)
    provider.launch({GROUP: ray.to_launch[0].count}, "ray")
    assert cluster.spec()["replicas"] == 1


@pytest.mark.parametrize("make", SCHEDULERS.values(), ids=SCHEDULERS.keys())
def test_scheduler_counts_hosts_on_their_way(make: Any) -> None:
    """Instances already queued or requested (no pods yet) are a replica on its way:
    the same demand launches nothing more."""
    queued = [
        AutoscalerInstance(
            im_instance=Instance(
                instance_id=f"im-{i}",
                instance_type=GROUP,
                status=Instance.REQUESTED if i % 2 else Instance.QUEUED,
                node_kind=NodeKind.WORKER,
            )
        )
        for i in range(4)
    ]
    request = _request(v6e(), [_head(), *queued], _slice_head_demand())
    reply = make().schedule(request)
    assert reply.to_launch == []
    assert reply.to_terminate == []


def test_scheduler_reports_ray_messages_for_infeasible_demand() -> None:
    state = autoscaler_pb2.ClusterResourceState()
    gcs_state.add_task_demand(state, {"GPU": 1.0}, 3)
    request = _request(v6e(), [_head()], state)
    reply = SliceScheduler(clock=lambda: 0.0).schedule(request)
    assert reply.to_launch == []
    # Once per copy, as Ray's scheduler reports it (it ungroups requests by count).
    assert (
        list(reply.infeasible_resource_requests) == [state.pending_resource_requests[0].request] * 3
    )


def test_alike_infeasible_gangs_are_one_line_but_every_message_goes_back() -> None:
    """Three identical placement groups no group can hold are reported as one line;
    Ray still gets each of its three requests back, and nothing it did not ask for
    (a feasible gang of another kind stays out)."""
    state = autoscaler_pb2.ClusterResourceState()
    for pg in ("pg-a", "pg-b", "pg-c"):
        gcs_state.add_gang_demand(state, pg, [{"GPU": 1.0}] * 2, "PACK")
    gcs_state.add_gang_demand(state, "pg-ok", [{"TPU": 4.0}], "PACK")
    reply = SliceScheduler(clock=lambda: 0.0).schedule(_request(v6e(), [_head()], state))
    assert list(reply.infeasible_gang_resource_requests) == list(
        state.pending_gang_resource_requests[:3]
    )
    assert list(reply.infeasible_resource_requests) == []


def test_scheduler_and_provider_on_the_kubernetes_cluster() -> None:
    """The scheduler reading replicas from the pods, and the provider carrying out
    its reply: one slice launched for the head demand, nothing more once it exists."""
    cluster = Cluster()
    kube = KubeCluster(cluster.store, NS, NAME)
    # The simulated operator stamps pods at t=0: 10 s later they are still in time.
    scheduler = SliceScheduler(cluster=kube, clock=lambda: 10.0)
    provider = SliceCloudInstanceProvider(cluster.store, NS, NAME)
    reply = scheduler.schedule(_request(v6e(), [_head()], _slice_head_demand()))
    for launch in reply.to_launch:
        provider.launch({launch.instance_type: launch.count}, launch.id)
    assert cluster.spec()["replicas"] == 1
    # Before KubeRay creates the pods, and after: no second slice.
    again = scheduler.schedule(_request(v6e(), [_head()], _slice_head_demand()))
    assert again.to_launch == []
    cluster.reconcile(running=False)
    allocated = [
        AutoscalerInstance(
            cloud_instance_id=pod.cloud_instance_id,
            im_instance=Instance(
                instance_id=f"im-{name}",
                cloud_instance_id=name,
                instance_type=GROUP,
                status=Instance.ALLOCATED,
                node_kind=NodeKind.WORKER,
            ),
        )
        for name, pod in provider.get_non_terminated().items()
    ]
    later = scheduler.schedule(_request(v6e(), [_head(), *allocated], _slice_head_demand()))
    assert later.to_launch == []
    assert later.to_terminate == []


def _no_demand() -> Any:
    return autoscaler_pb2.ClusterResourceState()


def test_v1_default_client_is_the_kubernetes_client_at_kube_host() -> None:
    api = default_kube_api({"namespace": NS, "kube_host": "http://127.0.0.1:1"})
    assert isinstance(api, KubernetesApi)
