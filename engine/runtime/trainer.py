"""The training loop of one worker: build the stage, run steps, report, checkpoint.

One optimizer step = the stage's action list for all micro-batches (gradient
accumulation keeps the global batch fixed), then the gradient sum over replicas and
tied stages, then the optimizer update. The loss of the step is the sum of the last
stage's weighted micro-batch losses over its replicas: the global-batch mean, exactly
what a single process would compute.
"""

from __future__ import annotations

import contextlib
import functools
import os
import resource
import time
from pathlib import Path

import torch
import torch.distributed as dist

from jobctl.engine.channel.client import event_sink
from jobctl.engine.checkpoint.blocks import (
    blocks_written_by,
    load_blocks,
    read_meta,
    snapshot_blocks,
)
from jobctl.engine.checkpoint.manager import CheckpointManager
from jobctl.engine.core.actions import Action
from jobctl.engine.core.events import Kind
from jobctl.engine.core.plan import Plan
from jobctl.engine.data.dataset import Sharding, make_data
from jobctl.engine.model.blocks import Stage, block_seed, model_def
from jobctl.engine.pruning.pruner import Pruner
from jobctl.engine.rebalance.hook import Rebalancer
from jobctl.engine.runtime.executor import Channels, StepExecutor, StepStats
from jobctl.engine.runtime.optim import build_optimizer, lr_at, set_lr, sync_gradients, tied_names
from jobctl.engine.runtime.p2p.gloo import comm_device, pg_timeout_s, recv_meta, send_meta
from jobctl.engine.runtime.p2p.shm import connect_neighbours
from jobctl.engine.runtime.topology import build_topology
from jobctl.spec import spec_hash


def _max_rss_mb() -> float:
    """Peak resident memory of this process (CPU) in MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _rss_mb() -> float:
    """Resident memory of this process now, in MiB (/proc; the peak where there is none)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return _max_rss_mb()
    return pages * resource.getpagesize() / 2**20


def memory_fields(device: torch.device) -> dict:
    """A heartbeat's memory: the CUDA allocator's peak on a GPU, the process RSS on CPU."""
    out = {"max_rss_mb": _max_rss_mb()}
    if device.type == "cuda":
        out.update(mem_mb=torch.cuda.max_memory_allocated(device) / 2**20, mem_kind="cuda_peak")
    else:
        out.update(mem_mb=_rss_mb(), mem_kind="rss")
    return out


def compute_fields(stats: StepStats, micro_batches: int) -> dict:
    """Per-micro-batch compute of one step: forward (recomputes included) and backward
    means in ms, and their sum in seconds (``compute_s``, what the straggler detector
    compares with the stage peers). Waits for peers are not compute and not counted."""
    n = max(1, micro_batches)
    fwd, bwd = sum(stats.fwd_s) / n, sum(stats.bwd_s) / n
    return {"fwd_ms": 1e3 * fwd, "bwd_ms": 1e3 * bwd, "compute_s": fwd + bwd}


def same_machine(spec, plan: Plan, rank: int):
    """``peer -> bool``: does ``peer`` run on ``rank``'s machine (shared memory reaches it)?

    Where every "node" is this machine (``HardwareSpec.one_machine``, as the planner's
    ``Hosting.one_host`` has it), ranks on other "nodes" are reached through shared
    memory too, not gloo's loopback TCP (which cost a 4-stage pipeline over two local
    "nodes" 8 % of its step on 2 cores). Elsewhere, a node is a machine.
    """
    if spec.hardware.one_machine:
        return lambda peer: True
    me = plan.rank(rank).node
    return lambda peer: plan.rank(peer).node == me


class StopVote:
    """Do all ranks stop? Agreed one step behind, off the critical path.

    A rank asked to stop (SIGTERM, ``jobctl stop``) votes at the end of a step; the vote
    (an asynchronous MAX all-reduce over the training ranks) runs while the next step
    trains, and its result is read after that step. Every rank reads the same result
    after the same step, so all checkpoint the same step, one step after the request,
    and no rank waits for the others between steps (a blocking vote after every step
    made each rank wait for the pipeline's slowest rank there).
    """

    def __init__(self) -> None:
        self.flag: torch.Tensor | None = None
        self.work = None

    def start(self, want: bool, group=None) -> None:
        self.flag = torch.tensor([1 if want else 0], dtype=torch.int32, device=comm_device())
        self.work = dist.all_reduce(self.flag, op=dist.ReduceOp.MAX, group=group, async_op=True)

    def result(self) -> bool:
        """The vote started after the previous step (False if none was)."""
        if self.work is None:
            return False
        self.work.wait()
        self.work = None
        return bool(self.flag.item())


