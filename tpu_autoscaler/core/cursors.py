"""The cursors of the scratch capacity (`placement.World`): per selector the hosts
that match it, per bundle kind a cursor past the prefix of them that is full for it
(free capacity only shrinks during a pass, so placement is linear in hosts per bundle
kind), and the journal that undoes a gang being tried exactly."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping
from dataclasses import dataclass, field

from tpu_autoscaler.core import labels
from tpu_autoscaler.core.demand import Bundle, LabelSelector, selector_matches
from tpu_autoscaler.core.slots import MIXED, SlotHost, SlotReplica


@dataclass(slots=True)
class Candidates:
    """Hosts matching one bundle kind's selector, and the cursor past those that are full."""

    positions: list[int] = field(default_factory=list)
    scanned_upto: int = 0
    cursor: int = 0


@dataclass(slots=True)
class LabelIndex:
    """The positions of the hosts by their value of one label, ascending."""

    by_value: dict[str, list[int]] = field(default_factory=dict)
    scanned_upto: int = 0


class Matches:
    """Per selector, the positions of the hosts that match it, scanned once as hosts
    are added; per bundle kind, that list with a cursor of its own. Once a second
    selector `key in values` asks for the same key (each slice's gang names its own
    slice), the hosts are indexed by that label's value instead of scanned again."""

    def __init__(self) -> None:
        self._by_key: dict[object, Candidates] = {}
        self._label_indexes: dict[str, LabelIndex] = {}
        self._selectors_of_label: dict[str, int] = {}
        """Selectors `key in values` met so far, per key: index a key asked twice."""

    def of_selector(self, selector: LabelSelector, hosts: list[SlotHost]) -> Candidates:
        cands = self._by_key.get(selector)
        if cands is None:
            cands = Candidates()
            self._by_key[selector] = cands
        if cands.scanned_upto < len(hosts):
            added = hosts[cands.scanned_upto :]
            if not selector:
                cands.positions.extend([host.position for host in added])
            elif len(selector) == 1 and selector[0].operator == "in":
                key, values = selector[0].key, selector[0].values
                if cands.scanned_upto == 0:
                    asked = self._selectors_of_label[key] = self._selectors_of_label.get(key, 0) + 1
                else:
                    asked = self._selectors_of_label.get(key, 0)
                if asked > 1 or key == labels.RAY_TPU_SLICE_NAME:
                    # Each slice's gang names its own slice: a slice name is asked
                    # again and again, so index it at once (one scan of every host
                    # per pass, not two: a sixth of a plan at 1,024 slices).
                    cands.positions.extend(self._indexed(key, values, cands.scanned_upto, hosts))
                else:
                    # One `key in values` term, `LabelConstraint.matches` inlined (a
                    # host without the key has None, in no set of names).
                    cands.positions.extend(
                        [host.position for host in added if host.labels.get(key) in values]
                    )
            elif len(selector) == 1:
                matches = selector[0].matches
                cands.positions.extend([host.position for host in added if matches(host.labels)])
            else:
                cands.positions.extend(
                    [host.position for host in added if selector_matches(selector, host.labels)]
                )
            cands.scanned_upto = len(hosts)
        return cands

    def _indexed(
        self, key: str, values: frozenset[str], start: int, hosts: list[SlotHost]
    ) -> list[int]:
        """Positions from `start` on of the hosts whose label `key` is in `values`."""
        index = self._label_indexes.get(key)
        if index is None:
            index = self._label_indexes[key] = LabelIndex()
        if index.scanned_upto < len(hosts):
            by_value = index.by_value
            i, end = index.scanned_upto, len(hosts)
            while i < end:
                host = hosts[i]
                replica_hosts = host.replica.hosts
                count = len(replica_hosts)
                if (
                    count > 1
                    and replica_hosts[0] is host
                    and i + count <= end
                    and replica_hosts[-1] is hosts[i + count - 1]
                ):
                    # A whole slice at once: its hosts lie together in world order.
                    # `shared_label`'s kept answer looked up here (a call per slice
                    # per pass cost as much as the hosts' labels).
                    memo = host.replica.label_memo
                    known = memo.get(key) if memo is not None else None
                    shared = (
                        known[2]
                        if known is not None and known[0] is replica_hosts and known[1] == count
                        else host.replica.shared_label(key)
                    )
                    if shared is not MIXED:
                        if isinstance(shared, str):
                            positions = by_value.get(shared)
                            if positions is None:
                                positions = by_value[shared] = []
                            positions += range(host.position, host.position + count)
                        i += count
                        continue
                value = host.labels.get(key)
                if value is not None:
                    positions = by_value.get(value)
                    if positions is None:
                        by_value[value] = [host.position]
                    else:
                        positions.append(host.position)
                i += 1
            index.scanned_upto = end
        found: list[int] = []
        for value in values:
            positions = index.by_value.get(value)
            if positions:
                found += positions[bisect_left(positions, start) :] if start else positions
        if len(values) > 1:
            found.sort()  # each host has one value: a merge of ascending lists
        return found

    def of_bundle(self, bundle: Bundle, hosts: list[SlotHost]) -> Candidates:
        key = bundle.key
        cands = self._by_key.get(key)
        base = self.of_selector(bundle.selector, hosts)
        if cands is None:
            cands = Candidates(positions=base.positions, scanned_upto=base.scanned_upto)
            self._by_key[key] = cands
        else:
            cands.positions = base.positions
            cands.scanned_upto = base.scanned_upto
        return cands

    def forget_from(self, first_position: int, dropped: list[SlotHost]) -> None:
        """Hosts from `first_position` on were dropped (`dropped`)."""
        for key, index in self._label_indexes.items():
            if index.scanned_upto > first_position:
                for host in dropped[: index.scanned_upto - first_position]:
                    value = host.labels.get(key)
                    positions = index.by_value.get(value) if value is not None else None
                    while positions and positions[-1] >= first_position:
                        positions.pop()
                index.scanned_upto = first_position
        for cands in self._by_key.values():
            if cands.scanned_upto > first_position:
                while cands.positions and cands.positions[-1] >= first_position:
                    cands.positions.pop()
                cands.scanned_upto = first_position
                cands.cursor = min(cands.cursor, len(cands.positions))


class Journal:
    """What a gang being tried changed: resources taken, cursors moved, slices
    claimed; undone exactly if the gang does not fit."""

    __slots__ = ("claims", "cursors", "taken")

    def __init__(self) -> None:
        self.taken: list[tuple[SlotHost, Mapping[str, float], bool, frozenset[str]]] = []
        self.cursors: dict[int, tuple[Candidates, int]] = {}
        self.claims: list[SlotReplica] = []

    def undo(self, hosts: int) -> int:
        """Restore everything; the position of the first host touched (`hosts` if
        none). Cursors go back to before that host (hosts full before stay skipped)."""
        earliest = hosts
        while self.taken:
            host, free, used, asked = self.taken.pop()
            host.free = dict(free)
            host.replica.used = used
            host.asked = asked
            earliest = min(earliest, host.position)
        while self.claims:
            self.claims.pop().claimed = False
        for cands, first in self.cursors.values():
            cands.cursor = max(first, min(cands.cursor, bisect_left(cands.positions, earliest)))
        return earliest
