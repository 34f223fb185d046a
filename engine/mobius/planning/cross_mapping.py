"""Mobius's cross mapping (Mobius sec. 3.3, eqs. 12-13): which device runs each stage.

Adjacent stages whose devices share a PCIe root complex upload their weights over the
same lanes at about the same time. Eq. 12 prices a pair of stages i < j as
``shared(i, j) / (j - i)``, where ``shared`` is the number of devices under the root
complex both stages' devices sit under (0 when they sit under different ones); eq. 13
picks the mapping with the least sum over all pairs.

The Mobius pipeline (and ``planning.costs``' timing of it) runs stage j after stage
j - N on the same device, so a mapping is a device order: stage s runs on
``order[s % N]``. The search is exact over all N! orders: the cost depends only on
which root complex each position of the order is under, so it enumerates those
patterns once each (root complexes of equal size are interchangeable, so only the
pattern whose such complexes first appear in index order is priced) and returns the
least-cost one, under each complex its devices in index order; ties go to the
lexicographically smallest order. Stage 0 runs first, so it keeps device 0.

The plan (``planning.plan``) and the runtime's configuration (``mobius.planned``) use
it; ``Topology`` is its typed configuration, ``topology_of`` reads it from
``hardware.topology`` (validated by ``spec.topology``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction

from pydantic import BaseModel, ConfigDict, Field, model_validator

from jobctl.spec import HardwareSpec


class Topology(BaseModel):
    """Which devices share a PCIe root complex: each list is one complex's devices."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    root_complexes: list[list[int]] = Field(
        min_length=1, description="device indices under each CPU root complex"
    )

    @model_validator(mode="after")
    def _partition(self) -> Topology:
        flat = [d for rc in self.root_complexes for d in rc]
        if any(not rc for rc in self.root_complexes):
            raise ValueError("root_complexes: a root complex lists no device; drop it")
        if sorted(flat) != list(range(len(flat))):
            raise ValueError(
                f"root_complexes: {self.root_complexes} must list each device 0..N-1 "
                f"exactly once (N = {len(flat)} here)"
            )
        return self

    @property
    def devices(self) -> int:
        return sum(len(rc) for rc in self.root_complexes)

    def complex_of(self, device: int) -> int:
        return next(k for k, rc in enumerate(self.root_complexes) if device in rc)


def topology_of(hardware: HardwareSpec) -> Topology | None:
    """A node's root complexes from ``hardware.topology`` (None where it is not given)."""
    if hardware.topology is None:
        return None
    return Topology(root_complexes=hardware.topology.root_complexes)


@dataclass(frozen=True)
class CrossMapping:
    """The chosen device order and what eq. 13 says of it and of the sequential one."""

    order: tuple[int, ...]  # stage s runs on order[s % N]
    stage_devices: tuple[int, ...]
    contention: Fraction
    sequential: Fraction  # eq. 13 for order 0, 1, ..., N-1


def contention(stage_devices: Sequence[int], topology: Topology) -> Fraction:
    """Eq. 13: sum over stage pairs i < j of shared(i, j) / (j - i) (eq. 12), exactly."""
    rc = [topology.complex_of(d) for d in stage_devices]
    return _pattern_cost(rc, len(rc), [len(c) for c in topology.root_complexes])


def _pattern_cost(pattern: Sequence[int], stages: int, sizes: Sequence[int]) -> Fraction:
    """Eq. 13 for stage s under root complex ``pattern[s % len(pattern)]``."""
    n = len(pattern)
    total = Fraction(0)
    for d in range(1, stages):
        shared = sum(
            sizes[pattern[i % n]]
            for i in range(stages - d)
            if pattern[i % n] == pattern[(i + d) % n]
        )
        total += Fraction(shared, d)
    return total


def _patterns(sizes: Sequence[int]) -> Iterator[list[int]]:
    """Every sequence with ``sizes[k]`` copies of complex k, up to swapping complexes
    of equal size (those first appear in index order)."""
    left, out = list(sizes), []

    def extend() -> Iterator[list[int]]:
        if not any(left):
            yield list(out)
            return
        for k, n in enumerate(left):
            fresh = n == sizes[k]
            if (
                n == 0
                or fresh
                and any(sizes[a] == sizes[k] and left[a] == sizes[a] for a in range(k))
            ):
                continue  # an equal, earlier-indexed complex has not appeared yet
            left[k] -= 1
            out.append(k)
            yield from extend()
            out.pop()
            left[k] += 1

    yield from extend()


def _order(pattern: Sequence[int], topology: Topology) -> tuple[int, ...]:
    """Devices for a complex pattern: under each complex, its devices in index order."""
    pools = [sorted(rc) for rc in topology.root_complexes]
    taken = [0] * len(pools)
    order = []
    for k in pattern:
        order.append(pools[k][taken[k]])
        taken[k] += 1
    return tuple(order)


def cross_mapping(stages: int, topology: Topology) -> CrossMapping:
    """The device order minimising eq. 13 for ``stages`` stages (see the module doc)."""
    if stages < 1:
        raise ValueError(f"stages: {stages}; a pipeline has at least one stage")
    # Complexes by their first device: then, of the orders that relabel equal-size
    # complexes (equal cost), the one _patterns keeps is the lexicographically smallest.
    ordered = Topology(root_complexes=sorted(map(sorted, topology.root_complexes)))
    sizes = [len(rc) for rc in ordered.root_complexes]
    cost, order = min(
        (_pattern_cost(p, stages, sizes), _order(p, ordered)) for p in _patterns(sizes)
    )
    N = topology.devices
    return CrossMapping(
        order=order,
        stage_devices=tuple(order[s % N] for s in range(stages)),
        contention=cost,
        sequential=contention([s % N for s in range(stages)], topology),
    )
