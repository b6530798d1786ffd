"""When work runs on the simulated Ray: the nodes' resources, the queue of pending
work, the rounds that place it (where: `sim/ray_placement.py`), runs that end, and work
retried when its node dies.

- **Rounds**: work is placed when it is submitted and whenever resources free up, in
  queue order. A round tries only the work that could place now; the outcome is a
  full round's.
- **Idleness as the raylet counts it** (`local_resource_manager.cc`): a node is idle
  when every resource is fully free; the idle time runs from the last release. A
  placement-group bundle takes its resources from the node when it is prepared
  (`PlacementGroupResourceManager::PrepareBundle` allocates them like a task), so a
  node whose resources a bundle holds is busy even with nothing running in the
  bundle, and turns idle only when the group is removed.

Not modelled: a task that finds no available node waits in one cluster-wide queue
and is placed again when resources free up (Ray queues it at the chosen feasible
node, which later places it with its own view); object store usage and busy workers
without resources (actors that hold no CPU once running), which keep a real raylet
busy."""

from __future__ import annotations

import bisect
import heapq
import itertools
import random
from collections.abc import Callable, Iterable, Iterator, Mapping

from tpu_autoscaler.core.demand import RESOURCE_EPSILON
from tpu_autoscaler.sim.ray_model import Bundle, Node, NodeLedger, Work, fitting
from tpu_autoscaler.sim.ray_placement import place, place_group

Label = tuple[str, str]


class _KindQueue:
    """The pending work of one kind under one label (or under none): a heap of (place,
    work), its entries for work since placed, dropped or queued again left until
    they come to the top (or outnumber the `live` ones, how many are still queued)."""

    __slots__ = ("heap", "live")

    def __init__(self) -> None:
        self.heap: list[tuple[int, Work]] = []
        self.live = 0


