"""`record`'s history-to-trace step on histories as Ray's GCS gives them: a fixture
read from a real `tpu-autoscaler local` run (`test_record_e2e.py`'s job mix), and
small histories built here for what that run did not do (retried heads, lost events,
pending work, groups without work)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tpu_autoscaler.cli import main
from tpu_autoscaler.record.history import (
    History,
    Losses,
    RecordedBundle,
    RecordedPlacementGroup,
    RecordedWork,
    SliceLaunch,
    SliceUp,
    launches_up,
    slices_up,
)
from tpu_autoscaler.record.trace import SliceType, trace_from_history
from tpu_autoscaler.sim.workload import parse_workload

ROOT = Path(__file__).parent.parent
FIXTURE = ROOT / "tests/fixtures/record/job-mix-history.json"
V6E = ROOT / "examples/clusters/v6e-4x4-multihost.yaml"
V6E_16 = {"v6e-16": SliceType("4x4", "v6e", {"CPU": 1.0, "TPU": 4.0})}
T0 = 1_800_000_000_000.0


def work(
    kind: str = "task",
    at_s: float = 0,
    start_s: float | None = 1,
    end_s: float | None = 11,
    pg: str | None = None,
    resources: dict[str, float] | None = None,
) -> RecordedWork:
    return RecordedWork(
        kind=kind,  # type: ignore[arg-type]
        id=f"{kind}-{at_s}-{start_s}-{pg}",
        job_id="01000000",
        resources={"TPU": 4.0} if resources is None else resources,
        placement_group_id=pg,
        submitted_ms=T0 + at_s * 1000,
        started_ms=None if start_s is None else T0 + start_s * 1000,
        ended_ms=None if end_s is None else T0 + end_s * 1000,
    )


def head(pg_id: str, at_s: float, placed_s: float | None) -> RecordedPlacementGroup:
    return RecordedPlacementGroup(
        id=pg_id,
        job_id="01000000",
        strategy="PACK",
        bundles=[
            RecordedBundle(
                resources={"TPU-v6e-16-head": 1.0},
                label_selector={"ray.io/tpu-worker-id": "0", "ray.io/tpu-pod-type": "v6e-16"},
            )
        ],
        state="REMOVED" if placed_s is None else "CREATED",
        created_ms=T0 + at_s * 1000,
        placed_ms=None if placed_s is None else T0 + placed_s * 1000,
    )


def slice_workers(
    pg_id: str,
    at_s: float,
    placed_s: float,
    slices: list[str],
    bundle: dict[str, float] | None = None,
) -> RecordedPlacementGroup:
    return RecordedPlacementGroup(
        id=pg_id,
        job_id="01000000",
        strategy="SPREAD",
        bundles=[
            RecordedBundle(
                resources=bundle or {"CPU": 1.0, "TPU": 4.0},
                label_selector={"ray.io/tpu-slice-name": name},
            )
            for name in slices
            for _ in range(4)
        ],
        state="REMOVED",
        created_ms=T0 + at_s * 1000,
        placed_ms=T0 + placed_s * 1000,
    )


def history(
    *items: RecordedWork | RecordedPlacementGroup,
    losses: Losses | None = None,
    recorded_s: float = 1000,
) -> History:
    return History(
        recorded_ms=T0 + recorded_s * 1000,
        work=[i for i in items if isinstance(i, RecordedWork)],
        placement_groups=[i for i in items if isinstance(i, RecordedPlacementGroup)],
        losses=losses or Losses(),
    )


def test_the_real_runs_history_becomes_its_job_mix() -> None:
    recorded = trace_from_history(History.model_validate_json(FIXTURE.read_text()), V6E_16)
    kinds = [
        next(k for k in ("slice_placement_group", "task", "actor") if getattr(i, k))
        for i in recorded.workload.items
    ]
    assert sorted(set(kinds)) == ["actor", "slice_placement_group", "task"]
    assert sum(i.count for i in recorded.workload.items if i.task) == 4
    (spg,) = [i for i in recorded.workload.items if i.slice_placement_group]
    assert spg.at == 0 and spg.slice_placement_group is not None
    assert (spg.slice_placement_group.topology, spg.slice_placement_group.num_slices) == ("4x4", 1)
    assert 39 <= spg.duration <= 42, "40 s tasks on every host of the slice"
    assert recorded.notes == []
    assert len(recorded.waits_s) == 6


def test_a_slice_reservation_is_one_item_from_its_first_head_with_its_retries() -> None:
    recorded = trace_from_history(
        history(
            head("h1", 0, None),  # timed out: the caller saw TimeoutError, tried again
            head("h2", 100, 130),
            head("h3", 131, 160),
            slice_workers("w", 161, 162, ["s-0", "s-1"]),
            work(pg="w", at_s=162, start_s=162, end_s=462),
        ),
        V6E_16,
    )
    (item,) = recorded.workload.items
    assert item.at == 0 and item.duration == 300
    assert item.slice_placement_group is not None
    assert item.slice_placement_group.num_slices == 2
    assert item.slice_placement_group.retries == -1
    assert item.slice_placement_group.resources_per_bundle is None
    assert recorded.waits_s == [162.0]


def test_per_device_bundles_are_kept_and_an_unknown_pod_type_is_said() -> None:
    per_device = slice_workers("w", 1, 2, ["s-0"], bundle={"CPU": 1.0, "TPU": 1.0})
    ran = work(pg="w", start_s=2, end_s=12)
    recorded = trace_from_history(history(head("h", 0, 1), per_device, ran), V6E_16)
    (item,) = recorded.workload.items
    assert item.slice_placement_group is not None
    assert item.slice_placement_group.resources_per_bundle == {"CPU": 1.0, "TPU": 1.0}
    unknown = trace_from_history(history(head("h", 0, 1), per_device, ran), {})
    assert unknown.workload.items == []
    assert any("pod type v6e-16" in n for n in unknown.notes)


def test_work_inside_a_group_is_the_groups_not_new_demand() -> None:
    pg = RecordedPlacementGroup(
        id="pg",
        job_id="01000000",
        strategy="STRICT_SPREAD",
        bundles=[RecordedBundle(resources={"TPU": 4.0}, label_selector={"k": "in(a,b)"})] * 2,
        state="REMOVED",
        created_ms=T0 + 5000,
        placed_ms=T0 + 8000,
    )
    recorded = trace_from_history(
        history(pg, work(pg="pg", start_s=8, end_s=20), work(pg="pg", start_s=9, end_s=68)),
        V6E_16,
    )
    (item,) = recorded.workload.items
    assert item.placement_group is not None
    assert (item.at, item.duration) == (0, 60)
    assert item.placement_group.bundle_label_selector == [{"k": "in(a,b)"}] * 2


def test_equal_items_after_rounding_count_once_and_running_work_ends_at_recording() -> None:
    recorded = trace_from_history(
        history(
            work(at_s=0, start_s=1, end_s=21.2),
            work(at_s=0.3, start_s=1.1, end_s=21.0),
            work(kind="actor", at_s=2, start_s=3, end_s=None),
            recorded_s=50,
        ),
        V6E_16,
    )
    first, actor = recorded.workload.items
    assert (first.at, first.duration, first.count) == (0, 20, 2)
    assert actor.actor is not None and (actor.at, actor.duration) == (2, 47)


def test_what_cannot_be_traced_is_said_not_dropped_silently() -> None:
    recorded = trace_from_history(
        history(
            work(start_s=None, end_s=None),
            work(resources={}),
            work(pg="gone"),
            head("h", 0, 1),
            losses=Losses(task_events_dropped=1234, actors_truncated=5),
        ),
        V6E_16,
    )
    assert recorded.workload.items == []
    text = "\n".join(recorded.notes)
    for said in (
        "1 tasks never placed",
        "1 asked for no resources",
        "1 ran in a placement group the GCS no longer held",
        "1 slice head reservations never followed",
        "1234 task attempts lost",
        "RAY_task_events_max_num_task_in_gcs",
        "5 actors not read",
    ):
        assert said in text


def test_record_cli_writes_a_trace_simulate_accepts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace, cluster = tmp_path / "t.yaml", tmp_path / "c.yaml"
    args = ["record", "--from-history", str(FIXTURE), "--cluster", str(V6E), "-o", str(trace)]
    args += ["--cluster-output", str(cluster), "--provisioning-delay-s", "8-12"]
    assert main(args) == 0
    assert "waits as they happened" in capsys.readouterr().err
    data: dict[str, Any] = yaml.safe_load(trace.read_text())
    workload = parse_workload(data, "t")
    assert workload.provisioning.delay_s.min == 8
    assert yaml.safe_load(cluster.read_text())["metadata"]["name"] == "tpu-v6e-16"
    args = ["simulate", "--cluster", str(cluster), "--workload", str(trace), "--output", "json"]
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["unsatisfied_at_end"] == 0


def test_a_reused_slice_name_is_two_launches_and_hosts_without_a_slice_are_left_out() -> None:
    hosts = [
        ("tpu-a", "3", T0 + 7000),
        ("tpu-a", "0", T0 + 1000),
        ("", "", T0),  # the head
        ("tpu-a", "2", T0 + 1500),
        ("tpu-a", "1", T0 + 3000),
        ("tpu-a", "0", T0 + 60_000),  # the name's next launch
        ("tpu-b", "0", T0 + 2000),  # a single-host slice
        ("tpu-a", "1", T0 + 60_500),
        ("tpu-c", "1", T0 + 1300),  # came up after tpu-a's first host, before its second
        ("tpu-c", "0", T0 + 1200),
    ]
    assert slices_up(hosts) == [
        SliceUp(slice_name="tpu-a", hosts_started_ms=[T0 + 1000, T0 + 1500, T0 + 3000, T0 + 7000]),
        SliceUp(slice_name="tpu-c", hosts_started_ms=[T0 + 1200, T0 + 1300]),
        SliceUp(slice_name="tpu-b", hosts_started_ms=[T0 + 2000]),
        SliceUp(slice_name="tpu-a", hosts_started_ms=[T0 + 60_000, T0 + 60_500]),
    ]
    assert [up.spread_s for up in slices_up(hosts)] == [6.0, 0.1, 0.0, 0.5]


def test_record_writes_the_widest_host_spread_seen_as_the_traces_host_stagger(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = History.model_validate_json(FIXTURE.read_text())
    ups = [
        SliceUp(slice_name="tpu-a", hosts_started_ms=[T0, T0 + 2500, T0 + 9000]),
        SliceUp(slice_name="tpu-b", hosts_started_ms=[T0, T0 + 400]),
        SliceUp(slice_name="tpu-s", hosts_started_ms=[T0 + 5000]),  # single-host: no spread
    ]
    (tmp_path / "h.json").write_text(source.model_copy(update={"slices_up": ups}).model_dump_json())
    trace = tmp_path / "t.yaml"
    args = ["record", "--from-history", str(tmp_path / "h.json"), "--cluster", str(V6E)]
    assert main([*args, "-o", str(trace)]) == 0
    capsys.readouterr()
    workload = parse_workload(yaml.safe_load(trace.read_text()), "t")
    assert workload.provisioning.host_stagger_s == 9.0
    assert workload.provisioning.delay_s.min == 60, "no delay given: the simulator's"
    assert "2 multi-host slices seen (0.4-9 s)" in trace.read_text()
    assert main([*args, "-o", str(trace), "--provisioning-delay-s", "8"]) == 0
    workload = parse_workload(yaml.safe_load(trace.read_text()), "t")
    assert (workload.provisioning.delay_s.max, workload.provisioning.host_stagger_s) == (8, 9.0)
    assert (
        main(["record", "--from-history", str(FIXTURE), "--cluster", str(V6E), "-o", str(trace)])
        == 0
    )
    assert "provisioning" not in yaml.safe_load(trace.read_text()), "no slice seen: no stagger"


def test_record_cli_without_a_source_or_cluster_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["record", "--cluster", str(V6E), "-o", str(tmp_path / "t")]) == 2
    assert "--gcs-address" in capsys.readouterr().err
    assert main(["record", "--from-history", str(FIXTURE)]) == 2
    assert "--cluster" in capsys.readouterr().err


def test_record_reads_the_raycluster_from_kubernetes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tpu_autoscaler.controlplane.apiserver import ApiServer
    from tpu_autoscaler.controlplane.store import ObjectStore

    store = ObjectStore()
    store.create_raycluster(yaml.safe_load(V6E.read_text()))
    cluster = tmp_path / "c.yaml"
    args = ["record", "--from-history", str(FIXTURE), "--cluster-name", "tpu-v6e-16"]
    args += ["-o", str(tmp_path / "t.yaml"), "--cluster-output", str(cluster)]
    with ApiServer(store) as server:
        assert main([*args, "--kube-host", server.url]) == 0, capsys.readouterr().err
        written = yaml.safe_load(cluster.read_text())
        assert "status" not in written
        assert written["spec"]["workerGroupSpecs"][0]["numOfHosts"] == 4
        assert main([*args, "--kube-host", server.url, "--namespace", "elsewhere"]) == 1
        assert "Kubernetes API" in capsys.readouterr().err


@pytest.mark.parametrize("delay", ["12-8", "soon", "-5"])
def test_a_bad_provisioning_delay_exits_2_naming_the_flag_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], delay: str
) -> None:
    trace = tmp_path / "t.yaml"
    args = ["record", "--from-history", str(FIXTURE), "--cluster", str(V6E), "-o", str(trace)]
    assert main([*args, f"--provisioning-delay-s={delay}"]) == 2
    assert (
        "--provisioning-delay-s: give seconds, S or MIN-MAX, e.g. 8-12" in capsys.readouterr().err
    )
    assert not trace.exists()


def first_hosts_after_launch_s(launches: list[SliceLaunch], ups: list[SliceUp]) -> list[float]:
    """Each paired launch's first pod created to its slice's first host, in seconds."""
    return [
        round((up.hosts_started_ms[0] - launch.first_pod_created_ms) / 1000, 3)
        for launch, up in launches_up(launches, ups)
    ]


def _launch(slice_name: str, created_ms: float) -> SliceLaunch:
    return SliceLaunch(
        slice_name=slice_name, replica=f"r-{created_ms}", group="g", first_pod_created_ms=created_ms
    )


def test_each_slice_up_goes_to_the_latest_launch_under_its_name_before_its_first_host() -> None:
    ups = [
        SliceUp(slice_name="tpu-a", hosts_started_ms=[T0 + 90_000, T0 + 95_000]),
        SliceUp(slice_name="tpu-a", hosts_started_ms=[T0 + 500_000, T0 + 501_000]),
        SliceUp(slice_name="tpu-b", hosts_started_ms=[T0 + 130_000]),
        SliceUp(slice_name="tpu-c", hosts_started_ms=[T0 + 10_000]),  # before its launch
        SliceUp(slice_name="tpu-e", hosts_started_ms=[T0 + 7_123.45]),
        SliceUp(slice_name="tpu-f", hosts_started_ms=[T0 + 5_000]),  # at its pods' creation
        SliceUp(slice_name="tpu-g", hosts_started_ms=[T0 + 52_000]),
        SliceUp(slice_name="tpu-g", hosts_started_ms=[T0 + 302_000]),  # its launch not told
    ]
    launches = [
        _launch("tpu-a", T0 + 400_000),  # the name's second launch
        _launch("tpu-a", T0),
        _launch("tpu-b", T0 + 10_000),
        _launch("tpu-c", T0 + 20_000),  # Ray no longer knows its slice: left out
        _launch("tpu-d", T0),  # never came up in Ray
        _launch("tpu-e", T0 + 1_000),
        _launch("tpu-e", T0 - 61_000),  # a launch before it whose slice Ray forgot
        _launch("tpu-f", T0 + 5_000),
        _launch("tpu-g", T0 + 2_000),
    ]
    assert first_hosts_after_launch_s(launches, ups) == [90.0, 6.123, 50.0, 0.0, 120.0, 100.0]
    # Two launches, one slice seen: the later launch's (the earlier's was forgotten).
    assert first_hosts_after_launch_s([_launch("tpu-b", T0), _launch("tpu-b", T0 + 1)], ups) == [
        129.999
    ]


def test_record_measures_the_provisioning_delay_from_the_autoscalers_replica_up_events(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from tpu_autoscaler.adapters.ray import history as ray_history
    from tpu_autoscaler.controlplane.apiserver import ApiServer
    from tpu_autoscaler.controlplane.store import ObjectStore
    from tpu_autoscaler.shell import events
    from tpu_autoscaler.shell.readiness import ReplicaUp

    source = History.model_validate_json(FIXTURE.read_text())
    ups = [
        SliceUp(slice_name="tpu-a", hosts_started_ms=[T0 + 84_000, T0 + 90_000]),
        SliceUp(slice_name="tpu-a", hosts_started_ms=[T0 + 664_000, T0 + 665_000]),
    ]
    monkeypatch.setattr(
        ray_history, "read_history", lambda *_, **__: source.model_copy(update={"slices_up": ups})
    )
    store = ObjectStore()
    raw = store.create_raycluster(yaml.safe_load(V6E.read_text()))
    name = raw["metadata"]["name"]
    # Told by a version without the annotations: passed over, not the end of the list.
    store.create_event("default", events.cluster_event(raw, events.REPLICA_UP, "up", "Normal", 0.0))
    for created_s in (T0 / 1000, T0 / 1000 + 600, T0 / 1000 + 2000):  # the last: never up
        up = ReplicaUp("tpu", f"tpu-{created_s:.0f}", "tpu-a", 2, created_s, 0.0, 0.0)
        told = events.cluster_event(raw, events.REPLICA_UP, up.message(), "Normal", 0.0)
        store.create_event(
            "default", {**told, "metadata": {**told["metadata"], "annotations": up.annotations()}}
        )
    # Another reason with the same annotations (one second later) is no launch.
    up = ReplicaUp("tpu", "tpu-other", "tpu-a", 2, T0 / 1000 + 1, 0.0, 0.0)
    other = events.cluster_event(raw, events.LAUNCH, "launching", "Normal", 0.0)
    store.create_event(
        "default", {**other, "metadata": {**other["metadata"], "annotations": up.annotations()}}
    )
    trace, history = tmp_path / "t.yaml", tmp_path / "h.json"
    args = ["record", "--gcs-address", "gcs:6379", "--cluster", str(V6E), "--no-progress"]
    args += ["--cluster-name", name, "-o", str(trace), "--history-output", str(history)]
    with ApiServer(store) as server:
        assert main([*args, "--kube-host", server.url]) == 0, capsys.readouterr().err
        workload = parse_workload(yaml.safe_load(trace.read_text()), "t")
        # 84 and 64 s to the first host, less the simulator's 4 s raylet start and the
        # first of a 2-host slice's pods' average wait within the 6 s stagger: 6/3 s.
        assert workload.provisioning.host_stagger_s == 6.0
        assert (workload.provisioning.delay_s.min, workload.provisioning.delay_s.max) == (58, 78)
        told = "2 slice launches (the autoscaler's ReplicaUp Events): 64.0-84.0 s"
        assert told in trace.read_text()
        unmatched = "1 of 3 slice launches the autoscaler told matched no slice Ray still"
        assert unmatched in trace.read_text() and unmatched in capsys.readouterr().err
        kept = History.model_validate_json(history.read_text()).slices_launched
        assert [launch.replica for launch in kept] == [
            f"tpu-{T0 / 1000 + s:.0f}" for s in (0, 600, 2000)
        ]
        # Replayed from the history written, the same delay.
        again = ["record", "--from-history", str(history), "--cluster", str(V6E), "-o", str(trace)]
        assert main(again) == 0
        replayed = parse_workload(yaml.safe_load(trace.read_text()), "t").provisioning.delay_s
        assert (replayed.min, replayed.max) == (58, 78)
        # A delay given wins; without the Events, the simulator's.
        assert main([*args, "--kube-host", server.url, "--provisioning-delay-s", "5"]) == 0
        assert parse_workload(yaml.safe_load(trace.read_text()), "t").provisioning.delay_s.max == 5
        assert main([*args, "--kube-host", server.url, "--no-kubernetes-events"]) == 0
        assert "delay_s" not in trace.read_text()


def test_record_goes_on_without_the_launches_when_kubernetes_cannot_give_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from tpu_autoscaler.adapters.kube.api import Unavailable
    from tpu_autoscaler.cli import live

    class Down:
        def list_events(self, namespace: str, field_selector: str | None = None) -> Any:
            raise Unavailable("events: 503 Service Unavailable")

    trace = tmp_path / "t.yaml"
    args = ["record", "--from-history", str(FIXTURE), "--cluster", str(V6E), "-o", str(trace)]
    live_args = [*args[:1], "--gcs-address", "gcs:6379", *args[3:], "--cluster-name", "c"]
    source = History.model_validate_json(FIXTURE.read_text())
    from tpu_autoscaler.adapters.ray import history as ray_history

    monkeypatch.setattr(ray_history, "read_history", lambda *_, **__: source)
    for kubernetes, said in [
        (Down(), "warning: no slice launches read from Kubernetes: events: 503"),
        (None, "warning: no slice launches read: the delay is not measured"),
    ]:
        monkeypatch.setattr(live, "_kubernetes", lambda _host, k=kubernetes: k)
        assert main(live_args) == 0
        assert said in capsys.readouterr().err
        assert "delay_s" not in trace.read_text()
