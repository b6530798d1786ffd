"""Chips GKE bills that no Ray node shows: a slice's VMs are billed from the moment
its pods are bound to them, while image pulls, init containers and raylets start,
until GCE reclaims them or the pods are gone (a drained host until KubeRay deletes
it, a deleted pod through its grace period, a failed host until its slice is
replaced). The sampler counts them by group as `unregistered_chip_hours`, which
`whatif --price` bills with the busy and idle ones."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tpu_autoscaler.controlplane import gke_events
from tpu_autoscaler.controlplane.world import REALISTIC
from tpu_autoscaler.core import labels
from tpu_autoscaler.core.problems import ManifestError
from tpu_autoscaler.sim.cluster import SimulatedCluster
from tpu_autoscaler.sim.workload import WorkItem, load_workload, parse_workload

ROOT = Path(__file__).resolve().parent.parent
CHECK_EVERY_S = 1.3


def _unregistered(sim: SimulatedCluster) -> dict[str, int]:
    """The sampler's kept chips of VMs up without a Ray node, checked against its walk
    (after the slice states, which hear of the nodes that came or went)."""
    sim.sampler._replica_states()
    kept = sim.sampler._unregistered_by_group()
    assert kept == sim.sampler.unregistered_from_pods()
    return kept


def _unregistered_from_pod_fields(sim: SimulatedCluster) -> tuple[dict[str, int], set[str]]:
    """From the pods and Ray's nodes alone, not the simulated GKE's bookkeeping: chips
    of the pods bound to a node that GCE did not reclaim (the kubelet's node-shutdown
    reason) and that have no Ray node, by group; and what kinds of such pods there
    were (booting, deleting, failed)."""
    chips: dict[str, int] = {}
    kinds: set[str] = set()
    for pod in sim.store.list_pods(sim.namespace, {labels.KUBERAY_CLUSTER: sim.name}):
        meta, status = pod["metadata"], pod["status"]
        group = meta["labels"].get(labels.KUBERAY_GROUP, "")
        shape = sim.shapes.get(group)
        if (
            shape is None
            or not shape.chips_per_host
            or not pod["spec"].get("nodeName")
            or status.get("reason") == gke_events.NODE_SHUTDOWN_REASON
            or meta["name"] in sim.ray.nodes
        ):
            continue
        chips[group] = chips.get(group, 0) + int(shape.chips_per_host)
        if meta.get("deletionTimestamp"):
            kinds.add("deleting")
        elif status["phase"] == "Failed":
            kinds.add("failed")
        elif meta["name"] not in sim.ray_seen:
            kinds.add("booting")
        else:
            kinds.add("drained")
    return dict(sorted(chips.items())), kinds


@pytest.mark.parametrize(
    ("cluster_name", "workload_name", "kinds_expected"),
    [
        ("v6e-4x4-spot-and-on-demand", "spot-churn", {"booting", "deleting"}),
        ("v6e-4x4-multihost", "training-day", {"booting", "deleting", "drained"}),
    ],
)
def test_vms_up_without_a_ray_node_are_counted_until_reclaimed_or_gone(
    cluster_name: str, workload_name: str, kinds_expected: set[str]
) -> None:
    cluster = yaml.safe_load((ROOT / f"examples/clusters/{cluster_name}.yaml").read_text())
    workload = load_workload(str(ROOT / f"examples/workloads/{workload_name}.yaml"))
    sim = SimulatedCluster(cluster, seed=5, capacity=workload.provisioning.capacity)
    kinds_seen: set[str] = set()

    def check() -> None:
        expected, kinds = _unregistered_from_pod_fields(sim)
        assert _unregistered(sim) == expected, sim.events.now_s
        kinds_seen.update(kinds)
        listed = {p["metadata"]["name"] for p in sim.store.list_pods(sim.namespace)}
        assert sim.gke.vms_up <= listed, sim.events.now_s  # a pod gone takes its VM

    sim.events.every(CHECK_EVERY_S, check, observes=True)
    sim.load(workload)
    summary = sim.run(workload.last_end_s + 1800.0)
    assert kinds_seen == kinds_expected
    by_group = summary["unregistered_chip_hours_by_group"]
    assert set(by_group) == set(summary["busy_chip_hours_by_group"])
    assert all(hours > 0 for hours in by_group.values())
    assert sum(by_group.values()) == pytest.approx(summary["unregistered_chip_hours"], abs=0.02)
    seconds = sim.metrics.unregistered_chip_seconds_by_group  # before rounding: exactly
    assert sum(seconds.values()) == pytest.approx(sim.metrics.unregistered_chip_seconds, abs=1e-6)


def test_a_slice_booting_is_billed_from_bound_until_its_raylets_register() -> None:
    """One slice, sampled each step: its 16 chips count from its four pods bound
    (all at once, as GKE brings a slice's VMs up together) down to 0 as each raylet
    registers, 4 chips at a time, and the run's hours are those samples."""
    cluster = yaml.safe_load((ROOT / "examples/clusters/v6e-4x4-multihost.yaml").read_text())
    workload = load_workload(str(ROOT / "examples/workloads/seed-slice-placement-group.yaml"))
    sim = SimulatedCluster(cluster, seed=5, capacity=workload.provisioning.capacity)
    sim.load(workload)
    seen: list[int] = []
    while not seen or seen[-1] or len(seen) < 2:
        sim.events.run_until(sim.events.now_s + 0.5)
        chips = sum(_unregistered(sim).values())
        if chips or seen:
            seen.append(chips)
        assert sim.events.now_s < 3600.0, "the slice never came up"
    steps = [n for i, n in enumerate(seen) if i == 0 or n != seen[i - 1]]
    assert steps == [16, 12, 8, 4, 0]
    assert len(sim.ray.nodes) == 4  # worker nodes: the slice's four hosts


def test_a_failed_host_is_billed_and_a_reclaimed_vm_is_not() -> None:
    """Between a fault and KubeRay's reaction (which the sampler rarely sees: KubeRay
    deletes a failed slice at once, and a terminated pod goes without a grace
    period): a host that failed keeps its VM, billed; hosts whose VMs GCE reclaimed
    (a spot preemption) are not billed, though their failed pods are still listed."""
    cluster = yaml.safe_load((ROOT / "examples/clusters/v6e-4x4-multihost.yaml").read_text())
    workload = load_workload(str(ROOT / "examples/workloads/seed-slice-placement-group.yaml"))
    sim = SimulatedCluster(cluster, seed=5, capacity=workload.provisioning.capacity)
    sim.load(workload)
    group = "tpu-v6e-group"
    while len(sim.ray.nodes) < 4:  # the slice's four hosts (the head is apart)
        sim.events.run_until(sim.events.now_s + 5.0)
        assert sim.events.now_s < 3600.0, "the slice never came up"

    def unregistered() -> dict[str, int]:
        kept = _unregistered(sim)
        assert kept == _unregistered_from_pod_fields(sim)[0]
        return kept

    assert unregistered() == {}
    sim.gke.host_failure(group)
    assert unregistered() == {group: 4}
    reclaimed = sim.gke.preempt_slice(group)
    assert len(reclaimed) == 3
    listed = [sim.store.pod(sim.namespace, pod) for pod in reclaimed]
    assert all(p is not None and p["status"]["phase"] == "Failed" for p in listed)
    assert unregistered() == {group: 4}


def test_a_revoked_requests_vms_are_not_billed() -> None:
    """Queued provisioning: GKE takes a granted request's capacity back (`revoke`),
    the kubelet fails the pods on it; their VMs are gone, so those failed pods, bound
    and without a Ray node, count no chips, unlike a failed host's."""
    cluster = yaml.safe_load((ROOT / "examples/clusters/v6e-4x4-queued.yaml").read_text())
    workload = load_workload(str(ROOT / "examples/workloads/queued-provisioning.yaml"))
    sim = SimulatedCluster(cluster, seed=5, capacity=workload.provisioning.capacity)
    sim.load(workload)

    def running_request() -> str | None:
        return next(
            (r for r, pods in sim.gke.consumed.items() if all(p in sim.ray.nodes for p in pods)),
            None,
        )

    while running_request() is None:
        sim.events.run_until(sim.events.now_s + 5.0)
        assert sim.events.now_s < 7200.0, "no granted request's slice came up"
    request = running_request()
    assert request is not None
    pods = sim.gke.consumed[request]
    before = _unregistered(sim)
    sim.gke.revoke(request)
    listed = [sim.store.pod(sim.namespace, pod) for pod in pods]
    assert all(p is not None and p["status"]["phase"] == "Failed" for p in listed)
    assert not any(p in sim.ray.nodes for p in pods)
    assert _unregistered(sim) == before


SCALE_DOWN_DELAY_S = 600.0
GROUP = "tpu-v6e-group"


def _one_slice_job(at_s: float) -> WorkItem:
    return parse_workload(
        [
            {
                "at": at_s,
                "duration": 120,
                "slice_placement_group": {"topology": "4x4", "accelerator_version": "v6e"},
            }
        ],
        "one slice job",
    ).items[0]


def _until_a_slice_lingers(scale_down_delay_s: float) -> SimulatedCluster:
    """A v6e 4x4 cluster whose GKE keeps a slice's VMs `scale_down_delay_s` after its
    pods go, run until the slice of one short job was removed and its pods are gone."""
    cluster = yaml.safe_load((ROOT / "examples/clusters/v6e-4x4-multihost.yaml").read_text())
    sim = SimulatedCluster(
        cluster, provisioning_delay=lambda _: 120.0, scale_down_delay_s=scale_down_delay_s
    )
    sim.submit(_one_slice_job(0.0))
    while not sim.gke.lingering:
        sim.events.run_until(sim.events.now_s + 1.0)
        assert sim.events.now_s < 3600.0, "no slice's VMs were kept"
    assert not sim.store.list_pods(sim.namespace, {labels.KUBERAY_GROUP: GROUP})
    return sim


def test_a_slices_vms_outlive_its_pods_by_the_scale_down_delay_billed() -> None:
    sim = _until_a_slice_lingers(SCALE_DOWN_DELAY_S)
    (kept,) = sim.gke.lingering
    gone_s = kept.until_s - SCALE_DOWN_DELAY_S
    assert (kept.group, kept.hosts) == (GROUP, 4)
    assert sim.events.now_s - 1.0 < gone_s <= sim.events.now_s  # when its last pod went
    assert _unregistered(sim) == {GROUP: 16}  # four 4-chip VMs, no pod on them
    sim.events.run_until(gone_s + SCALE_DOWN_DELAY_S - 1.0)
    assert _unregistered(sim) == {GROUP: 16}
    sim.events.run_until(gone_s + SCALE_DOWN_DELAY_S + 1.0)
    assert not sim.gke.lingering and _unregistered(sim) == {}


def test_a_slice_asked_for_while_vms_linger_lands_on_them_at_once() -> None:
    """Even through a stockout, and with a provisioning delay of 120 s: the kept VMs
    take the slice's pods as a cluster's nodes do, so only the pods' start remains
    (bound 2 s after created, Running up to the world's 20 s stagger later, raylets
    4 s after that)."""
    sim = _until_a_slice_lingers(SCALE_DOWN_DELAY_S)
    sim.stockout(GROUP, sim.events.now_s + 3600.0)
    ups = len(sim.metrics.slice_up_s)
    sim.submit(_one_slice_job(sim.events.now_s))
    while len(sim.metrics.slice_up_s) == ups:
        sim.events.run_until(sim.events.now_s + 1.0)
        assert sim.events.now_s < 3600.0, "the second slice never came up"
    assert sim.metrics.slice_up_s[-1] <= 2.0 + 20.0 + 4.0
    assert sim.metrics.slice_up_s[0] >= 120.0  # the first slice's VMs were provisioned
    assert not sim.gke.lingering  # taken


@pytest.mark.parametrize("fault", ["none", "preempted", "host failed"])
def test_no_vms_are_kept_without_a_delay_nor_once_one_failed_or_was_reclaimed(
    fault: str,
) -> None:
    """A slice's VMs are kept only with a delay, and only whole: GKE replaces a
    multi-host slice whose VM failed or was reclaimed."""
    cluster = yaml.safe_load((ROOT / "examples/clusters/v6e-4x4-multihost.yaml").read_text())
    delay_s = 0.0 if fault == "none" else SCALE_DOWN_DELAY_S
    sim = SimulatedCluster(cluster, provisioning_delay=lambda _: 120.0, scale_down_delay_s=delay_s)
    sim.submit(_one_slice_job(0.0))
    while len(sim.ray.nodes) < 4:
        sim.events.run_until(sim.events.now_s + 1.0)
        assert sim.events.now_s < 3600.0, "the slice never came up"
    slice_pods = set(sim.ray.nodes)
    if fault == "preempted":
        assert set(sim.gke.preempt_slice(GROUP)) == slice_pods
    elif fault == "host failed":
        sim.gke.host_failure(GROUP)
    # Until the slice's pods are gone: removed idle after its job, or replaced whole.
    while any(sim.store.pod(sim.namespace, pod) for pod in slice_pods):
        sim.events.run_until(sim.events.now_s + 1.0)
        assert sim.events.now_s < 3600.0, "the slice's pods never went"
    assert not sim.gke.lingering
    assert sim.metrics.slices_launched == 1 + (fault != "none")  # a lost slice replaced
    if fault != "none":  # the replacement waits for VMs of its own, not the lost ones
        while len(sim.metrics.slice_up_s) < 2:
            sim.events.run_until(sim.events.now_s + 1.0)
            assert sim.events.now_s < 3600.0, "the replacement never came up"
        assert sim.metrics.slice_up_s[1] >= 120.0


def test_a_traces_scale_down_delay_is_read_checked_and_used_by_simulate() -> None:
    cluster = yaml.safe_load((ROOT / "examples/clusters/v6e-4x4-multihost.yaml").read_text())
    spg = {"topology": "4x4", "accelerator_version": "v6e"}
    job = {"at": 0, "duration": 120, "slice_placement_group": spg}
    with pytest.raises(ManifestError) as refused:
        parse_workload({"items": [job], "provisioning": {"scale_down_delay_s": -60}}, "t")
    (problem,) = refused.value.problems
    assert problem.path == "t: provisioning.scale_down_delay_s"
    assert problem.message == "Input should be greater than or equal to 0"
    traced = parse_workload({"items": [job], "provisioning": {"scale_down_delay_s": 600}}, "t")
    sim = SimulatedCluster.for_workload(cluster, traced, "slice", 0, REALISTIC)
    assert sim.gke.scale_down_delay_s == 600.0
    summary = sim.run(traced.last_end_s + 900.0)
    assert summary["unregistered_chip_hours"] > 16 * 600 / 3600  # a slice's VMs, kept


def test_a_queued_groups_vms_are_not_kept() -> None:
    """Queued provisioning: a slice's nodes belong to its ProvisioningRequest, so none
    are kept for a later slice once its pods go."""
    cluster = yaml.safe_load((ROOT / "examples/clusters/v6e-4x4-queued.yaml").read_text())
    workload = load_workload(str(ROOT / "examples/workloads/queued-provisioning.yaml"))
    sim = SimulatedCluster(
        cluster,
        seed=5,
        capacity=workload.provisioning.capacity,
        scale_down_delay_s=SCALE_DOWN_DELAY_S,
    )
    kept_groups: set[str] = set()

    def check() -> None:
        kept_groups.update(kept.group for kept in sim.gke.lingering)

    sim.events.every(CHECK_EVERY_S, check, observes=True)
    sim.load(workload)
    sim.run(workload.last_end_s + 1800.0)
    assert sim.gke.queued == {"tpu-v6e-queued"}
    assert sim.removals["tpu-v6e-queued"]  # its slices went
    assert "tpu-v6e-queued" not in kept_groups