class Trainer:
    """Everything one rank needs to train its stage."""

    def __init__(self, spec, plan: Plan, run_dir: Path, rank: int, device: torch.device):
        self.spec, self.plan, self.run_dir, self.rank, self.device = (
            spec,
            plan,
            run_dir,
            rank,
            device,
        )
        self.mdef = model_def(spec.model, spec.training.seed)
        self.topo = build_topology(plan, rank, bool(self.mdef.ties))
        me = plan.stage_of(rank)
        self.actions: list[Action] = me.action_list()
        self.stage = Stage(self.mdef, me.blocks).to(device)
        self.named = dict(self.stage.named_parameters())
        self.opt = build_optimizer(list(self.named.values()), spec.training)
        self.ties = tied_names(self.mdef.ties)
        self.shard = Sharding(plan.global_batch_size, plan.D, plan.micro_batch_size)
        self.data = make_data(spec)
        self.start_step = 0
        self.stop_requested = False
        # The run's channel (with liveness pings from this rank's node), else metrics.jsonl.
        self.events = event_sink(run_dir, rank, plan.rank(rank).node)
        root = Path(spec.checkpoint.local_dir or run_dir / "checkpoints")
        shared = os.environ.get("JOBCTL_SHARED_CKPT_DISK", "1") == "1"
        self.ckpt = CheckpointManager(spec, plan, rank, root, self.events, shared)
        self.pruner = (
            Pruner(
                spec,
                self.stage,
                self.named,
                self.opt,
                self.topo,
                self.mdef.ties,
                self.events,
                micro_batch=self.plan.micro_batch_size,
            )
            if spec.pruning.enabled
            else None
        )
        self.live_group = None  # the ranks still training, once packing freed some
        self._executor: StepExecutor | None = None  # the latest make_executor's
        self.rebalancer = Rebalancer(self) if spec.rebalancing.enabled else None
        self.stop_vote = StopVote()

    def _autocast(self):
        if self.spec.training.precision == "bf16":
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def probe_shapes(self) -> Channels:
        """Propagate activation shapes down the pipeline with one dry forward per stage."""
        t = self.topo
        if t.is_first:
            x = torch.zeros(self.shard.micro_batch, self.spec.model.seq_len, dtype=torch.long)
            in_shape, in_dtype = None, None
        else:
            in_shape, in_dtype = recv_meta(t.prev)
            x = torch.zeros(in_shape, dtype=in_dtype)
        with torch.no_grad(), torch.random.fork_rng(devices=[]), self._autocast():
            out = self.stage(x.to(self.device))
        if t.next is not None:
            send_meta(out, t.next)
        return Channels(in_shape, in_dtype, tuple(out.shape), out.dtype)

    def resume_from(self, ckpt_dir: Path) -> None:
        """Load weights and optimizer state; continue at the checkpoint's next sample."""
        meta = read_meta(ckpt_dir)
        if meta["global_batch_size"] != self.plan.global_batch_size:
            raise ValueError(f"checkpoint global batch {meta['global_batch_size']} != spec's")
        load_blocks(self.stage, self.opt, ckpt_dir, self.mdef.ties)
        self.start_step = int(meta["step"])
        if self.pruner is not None:
            self.pruner.load(ckpt_dir, self.start_step)

    def run(self) -> None:
        if f"rank-{self.rank}" == self.ckpt.local_parts[0]:
            self.ckpt.clear_stale_staging()
        dist.barrier()  # nobody stages before stale staging folders are gone
        ex = self.make_executor()
        total = self.spec.training.steps
        if self.pruner is not None and self.start_step == 0:
            self.pruner.maybe_prune(0)  # a schedule may start before the first step
        last_report = None  # when the previous step was reported (its period's start)
        for step in range(self.start_step, total):
            t0 = time.perf_counter()
            with self.pruner.profile_step(step) if self.pruner else contextlib.nullcontext():
                stats = self.train_step(ex, step)
            loss = self.global_loss(stats)
            now = time.perf_counter()
            seconds = now - t0
            # What users see (step_time_s, samples/s) is the step's period: report to
            # report, so the previous step's checkpoint, pruning and rebalancing work and
            # this rank's wait for the pipeline's tail all count.
            self.report(step + 1, loss, now - (last_report or t0), stats)
            last_report = now
            done = step + 1
            stopping = self.stop_vote.result()  # asked before the previous step ended
            if self.pruner is not None:
                self.pruner.maybe_prune(done)  # after step `done`'s optimizer step
            if self.rebalancer is not None:  # after a profiled step: move layers, or pack
                ex = self.rebalancer.after_step(done, stats, seconds) or ex
                if self.rebalancer.freed:  # packed away: this rank's part is done
                    return
            if not stopping and done < total:
                self.stop_vote.start(self.stop_requested, self.live_group)
            if stopping or done % self.spec.checkpoint.interval == 0 or done == total:
                self.checkpoint(done, final=stopping or done == total)
            self.ckpt.poll()
            if stopping:
                self.ckpt.close(timeout=self.STOP_UPLOAD_GRACE_S)
                self.events.write(Kind.STOPPED, step=done, rank=self.rank)
                return
        self.ckpt.close()  # the final checkpoint must reach the remote store

    STOP_UPLOAD_GRACE_S = 20.0  # a preempted machine has little time left

    def make_executor(self) -> StepExecutor:
        """Probe activation shapes down the pipeline and build the step executor, with
        shared-memory links to the neighbours on this machine (replacing any earlier)."""
        chans = self.probe_shapes()
        if self._executor is not None:
            self._executor.close()
        links = connect_neighbours(
            self.topo,
            chans,
            self.device,
            same_machine(self.spec, self.plan, self.rank),
            pg_timeout_s(),
            self.shard.micro_batches,
        )
        self._executor = StepExecutor(
            self.stage,
            self.topo,
            self.data,
            self.shard,
            chans,
            self.device,
            opportunistic=self.spec.parallelism.schedule == "varuna",
            links=links,
        )
        return self._executor

    def request_stop(self) -> None:
        """Ask for a checkpoint-then-exit (SIGTERM): all ranks stop together, at the end
        of the step after the one this lands in (see :class:`StopVote`)."""
        self.stop_requested = True
        me = self.plan.rank(self.rank)
        self.events.write(Kind.SIGTERM, rank=self.rank, node=me.node)

    def train_step(self, ex: StepExecutor, step: int) -> StepStats:
        # The RNG (dropout) is a pure function of (seed, step, stage, replica): runs are
        # reproducible and a resumed run needs no saved RNG state.
        torch.manual_seed(block_seed(self.spec.training.seed, 1_000_000 + step * 4096 + self.rank))
        self.opt.zero_grad(set_to_none=True)
        with self._autocast():
            stats = ex.run(self.actions, step)
        sync_gradients(self.named, self.topo, self.ties)
        if self.pruner is not None:
            self.pruner.mask_grads()
        set_lr(self.opt, lr_at(step, self.spec.training))
        self.opt.step()
        if self.pruner is not None:
            self.pruner.after_step()
        return stats

    def global_loss(self, stats: StepStats) -> float | None:
        """Global-batch mean loss, on last-stage ranks."""
        if not self.topo.is_last:
            return None
        total = torch.tensor([stats.loss_sum], dtype=torch.float64, device=comm_device())
        if self.topo.dp_group is not None:
            dist.all_reduce(total, group=self.topo.dp_group)
        return float(total)

    def report(self, step: int, loss: float | None, seconds: float, stats: StepStats) -> None:
        me = self.plan.rank(self.rank)
        self.events.write(
            Kind.HEARTBEAT,
            step=step,
            rank=self.rank,
            stage=me.stage,
            node=me.node,
            **compute_fields(stats, self.plan.micro_batches),
            **memory_fields(self.device),
        )
        if not self.topo.is_reporter:
            return
        self.events.write(
            Kind.STEP,
            step=step,
            loss=loss,
            step_time_s=seconds,
            samples_per_s=self.plan.global_batch_size / seconds,
            deviations=stats.deviations,
        )

    def checkpoint(self, step: int, final: bool = False) -> None:
        """Snapshot this rank's blocks; a background writer does the rest.

        No barrier: each rank records its part, and the part that completes the set
        writes the manifest and renames the staging folder (atomic commit), then queues
        the background upload.
        """
        mine = blocks_written_by(self.plan, self.rank)
        masks = self.pruner.masks if self.pruner is not None else None
        snap = snapshot_blocks(self.stage, self.opt, mine, self.mdef.ties, masks)
        meta = {
            "step": step,
            "next_sample": step * self.plan.global_batch_size,
            "global_batch_size": self.plan.global_batch_size,
            "plan": self.plan.model_dump(mode="json"),
            "spec_hash": self.spec_hash,
            # Dropout RNG and learning rate are pure functions of the step (see
            # train_step and optim.lr_at): resuming at `step` restores both exactly.
            "rng": "derived from (training.seed, step, rank)",
            "lr": lr_at(step, self.spec.training),
        }
        self.ckpt.save(step, snap, meta, final=final)

    @functools.cached_property
    def spec_hash(self) -> str:
        return spec_hash(self.spec)
