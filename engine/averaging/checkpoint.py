"""Checkpoints of an elastically averaged run: the reference model and every parallel
model, still one file per block (layout-independent, any P x D).

A block file's ``params`` hold the reference's weights (what ``export`` and
``load_full_state`` read: the reference is the run's model) with empty ``optim``; its
``parallel`` list holds each parallel model's ``params`` and ``optim``, and
``meta.json`` records ``averaging: {N, alpha}``. A checkpoint is taken once the
reference has applied every batch up to its step (r_step).

Resume (:func:`resume_averaged`): with the checkpoint's N, the reference, every parallel
model and its optimizer state come back exactly, so the run continues as if never
stopped. With another N (or from a synchronous run's checkpoint), the reference is the
checkpoint's model and every parallel model restarts from it, with the optimizer state
the checkpoint's ``optim`` holds (a synchronous run's; none after elastic averaging).
A run without averaging resumes from the reference, with a fresh optimizer.
"""

from __future__ import annotations

from pathlib import Path

from jobctl.engine.averaging.parts import AveragingParts
from jobctl.engine.checkpoint.blocks import (
    Reshard,
    blocks_written_by,
    load_blocks,
    read_meta,
    snapshot_blocks,
)
from jobctl.engine.checkpoint.buffers import Buffers, Scoped
from jobctl.engine.checkpoint.hook import Checkpointing
from jobctl.engine.core.plan import Plan
from jobctl.engine.model.blocks import Tie
from jobctl.engine.runtime.hook import StageState


def snapshot_averaged(
    parts: AveragingParts,
    blocks: list[int],
    ties: list[Tie],
    masks: dict | None = None,
    whole: Reshard | None = None,
    into: Buffers | None = None,
) -> dict:
    """The reference's blocks (with pruning's ``masks``, one set for every copy), each
    with the parallel models' under ``parallel``; with ``whole`` (T > 1: collective
    over the T group) split tensors saved whole; copied into ``into``'s reused host
    tensors where given, each copy under its own prefix."""
    scope = (lambda k: None) if into is None else (lambda k: Scoped(into, k))  # noqa: E731
    ref = parts.reference.stage
    snap = snapshot_blocks(ref, None, blocks, ties, masks, whole, scope("reference"))
    shots = [
        snapshot_blocks(m.stage, m.opt, blocks, ties, whole=whole, into=scope(i))
        for i, m in enumerate(parts.models)
    ]
    for b in blocks:
        snap[b]["parallel"] = [shot[b] for shot in shots]
    return snap


def resume_averaged(
    parts: AveragingParts,
    batch: int,
    ties: list[Tie],
    ckpt_dir: Path,
    local: Reshard | None = None,
) -> int:
    """Load ``ckpt_dir`` into ``parts`` (see the module docstring) for a run of global
    batch ``batch`` (with ``local``, T > 1: this rank's shard of each whole tensor);
    returns the step to continue at."""
    meta = read_meta(ckpt_dir)
    if meta["global_batch_size"] != batch:
        raise ValueError(f"checkpoint global batch {meta['global_batch_size']} != spec's")
    same_n = meta.get("averaging", {}).get("N") == parts.config.N
    load_blocks(parts.reference.stage, None, ckpt_dir, ties, local=local)
    for i, m in enumerate(parts.models):
        part = i if same_n else None
        load_blocks(m.stage, m.opt, ckpt_dir, ties, part=part, local=local)
    step = int(meta["step"])
    parts.reference.version = step  # the checkpoint holds r_step
    return step


class AveragingCheckpointing(Checkpointing):
    """:class:`Checkpointing` that saves the reference and the N parallel models."""

    def __init__(self, *args, parts: AveragingParts, **kwargs):
        super().__init__(*args, **kwargs)
        self.parts = parts

    def save(self, state: StageState, step: int, final: bool = False) -> None:
        self.parts.reference.wait_for(step)  # r_step: every batch before it applied
        mine = blocks_written_by(state.plan, self.rank)
        masks = self.masks() if self.masks is not None else None
        whole = None if state.tp is None else state.tp.whole  # T > 1: gathered by the group
        take = lambda into: snapshot_averaged(  # noqa: E731
            self.parts, mine, self.ties, masks, whole, into
        )
        keep = not state.plan.rank(self.rank).tp_rank  # the group's whole: t = 0 writes
        self.save_taken(step, state.plan, take, final, keep)

    def meta(self, plan: Plan, step: int) -> dict:
        cfg = self.parts.config
        return {**super().meta(plan, step), "averaging": {"N": cfg.N, "alpha": cfg.alpha}}
