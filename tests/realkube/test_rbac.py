"""`tpu-autoscaler run` with nothing but the Role of `docs/rbac.yaml`, against a real
kube-apiserver 1.20.2 with RBAC on.

The Role and RoleBinding are the documented ones, read from `docs/rbac.yaml` (its
namespace and service account substituted), bound to a ServiceAccount whose token comes
from the TokenRequest API (`POST .../serviceaccounts/NAME/token`): the fixture starts
the server with a service-account issuer and signing key, so bound tokens work although
no controller-manager runs to make token Secrets. The project's `KubernetesApi` gets
that token and no other credential; the Ray side is the simulator's Ray (`SimRay`) on
a hand-driven clock, the pods are created as KubeRay would (labels, host index, TPU
environment) by the admin, since no operator runs here.

Shown: a launch (spec `replicas` patched, an Event recorded) and an idle scale-down
(`workersToDelete` and `replicas` in one guarded patch) with the Role alone; every
write outside it refused with 403 Forbidden by the server (each case named); and, for
each verb of the Role, what `run` loses without it: the ones it needs fail the round
(or lose the Events), the ones it never sends change nothing."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.realkube.endpoints import GROUP, NAME, raycluster
from tests.realkube.service_account import (
    SERVICE_ACCOUNT,
    Exchange,
    documented_rbac,
    grant,
    record_requests,
    role_verbs,
    without,
)
from tpu_autoscaler.adapters.kube.api import ApiError
from tpu_autoscaler.adapters.kube.client import KubernetesApi, RetryPolicy
from tpu_autoscaler.controlplane.real_kube import RealKube
from tpu_autoscaler.core import labels
from tpu_autoscaler.manifest.loading import parse_raycluster
from tpu_autoscaler.manifest.shapes import derive_shapes
from tpu_autoscaler.shell import events
from tpu_autoscaler.shell.controller import Autoscaler, Round
from tpu_autoscaler.sim.ray import SimRay
from tpu_autoscaler.sim.ray_model import Bundle, Work

pytestmark = pytest.mark.kube_real

RAY = ("ray.io", "v1")
HOSTS = 4
"""Hosts per replica of the example's group (v6e 4x4)."""


# --- a RayCluster, KubeRay's pods made by hand, Ray simulated ------------------------------


@dataclass
class Clock:
    now: float = field(default_factory=time.time)


