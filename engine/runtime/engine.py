"""How one rank runs a step: the step-engine protocol the one training loop drives.

``runtime.trainer.Trainer`` is the only code that iterates steps: it owns the hooks
around the step and the update, reporting, eval, the stop vote, the step ledger and
the survivors' hand-over. What differs between the ways of running a step lives in a
:class:`StepEngine`:

* :class:`ResidentEngine` (here): this rank's stages stay in device memory and run an
  action list (gpipe, 1f1b, varuna with its opportunistic order, shifted critical
  path, advance forward, zb_h1; several stages per rank under a per-device placement:
  zb_v), then the gradient sum over replicas and tied stages, the step commit, the
  fp16 overflow agreement and the optimizer update;
* ``averaging.engine.AveragingEngine``: a resident engine whose step trains N parallel
  models and a reference (AvgPipe);
* ``mobius.engine.SwappedEngine``: stages swapped through the tier below device memory
  (Mobius).

An engine is built from typed parts (:class:`EngineConfig`, the rank's state, the
model definition), never the whole spec.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.distributed as dist

from jobctl.engine.core.plan import Plan
from jobctl.engine.data.dataset import Sharding
from jobctl.engine.data.prefetch import prefetching
from jobctl.engine.model.blocks import ModelDef
from jobctl.engine.runtime.evaluation import eval_loss
from jobctl.engine.runtime.executor import StepExecutor, StepStats
from jobctl.engine.runtime.failure import StepLedger, commit_step
from jobctl.engine.runtime.hook import StageState, StepHook
from jobctl.engine.runtime.loss_scale import agree_found_inf, attach_scaler
from jobctl.engine.runtime.optim import lr_at, set_lr, sync_gradients, tied_names
from jobctl.engine.runtime.p2p.gloo import comm_device, pg_timeout_s
from jobctl.engine.runtime.p2p.shm import connect, connect_neighbours, poll_where_cores_allow
from jobctl.engine.runtime.step import StepTimes, autocast, probe_channels, train_step
from jobctl.engine.runtime.two_stage import RankStages, v_executor
from jobctl.engine.runtime.vitals import compute_fields
from jobctl.spec.sections import TrainingSpec


@dataclass(frozen=True)
class EngineConfig:
    """What a step engine reads of the job, typed (``worker.assembly.engine_config``)."""

    training: TrainingSpec
    seq_len: int
    one_machine: bool  # every "node" is this machine (HardwareSpec.one_machine)
    opportunistic: bool  # Varuna's order: run what has arrived (T = 1 only)
    commits: bool  # the step commit: survivors can hand a step over (elastic, D > 1)


class StepEngine(Protocol):
    """One way of running a training step on this rank, as the loop sees it."""

    rank: int
    device: torch.device
    state: StageState | None  # the resident stage state (None: swapped)

    @property
    def plan(self) -> Plan: ...  # the layout this rank trains under now
    @property
    def data(self): ...  # the training data (its ``epoch``; closed on a re-form)
    @property
    def reporter(self) -> bool: ...  # writes the step and eval records
    @property
    def vote_group(self): ...  # the group the stop vote runs over
    @property
    def scaler(self): ...  # fp16's loss scale, or None
    @property
    def hand_over_refusal(self) -> str | None: ...  # why survivors cannot hand a step over

    def prepare(self) -> None:
        """Ready the first step (probe shapes, open links)."""

    def train(
        self, step: int, hooks: Sequence[StepHook], ledger: StepLedger
    ) -> tuple[StepStats, StepTimes]:
        """Loop step ``step``: forward, backward, sync and update (between the hooks'
        ``before_update`` and ``after_update``)."""

    def global_loss(self, step: int, stats: StepStats, ledger: StepLedger) -> float | None:
        """The global-batch loss of ``step`` on the reporter's side, else None."""

    def eval_loss(self, eval_data, done: int) -> float | None:
        """The eval loss of the model after ``done`` steps (collective): on the ranks
        that hold the last stage, None on the others."""

    def heartbeat(self, stats: StepStats) -> dict:
        """This rank's compute fields (and the engine's own) for the heartbeat."""

    def relayout(self, state: StageState) -> None:
        """Train on under a hook's new stage state."""

    def apply_pending(self, step: int, hooks: Sequence[StepHook]) -> None:
        """Apply the summed but unapplied update of ``step`` (a hand-over)."""

    def cut_links(self) -> None:
        """Close the links to the neighbours (a peer waiting on one hears it)."""

    def finish(self, ok: bool) -> None:
        """The loop is over (``ok``: it ended without an error); release what is held."""


