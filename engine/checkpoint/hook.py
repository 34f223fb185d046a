"""Checkpointing as a plug-in of the training loop (a ``runtime.hook.StepHook``), and
a rank's stage resumed from a checkpoint.

Every ``checkpoint.interval`` steps, at the last step and at the step a stop was agreed
on, this rank snapshots its blocks (with pruning's masks, if any) and a background
:class:`~jobctl.engine.checkpoint.manager.CheckpointManager` writes, publishes and
uploads them. No barrier: each rank records its part, and the part that completes the
set writes the manifest and renames the staging folder (atomic commit). After a pack
(fewer ranks) the old plan's writer finishes and a new one follows the new plan.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch

from jobctl.engine.checkpoint.blocks import (
    blocks_written_by,
    load_blocks,
    read_meta,
    snapshot_blocks,
    snapshot_bytes,
)
from jobctl.engine.checkpoint.manager import CheckpointManager, Copied
from jobctl.engine.checkpoint.resume import local_root
from jobctl.engine.core.env import SHARED_CKPT_DISK
from jobctl.engine.core.events import EventLog
from jobctl.engine.core.plan import Plan
from jobctl.engine.model.blocks import Tie
from jobctl.engine.runtime.hook import Relayout, StageState, StepEnd, StepHook
from jobctl.engine.runtime.optim import lr_at
from jobctl.spec import spec_hash
from jobctl.spec.job import JobSpec


def resume_stage(state: StageState, ties: list[Tie], ckpt_dir: Path) -> int:
    """Load a checkpoint's weights and optimizer state into ``state``'s stage; returns
    the step to continue at (the checkpoint's next sample)."""
    meta = read_meta(ckpt_dir)
    if meta["global_batch_size"] != state.plan.global_batch_size:
        raise ValueError(f"checkpoint global batch {meta['global_batch_size']} != spec's")
    local = None if state.tp is None else state.tp.local  # T > 1: keep this rank's shard
    load_blocks(state.stage, state.opt, ckpt_dir, ties, local=local)
    if state.scaler is not None and "loss_scale" in meta:  # fp16: the run's scale goes on
        state.scaler.restore(meta["loss_scale"])
    return int(meta["step"])


class Checkpointing(StepHook):
    """One rank's checkpoints, taken after the steps that need one."""

    STOP_UPLOAD_GRACE_S = 20.0  # a preempted machine has little time left

    def __init__(
        self,
        spec: JobSpec,
        plan: Plan,
        rank: int,
        run_dir: Path,
        events: EventLog,
        ties: list[Tie],
        masks: Callable[[], dict[str, torch.Tensor]] | None = None,
    ):
        self.spec, self.run_dir, self.events = spec, run_dir, events
        self.ties, self.masks = ties, masks  # masks: pruning's, saved with the blocks
        self.rank = rank
        self.manager = self._manager(plan)
        self.scaler = None  # fp16: the run's loss scale, kept in meta.json (the state's)

    def _manager(self, plan: Plan) -> CheckpointManager:
        root = local_root(self.spec.checkpoint, self.run_dir)
        shared = os.environ.get(SHARED_CKPT_DISK, "1") == "1"
        return CheckpointManager(self.spec.checkpoint, plan, self.rank, root, self.events, shared)

    def clear_stale_staging(self) -> None:
        """Remove the staging folders a killed run left (the local group's first part
        does; call before any rank stages)."""
        if f"rank-{self.rank}" == self.manager.local_parts[0]:
            self.manager.clear_stale_staging()

    def after_step(self, end: StepEnd) -> Relayout | None:
        plan = end.plan
        if plan.world_size < self.manager.plan.world_size:  # packed: follow the new plan
            self.manager.close()  # parts of earlier steps are all written first
            self.manager = self._manager(plan)
        done, total = end.done, self.spec.training.steps
        self.scaler = end.scaler
        if end.stopping or done % self.spec.checkpoint.interval == 0 or done == total:
            self.save(end.state, done, final=end.stopping or done == total)
        self.manager.poll()
        return None

    def on_stop(self, stopped: bool) -> None:
        # the final checkpoint must reach the remote store; a stopped machine waits less
        self.manager.close(timeout=self.STOP_UPLOAD_GRACE_S if stopped else None)

    def save(self, state: StageState, step: int, final: bool = False) -> None:
        """Snapshot this rank's blocks; the background writer does the rest."""
        plan = state.plan
        masks = self.masks() if self.masks is not None else None
        mine = blocks_written_by(plan, self.rank)
        whole = None if state.tp is None else state.tp.whole  # T > 1: gathered by the group
        take = lambda into: snapshot_blocks(  # noqa: E731
            state.stage, state.opt, mine, self.ties, masks, whole, into
        )
        self.save_taken(step, plan, take, final, keep=not plan.rank(self.rank).tp_rank)

    def save_taken(
        self, step: int, plan: Plan, take: Callable, final: bool, keep: bool = True
    ) -> None:
        """Queue the snapshot ``take(into)`` copies into the manager's reused host
        buffers, with how long training waited for it and its bytes (``keep`` False: a
        T group's t > 0, whose whole tensors its t = 0 writes)."""
        into = self.manager.buffers()  # reused host tensors: the copy maps no new pages
        t0 = time.perf_counter()
        snap = take(into)
        copied = Copied(time.perf_counter() - t0, snapshot_bytes(snap))
        meta = self.meta(plan, step)
        snap = snap if keep else {}
        self.manager.save(step, snap, meta, final=final, buffers=into, copied=copied)

    def meta(self, plan: Plan, step: int) -> dict:
        """The ``meta.json`` of a checkpoint of ``step`` taken under ``plan``."""
        return {
            "step": step,
            "next_sample": step * plan.global_batch_size,
            "global_batch_size": plan.global_batch_size,
            "plan": plan.model_dump(mode="json"),
            "spec_hash": self.spec_hash,
            # Dropout RNG and learning rate are pure functions of the step (see
            # runtime.step and optim.lr_at): resuming at `step` restores both exactly.
            "rng": "derived from (training.seed, step, rank)",
            "lr": lr_at(step, self.spec.training),
            # fp16: one scale for every rank, so any layout resumes with it
            **({} if self.scaler is None else {"loss_scale": self.scaler.record()}),
        }

    @functools.cached_property
    def spec_hash(self) -> str:
        return spec_hash(self.spec)