class RayScheduler:
    """The head and worker nodes with their free resources, and the work on them."""

    def __init__(
        self,
        now: Callable[[], float],
        schedule_after: Callable[[float, Callable[[], None]], None],
        rng: random.Random,
    ) -> None:
        self.now = now
        self.schedule_after = schedule_after
        self.random = rng
        self.head: Node | None = None
        """The head node: the driver's, never a worker, not in `nodes`."""
        self.nodes: dict[str, Node] = {}
        """Worker nodes by pod name."""
        self.pending: list[Work] = []
        self.running: dict[str, Work] = {}
        self.finished: list[Work] = []
        # What changed since the last round: after a round no pending work fits, so
        # only new work and work that could use a node that gained room can place.
        self._grown: dict[str, Node] | None = {}
        """Nodes that gained room (None: assume any did, scan everything)."""
        self._fresh: set[int] = set()
        """`id()` of work queued since the last round."""
        self._tracked_nodes = 0
        """`len(nodes)` as this class last left it: a node added by hand (tests) is
        noticed and everything is scanned again."""
        self._placements = itertools.count()
        self._placed: dict[str, int] = {}
        """Each running work's placement number (by work id): running's order."""
        self._on_pod: dict[str, list[tuple[int, Work]]] = {}
        """Per pod, the works placed on it, by placement number: some since gone or
        moved (`remove_node` checks each against `running`). A walk of all running
        work per node removed was a large cluster's scale-down."""
        self._by_label: dict[tuple[str, str], dict[str, Node]] = {}
        """The worker nodes under each of their labels, in `nodes`' order (some since
        gone, or replaced by hand: `_narrowed` checks each against `nodes`). A walk of
        every node per placement group tried was most of a large cluster's rounds."""
        # The pending work indexed by the nodes it could use, and by kind, so that a
        # round after a node gained room looks only at the work that could use it,
        # and of each kind only until one fails, not at the whole queue (a thousand
        # waiting slice heads, per raylet started).
        self._queued: dict[int, tuple[int, Work, list[tuple[Label | None, _KindQueue]]]] = {}
        """Pending work by `id()`, with its place in `pending` (a number that orders
        it) and the queues it is in."""
        self._queued_under: dict[Label, dict[object, _KindQueue]] = {}
        """Pending work under a label one of its bundles requires exactly (only a node
        with that label can hold that bundle), by kind."""
        self._queued_anywhere: dict[object, _KindQueue] = {}
        """Pending work with a bundle that requires no label exactly, by kind."""
        self._queue_ends = [0, 0]
        """The place numbers last given at the front and at the back of `pending`."""
        self._queue_as_indexed: tuple[list[Work], int] = (self.pending, 0)
        """`pending` and its length as indexed: anything else means a change by hand
        (tests), and the index is made again."""
        self._ledgers: list[NodeLedger] = []
        """One per reader that `watch`es the worker nodes, shared with every node."""
        self._place_of: dict[str, int] = {}
        """Each indexed worker node's place in `nodes`' order (which `_by_label`
        keeps), by pod."""
        self._places = itertools.count()
        self._room: dict[str, dict[str, Node]] = {}
        """Per resource, the worker nodes that had some of it free when last looked at
        (some since gone, replaced or taken: `_narrowed` tests each), by pod: every
        node with some free is in it once `_room_changes` is followed. A slice head's
        resource is free on a few nodes of a thousand under its label."""
        self._room_keys: dict[str, tuple[str, ...]] = {}
        """The resources each pod's node is held under in `_room`."""
        self._room_changes = self.watch()

    # --- nodes ---------------------------------------------------------------------

    def watch(self) -> NodeLedger:
        """A ledger of the pods whose worker node comes, goes or is written
        (`Node.changed`) from now on, for a reader that follows the nodes rather than
        walk them all: it empties the ledger as it reads it. Nodes added or replaced by
        hand, bypassing `add_node` (tests), are not in it; the reader checks how many
        nodes there are."""
        ledger: NodeLedger = {}
        self._ledgers.append(ledger)
        for node in self.live_nodes():
            node.ledgers = self._ledgers
        return ledger

    def _came_or_went(self, pod: str) -> None:
        for ledger in self._ledgers:
            ledger[pod] = True

    def add_head(self, head: Node) -> None:
        self.head = head
        head.ledgers = self._ledgers
        self._grew(head)
        self._round()

    def add_node(self, node: Node) -> None:
        self._check_tracked()
        node.ledgers = self._ledgers
        self._came_or_went(node.pod)
        if node.pod in self.nodes:  # keeps its place in `nodes`: the index follows
            self.nodes[node.pod] = node
            self._index_all()
        else:
            self.nodes[node.pod] = node
            self._index(node)
        self._tracked_nodes = len(self.nodes)
        self._grew(node)
        self._round()

    def remove_node(self, pod: str) -> tuple[Node | None, list[Work]]:
        """The node's raylet is gone; work on it is retried, as Ray retries tasks and
        reschedules placement groups. Returns the node and the work that was running
        there."""
        self._check_tracked()
        self._check_queue()
        node = self.nodes.pop(pod, None)
        self._tracked_nodes = len(self.nodes)
        if node is None:
            return None, []
        self._came_or_went(pod)
        self._place_of.pop(pod, None)
        for label in node.labels.items():
            self._by_label.get(label, {}).pop(pod, None)
        # The running work placed on the pod, in `running`'s order (placement order):
        # those of its entries still running from that very placement.
        hit = [
            work
            for number, work in self._on_pod.pop(pod, ())  # appended in number order
            if self.running.get(work.work_id) is work
            and self._placed.get(work.work_id) == number
            and any(placed_on == pod for placed_on, _ in work.placement)
        ]
        for work in hit:
            self._release(work)
            del self.running[work.work_id]
            work.placed_s = None
            work.placement = []
            self.pending.insert(0, work)
            self._queue(work, front=True)
            self._fresh.add(id(work))
        self._round()
        return node, hit

    def node(self, pod: str) -> Node | None:
        if self.head is not None and pod == self.head.pod:
            return self.head
        return self.nodes.get(pod)

    def live_nodes(self) -> list[Node]:
        head = [self.head] if self.head is not None else []
        return head + list(self.nodes.values())

    # --- work ----------------------------------------------------------------------

    def submit(self, work: Work) -> None:
        self._check_queue()
        self.pending.append(work)
        self._queue(work, front=False)
        self._fresh.add(id(work))
        self._round()

    def remove(self, work: Work) -> None:
        """`remove_placement_group` (or a cancelled task): pending, it is dropped;
        placed, its resources are returned. It does not count as finished."""
        self._drop(work)
        if self.running.get(work.work_id) is work:
            del self.running[work.work_id]
            self._release(work)
            self._round()

    def schedule(self) -> None:
        """A round over all pending work."""
        self._grown = None
        self._round()

    def _round(self) -> None:
        """A round that tries only the work that could place now: what came since the
        last round, and what could use a node that gained room since. Any other work
        did not fit at the end of the last round and nothing it could use has grown,
        so it would not fit now (a failed try draws no randomness and changes nothing):
        the outcome is a full round's."""
        self._check_tracked()
        grown, fresh = self._grown, self._fresh
        self._grown, self._fresh = {}, set()
        if grown is not None and not grown and not fresh:
            return
        indexed = self._check_queue()
        # All of it, or (the index kept) only the work that is new or could use a
        # node that grew, in queue order: the rest would be passed over below.
        walking_all = grown is None or not indexed
        still: list[Work] = []
        placed: list[Work] = []
        placed_ids: set[int] = set()
        # Capacity only shrinks within a round: a kind of work that did not fit once
        # will not fit again until something is released.
        failed: set[object] = set()
        usable: dict[object, bool] = {}
        live: list[Node] | None = None
        taking: list[Node] = []
        narrow = self._narrower()

        def passed_over(kind: object, work: Work) -> bool:
            """Whether the round passes `work` (of `kind`) over untried."""
            if kind in failed:
                return True
            if grown is not None and id(work) not in fresh:
                # Capacity only shrinks within a round, so a kind that could use no
                # grown node earlier in it cannot later either.
                if kind not in usable:
                    usable[kind] = any(work.could_use(n) for n in grown.values() if self._usable(n))
                return not usable[kind]
            return False

        trying: Iterable[Work] = (
            self.pending
            if walking_all
            else self._could_place(grown or {}, fresh, passed_over, placed_ids)
        )
        for work in trying:
            kind = work.kind
            if passed_over(kind, work):
                still.append(work)
                continue
            if work.is_gang:
                # By label from the index; the nodes taking work are listed only
                # when its bundles require no label exactly.
                done = place_group(work, narrow)
            else:
                if live is None:  # nodes neither come nor go, nor start draining, in a round
                    live = self.live_nodes()
                    taking = [n for n in live if not n.draining]
                done = place(work, live, self.head, self.random, taking)
            if done:
                work.placed_s = self.now()
                work.runs += 1
                self.running[work.work_id] = work
                number = next(self._placements)
                self._placed[work.work_id] = number
                for pod in {pod for pod, _ in work.placement}:
                    self._on_pod.setdefault(pod, []).append((number, work))
                placed.append(work)
                placed_ids.add(id(work))
                if work.finishes:
                    self.schedule_after(work.duration_s, self._finisher(work, work.runs))
            else:
                failed.add(kind)
                still.append(work)
        if walking_all:
            self.pending = still
        elif placed:
            self.pending = self._without(placed)
        for work in placed:
            self._unqueue(work)
        self._queue_as_indexed = (self.pending, len(self.pending))
        for work in placed:
            if work.on_placed is not None:
                # `ready()` resolves after the round: what it submits queues behind.
                self.schedule_after(0.0, self._announcer(work))

    # --- the pending work by the nodes it could use -----------------------------------

    def _queue(self, work: Work, front: bool) -> None:
        """`work` just went to the `front` (else the back) of `pending`."""
        ends = self._queue_ends
        if front:
            ends[0] -= 1
        else:
            ends[1] += 1
        place = ends[0] if front else ends[1]
        kind = work.kind
        queues: list[tuple[Label | None, _KindQueue]] = []
        for bundle in work.distinct_bundles:
            required = bundle.required_labels
            label: Label | None = None
            if required:
                label = min(required, key=lambda kv: len(self._by_label.get(kv, ())))
                owner = self._queued_under.setdefault(label, {})
            else:
                owner = self._queued_anywhere
            queue = owner.get(kind)
            if queue is None:
                queue = owner[kind] = _KindQueue()
            if all(queue is not q for _, q in queues):
                heapq.heappush(queue.heap, (place, work))
                queue.live += 1
                queues.append((label, queue))
        self._queued[id(work)] = (place, work, queues)
        self._queue_as_indexed = (self.pending, len(self.pending))

    def _unqueue(self, work: Work) -> None:
        entry = self._queued.pop(id(work), None)
        if entry is None:
            return
        kind = work.kind
        for label, queue in entry[2]:
            queue.live -= 1
            if queue.live:
                if len(queue.heap) > 2 * queue.live + 16:  # mostly entries gone stale
                    queue.heap = [(p, w) for p, w in queue.heap if self._still_queued(p, w)]
                    heapq.heapify(queue.heap)
                continue
            owner = self._queued_anywhere if label is None else self._queued_under.get(label, {})
            if owner.get(kind) is queue:
                del owner[kind]
            if label is not None and not owner:
                self._queued_under.pop(label, None)

    def _still_queued(self, place: int, work: Work) -> bool:
        """Whether a `_KindQueue` entry is current: `work` still queued at `place`."""
        entry = self._queued.get(id(work))
        return entry is not None and entry[1] is work and entry[0] == place

    def _drop(self, work: Work) -> None:
        """`work` leaves `pending` unplaced."""
        self._check_queue()
        self.pending = [w for w in self.pending if w is not work]
        self._unqueue(work)
        self._queue_as_indexed = (self.pending, len(self.pending))

    def _check_queue(self) -> bool:
        """Whether the index holds `pending` as it is, made again if `pending` was
        changed by hand; False if it cannot (the same work queued twice)."""
        listed, length = self._queue_as_indexed
        if listed is self.pending and length == len(self.pending) == len(self._queued):
            return True
        self._queued, self._queued_under, self._queued_anywhere = {}, {}, {}
        self._queue_ends = [0, 0]
        for work in self.pending:
            self._queue(work, front=False)
        return len(self._queued) == len(self.pending)

    def _could_place(
        self,
        grown: dict[str, Node],
        fresh: set[int],
        passed_over: Callable[[object, Work], bool],
        placed: set[int],
    ) -> Iterator[Work]:
        """The pending work that is `fresh` or has a bundle that could match a node
        that `grown` (work requiring labels exactly under a grown node's labels, and
        all work that requires none), in queue order; but of each kind only until the
        round passes one over (`passed_over`: its kind failed, or could use no grown
        node), as it passes over the rest of that kind too (fresh work aside, which
        comes on its own). `placed`: the work the round placed so far, by `id()`."""
        queued = self._queued
        cursors = list(self._queued_anywhere.values())
        chosen = {id(queue) for queue in cursors}
        for node in grown.values():
            for label in node.labels.items():
                for queue in self._queued_under.get(label, {}).values():
                    if id(queue) not in chosen:
                        chosen.add(id(queue))
                        cursors.append(queue)
        new = sorted((queued[key][0], key) for key in fresh if key in queued)
        # The cursors' next places, merged (the fresh work as cursor -1, first on a tie).
        tops = [(new[0][0], -1)] if new else []
        for number, queue in enumerate(cursors):
            place = self._top(queue, placed)
            if place is not None:
                tops.append((place, number))
        heapq.heapify(tops)
        seen: set[int] = set()
        next_new = 0
        while tops:
            _, number = heapq.heappop(tops)
            if number < 0:
                key = new[next_new][1]
                next_new += 1
                if next_new < len(new):
                    heapq.heappush(tops, (new[next_new][0], -1))
                if key not in seen:
                    seen.add(key)
                    yield queued[key][1]
                continue
            queue = cursors[number]
            work = queue.heap[0][1]
            if id(work) in seen or passed_over(work.kind, work):
                continue  # tried and not placed, or passed over: so is the rest of its kind
            seen.add(id(work))
            yield work
            place = self._top(queue, placed)
            if place is not None:
                heapq.heappush(tops, (place, number))

    def _top(self, queue: _KindQueue, placed: set[int]) -> int | None:
        """The place of the first work in `queue` still queued and not placed in this
        round; the entries before it are dropped."""
        heap = queue.heap
        while heap:
            place, work = heap[0]
            if self._still_queued(place, work) and id(work) not in placed:
                return place
            heapq.heappop(heap)
        return None

    def _without(self, placed: list[Work]) -> list[Work]:
        """`pending` without the `placed` work (still queued), found by its place:
        `pending` is in the order of its places while the index holds it (a walk of
        the queue per work placed was a thousand waiting slices per slice placed)."""
        pending = self.pending
        queued = self._queued
        found: list[int] = []
        for work in placed:
            at = bisect.bisect_left(pending, queued[id(work)][0], key=lambda w: queued[id(w)][0])
            if at == len(pending) or pending[at] is not work:  # not in order: walked
                gone = {id(w) for w in placed}
                return [w for w in pending if id(w) not in gone]
            found.append(at)
        kept: list[Work] = []
        start = 0
        for at in sorted(found):
            kept += pending[start:at]
            start = at + 1
        return kept + pending[start:]

    def _check_tracked(self) -> None:
        if len(self.nodes) != self._tracked_nodes:
            self._grown = None
            self._tracked_nodes = len(self.nodes)
            self._index_all()

    # --- the nodes by label ----------------------------------------------------------

    def _index(self, node: Node) -> None:
        self._place_of[node.pod] = next(self._places)
        for label in node.labels.items():
            self._by_label.setdefault(label, {})[node.pod] = node

    def _index_all(self) -> None:
        self._by_label = {}
        self._place_of = {}
        self._room, self._room_keys = {}, {}
        self._room_changes.clear()
        for node in self.nodes.values():
            node.ledgers = self._ledgers  # those added by hand, too, from now on
            self._index(node)
            self._hold_room(node)

    def _follow_room(self) -> None:
        """`_room` moved on to the nodes as they are, from the ledger of those that
        changed since (within a round, those that work took room from)."""
        changes = self._room_changes
        if not changes:
            return
        room = self._room
        for pod in changes:
            for key in self._room_keys.pop(pod, ()):
                del room[key][pod]
            node = self.nodes.get(pod)
            if node is not None:
                self._hold_room(node)
        changes.clear()

    def _hold_room(self, node: Node) -> None:
        keys = tuple(key for key, free in node.available.items() if free > 0)
        for key in keys:
            self._room.setdefault(key, {})[node.pod] = node
        self._room_keys[node.pod] = keys

    def _narrower(self) -> Callable[[list[Bundle], Mapping[str, float]], list[Node]]:
        """`_narrowed` for one round: nodes neither come nor go, nor start draining,
        within it, so the nodes taking work are listed once, if at all."""
        taking: list[Node] | None = None

        def narrowed(bundles: list[Bundle], resources: Mapping[str, float]) -> list[Node]:
            nonlocal taking
            fewest = self._fewest(bundles)
            if fewest is not None:
                return self._narrowed(fewest, resources)
            if taking is None:
                taking = [n for n in self.live_nodes() if not n.draining]
            return fitting(taking, resources)

        return narrowed

    def _fewest(self, bundles: list[Bundle]) -> dict[str, Node] | None:
        """The nodes under the rarest label the `bundles` all require exactly (None:
        they require none exactly)."""
        fewest: dict[str, Node] | None = None
        for bundle in bundles:
            for label in bundle.required_labels or ():
                under = self._by_label.get(label, {})
                if fewest is None or len(under) < len(fewest):
                    fewest = under
        return fewest

    def _narrowed(self, under: dict[str, Node], resources: Mapping[str, float]) -> list[Node]:
        """Of the nodes taking work (the head first), the head and those `under` a
        label, whose free resources hold `resources`, in order: a superset of those
        matching bundles that require the label (`ray_placement.Narrow`). Room is
        tested first, as few nodes have it on a busy cluster; the index may hold
        nodes since gone."""
        nodes = self.nodes
        head = self.head
        near = [head] if head is not None and not head.draining else []
        room = self._with_room(resources)
        if room is not None and len(room) < len(under):
            # Fewer nodes have room for one of the resources than are under the label:
            # those of them under it, in order (`_by_label` keeps `nodes`' order).
            place = self._place_of
            near += sorted(
                (
                    n
                    for n in room.values()
                    if under.get(n.pod) is n and nodes.get(n.pod) is n and not n.draining
                ),
                key=lambda n: place[n.pod],
            )
            return fitting(near, resources)
        near += under.values()
        return [
            n
            for n in fitting(near, resources)
            if n is head or (not n.draining and nodes.get(n.pod) is n)
        ]

    def _with_room(self, resources: Mapping[str, float]) -> dict[str, Node] | None:
        """The fewest worker nodes among those with some of one of `resources` free: a
        node that holds `resources` is among them. None if none is asked for."""
        self._follow_room()
        fewest: dict[str, Node] | None = None
        for key, amount in resources.items():
            if amount > RESOURCE_EPSILON:  # a node holding it has some free
                room = self._room.get(key, {})
                if fewest is None or len(room) < len(fewest):
                    fewest = room
        return fewest

    def _grew(self, node: Node) -> None:
        if self._grown is not None:
            self._grown[node.pod] = node

    def _usable(self, node: Node) -> bool:
        """Still the live node of its pod, taking work."""
        return self.node(node.pod) is node and not node.draining

    def _announcer(self, work: Work) -> Callable[[], None]:
        def announce() -> None:
            if self.running.get(work.work_id) is work and work.on_placed is not None:
                work.on_placed(work)

        return announce

    def _finisher(self, work: Work, run: int) -> Callable[[], None]:
        return lambda: self.finish(work, run)

    def finish(self, work: Work, run: int | None = None) -> None:
        """`work`'s run number `run` ends (None: its current one)."""
        if self.running.get(work.work_id) is not work or run not in (None, work.runs):
            return  # its node died: the retry, placed anew, ends a full duration later
        del self.running[work.work_id]
        self._release(work)
        self.finished.append(work)
        for held in work.holds or []:
            if self.running.get(held.work_id) is held:
                del self.running[held.work_id]
                self._release(held)
                self.finished.append(held)
            else:
                self._drop(held)
        self._round()

    def _release(self, work: Work) -> None:
        for pod, resources in work.placement:
            node = self.node(pod)
            if node is None:
                continue
            self._grew(node)
            for key, value in resources.items():
                node.available[key] = node.available.get(key, 0.0) + value
            if all(
                abs(node.available.get(k, 0.0) - v) < RESOURCE_EPSILON
                for k, v in node.total.items()
            ):
                node.idle_since_s = self.now()
            node.changed()
