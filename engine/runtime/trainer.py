"""The training loop of one worker: run steps, report them, apply new layouts.

One optimizer step (``runtime.step.train_step``) = the stage's action list for all
micro-batches (gradient accumulation keeps the global batch fixed), then the gradient
sum over replicas and tied stages, then the optimizer update. The loss of the step is
the sum of the last stage's weighted micro-batch losses over its replicas: the
global-batch mean, exactly what a single process would compute. Pruning, rebalancing
and checkpointing plug in as :class:`~jobctl.engine.runtime.hook.StepHook` s that the
worker builds; a hook's :class:`~jobctl.engine.runtime.hook.Relayout` is applied here.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from jobctl.engine.core.events import EventLog, Kind
from jobctl.engine.core.plan import Plan
from jobctl.engine.data.dataset import Sharding, make_data, make_eval_data
from jobctl.engine.data.prefetch import prefetching
from jobctl.engine.model.blocks import ModelDef, Stage
from jobctl.engine.runtime.evaluation import eval_loss
from jobctl.engine.runtime.executor import StepExecutor, StepStats
from jobctl.engine.runtime.failure import StepFailure, StepLedger, commit_step, is_peer_failure
from jobctl.engine.runtime.hook import Relayout, StageState, StepEnd, StepHook
from jobctl.engine.runtime.loss_scale import agree_found_inf, attach_scaler, loss_scaler
from jobctl.engine.runtime.optim import build_optimizer, lr_at, set_lr, sync_gradients, tied_names
from jobctl.engine.runtime.p2p.gloo import comm_device, pg_timeout_s
from jobctl.engine.runtime.p2p.shm import connect, connect_neighbours, poll_where_cores_allow
from jobctl.engine.runtime.step import StepTimes, autocast, probe_channels, train_step
from jobctl.engine.runtime.stop_vote import StopVote
from jobctl.engine.runtime.topology import build_topology, tie_blocks
from jobctl.engine.runtime.two_stage import RankStages, v_executor, v_state
from jobctl.engine.runtime.vitals import compute_fields, memory_fields
from jobctl.spec.job import JobSpec
from jobctl.spec.sections import HardwareSpec, TrainingSpec


def same_machine(hardware: HardwareSpec, plan: Plan, rank: int):
    """``peer -> bool``: does ``peer`` run on ``rank``'s machine (shared memory reaches it)?

    Where every "node" is this machine (``HardwareSpec.one_machine``, as the planner's
    ``Hosting.one_host`` has it), ranks on other "nodes" are reached through shared
    memory too, not gloo's loopback TCP (which cost a 4-stage pipeline over two local
    "nodes" 8 % of its step on 2 cores). Elsewhere, a node is a machine.
    """
    if hardware.one_machine:
        return lambda peer: True
    me = plan.rank(rank).node
    return lambda peer: plan.rank(peer).node == me


def build_state(
    mdef: ModelDef, training: TrainingSpec, plan: Plan, rank: int, device: torch.device
) -> StageState:
    """The stage state ``rank`` starts under: its stage of ``plan``, a fresh optimizer
    and, under fp16, a fresh loss scale (creates the process groups: collective, every
    rank in the same order); a rank hosting two stages (a plan's ``placement``: ZB-V)
    gets ``two_stage.v_state``."""
    build = v_state if plan.placement is not None else _one_stage
    state = build(mdef, training, plan, rank, device)
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
        # Here, not at the top: DTensor's import (sympy) cost every worker ~0.8 s of
        # its start-up, a relaunch after a lost node included, for T = 1 too.
        from jobctl.engine.model.graph.tp_stage import StageShards

        tp = StageShards(
            mdef.graph,
            plan.T,
            topo.tp_group,
            topo.tp_ranks,
            device.type,
            subpipeline=plan.tp_subpipeline,
            m=plan.micro_batch_size,
        )
        tp.apply(stage)
        if (line := tp.outcome()) is not None:  # a fallback to plain TMP is never silent
            print(f"rank {rank} stage {me.index}: {line}", flush=True)
    named = dict(stage.named_parameters())
    opt = build_optimizer(list(named.values()), training)
    return StageState(plan, stage, named, opt, topo, me.action_list(), tp=tp)


class Trainer:
    """Everything one rank needs to train its stage; plug-ins (pruning, rebalancing,
    checkpointing) come as ``hooks``."""

    def __init__(
        self,
        spec: JobSpec,
        mdef: ModelDef,
        state: StageState,
        device: torch.device,
        events: EventLog,
        hooks: list[StepHook] | None = None,
        start_step: int = 0,
    ):
        self.spec, self.state, self.device, self.events = spec, state, device, events
        self.rank = state.topo.rank
        self.hooks, self.start_step = hooks or [], start_step
        self.ties = tied_names(mdef.ties)
        self.tie_groups, self.tie_shapes = mdef.ties, mdef.tie_shapes()
        plan = state.plan
        self.shard = Sharding(plan.global_batch_size, plan.D, plan.micro_batch_size)
        self.data = prefetching(make_data(spec), self.shard, state.topo.replica, device)
        self.eval_data = make_eval_data(spec) if spec.training.eval_every else None
        self.stop_requested = False
        self.freed = False  # packed away by a hook's relayout
        self.executor: StepExecutor | None = None  # the latest make_executor's
        self.stop_vote = StopVote()
        self.ledger = StepLedger(start_step)  # where this rank is, for a trapped failure
        # The step commit lets survivors hand a step over; only an elastic job with
        # replicas has survivors that can (a lost node takes a stage of a D = 1 job).
        self.commits = spec.elasticity.enabled and plan.D > 1
        if state.tp is not None and state.tp.requested:  # its fallbacks, for the views too
            me = plan.stage_of(self.rank).index
            self.events.write(Kind.TP_SUBPIPELINE, rank=self.rank, stage=me, **state.tp.record())

    def _compute(self):
        return autocast(self.spec.training.precision, self.device)

    def run(self) -> None:
        """Train from ``start_step`` to ``training.steps``, or until a stop or a pack;
        a lost peer raises :class:`~jobctl.engine.runtime.failure.StepFailure` with the
        state this rank holds (engine/worker/survival.py takes it from there)."""
        self.make_executor()
        try:
            self._loop()
        except Exception as e:
            if not is_peer_failure(e):
                raise
            self._cut_links()
            raise StepFailure(self.ledger.held(e, self._apply_pending)) from e

    def _cut_links(self) -> None:
        """Close this rank's shared-memory links, so a neighbour still waiting on one
        hears that this rank left (a peer-gone) instead of waiting out the timeout."""
        if self.executor is not None:
            self.executor.close()

    def _apply_pending(self) -> None:
        """Apply the update of the step whose gradients are summed (and committed by
        some survivor) but which this rank had not applied when it trapped."""
        st, step = self.state, self.ledger.done
        for hook in self.hooks:
            hook.before_update()
        set_lr(st.opt, lr_at(step, self.spec.training))
        if st.scaler is None or not st.scaler.pending_skip():
            st.opt.step()
        for hook in self.hooks:
            hook.after_update()
        self.ledger.applied(step + 1)

    def _loop(self) -> None:
        last_report = None  # when the previous step was reported (its period's start)
        for step in range(self.start_step, self.spec.training.steps):
            for hook in self.hooks:
                hook.before_step(step)
            stats, times = self.train_step(step)
            self.ledger.applied(step + 1)
            loss = self.global_loss(step + 1, stats)
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
            change = hook.after_step(StepEnd(done, stats, seconds, self.state, stopping))
            if change is not None and not self.apply(change):
                return False  # packed away: this rank's part is done
        if stopping:
            self._stop_hooks(stopped=True)
            self.events.write(Kind.STOPPED, step=done, rank=self.rank)
            return False
        if done < self.spec.training.steps:
            self.stop_vote.start(self.stop_requested, self.state.live_group)
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
        change.state.scaler = self.state.scaler  # one loss scale for the run's life
        self.state = change.state
        t1 = time.perf_counter()
        self.make_executor()  # the pipeline probes its new activation shapes
        # Every live rank can train again: the next step would wait for the slowest rank
        # anyway, so the leader's clock now holds the move's whole cost.
        dist.barrier(group=self.state.live_group)
        change.settled(time.perf_counter() - t1)
        return True

    def make_executor(self) -> StepExecutor:
        """Probe activation shapes down the pipeline and build the step executor, with
        shared-memory links to the neighbours on this machine (replacing any earlier)."""
        st = self.state
        seq_len = self.spec.model.seq_len
        if isinstance(st.stage, RankStages):  # two stages on this rank (ZB-V)
            return self._v_executor(st.stage, seq_len)
        chans = probe_channels(
            st.stage, st.topo, self.shard.micro_batch, seq_len, self.device, self._compute
        )
        if self.executor is not None:
            self.executor.close()
        here = same_machine(self.spec.hardware, st.plan, self.rank)
        links = connect_neighbours(
            st.topo, chans, self.device, here, pg_timeout_s(), self.shard.micro_batches
        )
        poll_where_cores_allow(links, sum(here(r) for r in range(st.plan.world_size)))
        # Varuna's deviations follow message arrival, which may differ between the T ranks
        # of a stage; their all-reduces need one order, so a T group keeps the schedule's
        varuna = self.spec.parallelism.schedule == "varuna" and st.plan.T == 1
        self.executor = StepExecutor(
            st.stage,
            st.topo,
            self.data,
            self.shard,
            chans,
            self.device,
            opportunistic=varuna,
            links=links,
        )
        attach_scaler(self.executor, st.scaler)
        return self.executor

    def _v_executor(self, whole: RankStages, seq_len: int):  # noqa: ANN202 - TwoStageExecutor
        """``make_executor`` for a rank hosting two stages: a link per stage boundary."""
        if self.executor is not None:
            self.executor.close()
        here = same_machine(self.spec.hardware, self.state.plan, self.rank)
        timeout, M = pg_timeout_s(), self.shard.micro_batches

        def link(peer: int, shape: tuple, dtype: torch.dtype):  # noqa: ANN202
            return connect(peer, shape, dtype, self.device, here(peer), timeout, M)

        self.executor = v_executor(
            whole, self.data, self.shard, seq_len, self.device, self._compute, link
        )  # type: ignore[assignment]
        local = sum(here(r) for r in range(self.state.plan.world_size))
        for ex in self.executor.by_stage.values():
            poll_where_cores_allow(ex.links, local)
        attach_scaler(self.executor, self.state.scaler)
        return self.executor

    def evaluate(self, done: int) -> None:
        """The eval loss every ``training.eval_every`` steps and after the last."""
        every, steps = self.spec.training.eval_every, self.spec.training.steps
        if self.eval_data is None or (done % every and done != steps):
            return
        with self._compute():  # the training numerics (the channels were probed so)
            loss = eval_loss(self.executor, self.state, self.eval_data)
        if self.state.topo.is_reporter:
            self.events.write(Kind.EVAL, step=done, eval_loss=loss)

    def request_stop(self) -> None:
        """Ask for a checkpoint-then-exit (SIGTERM): all ranks stop together, at the end
        of the step after the one this lands in (see :class:`StopVote`)."""
        self.stop_requested = True
        me = self.state.plan.rank(self.rank)
        self.events.write(Kind.SIGTERM, rank=self.rank, node=me.node)

    def train_step(self, step: int) -> tuple[StepStats, StepTimes]:
        """Loop step ``step`` on the current layout (see ``runtime.step.train_step``)."""
        st = self.state
        self.ledger.begin()
        # A T group shares one seed: dropout outside the split layers is the same on all
        seed_rank = self.rank // st.plan.T
        return train_step(
            _Recorded(self.executor, self.ledger),
            st.actions,
            st.opt,
            self.spec.training,
            step,
            seed_rank,
            compute=self._compute,
            hooks=self.hooks,
            sync=lambda: self._sync_and_commit(step + 1),
        )

    def _sync_and_commit(self, step: int) -> bool:
        """Sum gradients over replicas and tied stages, then the step's commit (which
        sums the loss too; see engine/runtime/failure.py) before any rank updates.
        Under fp16 the gradients are unscaled and the world agrees on an overflow
        (carried by the commit where there is one); True: every rank skips."""
        st = self.state
        sync_gradients(st.named, st.topo, self.ties, self.tie_groups, self.tie_shapes)
        found = st.scaler is not None and st.scaler.unscale(list(st.named.values()))
        self.ledger.ready = True
        if self.commits:
            # shard 0 only: a T group's ranks each hold the whole loss, summed once
            last = st.topo.is_last and st.topo.t == 0
            loss, found = commit_step(self.ledger.stats.loss_sum, last, st.live_group, found)
            self.ledger.committed(step, loss)
        elif st.scaler is not None:
            found = agree_found_inf(found, st.live_group)
        if st.scaler is not None:
            st.scaler.update(found)
        return found

    def global_loss(self, step: int, stats: StepStats) -> float | None:
        """Global-batch mean loss of ``step`` on last-stage ranks (summed by its commit,
        or here over the stage's replicas)."""
        topo = self.state.topo
        if not topo.is_last:
            return None
        if step in self.ledger.losses:
            return self.ledger.losses[step]
        total = torch.tensor([float(stats.loss_sum)], dtype=torch.float64, device=comm_device())
        if topo.dp_group is not None:
            dist.all_reduce(total, group=topo.dp_group)
        return float(total)

    def heartbeat_extras(self) -> dict:
        """Fields a trainer variant adds to each heartbeat (AvgPipe's distances)."""
        return {}

    def report(self, step: int, loss: float | None, seconds: float, stats: StepStats) -> None:
        """Heartbeat (every rank), step record (the reporter) and a log line every
        ``training.log_every`` steps (this rank's stdout, ``jobctl logs --rank``)."""
        plan = self.state.plan
        me = plan.rank(self.rank)
        self.events.write(
            Kind.HEARTBEAT,
            step=step,
            rank=self.rank,
            stage=me.stage,
            node=me.node,
            **compute_fields(stats, plan.micro_batches),
            **memory_fields(self.device),
            **self.heartbeat_extras(),
        )
        samples_per_s = plan.global_batch_size / seconds
        skipped = getattr(self.state.scaler, "skipped", False)  # fp16: an overflow
        if step % self.spec.training.log_every == 0:
            shown = "-" if loss is None else f"{loss:.4f}"
            note = " (update skipped: fp16 overflow)" if skipped else ""
            print(f"step {step} loss {shown} samples/s {samples_per_s:.1f}{note}", flush=True)
        if not self.state.topo.is_reporter:
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


class _Recorded:
    """The step executor, noting each run's stats in the ledger (the commit sums their
    loss before the update)."""

    def __init__(self, executor: StepExecutor, ledger: StepLedger):
        self.executor, self.ledger = executor, ledger

    def run(self, actions, step: int) -> StepStats:
        self.ledger.stats = self.executor.run(actions, step)
        return self.ledger.stats
