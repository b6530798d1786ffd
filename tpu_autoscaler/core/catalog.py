"""Which TPU slices exist, and what a host of each one reports to Ray.

The catalog answers: given a generation, a topology and the chips each host (pod)
gets, how many hosts a slice has, what Ray calls it (`v6e-16`, `TPU-v6e-16-head`)
and which labels and resources each of its hosts will carry once Ray starts there.
Facts are those of Ray 2.60 (`ray/_private/accelerators/tpu.py`), GKE and the TPU
webhook; `tests/test_catalog_ray.py` compares them with Ray's own code.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from itertools import product

from tpu_autoscaler.core import labels
from tpu_autoscaler.core.units import Chips, Hosts, TensorCores

MULTI_HOST_CHIPS_PER_HOST = Chips(4)
"""Every multi-host slice of every generation is built of 4-chip hosts."""


class CatalogError(ValueError):
    """A slice that does not exist; the message says what would be valid."""


def _multiples_of_four_3d(max_x: int, max_y: int, max_z: int) -> frozenset[str]:
    return frozenset(
        f"{x}x{y}x{z}"
        for x, y, z in product(
            range(4, max_x + 1, 4), range(4, max_y + 1, 4), range(4, max_z + 1, 4)
        )
    )


@dataclass(frozen=True, slots=True)
class Generation:
    """One TPU generation as GKE and Ray name it."""

    name: str
    """Our name for it, as users say it: v4, v5e, v5p, v6e, tpu7x."""
    ray_version: str
    """Ray's canonical spelling, the prefix of its pod types (`v5litepod`, `v7x`)."""
    gke_accelerators: tuple[str, ...]
    """Values of the `cloud.google.com/gke-tpu-accelerator` node selector; first is current."""
    gke_type_prefix: str
    """Prefix of the `TPU_ACCELERATOR_TYPE` GKE sets in the pod (`tpu7x` for TPU7x)."""
    tensorcores_per_chip: int
    logical_devices_per_chip: int
    """Devices a chip exposes; Ray counts them only with RAY_TPU_RESOURCE_PER_CHIP."""
    host_chip_sizes: tuple[Chips, ...]
    """Chips a single VM of this generation can have."""
    topologies: frozenset[str]

    @property
    def accelerator_type(self) -> str:
        """Value of the `ray.io/accelerator-type` label, e.g. `TPU-V6E`."""
        return f"TPU-{self.ray_version.upper()}"

    def sorted_topologies(self) -> list[str]:
        return sorted(self.topologies, key=lambda t: (chips_in_topology(t), t))

    def valid_chips_per_host(self, topology: str) -> tuple[Chips, ...]:
        """Host sizes a slice of `topology` can be built from, smallest first.

        A slice is either one VM holding all its chips, or several 4-chip VMs.
        """
        chips = chips_in_topology(topology)
        return tuple(
            size
            for size in sorted(self.host_chip_sizes)
            if chips % size == 0 and size in (chips, MULTI_HOST_CHIPS_PER_HOST)
        )

    def default_chips_per_host(self, topology: str) -> Chips:
        """What Ray assumes when nobody says (`get_chips_per_host`): single-host
        v5e/v6e topologies use one VM of all chips, everything else 4-chip VMs."""
        chips = chips_in_topology(topology)
        if chips in self.host_chip_sizes:
            return Chips(chips)
        return MULTI_HOST_CHIPS_PER_HOST


