"""What became of each demand item: bundles placed, and what could not be served,
deferred once (a later item may launch a replica it can share) and then reported as
waiting (a limit stands in the way: maxReplicas, backoff, the upscaling mode) or
infeasible (no group can ever hold it), with every group's reason."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple, TypeVar

from tpu_autoscaler.core.demand import (
    Bundle,
    ClusterConstraint,
    DemandRef,
    GangDemand,
    ResourceDemand,
    pinned_slice,
)
from tpu_autoscaler.core.plan import GroupReason, GroupVerdict, Unmet

T = TypeVar("T")


def skipped(group: str, message: str) -> GroupReason:
    return GroupReason(group, GroupVerdict.SKIPPED, message)


def rejected(group: str, message: str) -> GroupReason:
    return GroupReason(group, GroupVerdict.REJECTED, message)


def busy(group: str, message: str) -> GroupReason:
    return GroupReason(group, GroupVerdict.BUSY, message)


class Reasons(NamedTuple):
    """Why no group launched for an item: groups `blocked` by a limit now (skipped) or
    holding it once their work ends (busy), groups that `never` can (rejected). (Named
    tuples, not dataclasses: a pass makes one per unserved gang.)"""

    blocked: tuple[GroupReason, ...] = ()
    never: tuple[GroupReason, ...] = ()

    def text(self) -> tuple[str, str]:
        """Both lists as people read them: what tells alike items apart."""
        return "; ".join(r.message for r in self.blocked), "; ".join(r.message for r in self.never)


class Deferred(NamedTuple):
    item: ResourceDemand
    reasons: Reasons


class DeferredGangs(NamedTuple):
    """Gangs of one kind deferred for the same reasons, in the order they were served
    (a run a pass defers at once: kept whole, not gang by gang)."""

    gangs: Sequence[GangDemand]
    reasons: Reasons


class Outcome:
    def __init__(self) -> None:
        self.infeasible: list[Unmet] = []
        self.waiting: list[Unmet] = []
        self.bundles_placed = 0
        self.bundles_unmet = 0
        self.deferred: list[Deferred] = []
        """Tasks and actors deferred."""
        self.deferred_gangs: list[DeferredGangs] = []

    def placed(self, bundles: int) -> None:
        self.bundles_placed += bundles

    def unmet(self, item: object, reasons: Reasons, bundles: int) -> None:
        """Defer a task, actor or gang that got no capacity (it is served once more
        before it is reported); report anything else now."""
        if isinstance(item, ResourceDemand):
            self.deferred.append(Deferred(item, reasons))
        elif isinstance(item, GangDemand):
            self.deferred_gangs.append(DeferredGangs((item,), reasons))
        else:
            self.report(item, reasons, bundles)

    def defer_gangs(self, gangs: Sequence[GangDemand], reasons: Reasons) -> None:
        """`unmet` for each of `gangs`, gangs of one kind unmet for the same reasons."""
        if gangs:
            self.deferred_gangs.append(DeferredGangs(gangs, reasons))

    def take_deferred(self) -> list[Deferred]:
        """The tasks and actors deferred (`take_deferred_gangs`: the gangs)."""
        taken, self.deferred = self.deferred, []
        return taken

    def take_deferred_gangs(self) -> list[DeferredGangs]:
        taken, self.deferred_gangs = self.deferred_gangs, []
        return taken

    def deferred_count(self) -> int:
        """Tasks, actors (each request once) and gangs deferred."""
        return len(self.deferred) + sum([len(d.gangs) for d in self.deferred_gangs])

    def report(
        self,
        demand: object,
        reasons: Reasons,
        bundles: int,
        refs: tuple[DemandRef, ...] = (),
        note: str = "",
    ) -> None:
        """Report `demand` unmet; `note` (what is special about it) ends its reason."""
        self.bundles_unmet += bundles
        refs = refs or refs_of(demand)
        tail = f" ({note})" if note else ""
        if reasons.blocked:
            groups = tuple(dedupe(reasons.blocked + reasons.never))
            blocked = dedupe([r.message for r in reasons.blocked])
            self.waiting.append(Unmet(str(demand), "; ".join(blocked) + tail, refs, groups))
        else:
            groups = tuple(dedupe(reasons.never))
            reason = "; ".join(dedupe([r.message for r in groups])) or "no worker group"
            copies = bundles if isinstance(demand, ResourceDemand) else 1
            self.infeasible.append(
                Unmet(
                    str(demand), f"no group can ever serve it: {reason}{tail}", refs, groups, copies
                )
            )

    def report_deferred(
        self, kind_of: Callable[[GangDemand], int], kind_text: Callable[[GangDemand], str]
    ) -> None:
        """Report what is still deferred; gangs of one kind that failed for one reason
        as one line."""
        for deferred in self.take_deferred():
            self.report(deferred.item, deferred.reasons, deferred.item.count)
        alike: dict[tuple[int, str, str], tuple[Reasons, list[GangDemand]]] = {}
        """Gangs by kind and reasons' text; the reasons of the first of them."""
        texts: dict[int, tuple[str, str]] = {}
        """Each `Reasons`' text by identity: gangs deferred alike share one."""
        for run in self.take_deferred_gangs():
            reasons = run.reasons
            text = texts.get(id(reasons))
            if text is None:
                text = texts[id(reasons)] = reasons.text()
            key = (kind_of(run.gangs[0]), *text)  # a run is of one kind
            same = alike.get(key)
            if same is None:
                alike[key] = (reasons, list(run.gangs))
            else:
                same[1].extend(run.gangs)
        for reasons, gangs in alike.values():
            size = sum([len(g.bundles) for g in gangs])
            if len(gangs) == 1:
                self.report(gangs[0], reasons, size)
                continue
            examples = ", ".join(g.gang_id for g in gangs[:3])
            what = f"{len(gangs)} placement groups ({kind_text(gangs[0])}), e.g. {examples}"
            refs = tuple([g.source for g in gangs if g.source is not None])  # `refs_of`
            self.report(what, reasons, size, refs)

    def pinned_to_missing_slice(
        self, bundle: Bundle, what: object, bundles: int, slice_names: set[str]
    ) -> bool:
        """`bundle` names slices none of which exists: infeasible, reported now."""
        names = pinned_slice(bundle.selector)
        if names is None or names & slice_names:
            return False
        self.bundles_unmet += bundles
        self.infeasible.append(
            Unmet(
                str(what),
                f"names slice {', '.join(sorted(names))}, which does not exist; "
                "no other slice can serve it",
                refs_of(what),
            )
        )
        return True


def dedupe(items: Sequence[T]) -> list[T]:
    return list(dict.fromkeys(items))


def refs_of(item: object) -> tuple[DemandRef, ...]:
    """The request of Ray's report a demand item stands for, if it came from one."""
    if (
        isinstance(item, ResourceDemand | GangDemand | ClusterConstraint)
        and item.source is not None
    ):
        return (item.source,)
    return ()