def same_machine(one_machine: bool, plan: Plan, rank: int) -> Callable[[int], bool]:
    """``peer -> bool``: does ``peer`` run on ``rank``'s machine (shared memory reaches it)?

    Where every "node" is this machine (``HardwareSpec.one_machine``, as the planner's
    ``Hosting.one_host`` has it), ranks on other "nodes" are reached through shared
    memory too, not gloo's loopback TCP (which cost a 4-stage pipeline over two local
    "nodes" 8 % of its step on 2 cores). Elsewhere, a node is a machine.
    """
    if one_machine:
        return lambda peer: True
    me = plan.rank(rank).node
    return lambda peer: plan.rank(peer).node == me


class ResidentEngine:
    """This rank's stages held in device memory, run under the plan's action list."""

    def __init__(
        self, cfg: EngineConfig, state: StageState, mdef: ModelDef, device: torch.device, data
    ):
        self.cfg, self.state, self.device = cfg, state, device
        self.rank = state.topo.rank
        self.ties = tied_names(mdef.ties)
        self.tie_groups, self.tie_shapes = mdef.ties, mdef.tie_shapes()
        plan = state.plan
        self.shard = Sharding(plan.global_batch_size, plan.D, plan.micro_batch_size)
        self._data = prefetching(data, self.shard, state.topo.replica, device)
        self.executor: StepExecutor | None = None  # the latest make_executor's

    @property
    def plan(self) -> Plan:
        return self.state.plan

    @property
    def data(self):
        return self._data

    @property
    def reporter(self) -> bool:
        return self.state.topo.is_reporter

    @property
    def vote_group(self):
        return self.state.live_group

    @property
    def scaler(self):
        return self.state.scaler

    @property
    def hand_over_refusal(self) -> str | None:
        """Why a lost peer's survivors cannot hand this step over (None: they can, from
        whole blocks); the run then resumes from its newest checkpoint."""
        if self.state.plan.T > 1:  # a split stage's whole tensors need its whole T group
            return "tensor-parallel shards are not handed over (T > 1)"
        if isinstance(self.state.stage, RankStages):  # the decision picks one stage a rank
            return "ZB-V's two stages per rank are not handed over"
        return None

    def compute(self) -> contextlib.AbstractContextManager:
        """The step's compute context (autocast under bf16 and fp16)."""
        return autocast(self.cfg.training.precision, self.device)

    def prepare(self) -> None:
        self.make_executor()

    def relayout(self, state: StageState) -> None:
        state.scaler = self.state.scaler  # one loss scale for the run's life
        self.state = state
        self.make_executor()  # the pipeline probes its new activation shapes

    def make_executor(self) -> StepExecutor:
        """Probe activation shapes down the pipeline and build the step executor, with
        shared-memory links to the neighbours on this machine (replacing any earlier)."""
        st = self.state
        if isinstance(st.stage, RankStages):  # two stages on this rank (ZB-V)
            return self._v_executor(st.stage)
        chans = probe_channels(
            st.stage, st.topo, self.shard.micro_batch, self.cfg.seq_len, self.device, self.compute
        )
        self.cut_links()
        here = same_machine(self.cfg.one_machine, st.plan, self.rank)
        links = connect_neighbours(
            st.topo, chans, self.device, here, pg_timeout_s(), self.shard.micro_batches
        )
        poll_where_cores_allow(links, sum(here(r) for r in range(st.plan.world_size)))
        # Varuna's deviations follow message arrival, which may differ between the T ranks
        # of a stage; their all-reduces need one order, so a T group keeps the schedule's
        self.executor = StepExecutor(
            st.stage,
            st.topo,
            self._data,
            self.shard,
            chans,
            self.device,
            opportunistic=self.cfg.opportunistic and st.plan.T == 1,
            links=links,
        )
        attach_scaler(self.executor, st.scaler)
        return self.executor

    def _v_executor(self, whole: RankStages):  # noqa: ANN202 - TwoStageExecutor
        """``make_executor`` for a rank hosting two stages: a link per stage boundary."""
        self.cut_links()
        here = same_machine(self.cfg.one_machine, self.state.plan, self.rank)
        timeout, M = pg_timeout_s(), self.shard.micro_batches

        def link(peer: int, shape: tuple, dtype: torch.dtype):  # noqa: ANN202
            return connect(peer, shape, dtype, self.device, here(peer), timeout, M)

        self.executor = v_executor(
            whole, self._data, self.shard, self.cfg.seq_len, self.device, self.compute, link
        )  # type: ignore[assignment]
        local = sum(here(r) for r in range(self.state.plan.world_size))
        for ex in self.executor.by_stage.values():
            poll_where_cores_allow(ex.links, local)
        attach_scaler(self.executor, self.state.scaler)
        return self.executor

    def train(
        self, step: int, hooks: Sequence[StepHook], ledger: StepLedger
    ) -> tuple[StepStats, StepTimes]:
        """Loop step ``step`` on the current layout (see ``runtime.step.train_step``)."""
        st = self.state
        ledger.begin()
        # A T group shares one seed: dropout outside the split layers is the same on all
        seed_rank = self.rank // st.plan.T
        return train_step(
            _Recorded(self.executor, ledger),
            st.actions,
            st.opt,
            self.cfg.training,
            step,
            seed_rank,
            compute=self.compute,
            hooks=hooks,
            sync=lambda: self._sync_and_commit(step + 1, ledger),
        )

    def _sync_and_commit(self, step: int, ledger: StepLedger) -> bool:
        """Sum gradients over replicas and tied stages, then the step's commit (which
        sums the loss too; see engine/runtime/failure.py) before any rank updates.
        Under fp16 the gradients are unscaled and the world agrees on an overflow
        (carried by the commit where there is one); True: every rank skips."""
        st = self.state
        sync_gradients(st.named, st.topo, self.ties, self.tie_groups, self.tie_shapes)
        found = st.scaler is not None and st.scaler.unscale(list(st.named.values()))
        ledger.ready = True
        if self.cfg.commits:
            # shard 0 only: a T group's ranks each hold the whole loss, summed once
            last = st.topo.is_last and st.topo.t == 0
            loss, found = commit_step(ledger.stats.loss_sum, last, st.live_group, found)
            ledger.committed(step, loss)
        elif st.scaler is not None:
            found = agree_found_inf(found, st.live_group)
        if st.scaler is not None:
            st.scaler.update(found)
        return found

    def global_loss(self, step: int, stats: StepStats, ledger: StepLedger) -> float | None:
        """Global-batch mean loss of ``step`` on last-stage ranks (summed by its commit,
        or here over the stage's replicas)."""
        topo = self.state.topo
        if not topo.is_last:
            return None
        if step in ledger.losses:
            return ledger.losses[step]
        total = torch.tensor([float(stats.loss_sum)], dtype=torch.float64, device=comm_device())
        if topo.dp_group is not None:
            dist.all_reduce(total, group=topo.dp_group)
        return float(total)

    def eval_loss(self, eval_data, done: int) -> float | None:
        with self.compute():  # the training numerics (the channels were probed so)
            return eval_loss(self.executor, self.state, eval_data)

    def heartbeat(self, stats: StepStats) -> dict:
        return compute_fields(stats, self.state.plan.micro_batches)

    def apply_pending(self, step: int, hooks: Sequence[StepHook]) -> None:
        """Apply the update of ``step``, whose gradients are summed (and committed by
        some survivor) but which this rank had not applied when it trapped."""
        st = self.state
        for hook in hooks:
            hook.before_update()
        set_lr(st.opt, lr_at(step, self.cfg.training))
        if st.scaler is None or not st.scaler.pending_skip():
            st.opt.step()
        for hook in hooks:
            hook.after_update()

    def cut_links(self) -> None:
        """Close this rank's shared-memory links, so a neighbour still waiting on one
        hears that this rank left (a peer-gone) instead of waiting out the timeout."""
        if self.executor is not None:
            self.executor.close()

    def finish(self, ok: bool) -> None:
        """Nothing beyond the links, which a re-form or the process's exit closes."""


class _Recorded:
    """The step executor, noting each run's stats in the ledger (the commit sums their
    loss before the update)."""

    def __init__(self, executor: StepExecutor, ledger: StepLedger):
        self.executor, self.ledger = executor, ledger

    def run(self, actions, step: int) -> StepStats:
        self.ledger.stats = self.executor.run(actions, step)
        return self.ledger.stats
