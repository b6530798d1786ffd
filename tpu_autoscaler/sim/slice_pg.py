"""`ray.util.tpu.slice_placement_group` as Ray 2.60 runs it (`SlicePlacementGroup.
_reserve_slice`, `reserve_tpu_slice` in `ray/_private/accelerators/tpu.py`), as a small
state machine on the simulated Ray and its event queue.

For a multi-host topology the heads are reserved one slice after another: per slice a
one-bundle placement group `{TPU-<pod type>-head: 1}` selected on `ray.io/tpu-worker-id`
`0` and `ray.io/tpu-pod-type` `<pod type>`, waited for `head_reservation_timeout_s`
(Ray's default 100 s; None waits forever). A head not placed in time is removed and
the call raises TimeoutError, and `SlicePlacementGroup` shuts down what it already
held (the earlier slices' heads). With retries (Ray Train converts the TimeoutError
into a retryable startup error and its controller starts the worker group again,
without limit by default) the whole reservation starts again at once. Once every
head is held, one placement group (SPREAD) of `{CPU: 1, TPU: chips per host}` per
host, or `resources_per_bundle` with `CPU: 1` added, each bundle pinned to
`ray.io/tpu-slice-name` of its slice. The heads stay held until that group ends
(the seed's programs never call `release_head_pgs`). A single-host topology skips
the heads: its bundles carry no selector at all.

The user's wait runs from the first call, across retries."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from tpu_autoscaler.core import catalog, labels
from tpu_autoscaler.core.demand import GangStrategy
from tpu_autoscaler.sim.ray import SimRay
from tpu_autoscaler.sim.ray_model import Bundle, Work
from tpu_autoscaler.sim.workload import SlicePlacementGroupSpec

FOREVER = -1
"""`retries` without limit, as Ray Train's `controller_failure_limit` default."""


@dataclass
class SlicePlacementGroupRun:
    """One `slice_placement_group` call of a workload item, with its retries."""

    ray: SimRay
    after: Callable[[float, Callable[[], None]], None]
    spec: SlicePlacementGroupSpec
    duration_s: float
    submitted_s: float
    on_timeout: Callable[[], None]
    """A head reservation timed out (the user saw TimeoutError)."""
    attempts: int = 0
    heads: list[Work] = field(default_factory=list)
    """Heads held in this attempt, slice by slice."""
    workers: Work | None = None

    def start(self) -> None:
        self.attempts += 1
        self.heads = []
        if self._slice_type.hosts > 1:
            self._reserve_head()
        else:
            self._reserve_workers()

    @property
    def _slice_type(self) -> catalog.SliceType:
        generation = catalog.find_generation(self.spec.accelerator_version)
        if generation is None:
            raise ValueError(f"unknown accelerator_version {self.spec.accelerator_version!r}")
        return catalog.slice_type(generation, self.spec.topology)

    def _reserve_head(self) -> None:
        slice_type = self._slice_type
        head = Work(
            self.ray.new_id("spg-head"),
            [
                Bundle(
                    {slice_type.head_resource: 1.0},
                    {
                        labels.RAY_TPU_WORKER_ID: "0",
                        labels.RAY_TPU_POD_TYPE: slice_type.pod_type,
                    },
                )
            ],
            self.duration_s,
            self.submitted_s,
            GangStrategy.PACK,
            finishes=False,
        )
        attempt = self.attempts
        head.on_placed = lambda placed: self._head_held(attempt, placed)
        self.ray.submit(head)
        timeout_s = self.spec.head_reservation_timeout_s
        if timeout_s is not None:
            self.after(timeout_s, lambda: self._deadline(attempt, head))

    def _head_held(self, attempt: int, head: Work) -> None:
        if attempt != self.attempts or any(h is head for h in self.heads):
            return  # an abandoned attempt, or a head placed again after its node died
        self.heads.append(head)
        if len(self.heads) < self.spec.num_slices:
            self._reserve_head()
        else:
            self._reserve_workers()

    def _deadline(self, attempt: int, head: Work) -> None:
        if attempt != self.attempts or any(h is head for h in self.heads):
            return
        if self.ray.running.get(head.work_id) is head:
            return  # placed in time; `ready()` resolves in this instant
        self.ray.remove(head)
        for held in self.heads:
            self.ray.remove(held)
        self.heads = []
        self.on_timeout()
        retries = self.spec.retries
        if retries == FOREVER or self.attempts <= retries:
            self.start()

    def _reserve_workers(self) -> None:
        slice_type = self._slice_type
        per_bundle = dict(self.spec.resources_per_bundle or {})
        per_bundle.setdefault("CPU", 1.0)
        per_bundle.setdefault("TPU", float(slice_type.chips_per_host))
        bundles_per_slice = int(slice_type.chips // per_bundle["TPU"])
        if self.heads:
            names = [self._slice_name(head) for head in self.heads]
            selectors = [{labels.RAY_TPU_SLICE_NAME: name} for name in names]
        else:
            selectors = [{}] * self.spec.num_slices
        self.workers = Work(
            self.ray.new_id("spg"),
            [
                Bundle(dict(per_bundle), dict(selector))
                for selector in selectors
                for _ in range(bundles_per_slice)
            ],
            self.duration_s,
            self.submitted_s,
            GangStrategy.SPREAD,
            holds=list(self.heads) if self.heads else None,
        )
        self.ray.submit(self.workers)

    def _slice_name(self, head: Work) -> str:
        """`fetch_tpu_slice_name_from_pg`: the slice label of the node the head is on."""
        pod = head.placement[0][0]
        node = self.ray.nodes.get(pod)
        return node.labels.get(labels.RAY_TPU_SLICE_NAME, "") if node else ""