@dataclass
class World:
    """The example RayCluster in `namespace`, the simulated Ray beside it, and an
    `Autoscaler` whose only Kubernetes credential is `token`."""

    admin: client.ApiClient
    namespace: str
    account: client.ApiClient
    clock: Clock = field(default_factory=Clock)
    ray: SimRay = field(init=False)
    autoscaler: Autoscaler = field(init=False)
    created: dict[str, Any] = field(init=False)
    pending: list[Work] = field(default_factory=list)

    def __post_init__(self) -> None:
        objects = client.CustomObjectsApi(self.admin)
        self.created = objects.create_namespaced_custom_object(
            *RAY, self.namespace, "rayclusters", raycluster(self.namespace)
        )
        self.ray = SimRay(lambda: self.clock.now, lambda _s, _f: None, random.Random(0))
        self.ray.add_head(f"{NAME}-head-00000", {"CPU": 4.0, "memory": 16e9})
        kube = KubernetesApi(self.account, RetryPolicy(attempts=1), 30.0)
        self.autoscaler = Autoscaler(
            kube, self.ray, self.namespace, NAME, clock=lambda: self.clock.now
        )

    def step(self) -> Round:
        return self.autoscaler.step()

    def demand_a_slice(self) -> None:
        """Four tasks of one v6e host each: one 4x4 slice's worth, which only a launch
        can serve (the head has no TPU)."""
        for _ in range(HOSTS):
            work = Work(self.ray.new_id("task"), [Bundle({"TPU": 4.0})], 600.0, self.clock.now)
            self.pending.append(work)
            self.ray.submit(work)

    def demand_gone(self) -> None:
        for work in self.pending:
            self.ray.remove(work)
        self.pending.clear()

    def spec(self) -> dict[str, Any]:
        objects = client.CustomObjectsApi(self.admin)
        got = objects.get_namespaced_custom_object(*RAY, self.namespace, "rayclusters", NAME)
        group: dict[str, Any] = got["spec"]["workerGroupSpecs"][0]
        return group

    def bring_up_replica(self, replica: str) -> list[str]:
        """KubeRay's pods of one replica (labels as KubeRay >= 1.6 and the TPU webhook
        set them), bound and Running, and their raylets registered with Ray, idle."""
        core = client.CoreV1Api(self.admin)
        shape = next(
            s
            for s in derive_shapes(parse_raycluster(self.created, "test")).shapes
            if s.group == GROUP
        )
        names = []
        for host in range(HOSTS):
            name = f"{replica}-{host}"
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": name,
                    "namespace": self.namespace,
                    "labels": {
                        labels.KUBERAY_CLUSTER: NAME,
                        labels.KUBERAY_GROUP: GROUP,
                        labels.KUBERAY_NODE_TYPE: "worker",
                        labels.KUBERAY_REPLICA_NAME: replica,
                        labels.KUBERAY_HOST_INDEX: str(host),
                    },
                },
                "spec": {
                    "nodeName": f"gke-{name}",
                    "containers": [
                        {
                            "name": "ray-worker",
                            "image": "rayproject/ray:2.60.0",
                            "env": [
                                {"name": labels.ENV_TPU_NAME, "value": replica},
                                {"name": labels.ENV_TPU_WORKER_ID, "value": str(host)},
                            ],
                        }
                    ],
                },
            }
            created = core.create_namespaced_pod(self.namespace, pod)
            core.patch_namespaced_pod_status(name, self.namespace, {"status": {"phase": "Running"}})
            as_dict = self.admin.sanitize_for_serialization(created)
            self.ray.add_node(as_dict, shape, host)
            names.append(name)
        return names

    def events(self) -> list[dict[str, Any]]:
        core = client.CoreV1Api(self.admin)
        listed = core.list_namespaced_event(self.namespace, _preload_content=False)
        items: list[dict[str, Any]] = json.loads(listed.data)["items"]
        return items

    def api_errors(self, operation: str) -> float:
        value = self.autoscaler.metrics.registry.get_sample_value(
            "tpu_autoscaler_api_errors_total", {"api": "kubernetes", "operation": operation}
        )
        return float(value or 0.0)


def as_verbs(sent: list[Exchange], namespace: str) -> set[tuple[str, str]]:
    """The RBAC (resource, verb) of each namespaced request: GET of a collection is
    `list`, of an object `get`; PATCH `patch`; POST `create`; DELETE `delete`."""
    found = set()
    for exchange in sent:
        method, path = exchange.method, exchange.path
        parts = path.split("/")
        at = parts.index("namespaces")
        assert parts[at + 1] == namespace, path
        rest = parts[at + 2 :]
        resource = rest[0]
        named = len(rest) > 1
        verb = {"GET": "get" if named else "list", "PATCH": "patch", "POST": "create"}.get(
            method, method.lower()
        )
        found.add((resource, verb))
    return found


def _reasons(world: World) -> list[str]:
    """The reasons of the Events on the RayCluster, sorted (names are random)."""
    return sorted(e["reason"] for e in world.events() if e["involvedObject"]["name"] == NAME)


def launch_then_scale_down(world: World) -> tuple[Round, Round]:
    """Demand for one slice, a round; its pods up and idle past the timeout with the
    demand gone, rounds until one removes it. The launch and the removal rounds."""
    world.demand_a_slice()
    launched = world.step()
    world.demand_gone()
    pods = world.bring_up_replica("tpu-v6e-group-0")
    world.step()  # the hosts seen registered, idle for 0 s
    world.clock.now += 61 + 1  # the example's idleTimeoutSeconds is 60
    removed = world.step()
    assert pods
    return launched, removed


