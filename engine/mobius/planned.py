"""A Mobius run's swap configuration from its plan: the sec. 3.2 MIP's stages and the
sec. 3.3 cross mapping's devices.

``planning.partition`` cuts the layers into S stages (ranges of block indices) and
``planning.cross_mapping`` gives each stage a device so adjacent stages avoid
sharing a PCIe root complex; with one rank per device, that device is the stage's
rank (``SwapConfig.placement``). Without a topology, stage j runs on rank j % N, as
the partition priced it.
"""

from __future__ import annotations

from pathlib import Path

from jobctl.engine.mobius.planning.cross_mapping import Topology, cross_mapping
from jobctl.engine.mobius.planning.partition import MobiusPartition
from jobctl.engine.mobius.runtime import SwapConfig


def planned_config(
    partition: MobiusPartition,
    folder: Path,
    micro_batch: int,
    rank: int = 0,
    topology: Topology | None = None,
    **options,
) -> SwapConfig:
    """Rank ``rank``'s ``SwapConfig`` for ``partition`` (``options``: prefetch,
    budget_bytes)."""
    stages = tuple(tuple(r) for r in partition.stages)
    world = len(set(partition.devices))
    placement = tuple(partition.devices)
    if topology is not None:
        if topology.devices != world:
            raise ValueError(
                f"the topology lists {topology.devices} devices, the partition uses {world}"
            )
        placement = cross_mapping(len(stages), topology).stage_devices
    return SwapConfig(
        folder, stages, micro_batch, rank=rank, world=world, placement=placement, **options
    )
