"""Capacity signals read from Kubernetes: the Events GKE's cluster-autoscaler records
on Pending pods (their messages as GKE and cluster-autoscaler write them), the
kubelet's node-shutdown status of a preempted pod, and the snapshot file that
carries the Events to `plan`."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from tpu_autoscaler.adapters.kube.capacity_events import (
    PREEMPTIONS_KEPT,
    CoreEvent,
    capacity_problem,
    capacity_signals,
    event_signals,
    kept_signals,
    parse_events,
    preemption_signals,
)
from tpu_autoscaler.adapters.kube.pods import Pod, parse_pods
from tpu_autoscaler.adapters.ray.gcs import DeadNode
from tpu_autoscaler.adapters.snapshot_file import build_snapshot
from tpu_autoscaler.cli import main
from tpu_autoscaler.core.capacity import CapacityProblem, CapacitySignal
from tpu_autoscaler.core.problems import ManifestError
from tpu_autoscaler.testing.scenarios import SnapshotBuilder

CLUSTERS = Path(__file__).parent.parent / "examples" / "clusters"
GROUP = "tpu-v6e-group"

OUT_OF_RESOURCES = (
    "Node scale up in zones us-central2-b associated with this pod failed: GCE out of "
    "resources. Pod is at risk of not being scheduled."
)
QUOTA = (
    "Node scale up in zones us-central1-c associated with this pod failed: GCE quota "
    "exceeded. Pod is at risk of not being scheduled."
)
IP_SPACE = (
    "Node scale up in zones australia-southeast1-b associated with this pod failed: IP "
    "space exhausted. Pod is at risk of not being scheduled."
)
TIMEOUT_AND_STOCKOUT = (
    "Node scale up in zones us-central1-c, us-central1-a associated with this pod failed: "
    'Some nodes in node group ["ng1"] failed to appear in time, GCE out of resources. '
    "Pod is at risk of not being scheduled."
)
INTERNAL = (
    "Node scale up in zones us-central1-c associated with this pod failed: Internal error. "
    "Pod is at risk of not being scheduled."
)
BACKOFF = "pod didn't trigger scale-up: 1 in backoff after failed scale-up"
MAX_SIZE = "pod didn't trigger scale-up: 2 max node group size reached"
SHUTDOWN = "Pod was terminated in response to imminent node shutdown."


def _at(clock: str) -> float:
    """Seconds since the epoch of a time on 2026-12-02, UTC."""
    hour, minute = (int(x) for x in clock.split(":"))
    return datetime(2026, 12, 2, hour, minute, tzinfo=UTC).timestamp()


@pytest.mark.parametrize(
    ("reason", "message", "problem"),
    [
        ("FailedScaleUp", OUT_OF_RESOURCES, CapacityProblem.STOCKOUT),
        ("FailedScaleUp", QUOTA, CapacityProblem.QUOTA),
        ("FailedScaleUp", IP_SPACE, CapacityProblem.NODE_POOL_FAILED),
        ("FailedScaleUp", INTERNAL, CapacityProblem.NODE_POOL_FAILED),
        # Several reasons in one message: the stockout is what the policy acts on.
        ("FailedScaleUp", TIMEOUT_AND_STOCKOUT, CapacityProblem.STOCKOUT),
        ("NotTriggerScaleUp", BACKOFF, None),
        ("NotTriggerScaleUp", MAX_SIZE, None),
        ("TriggeredScaleUp", "pod triggered scale-up: [{ng1 0->1 (max: 4)}]", None),
        ("FailedScheduling", "0/3 nodes are available: 3 Insufficient google.com/tpu.", None),
    ],
)
def test_each_message_names_its_problem(
    reason: str, message: str, problem: CapacityProblem | None
) -> None:
    assert capacity_problem(reason, message) == problem


def _pod(name: str, group: str = GROUP, **status: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "default",
            "creationTimestamp": "2026-12-02T11:00:00Z",
            "labels": {"ray.io/cluster": "tpu-v6e-16", "ray.io/group": group},
        },
        "status": {"phase": "Pending", **status},
    }


def _event(
    pod: str, reason: str, message: str, last: str = "2026-12-02T11:50:00Z", **more: Any
) -> dict[str, Any]:
    return {
        "metadata": {"name": f"{pod}.18a", "namespace": "default"},
        "involvedObject": {"kind": "Pod", "name": pod, "namespace": "default"},
        "reason": reason,
        "message": message,
        "type": "Warning",
        "count": 1,
        "firstTimestamp": "2026-12-02T11:40:00Z",
        "lastTimestamp": last,
        **more,
    }


def _signals(events: list[dict[str, Any]], pods: list[dict[str, Any]]) -> list[CapacitySignal]:
    return event_signals(parse_events(events), parse_pods(pods), [GROUP, "other"])


def test_a_failed_scale_up_on_a_pod_is_a_signal_for_its_group_at_its_last_time() -> None:
    (signal,) = _signals([_event("w-0", "FailedScaleUp", OUT_OF_RESOURCES, count=3)], [_pod("w-0")])
    assert signal.group == GROUP
    assert signal.problem is CapacityProblem.STOCKOUT
    assert signal.at_s == _at("11:50")
    assert signal.message == OUT_OF_RESOURCES
    assert signal.source == "Event FailedScaleUp on pod w-0 (x3)"


def test_events_about_other_objects_unknown_pods_or_other_groups_say_nothing() -> None:
    node_event = _event("w-0", "FailedScaleUp", OUT_OF_RESOURCES)
    node_event["involvedObject"]["kind"] = "Node"
    found = _signals(
        [
            node_event,
            _event("gone-0", "FailedScaleUp", OUT_OF_RESOURCES),  # no such pod listed
            _event("x-0", "FailedScaleUp", OUT_OF_RESOURCES),  # a group not ours
        ],
        [_pod("w-0"), _pod("x-0", group="someone-elses")],
    )
    assert found == []


def test_the_time_falls_back_to_the_series_then_event_time() -> None:
    series = _event("w-0", "FailedScaleUp", QUOTA, last="")
    series["series"] = {"count": 4, "lastObservedTime": "2026-12-02T11:55:00.000000Z"}
    series["eventTime"] = "2026-12-02T11:30:00.000000Z"
    newer = _event("w-1", "FailedScaleUp", QUOTA, last="", firstTimestamp="")
    newer["eventTime"] = "2026-12-02T11:45:00.000000Z"
    found = {
        s.source.split()[-1]: s.at_s for s in _signals([series, newer], [_pod("w-0"), _pod("w-1")])
    }
    assert found == {"w-0": _at("11:55"), "w-1": _at("11:45")}


def test_the_newest_of_each_problem_per_group_is_kept() -> None:
    signals = [
        CapacitySignal(GROUP, CapacityProblem.STOCKOUT, 10.0, "old"),
        CapacitySignal(GROUP, CapacityProblem.QUOTA, 30.0, "quota"),
        CapacitySignal("other", CapacityProblem.NODE_POOL_FAILED, 20.0, "x"),
        CapacitySignal(GROUP, CapacityProblem.STOCKOUT, 25.0, "new"),
    ]
    kept = kept_signals(signals)
    assert [(s.group, s.message) for s in kept] == [
        (GROUP, "quota"),
        (GROUP, "new"),
        ("other", "x"),
    ]


def test_preemptions_are_kept_per_host_once_the_newest_few() -> None:
    hosts = [
        CapacitySignal(GROUP, CapacityProblem.PREEMPTED, float(t), "m", f"pod w-{t}")
        for t in range(PREEMPTIONS_KEPT + 3)
    ]
    # The same host read twice (its failed pod, then its dead node): one preemption.
    twice = CapacitySignal(GROUP, CapacityProblem.PREEMPTED, 100.0, "again", "pod w-4")
    kept = kept_signals([*hosts, twice])
    assert [s.source for s in kept] == [
        "pod w-4",
        *[f"pod w-{t}" for t in range(PREEMPTIONS_KEPT + 2, 2, -1) if t != 4],
    ][:PREEMPTIONS_KEPT]
    assert len(kept) == PREEMPTIONS_KEPT


signal_lists = st.lists(
    st.builds(
        CapacitySignal,
        st.sampled_from(["a", "b", "c"]),
        st.sampled_from(list(CapacityProblem)),
        st.floats(0, 1e6, allow_nan=False),
        st.text(max_size=3),
        st.sampled_from(["pod w-0", "pod w-1", "pod w-2", "Event FailedScaleUp on pod w-0"]),
    ),
    max_size=40,
)


@given(signal_lists)
def test_kept_signals_are_the_newest_once_each(signals: list[CapacitySignal]) -> None:
    kept = kept_signals(signals)
    assert [s.at_s for s in kept] == sorted((s.at_s for s in kept), reverse=True)
    for signal in kept:
        assert signal in signals
    for group in {s.group for s in signals}:
        for problem in CapacityProblem:
            said = [s for s in signals if (s.group, s.problem) == (group, problem)]
            have = [s for s in kept if (s.group, s.problem) == (group, problem)]
            if problem is not CapacityProblem.PREEMPTED:
                assert len(have) == min(len(said), 1)
                assert all(s.at_s == max(x.at_s for x in said) for s in have)
                continue
            hosts = {s.source for s in said}
            assert len(have) == min(len(hosts), PREEMPTIONS_KEPT)
            assert len({s.source for s in have}) == len(have)
            for s in have:  # each host at its newest
                assert s.at_s == max(x.at_s for x in said if x.source == s.source)


def test_a_pod_failed_by_its_nodes_shutdown_is_a_preemption_at_its_ready_change() -> None:
    ready = {"type": "Ready", "status": "False", "lastTransitionTime": "2026-12-02T11:58:00Z"}
    pods = parse_pods(
        [
            _pod("w-0", phase="Failed", reason="Terminated", message=SHUTDOWN, conditions=[ready]),
            # Kubernetes 1.20-1.21 wrote "Shutdown" and its own message.
            _pod(
                "w-1", phase="Failed", reason="Shutdown", message="Node is shutting, evicting pods"
            ),
            # A crash is no preemption; nor is a pod still running; the kubelet's reason
            # and its words are both needed.
            _pod("w-2", phase="Failed", reason="Error", message="exit code 1"),
            _pod("w-4", phase="Failed", reason="Evicted", message=SHUTDOWN),
            _pod("w-5", phase="Failed", reason="Terminated", message="The node was low on memory."),
            _pod("w-3", phase="Running", reason="Terminated", message=SHUTDOWN),
        ]
    )
    found = preemption_signals(pods, [GROUP])
    assert [(s.source, s.problem, s.at_s) for s in found] == [
        ("pod w-0", CapacityProblem.PREEMPTED, _at("11:58")),
        ("pod w-1", CapacityProblem.PREEMPTED, _at("11:00")),
    ]
    assert found[0].message == f"the kubelet: Terminated: {SHUTDOWN}"


def test_capacity_signals_joins_events_pods_and_dead_nodes() -> None:
    pods = [
        _pod("w-0"),
        _pod("v-0", group="other", phase="Failed", reason="Terminated", message=SHUTDOWN),
    ]
    events = parse_events([_event("w-0", "FailedScaleUp", OUT_OF_RESOURCES)])
    dead = [
        # v-0's node, dead for the preemption its pod told of: one preemption.
        DeadNode("v-0", "other", "AUTOSCALER_DRAIN_PREEMPTED", "spot VM preempted", 50.0),
        DeadNode("v-1", "other", "AUTOSCALER_DRAIN_PREEMPTED", "", 60.0),
        # Not preemptions: a crash, an idle removal, and a busy host this autoscaler
        # retired with a preemption drain (its own words).
        DeadNode("w-1", GROUP, "UNEXPECTED_TERMINATION", "raylet died", 70.0),
        DeadNode("w-2", GROUP, "AUTOSCALER_DRAIN_IDLE", "tpu-autoscaler: slice idle", 70.0),
        DeadNode(
            "w-3",
            GROUP,
            "AUTOSCALER_DRAIN_PREEMPTED",
            "tpu-autoscaler: slice s-1 lost hosts to a drain",
            70.0,
        ),
    ]
    found = capacity_signals(events, parse_pods(pods), [GROUP, "other"], dead)
    assert sorted((s.group, s.problem, s.source) for s in found) == [
        ("other", CapacityProblem.PREEMPTED, "pod v-0"),
        ("other", CapacityProblem.PREEMPTED, "pod v-1"),
        (GROUP, CapacityProblem.STOCKOUT, "Event FailedScaleUp on pod w-0"),
    ]
    by_host = {s.source: s.message for s in found}
    assert by_host["pod v-1"] == "the GCS: AUTOSCALER_DRAIN_PREEMPTED"


def test_an_event_that_does_not_parse_is_skipped() -> None:
    bad = _event("w-0", "FailedScaleUp", OUT_OF_RESOURCES, count="many")
    good = _event("w-1", "FailedScaleUp", QUOTA)
    assert [e.involved_object.name for e in parse_events([bad, good])] == ["w-1"]


# --- the snapshot file ----------------------------------------------------------------------


def _snapshot_with_a_pending_slice() -> dict[str, Any]:
    builder = SnapshotBuilder(yaml.safe_load((CLUSTERS / "v6e-4x4-multihost.yaml").read_text()))
    data = builder.replica(GROUP, 0, running=False, age_s=300).build()
    return data


def _pod_names(data: dict[str, Any]) -> list[str]:
    return [p["metadata"]["name"] for p in data["pods"]["items"]]


@pytest.mark.parametrize("as_list", [True, False], ids=["list", "EventList"])
def test_the_snapshot_file_carries_events_into_the_snapshots_signals(as_list: bool) -> None:
    data = _snapshot_with_a_pending_slice()
    items = [_event(name, "FailedScaleUp", OUT_OF_RESOURCES) for name in _pod_names(data)]
    data["events"] = items if as_list else {"apiVersion": "v1", "kind": "EventList", "items": items}
    (signal,) = build_snapshot(data, "snap.yaml").snapshot.capacity_signals
    assert (signal.group, signal.problem) == (GROUP, CapacityProblem.STOCKOUT)
    without = copy.deepcopy(data)
    del without["events"]
    assert build_snapshot(without, "snap.yaml").snapshot.capacity_signals == ()


def test_a_bad_event_in_the_snapshot_file_is_named() -> None:
    data = _snapshot_with_a_pending_slice()
    data["events"] = [_event(_pod_names(data)[0], "FailedScaleUp", QUOTA, count="many")]
    with pytest.raises(ManifestError) as caught:
        build_snapshot(data, "snap.yaml")
    (problem,) = caught.value.problems
    assert problem.path == "snap.yaml: events[0].count"
    assert "integer" in problem.message


def test_core_event_model_reads_camel_case() -> None:
    event = CoreEvent.model_validate(_event("w-0", "FailedScaleUp", QUOTA, count=7))
    assert event.involved_object.name == "w-0" and event.count == 7


def test_pods_model_keeps_the_kubelets_reason() -> None:
    pod = Pod.model_validate(_pod("w-0", phase="Failed", reason="Terminated", message=SHUTDOWN))
    assert (pod.status.reason, pod.status.message) == ("Terminated", SHUTDOWN)


def test_plan_prints_the_signals_it_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _snapshot_with_a_pending_slice()
    data["events"] = [_event(n, "FailedScaleUp", QUOTA) for n in _pod_names(data)]
    snap = tmp_path / "snap.yaml"
    snap.write_text(yaml.safe_dump(data))
    assert main(["plan", str(snap)]) == 0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("signal ")]
    assert line.startswith(f"signal {GROUP}: quota at {_at('11:50'):.0f}: {QUOTA} (Event ")
    assert main(["plan", "--output", "json", str(snap)]) == 0
    (read,) = json.loads(capsys.readouterr().out)["capacity_signals"]
    assert (read["group"], read["problem"], read["message"]) == (GROUP, "quota", QUOTA)
