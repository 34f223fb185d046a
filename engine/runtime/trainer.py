"""The one training loop of a rank: run steps, report them, apply new layouts.

:class:`Trainer` is the only code that iterates steps, whatever runs them: it owns the
hooks before and after the step and around the update, reporting, eval, the stop
vote, the step ledger and the survivors' hand-over. The step itself is a
:class:`~jobctl.engine.runtime.engine.StepEngine`'s: resident stages under an action
list (``runtime.engine.ResidentEngine``: the stage's action list for all micro-batches,
the gradient sum over replicas and tied stages, the optimizer update; the loss is the
global-batch mean, exactly what a single process would compute), N averaged models
(``averaging.engine``) or swapped stages (``mobius.engine``). Pruning, rebalancing,
checkpointing and chaos plug in as :class:`~jobctl.engine.runtime.hook.StepHook` s that
the worker builds; a hook's :class:`~jobctl.engine.runtime.hook.Relayout` is applied
here.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from jobctl.engine.core.events import EventLog, Kind
from jobctl.engine.core.plan import Plan
from jobctl.engine.model.blocks import ModelDef, Stage
from jobctl.engine.runtime.engine import StepEngine
from jobctl.engine.runtime.executor import StepStats
from jobctl.engine.runtime.failure import StepFailure, StepLedger, is_peer_failure
from jobctl.engine.runtime.hook import Relayout, StageState, StepEnd, StepHook
from jobctl.engine.runtime.loss_scale import loss_scaler
from jobctl.engine.runtime.optim import build_optimizer
from jobctl.engine.runtime.stop_vote import StopVote
from jobctl.engine.runtime.topology import build_topology, tie_blocks
from jobctl.engine.runtime.two_stage import v_state
from jobctl.engine.runtime.vitals import memory_fields
from jobctl.spec.sections import TrainingSpec


def build_state(
    mdef: ModelDef, training: TrainingSpec, plan: Plan, rank: int, device: torch.device
) -> StageState:
    """The stage state ``rank`` starts under: its stage of ``plan``, a fresh optimizer
    and, under fp16, a fresh loss scale (creates the process groups: collective, every
    rank in the same order); a rank hosting two stages (a plan's ``placement``: ZB-V)
    gets ``two_stage.v_state``."""
    if plan.placement is not None:
        split = (lambda topo: _shards(mdef, plan, topo, device)) if plan.T > 1 else None
        state = v_state(mdef, training, plan, rank, device, split)
    else:
        state = _one_stage(mdef, training, plan, rank, device)
    state.scaler = loss_scaler(training)
    return state


def _one_stage(
    mdef: ModelDef, training: TrainingSpec, plan: Plan, rank: int, device: torch.device
) -> StageState:
    """The state of a rank hosting one stage (split over its T group where T > 1)."""
    topo = build_topology(plan, rank, tie_blocks(mdef.ties))
    me = plan.stage_of(rank)
    stage = Stage(mdef, me.blocks, me.keep_blocks).to(device)
    tp = None
    if plan.T > 1:  # before the optimizer: the split parameters are new Parameters
        tp = _shards(mdef, plan, topo, device)
        tp.apply(stage)
        if (line := tp.outcome()) is not None:  # a fallback to plain TMP is never silent
            print(f"rank {rank} stage {me.index}: {line}", flush=True)
    named = dict(stage.named_parameters())
    opt = build_optimizer(list(named.values()), training)
    return StageState(plan, stage, named, opt, topo, me.action_list(), tp=tp)


def _shards(mdef: ModelDef, plan: Plan, topo, device: torch.device):  # noqa: ANN202
    """The stage's tensor-parallel split on its T group: a traced model's (its graph's
    column/row plan) or the builtin GPT's (its blocks' Megatron plan)."""
    # Here, not at the top: DTensor's import (sympy) cost every worker ~0.8 s of
    # its start-up, a relaunch after a lost node included, for T = 1 too.
    if mdef.graph is None:
        from jobctl.engine.model.gpt_tp import GPTShards

        return GPTShards(plan.T, topo.tp_group, topo.tp_ranks, device.type)
    from jobctl.engine.model.graph.tp_stage import StageShards

    return StageShards(
        mdef.graph,
        plan.T,
        topo.tp_group,
        topo.tp_ranks,
        device.type,
        subpipeline=plan.tp_subpipeline,
        m=plan.micro_batch_size,
    )


class Trainer:
    """The one training loop of a rank, over any :class:`~jobctl.engine.runtime.engine.
    StepEngine`; plug-ins (pruning, rebalancing, checkpointing, chaos) come as
    ``hooks``."""

    def __init__(
        self,
        training: TrainingSpec,
        engine: StepEngine,
        events: EventLog,
        hooks: list[StepHook] | None = None,
        start_step: int = 0,
        eval_data=None,  # noqa: ANN001 - the validation samples (``training.eval_every``)
    ):
        self.training, self.engine, self.events = training, engine, events
        self.rank, self.device = engine.rank, engine.device
        self.hooks, self.start_step = hooks or [], start_step
        self.eval_data = eval_data if training.eval_every else None
        self.stop_requested = False
        self.freed = False  # packed away by a hook's relayout
        self.stop_vote = StopVote()
        self.ledger = StepLedger(start_step)  # where this rank is, for a trapped failure

    @property
    def state(self) -> StageState | None:
        """The resident stage state this rank trains (None under a swapped engine)."""
        return self.engine.state

    @property
    def data(self):
        return self.engine.data

    def run(self) -> None:
        """Train from ``start_step`` to ``training.steps``, or until a stop or a pack;
        a lost peer raises :class:`~jobctl.engine.runtime.failure.StepFailure` with the
        state this rank holds (engine/worker/survival.py takes it from there: a hand-over
        where the engine allows one, else the newest checkpoint)."""
        self.engine.prepare()
        ok = False
        try:
            self._loop()
            ok = True
        except Exception as e:
            if not is_peer_failure(e):
                raise
            self.engine.cut_links()
            raise StepFailure(self.ledger.held(e, self._apply_pending)) from e
        finally:
            self.engine.finish(ok)

    def _apply_pending(self) -> None:
        """Apply the update of the step whose gradients are summed (and committed by
        some survivor) but which this rank had not applied when it trapped."""
        step = self.ledger.done
        self.engine.apply_pending(step, self.hooks)
        self.ledger.applied(step + 1)

    def _loop(self) -> None:
        last_report = None  # when the previous step was reported (its period's start)
        for step in range(self.start_step, self.training.steps):
            for hook in self.hooks:
                hook.before_step(step)
            stats, times = self.engine.train(step, self.hooks, self.ledger)
            self.ledger.applied(step + 1)
            loss = self.engine.global_loss(step + 1, stats, self.ledger)
            now = time.perf_counter()
            # What users see (step_time_s, samples/s) is the step's period: report to
            # report, so the previous step's checkpoint, pruning and rebalancing work and
            # this rank's wait for the pipeline's tail all count.
            self.report(step + 1, loss, now - (last_report or times.start), stats)
            last_report = now
            self.evaluate(step + 1)
            if not self._end_step(step + 1, stats, now - times.start):
                return
        self._stop_hooks(stopped=False)

    def _end_step(self, done: int, stats: StepStats, seconds: float) -> bool:
        """The hooks and the stop vote after step ``done``; False when this rank leaves
        the loop (stopped, or packed away)."""
        stopping = self.stop_vote.result()  # asked before the previous step ended
        for hook in self.hooks:  # pruning, rebalancing (which may move layers), checkpoints
            end = StepEnd(
                done, stats, seconds, self.engine.plan, self.state, stopping, self.engine.scaler
            )
            change = hook.after_step(end)
            if change is not None and not self.apply(change):
                return False  # packed away: this rank's part is done
        if stopping:
            self._stop_hooks(stopped=True)
            self.events.write(Kind.STOPPED, step=done, rank=self.rank)
            return False
        if done < self.training.steps:
            self.stop_vote.start(self.stop_requested, self.engine.vote_group)
        return True

    def _stop_hooks(self, stopped: bool) -> None:
        for hook in self.hooks:
            hook.on_stop(stopped)

    def apply(self, change: Relayout) -> bool:
        """Train on under a hook's new layout; False if it packed this rank away."""
        if change.state is None:
            self.freed = True
            self._stop_hooks(stopped=False)  # its checkpoint parts are written first
            change.settled(None)
            return False
        t1 = time.perf_counter()
        self.engine.relayout(change.state)
        # Every live rank can train again: the next step would wait for the slowest rank
        # anyway, so the leader's clock now holds the move's whole cost.
        dist.barrier(group=self.engine.vote_group)
        change.settled(time.perf_counter() - t1)
        return True

    def evaluate(self, done: int) -> None:
        """The eval loss every ``training.eval_every`` steps and after the last."""
        every, steps = self.training.eval_every, self.training.steps
        if self.eval_data is None or (done % every and done != steps):
            return
        loss = self.engine.eval_loss(self.eval_data, done)
        if self.engine.reporter:
            self.events.write(Kind.EVAL, step=done, eval_loss=loss)

    def request_stop(self) -> None:
        """Ask for a checkpoint-then-exit (SIGTERM): all ranks stop together, at the end
        of the step after the one this lands in (see :class:`StopVote`)."""
        self.stop_requested = True
        me = self.engine.plan.rank(self.rank)
        self.events.write(Kind.SIGTERM, rank=self.rank, node=me.node)

    def report(self, step: int, loss: float | None, seconds: float, stats: StepStats) -> None:
        """Heartbeat (every rank), step record (the reporter) and a log line every
        ``training.log_every`` steps (this rank's stdout, ``jobctl logs --rank``)."""
        plan = self.engine.plan
        me = plan.rank(self.rank)
        self.events.write(
            Kind.HEARTBEAT,
            step=step,
            rank=self.rank,
            stage=me.stage,
            node=me.node,
            **self.engine.heartbeat(stats),
            **memory_fields(self.device),
        )
        samples_per_s = plan.global_batch_size / seconds
        skipped = getattr(self.engine.scaler, "skipped", False)  # fp16: an overflow
        if step % self.training.log_every == 0:
            shown = "-" if loss is None else f"{loss:.4f}"
            note = " (update skipped: fp16 overflow)" if skipped else ""
            print(f"step {step} loss {shown} samples/s {samples_per_s:.1f}{note}", flush=True)
        if not self.engine.reporter:
            return
        self.ledger.reported = step
        self.events.write(
            Kind.STEP,
            step=step,
            loss=loss,
            step_time_s=seconds,
            samples_per_s=samples_per_s,
            deviations=stats.deviations,
            epoch=self.data.epoch((step - 1) * plan.global_batch_size),
            **({"skipped": True} if skipped else {}),
        )