# --- the documented Role is enough ----------------------------------------------------------


def test_run_with_only_the_documented_role_launches_and_scales_down(
    real_kube: RealKube,
    admin: client.ApiClient,
    namespace: str,
    account_client: Callable[[str], client.ApiClient],
) -> None:
    role, binding = documented_rbac(namespace, SERVICE_ACCOUNT)
    token = grant(admin, real_kube, role, binding)
    # The token is the service account's, and nothing more.
    review = client.AuthenticationV1Api(admin).create_token_review({"spec": {"token": token}})
    assert review.status.authenticated
    assert review.status.user.username == f"system:serviceaccount:{namespace}:{SERVICE_ACCOUNT}"
    assert "system:masters" not in review.status.user.groups
    account = account_client(token)
    world = World(admin, namespace, account)
    sent = record_requests(account)

    world.demand_a_slice()
    launched = world.step()
    assert launched.applied and launched.error is None, launched.error
    assert launched.plan is not None and [x.group for x in launched.plan.launch] == [GROUP]
    assert world.spec()["replicas"] == 1, "the launch's patch did not land"
    assert _reasons(world) == [events.LAUNCH], "the launch's Event was not recorded"
    (event,) = world.events()
    assert event["involvedObject"]["kind"] == "RayCluster"
    assert (
        event["source"]["component"] == events.COMPONENT
        or event.get("reportingComponent") == events.COMPONENT
    )

    world.demand_gone()
    pods = world.bring_up_replica("tpu-v6e-group-0")
    settled = world.step()
    assert settled.applied and settled.error is None, settled.error
    assert world.spec()["replicas"] == 1
    world.clock.now += 62
    removed = world.step()
    assert removed.applied and removed.error is None, removed.error
    assert removed.plan is not None and [x.pods for x in removed.plan.terminate] == [tuple(pods)]
    spec = world.spec()
    assert spec["replicas"] == 0, "the scale-down's patch did not land"
    assert sorted(spec["scaleStrategy"]["workersToDelete"]) == sorted(pods)
    assert _reasons(world) == sorted([events.LAUNCH, events.REPLICA_UP, events.REMOVE])
    assert world.api_errors("create_event") == 0
    # What the rounds sent, as RBAC verbs: exactly the Role's.
    used = as_verbs(sent, namespace)
    assert used == {
        ("rayclusters", "get"),
        ("rayclusters", "patch"),
        ("pods", "list"),
        ("events", "create"),
        ("events", "list"),
    }
    assert set(role_verbs(role)) - used == IPPR_ONLY | QUEUED_ONLY


# --- and no more ----------------------------------------------------------------------------


def _forbidden(
    world: World, account: client.ApiClient, elsewhere: str
) -> dict[str, Callable[[], Any]]:
    """Writes (and one read) outside the Role, each with the account's client."""
    namespace = world.namespace
    objects = client.CustomObjectsApi(account)
    core = client.CoreV1Api(account)
    kube = KubernetesApi(account, RetryPolicy(attempts=1), 30.0)
    scale = [{"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas", "value": 2}]
    exec_path = f"/api/v1/namespaces/{namespace}/pods/tpu-v6e-group-0-0/exec"

    def exec_in_pod() -> Any:
        # A plain POST, not the websocket upgrade `kubectl exec` sends: authorization
        # (`create` on `pods/exec`) is decided before the server looks at the upgrade.
        response = account.call_api(
            *account.param_serialize(
                method="POST",
                resource_path=exec_path,
                query_params=[("command", "true"), ("stdout", "true")],
                auth_settings=["BearerToken"],
            ),
            _request_timeout=30.0,
        )
        response.read()
        if not 200 <= response.status <= 299:
            raise ApiException.from_response(http_resp=response, body=None, data=None)
        return response

    return {
        "patch the RayCluster of another namespace": lambda: kube.patch_raycluster(
            elsewhere, NAME, scale, None
        ),
        "delete the RayCluster": lambda: objects.delete_namespaced_custom_object(
            *RAY, namespace, "rayclusters", NAME
        ),
        "create a RayCluster": lambda: objects.create_namespaced_custom_object(
            *RAY, namespace, "rayclusters", {**raycluster(namespace), "metadata": {"name": "x"}}
        ),
        "exec in a pod (pods/exec)": exec_in_pod,
        "create a pod": lambda: core.create_namespaced_pod(
            namespace,
            {
                "metadata": {"name": "intruder"},
                "spec": {"containers": [{"name": "c", "image": "x"}]},
            },
        ),
        "delete a pod": lambda: core.delete_namespaced_pod("tpu-v6e-group-0-0", namespace),
        "list secrets": lambda: core.list_namespaced_secret(namespace),
        "write the RayCluster's status": lambda: objects.patch_namespaced_custom_object_status(
            *RAY, namespace, "rayclusters", NAME, {"status": {"state": "ready"}}
        ),
    }


