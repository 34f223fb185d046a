"""A Mobius run re-cut while it trains: the S stages' blocks moved to new boundaries.

DynPipe's rebalancing (``rebalance.swapped`` decides it) under Mobius: the number of
stages S and the rank of each stage stay, the blocks of each stage change. Every
rank applies its pending update (``MobiusRunner.flush``), takes each of its blocks'
weights, optimizer slots and pruning masks out of its records, sends the blocks whose
new stage lives on another rank there and receives the ones it gains (in the model's
block order on every rank, so the earliest block still in flight always has both of
its ranks at it: no deadlock), and builds a runner over the new stages whose records
are filled from them. A tie's two copies (GPT's embedding and head) travel as the
parameters they are in their records, each with its own optimizer slots, as the
runner keeps them; nothing is recomputed, so the run trains on exactly as before.
"""

from __future__ import annotations

import dataclasses

import torch.distributed as dist

from jobctl.engine.checkpoint.blocks import Snapshot
from jobctl.engine.mobius import checkpoint
from jobctl.engine.mobius.masks import held, hold
from jobctl.engine.mobius.runtime import MobiusRunner
from jobctl.engine.model.blocks import ModelDef

Stages = list[list[int]]


def owners(stages: Stages, placement: tuple[int, ...]) -> dict[int, int]:
    """The rank that holds each block: its stage's."""
    return {b: placement[j] for j, blocks in enumerate(stages) for b in blocks}


def _taken(runner: MobiusRunner) -> Snapshot:
    """This rank's blocks, a tie's alias as its own parameter, with their masks."""
    return checkpoint.snapshot(runner, [], held(runner) or None)


def _exchange(runner: MobiusRunner, snap: Snapshot, new: Stages) -> Snapshot:
    """The blocks this rank holds under ``new``: kept, or received from their owner."""
    old = owners([list(s) for s in runner.cfg.stages], runner.placement)
    after = owners(new, runner.placement)
    me, links, out = runner.cfg.rank, runner.links, {}
    for b in sorted(old):  # one order on every rank (see the module doc)
        src, dst = old[b], after[b]
        if src == dst:
            if dst == me:
                out[b] = snap.pop(b)
        elif src == me:
            dist.send_object_list([snap.pop(b)], dst=links._global(dst), group=links.group)
        elif dst == me:
            box = [None]
            dist.recv_object_list(box, src=links._global(src), group=links.group)
            out[b] = box[0]
    return out


def relaid(runner: MobiusRunner, mdef: ModelDef, new: Stages) -> MobiusRunner:
    """``runner``'s training state under stages ``new`` (the same S and placement);
    ``runner`` is closed. Collective over the run's ranks."""
    if len(new) != runner.S:
        raise ValueError(f"a re-cut keeps the S = {runner.S} stages; got {len(new)}")
    runner.flush()  # the last step's update belongs to the weights that move
    got = _exchange(runner, _taken(runner), new)
    runner.close()  # the new records reuse its files: a rank keeps its stage indices
    cfg = dataclasses.replace(runner.cfg, stages=tuple(tuple(s) for s in new))
    args = (runner.training, runner.data, cfg, runner.device, runner.links.group, runner.scaler)
    fresh = MobiusRunner(mdef, *args)
    checkpoint.load(fresh, [], got)
    masks = {n: m for payload in got.values() for n, m in payload.get("masks", {}).items()}
    if masks:
        hold(fresh, masks)
    return fresh