GENERATIONS: tuple[Generation, ...] = (
    Generation(
        name="v4",
        ray_version="v4",
        gke_accelerators=("tpu-v4-podslice",),
        gke_type_prefix="v4",
        tensorcores_per_chip=2,
        logical_devices_per_chip=1,
        host_chip_sizes=(Chips(4),),
        topologies=frozenset({"2x2x1", "2x2x2", "2x2x4", "2x4x4"})
        | _multiples_of_four_3d(12, 12, 16),
    ),
    Generation(
        name="v5e",
        ray_version="v5litepod",
        gke_accelerators=("tpu-v5-lite-podslice", "tpu-v5-lite-device"),
        gke_type_prefix="v5litepod",
        tensorcores_per_chip=1,
        logical_devices_per_chip=1,
        host_chip_sizes=(Chips(1), Chips(4), Chips(8)),
        topologies=frozenset({"1x1", "2x2", "2x4", "2x8", "4x4", "4x8", "8x8", "8x16", "16x16"}),
    ),
    Generation(
        name="v5p",
        ray_version="v5p",
        gke_accelerators=("tpu-v5p-slice",),
        gke_type_prefix="v5p",
        tensorcores_per_chip=2,
        logical_devices_per_chip=1,
        host_chip_sizes=(Chips(4),),
        topologies=frozenset({"2x2x1", "2x2x2", "2x2x4", "2x4x4"})
        | _multiples_of_four_3d(16, 16, 24),
    ),
    Generation(
        name="v6e",
        ray_version="v6e",
        gke_accelerators=("tpu-v6e-slice",),
        gke_type_prefix="v6e",
        tensorcores_per_chip=1,
        logical_devices_per_chip=1,
        host_chip_sizes=(Chips(1), Chips(4), Chips(8)),
        topologies=frozenset({"1x1", "2x2", "2x4", "2x8", "4x4", "4x8", "8x8", "8x16", "16x16"}),
    ),
    Generation(
        name="tpu7x",
        ray_version="v7x",
        gke_accelerators=("tpu7x",),
        gke_type_prefix="tpu7x",
        tensorcores_per_chip=2,
        logical_devices_per_chip=2,
        host_chip_sizes=(Chips(4),),
        topologies=frozenset(
            {
                "2x2x1",
                "2x2x2",
                "2x2x4",
                "2x4x4",
                "4x4x4",
                "4x4x8",
                "4x8x8",
                "8x8x8",
                "8x8x16",
                "8x16x16",
            }
        ),
    ),
)

_BY_GKE_ACCELERATOR = {value: gen for gen in GENERATIONS for value in gen.gke_accelerators}
_BY_SPELLING = {
    spelling: gen
    for gen in GENERATIONS
    for spelling in {gen.name, gen.ray_version, gen.gke_type_prefix}
}
_TOPOLOGY_PATTERN = re.compile(r"^[1-9][0-9]*(x[1-9][0-9]*){1,2}$")


def normalize_topology(topology: str) -> str:
    return topology.strip().lower()


@lru_cache(maxsize=1024)
def chips_in_topology(topology: str) -> Chips:
    """`4x4` -> 16, `2x2x2` -> 8; CatalogError if it is not of that form."""
    normalized = normalize_topology(topology)
    if not _TOPOLOGY_PATTERN.match(normalized):
        raise CatalogError(f"topology {topology!r} is not of the form AxB or AxBxC")
    chips = 1
    for dim in normalized.split("x"):
        chips *= int(dim)
    return Chips(chips)


def gke_accelerator_values() -> list[str]:
    return sorted(_BY_GKE_ACCELERATOR)


def generation_for_gke_accelerator(value: str) -> Generation | None:
    """The generation a `cloud.google.com/gke-tpu-accelerator` value selects."""
    return _BY_GKE_ACCELERATOR.get(value.strip())


def find_generation(spelling: str) -> Generation | None:
    """A generation from any spelling users and Ray use: `v6e`, `TPU-V6E`, `v5e`,
    `v5litepod`, `tpu7x`, `v7x`, or a pod type such as `v6e-16` or `tpu7x-8`."""
    text = spelling.strip().lower()
    text = re.sub(r"-\d+$", "", text)
    if text.startswith("tpu-"):
        text = text[len("tpu-") :]
    return _BY_SPELLING.get(text) or _BY_SPELLING.get(re.sub(r"^tpu-?v?", "v", text))


@dataclass(frozen=True, slots=True)
class _SliceNames:
    """What a slice type's names derive from its generation's Ray spelling, its
    tensorcores per chip and its topology (`_slice_names`)."""

    chips: Chips
    pod_type: str
    head_resource: str
    accelerator_type: str
    accelerator_type_resource: str


@lru_cache(maxsize=1024)
def _slice_names(ray_version: str, tensorcores_per_chip: int, topology: str) -> _SliceNames:
    """A slice type's names, made once per kind: every host of a replica not up yet
    is given them again each time its replica changes (`slots.fresh_hosts`), and the
    f-strings were most of making its labels and resources."""
    chips = chips_in_topology(topology)
    pod_type = f"{ray_version}-{TensorCores(chips * tensorcores_per_chip)}"
    accelerator_type = f"TPU-{ray_version.upper()}"
    return _SliceNames(
        chips,
        pod_type,
        f"TPU-{pod_type}-head",
        accelerator_type,
        f"{labels.ACCELERATOR_TYPE_RESOURCE_PREFIX}{accelerator_type}",
    )