FORBIDDEN = [
    "patch the RayCluster of another namespace",
    "delete the RayCluster",
    "create a RayCluster",
    "exec in a pod (pods/exec)",
    "create a pod",
    "delete a pod",
    "list secrets",
    "write the RayCluster's status",
]


def test_every_request_outside_the_documented_role_is_forbidden(
    real_kube: RealKube,
    admin: client.ApiClient,
    namespace: str,
    account_client: Callable[[str], client.ApiClient],
) -> None:
    """The same token that ran the rounds: each request outside the Role gets 403
    Forbidden from the server (not 404: authorization comes first, and each target
    exists), and the failure names which request got through."""
    role, binding = documented_rbac(namespace, SERVICE_ACCOUNT)
    token = grant(admin, real_kube, role, binding)
    account = account_client(token)
    world = World(admin, namespace, account)
    world.demand_a_slice()
    assert world.step().applied
    world.bring_up_replica("tpu-v6e-group-0")
    elsewhere = f"{namespace[:50]}-other"
    client.CoreV1Api(admin).create_namespace({"metadata": {"name": elsewhere}})
    client.CustomObjectsApi(admin).create_namespaced_custom_object(
        *RAY, elsewhere, "rayclusters", raycluster(elsewhere)
    )

    attempts = _forbidden(world, account, elsewhere)
    assert list(attempts) == FORBIDDEN
    outcomes: dict[str, str] = {}
    for what, attempt in attempts.items():
        try:
            attempt()
        except ApiException as exc:
            reason = json.loads(exc.body).get("reason") if exc.body else exc.reason
            outcomes[what] = f"{exc.status} {reason}"
        except ApiError as exc:
            outcomes[what] = f"{exc.status} {'Forbidden' if 'forbidden' in str(exc) else exc}"
        else:
            outcomes[what] = "ALLOWED"
    wrong = {what: got for what, got in outcomes.items() if got != "403 Forbidden"}
    assert not wrong, f"outside the documented Role but not refused with 403: {wrong}"
    # The objects are untouched: the RayClusters are there, at the replicas we left.
    assert world.spec()["replicas"] == 1
    other = client.CustomObjectsApi(admin).get_namespaced_custom_object(
        *RAY, elsewhere, "rayclusters", NAME
    )
    assert other["spec"]["workerGroupSpecs"][0]["replicas"] == 0


# --- each verb of the Role, taken away -------------------------------------------------------

