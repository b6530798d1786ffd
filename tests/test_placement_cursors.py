"""The scratch capacity's cursors (`placement.World`): a bundle kind's cursor moves
past hosts that are full for it, never past a host that still has room, so demand
placed later still finds that room."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tpu_autoscaler.core.demand import Bundle, GangDemand, GangStrategy, selector_from_mapping
from tpu_autoscaler.core.placement import World
from tpu_autoscaler.core.slots import KeptReplica, SlotReplica

ONE_CPU = Bundle({"CPU": 1.0})


def two_hosts(cpus_each: float) -> World:
    world = World()
    host = ({}, {"CPU": cpus_each}, {"CPU": cpus_each})
    world.add_replica(SlotReplica("cpu", "cpu-0", False, None), [host, host])
    return world


def free_cpus(world: World) -> list[float]:
    return [host.free["CPU"] for host in world.hosts]


def test_a_host_a_strict_spread_gang_skipped_keeps_its_room_for_later_demand() -> None:
    world = two_hosts(2.0)
    gang = GangDemand("spread", (ONE_CPU, ONE_CPU), GangStrategy.STRICT_SPREAD)

    assert world.place_gang(gang)
    # The gang's second bundle passed host 0 (already used by the gang), which has room.
    assert free_cpus(world) == [1.0, 1.0]
    assert world.place_count(ONE_CPU, 2) == 0
    assert free_cpus(world) == [0.0, 0.0]


@pytest.mark.parametrize(
    "bundle",
    [ONE_CPU, Bundle({"CPU": 1.0, "memory": 1.0})],
    ids=["one resource", "two resources"],
)
def test_a_skipped_host_with_room_before_a_full_one_keeps_its_room(bundle: Bundle) -> None:
    """The second bundle skips host 0 (the gang's own), passes full host 1, takes host
    2: the cursor stays before host 0, whose room later demand still finds."""
    world = World()
    room, full = {"CPU": 2.0, "memory": 2.0}, {"CPU": 0.0, "memory": 0.0}
    world.add_replica(
        SlotReplica("cpu", "cpu-0", False, None),
        [({}, room, room), ({}, room, full), ({}, room, room)],
    )
    gang = GangDemand("spread", (bundle, bundle), GangStrategy.STRICT_SPREAD)

    assert world.place_gang(gang)
    assert free_cpus(world) == [1.0, 0.0, 1.0]
    assert world.place_count(bundle, 2) == 0
    assert free_cpus(world) == [0.0, 0.0, 0.0]


def test_copies_fill_hosts_in_order_and_later_copies_find_what_is_left() -> None:
    world = two_hosts(3.0)

    assert world.place_count(ONE_CPU, 2) == 0
    assert free_cpus(world) == [1.0, 3.0]
    assert world.place_count(ONE_CPU, 3) == 0
    assert free_cpus(world) == [0.0, 1.0]
    assert world.first_fit(ONE_CPU) is world.hosts[1]
    assert world.place_count(ONE_CPU, 2) == 1


def test_a_gang_that_does_not_fit_leaves_every_cursor_and_host_as_it_was() -> None:
    world = two_hosts(1.0)
    too_big = GangDemand("pack", (ONE_CPU, ONE_CPU, ONE_CPU), GangStrategy.SPREAD)

    assert not world.place_gang(too_big)
    assert free_cpus(world) == [1.0, 1.0]
    assert world.place_count(ONE_CPU, 2) == 0


def slices(count: int) -> World:
    """`count` v6e-16 slices of four hosts, the head resource on each slice's host 0."""
    world = World()
    for index in range(count):
        head = {"TPU": 4.0, "TPU-v6e-16-head": 1.0}
        hosts = [({}, head, head)] + [({}, {"TPU": 4.0}, {"TPU": 4.0})] * 3
        world.add_replica(SlotReplica("tpu", f"tpu-{index}", False, None), hosts)
    return world


def test_a_slice_head_claims_its_whole_slice_and_the_next_head_the_next_slice() -> None:
    world = slices(2)
    head = GangDemand("head", (Bundle({"TPU-v6e-16-head": 1.0}),), GangStrategy.PACK)

    assert world.place_gang(head)
    first, second = world.replicas
    assert [h.free["TPU"] for h in first.hosts] == [0.0] * 4
    assert all("TPU" in h.asked for h in first.hosts)
    assert first.claimed and first.used and not second.claimed
    assert world.place_gang(GangDemand("head2", head.bundles, GangStrategy.PACK))
    assert second.claimed
    assert not world.place_gang(GangDemand("head3", head.bundles, GangStrategy.PACK))


def test_hosts_a_trial_added_leave_the_label_index_with_it() -> None:
    """The second selector on a label indexes the hosts by its value (`Matches`); the
    hosts of a trial that lost leave that index, so hosts added later at their
    positions match by their own labels."""

    def pinned(slice_name: str) -> Bundle:
        return Bundle({"CPU": 1.0}, selector_from_mapping({"slice": slice_name}))

    def replica(world: World, slice_name: str) -> None:
        host = ({"slice": slice_name}, {"CPU": 1.0}, {"CPU": 1.0})
        world.add_replica(SlotReplica("cpu", f"cpu-{slice_name}", False, slice_name), [host])

    world = World()
    replica(world, "a")
    replica(world, "b")
    assert world.first_fit(pinned("a")) is world.hosts[0]  # scanned
    assert world.first_fit(pinned("b")) is world.hosts[1]  # indexed
    mark = world.fork()
    replica(world, "c")
    assert world.first_fit(pinned("c")) is world.hosts[2]
    world.revert(mark)
    replica(world, "d")
    assert world.first_fit(pinned("c")) is None
    assert world.first_fit(pinned("d")) is world.hosts[2]
    assert world.first_fit(pinned("a")) is world.hosts[0]


def test_a_kept_replica_comes_back_as_offered_and_one_world_holds_it_at_a_time() -> None:
    """A replica's scratch pieces kept between passes (`World.add_kept`): what a world
    placed on them is gone when the next world takes them, at that world's positions;
    while a world holds them, no other world (nor it again) takes them."""
    host = ({}, {"CPU": 2.0}, {"CPU": 2.0})
    kept = KeptReplica(SlotReplica("cpu", "cpu-0", False, None), [host, host])
    first = World()
    assert first.add_kept(kept)
    assert first.place_count(ONE_CPU, 3) == 0
    assert free_cpus(first) == [0.0, 1.0]
    assert not World().add_kept(kept)
    assert not first.add_kept(kept)
    first.release()

    second = World()
    second.add_replica(SlotReplica("cpu", "cpu-1", False, None), [host])
    assert second.add_kept(kept)
    assert free_cpus(second) == [2.0, 2.0, 2.0]
    assert [h.position for h in second.hosts] == [0, 1, 2]
    assert [h.asked for h in second.hosts[1:]] == [frozenset(), frozenset()]
    assert not kept.replica.used
    assert second.place_count(ONE_CPU, 6) == 0


def test_heads_placed_in_one_call_take_the_slices_each_head_placed_alone_takes() -> None:
    """`place_heads` is `place_gang` of each head in turn, stopping at the first that
    does not fit: a busy slice is passed, each head claims the next whole slice."""
    head = Bundle({"TPU-v6e-16-head": 1.0})
    one_by_one, at_once = slices(4), slices(4)
    for world in (one_by_one, at_once):
        assert world.place_count(Bundle({"TPU": 1.0}), 1) == 0  # slice 0 busy

    alone = [
        one_by_one.place_gang(GangDemand(f"h{i}", (head,), GangStrategy.PACK)) for i in range(5)
    ]
    assert alone == [True, True, True, False, False]
    assert at_once.place_heads(head, 5) == 3
    for world in (one_by_one, at_once):
        assert [r.claimed for r in world.replicas] == [False, True, True, True]
        assert [h.free["TPU"] for h in world.hosts] == [3.0] + [4.0] * 3 + [0.0] * 12
    assert at_once.place_heads(head, 1) == 0


def test_a_label_index_steps_a_slice_at_once_only_through_hosts_that_share_the_value() -> None:
    """Indexing by a label (`Matches`, a second selector on it) steps through a slice
    whose hosts share the value at once (`SlotReplica.shared_label`), host by host
    through one whose hosts differ; a replica's remembered value goes with the hosts
    it was worked out from."""

    def on(slice_name: str) -> Bundle:
        return Bundle({"CPU": 1.0}, selector_from_mapping({"slice": slice_name}))

    def host(slice_name: str) -> tuple[dict[str, str], dict[str, float], dict[str, float]]:
        return ({"slice": slice_name}, {"CPU": 1.0}, {"CPU": 1.0})

    mixed = SlotReplica("cpu", "mixed", False, None)
    grown = SlotReplica("cpu", "grown", False, None)
    world = World()
    world.add_replica(SlotReplica("cpu", "whole", False, None), [host("a"), host("a")])
    world.add_replica(mixed, [host("b"), host("a"), host("b")])
    world.add_replica(grown, [host("c"), host("c")])
    assert world.first_fit(on("c")) is world.hosts[5]  # scanned
    assert world.place_count(on("a"), 3) == 0  # indexed
    assert [h.free["CPU"] for h in world.hosts[:5]] == [0.0, 0.0, 1.0, 0.0, 1.0]
    assert world.place_count(on("b"), 2) == 0
    assert grown.shared_label("slice") == "c"

    world.release()
    again = World()
    again.add_replica(grown, [host("d"), host("d")])
    again.add_replica(grown, [host("d")])
    assert again.first_fit(on("c")) is None  # scanned
    assert again.place_count(on("d"), 3) == 0  # indexed: the value worked out anew
    assert [h.free["CPU"] for h in again.hosts] == [0.0, 0.0, 0.0]


HEAD = Bundle({"TPU-v6e-16-head": 1.0})


def kept_slice(name: str) -> KeptReplica:
    """A v6e-16 slice's kept scratch pieces, the head resource on host 0."""
    head = {"TPU": 4.0, "TPU-v6e-16-head": 1.0}
    hosts = [({}, head, head)] + [({}, {"TPU": 4.0}, {"TPU": 4.0})] * 3
    return KeptReplica(SlotReplica("tpu", name, False, None), list(hosts))


def test_a_kept_slice_a_head_claimed_is_passed_once_something_is_placed_on_it() -> None:
    """A kept slice a head claimed in one world comes back unclaimed in the next
    (`World.add_kept`); a task placed on it there first has the next heads pass it
    for the next whole slice."""
    first, second = kept_slice("tpu-0"), kept_slice("tpu-1")
    world = World()
    assert world.add_kept(first) and world.add_kept(second)
    assert world.place_heads(HEAD, 1) == 1
    world.release()

    again = World()
    assert again.add_kept(first) and again.add_kept(second)
    assert again.place_count(Bundle({"TPU": 1.0}), 1) == 0  # on slice 0's host 0
    assert again.place_heads(HEAD, 2) == 1
    assert [r.claimed for r in again.replicas] == [False, True]


_SLICE_KINDS = ("free", "busy", "busy-last-host", "cpu", "other-head")


def _slice_hosts(kind: str) -> list[tuple[dict[str, str], dict[str, float], dict[str, float]]]:
    """A 4-host slice as offered: TPUs free, some taken (on host 0 or the last host
    only), no TPUs at all, or another shape's head resource."""
    head_name = "TPU-v5p-16-head" if kind == "other-head" else "TPU-v6e-16-head"
    head = {"TPU": 4.0, head_name: 1.0}
    hosts = [({}, head, dict(head))] + [({}, {"TPU": 4.0}, {"TPU": 4.0}) for _ in range(3)]
    if kind == "busy":
        hosts[0] = ({}, head, {**head, "TPU": 1.0})
    elif kind == "busy-last-host":
        hosts[3] = ({}, {"TPU": 4.0}, {"TPU": 0.0})
    elif kind == "cpu":
        hosts = [({}, {"CPU": 8.0}, {"CPU": 8.0})] * 4
    return hosts


@settings(max_examples=200, deadline=None)
@given(
    kinds=st.lists(st.sampled_from(_SLICE_KINDS), max_size=8),
    kept=st.lists(st.booleans(), min_size=8, max_size=8),
    trial=st.lists(st.sampled_from(_SLICE_KINDS), max_size=3),
    busy_first=st.integers(0, 3),
    heads=st.integers(0, 10),
)
def test_heads_placed_at_once_take_what_heads_placed_one_by_one_take(
    kinds: list[str], kept: list[bool], trial: list[str], busy_first: int, heads: int
) -> None:
    """`place_heads` looks only at slices whose TPUs were all free when added
    (`World._untouched`), `place_gang` of a head at every slice: both take the same
    slices, in worlds of kept and added slices, busy or not as offered or made busy
    since, after a trial's slices came and went, and with kept slices a head claimed
    in an earlier world."""

    def build(earlier_heads: int) -> World:
        pieces = [
            KeptReplica(SlotReplica("tpu", f"tpu-{i}", False, None), _slice_hosts(kind))
            if keep
            else None
            for i, (kind, keep) in enumerate(zip(kinds, kept, strict=False))
        ]
        if earlier_heads:  # the kept pieces come back from a world that claimed some
            earlier = World()
            for piece in pieces:
                if piece is not None:
                    earlier.add_kept(piece)
            earlier.place_heads(HEAD, earlier_heads)
            earlier.release()
        world = World()
        for i, (kind, piece) in enumerate(zip(kinds, pieces, strict=True)):
            if piece is None:
                world.add_replica(SlotReplica("tpu", f"tpu-{i}", False, None), _slice_hosts(kind))
            else:
                assert world.add_kept(piece)
        mark = world.fork()
        for i, kind in enumerate(trial):
            world.add_replica(SlotReplica("tpu", f"trial-{i}", True, None), _slice_hosts(kind))
        world.place_count(Bundle({"TPU": 1.0}), busy_first)  # on a trial's slice too
        world.revert(mark)
        world.place_count(Bundle({"TPU": 2.0}), busy_first)
        return world

    for earlier_heads in (0, 2):
        one_by_one, at_once = build(earlier_heads), build(earlier_heads)
        alone = [
            one_by_one.place_gang(GangDemand(f"h{i}", (HEAD,), GangStrategy.PACK))
            for i in range(heads)
        ]
        assert at_once.place_heads(HEAD, heads) == sum(alone)
        assert [r.claimed for r in at_once.replicas] == [r.claimed for r in one_by_one.replicas]
        assert [h.free for h in at_once.hosts] == [h.free for h in one_by_one.hosts]
        # A later head of the same kind resumes where each stopped.
        later = GangDemand("later", (HEAD,), GangStrategy.PACK)
        assert at_once.place_gang(later) == one_by_one.place_gang(later)
        assert [r.claimed for r in at_once.replicas] == [r.claimed for r in one_by_one.replicas]
