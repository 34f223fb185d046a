"""The spec side of a node's PCIe topology (``hardware.topology``).

``root_complexes`` lists, for each CPU root complex of a node, the indices of the
node's devices (0 .. processes_per_node - 1) under it. Mobius's cross mapping
(``engine.mobius.planning.cross_mapping``, sec. 3.3) maps adjacent pipeline stages to
devices under different root complexes, so that their uploads from host memory do not
share lanes. The field lives on ``HardwareSpec`` (which inherits :class:`TopologyFields`);
:func:`topology_violations`, called by ``JobSpec``, checks the lists against
``processes_per_node``; a Mobius plan reads it (``engine.mobius.planning.plan``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Annotated, Any

from pydantic import Field

from .base import SpecModel, Violation

PATH = "hardware.topology.root_complexes"


class TopologySpec(SpecModel):
    """Which of a node's devices share a CPU root complex."""

    root_complexes: list[list[Annotated[int, Field(ge=0)]]] = Field(
        min_length=1,
        description="Device indices (0 .. processes_per_node - 1) under each CPU root "
        "complex, e.g. [[0, 1], [2, 3]]: every device under exactly one.",
    )


class TopologyFields(SpecModel):
    """``hardware.topology``."""

    topology: TopologySpec | None = Field(
        None,
        description="Which devices of a node share a PCIe root complex (Mobius cross "
        "mapping); unset: unknown.",
    )


def topology_violations(hardware: Any) -> Iterator[Violation]:
    """``hardware.topology`` against ``hardware.processes_per_node``."""
    if hardware.topology is None:
        return
    rcs = hardware.topology.root_complexes
    n = hardware.processes_per_node
    if any(not rc for rc in rcs):
        yield Violation(PATH, "a root complex lists no device", "drop the empty list")
    counts = Counter(d for rc in rcs for d in rc)
    outside = sorted(d for d in counts if d >= n)
    if outside:
        yield Violation(
            PATH,
            f"device {outside[0]} is not on a node of {n} devices (processes_per_node)",
            f"use device indices 0 .. {n - 1}, or raise hardware.processes_per_node",
        )
    twice = sorted(d for d, k in counts.items() if k > 1)
    if twice:
        yield Violation(
            PATH,
            f"device {twice[0]} is under more than one root complex",
            "list each device under exactly one root complex",
        )
    missing = [d for d in range(n) if d not in counts]
    if missing and not outside:
        yield Violation(
            PATH,
            f"devices {missing} are under no root complex",
            "add each device to the list of its root complex (alone: a list of its own)",
        )