NEEDED = {
    ("rayclusters", "get"): ("read", []),
    ("rayclusters", "patch"): ("patch", [events.APPLY_FAILED] * 2),
    ("pods", "list"): ("read", []),
}
"""Verbs without which every round is abandoned: at which step, and the Events the
launch and removal rounds leave (a refused patch is announced; a refused read has no
RayCluster to announce it on)."""
EVENTS_ONLY = {("events", "create")}
"""Verbs without which the rounds still scale but record no Event."""
SIGNALS_ONLY = {("events", "list")}
"""Verbs without which the rounds still scale and announce, but read no capacity
signal (each round counts the refused list as an API error)."""
IPPR_ONLY = {("pods/resize", "patch"), ("pods", "patch")}
"""Verbs only an in-place resize sends (groups named in `ray.io/ippr`; none here, and a
1.20 server has no `pods/resize`: `test_resize_real.py`): without them nothing changes."""
QUEUED_ONLY = {
    (resource, verb)
    for resource in ("provisioningrequests", "podtemplates")
    for verb in ("list", "create", "delete")
}
"""Verbs only queued provisioning sends (groups annotated
`tpu-autoscaler.dev/queued-provisioning`; none here, and this server has no
ProvisioningRequest API): without them nothing changes."""
UNUSED: set[tuple[str, str]] = set()
"""Verbs the Role grants that `run` never sends. (It granted `pods get` and `events
patch` until this test showed neither was ever sent.)"""

_DOCUMENTED, _ = documented_rbac("default", SERVICE_ACCOUNT)


def test_every_verb_of_the_documented_role_is_accounted_for() -> None:
    granted = set(role_verbs(_DOCUMENTED))
    known = set(NEEDED) | EVENTS_ONLY | SIGNALS_ONLY | IPPR_ONLY | QUEUED_ONLY | UNUSED
    assert granted == known, (
        f"docs/rbac.yaml grants {sorted(granted - known)} not classified here, or no longer "
        f"grants {sorted(known - granted)}: run test_without_one_verb on it and classify"
    )


@pytest.mark.parametrize(
    ("resource", "verb"),
    role_verbs(_DOCUMENTED),
    ids=[f"{r}-{v}" for r, v in role_verbs(_DOCUMENTED)],
)
def test_without_one_verb(
    real_kube: RealKube,
    admin: client.ApiClient,
    namespace: str,
    account_client: Callable[[str], client.ApiClient],
    resource: str,
    verb: str,
) -> None:
    """The documented Role less `verb` on `resource`, then the launch and scale-down:
    a needed verb abandons the round at the step that sends it with 403; `events
    create` loses the Events only (counted as API errors), `events list` the capacity
    signals only; an unused verb changes nothing, which is what "unused today" in
    docs/rbac.yaml claims."""
    role, binding = documented_rbac(namespace, SERVICE_ACCOUNT)
    token = grant(admin, real_kube, without(role, resource, verb), binding)
    world = World(admin, namespace, account_client(token))
    launched, removed = launch_then_scale_down(world)
    if (resource, verb) in NEEDED:
        step, announced = NEEDED[resource, verb]
        for outcome in (launched, removed):
            assert not outcome.applied, f"a round succeeded without {verb} {resource}"
            assert outcome.error is not None and outcome.error.startswith(f"{step}: "), outcome
            assert "403" in outcome.error and "forbidden" in outcome.error, outcome.error
        assert world.spec()["replicas"] == 0 and "scaleStrategy" not in world.spec()
        assert _reasons(world) == announced
        return
    # Otherwise the scaling itself is untouched.
    assert launched.applied and removed.applied, (launched.error, removed.error)
    spec = world.spec()
    assert spec["replicas"] == 0 and len(spec["scaleStrategy"]["workersToDelete"]) == HOSTS
    if (resource, verb) in EVENTS_ONLY:
        assert _reasons(world) == []
        assert world.api_errors("create_event") == 3  # the launch's, the slice up's, the removal's
    elif (resource, verb) in SIGNALS_ONLY:
        assert _reasons(world) == sorted([events.LAUNCH, events.REPLICA_UP, events.REMOVE])
        assert world.api_errors("list_events") == 3  # each of the three rounds
        assert world.api_errors("create_event") == 0
    else:
        assert (resource, verb) in UNUSED | IPPR_ONLY | QUEUED_ONLY
        assert _reasons(world) == sorted([events.LAUNCH, events.REPLICA_UP, events.REMOVE])
        assert world.api_errors("create_event") == 0
