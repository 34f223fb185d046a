"""A Mobius rank's checkpoint part, in the layout-independent block format.

A Mobius stage's weights and optimizer slots live in its record in the tier, not in
the module; ``snapshot`` brings each of this rank's stages up once (the last step's
update applied first, ``MobiusRunner.flush``), binds it and takes the same per-block
snapshot a 1f1b rank takes (``checkpoint.blocks.snapshot_blocks``: every parameter
and its optimizer state under its global block's file, a tied alias left to its
canonical), so a Mobius checkpoint resumes under any P x D and back. ``load`` is the
reverse: a checkpoint's blocks (written by any layout) into this rank's records.
:class:`MobiusCheckpointing` is the loop's checkpoint hook over them.
"""

from __future__ import annotations

from pathlib import Path

import torch

from jobctl.engine.checkpoint.blocks import Snapshot, load_blocks, read_meta, snapshot_blocks
from jobctl.engine.checkpoint.buffers import Buffers
from jobctl.engine.checkpoint.hook import Checkpointing
from jobctl.engine.mobius import resident
from jobctl.engine.mobius.runtime import MobiusRunner
from jobctl.engine.model.blocks import Tie
from jobctl.engine.runtime.hook import StageState


def _kept(lay) -> list[tuple[int, int]]:
    """The byte ranges a checkpoint keeps of a record: weights and optimizer slots."""
    return [lay.section(0)] + [lay.section(2 + k) for k in range(len(lay.slots))]


def _bound(runner: MobiusRunner, j: int) -> torch.Tensor:
    """Stage ``j``'s whole record, read into its reserved buffer and bound (weights
    and optimizer slots); the caller releases it."""
    lay = runner.layouts[j]
    flat = runner._buffer(j)
    runner.tier.load(j, flat, _kept(lay), ["params", *["optim"] * len(lay.slots)]).result()
    resident.bind(runner.mods[j], lay, runner.opts[j], flat, grads=False, slots=True)
    return flat


def snapshot(
    runner: MobiusRunner, ties: list[Tie], masks: dict | None = None, into: Buffers | None = None
) -> Snapshot:
    """Copies of this rank's blocks, parameters and optimizer state (and pruning's
    ``masks``), by global block (into ``into``'s reused host tensors where given)."""
    runner.flush()  # the pending update belongs to the step being saved
    snap: Snapshot = {}
    for j in runner.mine:
        _bound(runner, j)
        blocks = list(runner.cfg.stages[j])
        mod, opt = runner.mods[j], runner.opts[j]
        snap.update(snapshot_blocks(mod, opt, blocks, ties, masks, into=into))
        resident.release(
            runner.mods[j], runner.layouts[j], runner.opts[j], runner.reserved.placeholder
        )
    return snap


def load(runner: MobiusRunner, ties: list[Tie], ckpt_dir: Path | Snapshot) -> None:
    """This rank's stages' weights and optimizer state from checkpoint ``ckpt_dir``
    (any layout's; or a snapshot in memory, ``mobius.relayout``), written into their
    records; the runner starts with no pending update (a checkpoint holds its step's
    update applied)."""
    for j in runner.mine:
        mod, lay, opt = runner.mods[j], runner.layouts[j], runner.opts[j]
        flat = _bound(runner, j)
        load_blocks(mod, opt, ckpt_dir, ties)  # weights into the record; slots aside
        params = dict(mod.named_parameters())
        loaded = {s.name: dict(opt.state[params[s.name]]) for s in lay.spans}
        resident.bind(mod, lay, opt, flat, grads=False, slots=True)
        for span in lay.spans:
            state = opt.state[params[span.name]]
            for slot in lay.slots:
                saved = loaded[span.name].get(slot)
                if saved is None:  # saved without optimizer state: fresh slots
                    state[slot].zero_()
                else:
                    state[slot].copy_(saved)
            if "step" in loaded[span.name]:
                state["step"] = loaded[span.name]["step"]
        runner.tier.store(j, flat, _kept(lay), ["params", *["optim"] * len(lay.slots)]).result()
        runner.tier.drain()
        resident.release(mod, lay, opt, runner.reserved.placeholder)
    runner.pending = None


def resume(runner: MobiusRunner, ties: list[Tie], batch: int, ckpt_dir: Path) -> int:
    """Load checkpoint ``ckpt_dir`` into ``runner`` for a run of global batch ``batch``;
    returns the step to continue at."""
    meta = read_meta(ckpt_dir)
    if meta["global_batch_size"] != batch:
        raise ValueError(f"checkpoint global batch {meta['global_batch_size']} != spec's")
    load(runner, ties, ckpt_dir)
    if runner.scaler is not None and "loss_scale" in meta:  # fp16: the run's scale goes on
        runner.scaler.restore(meta["loss_scale"])
    return int(meta["step"])


class MobiusCheckpointing(Checkpointing):
    """:class:`Checkpointing` of a Mobius rank: its parts come from the tier of the
    engine's runner (a re-cut's new one after rebalancing, ``mobius.relayout``)."""

    def __init__(self, *args, engine, **kwargs):  # noqa: ANN001 - a SwappedEngine
        super().__init__(*args, **kwargs)
        self.engine = engine

    def save(self, state: StageState | None, step: int, final: bool = False) -> None:
        masks = self.masks() if self.masks is not None else None
        take = lambda into: snapshot(self.engine.runner, self.ties, masks, into)  # noqa: E731
        self.save_taken(step, self.engine.plan, take, final)