@dataclass(frozen=True, slots=True)
class SliceType:
    """A slice of one generation and topology built of hosts of `chips_per_host`."""

    generation: Generation
    topology: str
    chips_per_host: Chips

    @property
    def _names(self) -> _SliceNames:
        generation = self.generation
        return _slice_names(generation.ray_version, generation.tensorcores_per_chip, self.topology)

    @property
    def chips(self) -> Chips:
        return chips_in_topology(self.topology)

    @property
    def hosts(self) -> Hosts:
        return Hosts(self.chips // self.chips_per_host)

    @property
    def tensorcores(self) -> TensorCores:
        return TensorCores(self.chips * self.generation.tensorcores_per_chip)

    @property
    def pod_type(self) -> str:
        """Ray's pod type, `{gen}-{cores}`: v6e 4x4 -> `v6e-16`, v5p 2x2x2 -> `v5p-16`."""
        return self._names.pod_type

    @property
    def gke_accelerator_type(self) -> str:
        """The `TPU_ACCELERATOR_TYPE` GKE puts in the pod (`tpu7x-16`; Ray reads `v7x-16`)."""
        return f"{self.generation.gke_type_prefix}-{self.tensorcores}"

    @property
    def head_resource(self) -> str:
        """The resource Ray puts on worker 0 of each slice only."""
        return self._names.head_resource

    @property
    def accelerator_type_resource(self) -> str:
        return self._names.accelerator_type_resource

    def static_labels(self) -> dict[str, str]:
        """Labels every host of every slice of this type carries."""
        names = self._names
        return {
            labels.RAY_ACCELERATOR_TYPE: names.accelerator_type,
            labels.RAY_TPU_TOPOLOGY: self.topology,
            labels.RAY_TPU_POD_TYPE: names.pod_type,
        }

    def host_labels(self, worker_id: int, slice_name: str | None = None) -> dict[str, str]:
        """Labels Ray derives on host `worker_id`; the slice name exists once launched."""
        if not 0 <= worker_id < self._names.chips // self.chips_per_host:
            raise CatalogError(
                f"worker id {worker_id} outside 0..{self.hosts - 1} of {self.pod_type}"
            )
        host = self.static_labels()
        host[labels.RAY_TPU_WORKER_ID] = str(worker_id)
        if slice_name is not None:
            host[labels.RAY_TPU_SLICE_NAME] = slice_name
        return host

    def host_extra_resources(
        self, worker_id: int, slice_name: str | None = None
    ) -> dict[str, float]:
        """Resources Ray adds on a TPU host besides `TPU`: the accelerator type, the
        slice-name resource (once launched) and the head resource on worker 0."""
        extra: dict[str, float] = {self.accelerator_type_resource: 1.0}
        if slice_name is not None:
            extra[slice_name] = 1.0
        if worker_id == 0:
            extra[self.head_resource] = 1.0
        return extra


def require_topology(generation: Generation, topology: str) -> str:
    """`topology` normalized; CatalogError listing the valid ones if it does not exist."""
    normalized = normalize_topology(topology)
    chips_in_topology(normalized)
    if normalized not in generation.topologies:
        raise CatalogError(
            f"{topology!r} is not a {generation.name} topology; valid: "
            + ", ".join(generation.sorted_topologies())
        )
    return normalized


def slice_type(
    generation: Generation, topology: str, chips_per_host: int | None = None
) -> SliceType:
    """The slice of `generation` and `topology` on hosts of `chips_per_host` chips
    (Ray's default when None); CatalogError naming what would be valid otherwise."""
    normalized = require_topology(generation, topology)
    if chips_per_host is None:
        return SliceType(generation, normalized, generation.default_chips_per_host(normalized))
    valid = generation.valid_chips_per_host(normalized)
    if chips_per_host not in valid:
        raise CatalogError(
            f"{generation.name} {normalized} ({chips_in_topology(normalized)} chips) cannot be "
            f"built of {chips_per_host}-chip hosts; valid chips per host: "
            + ", ".join(str(c) for c in valid)
        )
    return SliceType(generation, normalized, Chips(chips_per_host))


def all_slice_types() -> list[SliceType]:
    """Every slice the catalog knows, for tests and documentation."""
    return [
        SliceType(gen, topology, chips_per_host)
        for gen in GENERATIONS
        for topology in gen.sorted_topologies()
        for chips_per_host in gen.valid_chips_per_host(topology)
    ]
