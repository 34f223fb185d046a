"""A rank of a ``parallelism.schedule: mobius`` run (a plan with ``Plan.mobius``).

``MobiusTrainer`` is what ``worker.process`` drives for such a plan, in place of
``runtime.trainer.Trainer``: the same events (a heartbeat from every rank, the step
record with the global-batch loss from the rank of the last stage, STOPPED), the
same stop protocol (a SIGTERM or ``jobctl stop`` votes at a step's end, all ranks
checkpoint the step after; ``runtime.trainer.StopVote``) and the same checkpoints
(``checkpoint.hook.Checkpointing``'s writer, the block format: ``mobius.checkpoint``),
over an ``engine.mobius.MobiusRunner`` that swaps this rank's stages through the
tier below device memory: files under ``<run>/mobius/rank-<r>/`` on a CPU device,
pinned host memory on CUDA, held to ``hardware.memory_gb`` per process.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import torch.distributed as dist

from jobctl.engine.channel.client import event_sink
from jobctl.engine.checkpoint.blocks import read_meta
from jobctl.engine.checkpoint.hook import Checkpointing
from jobctl.engine.core.events import Kind
from jobctl.engine.core.plan import Plan
from jobctl.engine.data.dataset import make_data
from jobctl.engine.mobius import checkpoint as mobius_checkpoint
from jobctl.engine.mobius.runtime import MobiusRunner, SwapConfig
from jobctl.engine.model.blocks import model_def
from jobctl.engine.runtime.trainer import StopVote
from jobctl.engine.runtime.vitals import memory_fields
from jobctl.spec.job import JobSpec

#: hardware.memory_gb's unit (the planner's GB).
GB = 1024**3


def swap_config(spec: JobSpec, plan: Plan, run_dir: Path, rank: int) -> SwapConfig:
    """This rank's ``SwapConfig`` from the plan's Mobius record."""
    lay = plan.mobius
    assert lay is not None
    return SwapConfig(
        run_dir / "mobius",
        tuple(tuple(s) for s in lay.stages),
        plan.micro_batch_size,
        prefetch=lay.prefetch,
        budget_bytes=int(spec.hardware.memory_gb * GB),
        rank=rank,
        world=lay.N,
        placement=tuple(lay.ranks),
    )


class MobiusTrainer:
    """One rank of a Mobius run: steps, events, stop votes and checkpoints."""

    freed = False  # a Mobius run is never packed

    def __init__(self, spec: JobSpec, plan: Plan, run_dir: Path, rank: int, device, resume):
        self.spec, self.plan, self.rank, self.device = spec, plan, rank, device
        self.events = event_sink(run_dir, rank, plan.rank(rank).node)
        self.mdef = model_def(spec.model, spec.training.seed, plan.micro_batch_size)
        self.cfg = swap_config(spec, plan, run_dir, rank)
        # Boundary tensors travel as CPU tensors (gloo, also under NCCL); the stop vote
        # on a group of its own, apart from the links' sends.
        links, self.vote_group = dist.new_group(backend="gloo"), dist.new_group()
        self.data = make_data(spec)
        self.runner = MobiusRunner(self.mdef, spec.training, self.data, self.cfg, device, links)
        self.checkpoints = Checkpointing(spec, plan, rank, run_dir, self.events, self.mdef.ties)
        self.start_step = 0 if resume is None else self._resume(Path(resume))
        self.checkpoints.clear_stale_staging()
        self.stop_vote, self.stop_requested = StopVote(), False
        self.reporter = rank == plan.mobius.ranks[-1]  # the last stage's loss
        dist.barrier()  # nobody stages before stale staging folders are gone

    def _resume(self, ckpt_dir: Path) -> int:
        meta = read_meta(ckpt_dir)
        if meta["global_batch_size"] != self.plan.global_batch_size:
            raise ValueError(f"checkpoint global batch {meta['global_batch_size']} != spec's")
        mobius_checkpoint.load(self.runner, self.mdef.ties, ckpt_dir)
        return int(meta["step"])

    def request_stop(self) -> None:
        """Checkpoint and leave at the end of the step after this one (all ranks)."""
        self.stop_requested = True
        self.events.write(Kind.SIGTERM, rank=self.rank, node=self.plan.rank(self.rank).node)

    def run(self) -> None:
        """Train from the start step to ``training.steps``, or until a stop."""
        try:
            for step in range(self.start_step, self.spec.training.steps):
                t0 = time.perf_counter()
                loss = self.runner.step(step)
                self.report(step + 1, loss, time.perf_counter() - t0)
                if not self._end_step(step + 1):
                    return
            self.checkpoints.on_stop(False)
        finally:
            self.runner.close()
            shutil.rmtree(self.cfg.folder / f"rank-{self.rank}", ignore_errors=True)

    def _end_step(self, done: int) -> bool:
        """Checkpoint where due, then the stop vote; False once the run stops here."""
        stopping = self.stop_vote.result()  # asked before the previous step ended
        total = self.spec.training.steps
        if stopping or done % self.spec.checkpoint.interval == 0 or done == total:
            snap = mobius_checkpoint.snapshot(self.runner, self.mdef.ties)
            meta = self.checkpoints.meta(self.plan, done)
            self.checkpoints.manager.save(done, snap, meta, final=stopping or done == total)
        self.checkpoints.manager.poll()
        if stopping:
            self.checkpoints.on_stop(True)
            self.events.write(Kind.STOPPED, step=done, rank=self.rank)
            return False
        if done < total:
            self.stop_vote.start(self.stop_requested, self.vote_group)
        return True

    def report(self, step: int, loss: float | None, seconds: float) -> None:
        """Heartbeat (every rank) and the step record (the last stage's rank). The
        runner does not split compute from waits: compute_s is the step's seconds."""
        me = self.plan.rank(self.rank)
        self.events.write(
            Kind.HEARTBEAT,
            step=step,
            rank=self.rank,
            stage=me.stage,
            node=me.node,
            compute_s=seconds,
            **memory_fields(self.device),
        )
        samples_per_s = self.plan.global_batch_size / seconds
        if step % self.spec.training.log_every == 0:
            shown = "-" if loss is None else f"{loss:.4f}"
            print(f"step {step} loss {shown} samples/s {samples_per_s:.1f}", flush=True)
        if self.reporter:
            self.events.write(
                Kind.STEP,
                step=step,
                loss=loss,
                step_time_s=seconds,
                samples_per_s=samples_per_s,
                deviations=0,
                epoch=self.data.epoch((step - 1) * self.plan.global_batch_size),
            )
