"""AvgPipe's step engine: each loop step trains one batch on the N parallel pipelines,
interleaved in one run of the plan's action list on the same ranks (``interleave``:
micro-batch j runs on its owner's parallel model, so the N pipelines fill each
other's bubbles). The one loop (``runtime.trainer``) drives it like any engine.

Then, for each pipeline i: model i's gradients are summed over the D replicas and the
tied stages (as a synchronous step does), model i's own optimizer steps (E1-E2), it
waits for r_t if the reference thread is a batch behind, dilutes (E3) and queues its
local update for the reference (steps 3-5, ``reference``). With D = 1 this update
runs inside the action list, right after pipeline i's last backward on this rank
(``interleave``'s ``on_done``: AvgPipe sec. 4.2, the update fills the bubble while the
later pipelines drain). With D > 1 the updates stay after the list: their all-reduces
must meet in one order on every replica, and a replica may hold none of a pipeline's
micro-batches. The reported loss is the mean over the N models of each model's loss
on its share. Evaluation and checkpoints read the reference once it has applied the
batch. Every heartbeat carries each model's squared distance from r_t on this stage
(``avg_dist2``); ``jobctl status`` shows the whole model's
(``supervise.figures.avg_distance``).

Under fp16 one loss scale S serves the N models (as one ``torch.amp.GradScaler``
serves N optimizers): every model's gradients are summed and unscaled after the
list, the world agrees on each model's found-inf flag (a MAX over every stage and
replica), a model that overflowed skips its optimizer step (its local update is
zero; it still dilutes) and S moves once, backing off if any model overflowed. So
the updates never run inside the list there: no model may step before every
stage's flag is in.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Sequence

import torch
import torch.distributed as dist

from jobctl.engine.averaging.interleave import (
    InterleavedExecutor,
    InterleavedShare,
    InterleavedTwoStage,
)
from jobctl.engine.averaging.parts import AveragingParts
from jobctl.engine.averaging.rule import dilute, local_update, squared_distance
from jobctl.engine.runtime.engine import ResidentEngine
from jobctl.engine.runtime.evaluation import eval_loss
from jobctl.engine.runtime.executor import StepExecutor, StepStats
from jobctl.engine.runtime.failure import StepLedger
from jobctl.engine.runtime.hook import StepHook
from jobctl.engine.runtime.optim import lr_at, set_lr, sync_gradients
from jobctl.engine.runtime.p2p.gloo import comm_device
from jobctl.engine.runtime.step import StepTimes, seed_rng, step_seed
from jobctl.engine.runtime.two_stage import TwoStageExecutor


def executor_for(ex: StepExecutor, stage, share) -> StepExecutor:
    """``ex`` running ``stage`` on ``share``: a shallow copy with the same links to the
    neighbours (the evaluation of the reference); a V rank's, each stage's."""
    view = copy.copy(ex)
    if isinstance(ex, TwoStageExecutor):
        pairs = zip(ex.by_stage.items(), stage.parts, strict=True)
        view.by_stage = {s: executor_for(e, part, share) for (s, e), part in pairs}
        return view
    view.stage, view.shard = stage, share
    return view


class AveragingEngine(ResidentEngine):
    """A :class:`ResidentEngine` whose step trains the N parallel models of ``parts``."""

    def __init__(self, *args, parts: AveragingParts):
        super().__init__(*args)
        self.parts = parts
        self.interleaved: InterleavedExecutor | None = None
        # Each model's squared distance from r_t on this stage (tied aliases once), in
        # every heartbeat; the supervisor's figures sum the stages.
        self.dist2 = [0.0] * parts.config.N
        self.pairs = self._all_pairs()

    def _all_pairs(self) -> list[tuple[list, list]]:
        aliases = {t.alias for t in self.tie_groups}
        ref = dict(self.parts.reference.stage.named_parameters())
        return [self._pairs(m.named, ref, aliases) for m in self.parts.models]

    def relayout(self, state) -> None:  # noqa: ANN001 - a StageState
        """Train on under a migration's new stage; ``parts`` were moved with it
        (``averaging.parts.Moves``)."""
        super().relayout(state)
        self.pairs = self._all_pairs()

    @property
    def hand_over_refusal(self) -> str | None:
        # the survivors' emergency checkpoint is one model's blocks; a morph resumes
        # the reference and every parallel model from the newest regular checkpoint
        return "AvgPipe's reference and parallel models are not handed over"

    def finish(self, ok: bool) -> None:
        """Close the reference thread; its own error is raised only if the loop's
        ended well (else the loop's error goes on)."""
        self.parts.reference.close(check=ok)

    def make_executor(self) -> StepExecutor:
        ex = super().make_executor()
        first = self.state.stage
        others = [m.stage for m in self.parts.models[1:]] + [self.parts.reference.stage]
        for k, part in enumerate(getattr(first, "parts", [first])):  # a V rank: two
            if part.graph is not None:  # probed on model 0 only: the same layout
                for stage in others:
                    getattr(stage, "parts", [stage])[k].graph.in_boundary = part.graph.in_boundary
        sh, n = self.shard, self.parts.config.N
        share = InterleavedShare(sh.global_batch, sh.replicas, sh.micro_batch, N=n)
        stages = [m.stage for m in self.parts.models]
        if isinstance(ex, TwoStageExecutor):  # ZB-V: each of the rank's two stages
            self.interleaved = InterleavedTwoStage(ex, stages, share)
        else:
            self.interleaved = InterleavedExecutor(ex, stages, share)
        return ex

    def train(
        self, step: int, hooks: Sequence[StepHook], ledger: StepLedger
    ) -> tuple[StepStats, StepTimes]:
        """Batch ``step`` on the N interleaved pipelines, then each model's E1-E3, its
        update queued (E4)."""
        ledger.begin()
        start = time.perf_counter()
        cfg = self.parts.config
        # Dropout stays a function of (seed, step, rank); the N pipelines draw in turn.
        seed_rng(step_seed(self.cfg.training.seed, step * cfg.N, self.rank), self.device)
        for model in self.parts.models:
            model.opt.zero_grad(set_to_none=True)
        done: list[int] = []
        if self.state.topo.D == 1 and self.scaler is None:  # see the module docstring
            self.interleaved.on_done = lambda i: self._update_in_drain(i, step, hooks, done)
        with self.compute():
            stats = self.interleaved.run(self.state.actions, step)
        self.interleaved.on_done = None
        stats.loss_sum /= cfg.N  # the mean over the N models of each one's share loss
        skips = self._overflowed() if self.scaler is not None else None
        for i in range(cfg.N):
            if i not in done:
                self._update(i, step, hooks, skips)
        ledger.stats = stats
        end = time.perf_counter()
        return stats, StepTimes(start, start, end, end)

    def _update_in_drain(self, i: int, step: int, hooks, done: list[int]) -> None:
        """Model ``i``'s update inside the action list, outside its autocast."""
        with torch.autocast(self.device.type, enabled=False):
            self._update(i, step, hooks)
        done.append(i)

    def _sync(self, model) -> None:  # noqa: ANN001 - a ParallelModel
        """Sum ``model``'s gradients over the replicas and the tied stages."""
        st = self.state
        sync_gradients(model.named, st.topo, self.ties, self.tie_groups, self.tie_shapes)

    def _overflowed(self) -> list[bool]:
        """fp16: every model's gradients summed and unscaled, then the world's found-inf
        flag of each (a MAX over ``live_group``); S moves once, backing off on any."""
        st = self.state
        flags = []
        for model in self.parts.models:
            self._sync(model)
            flags.append(st.scaler.unscale(list(model.named.values())))
        agreed = torch.tensor(flags, dtype=torch.int32, device=comm_device())
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX, group=st.live_group)
        skips = [bool(v) for v in agreed.tolist()]
        st.scaler.update(any(skips))
        return skips

    def _update(
        self, i: int, step: int, hooks: Sequence[StepHook], skips: list[bool] | None = None
    ) -> None:
        """Model ``i``'s gradient summed (``skips`` given: summed and unscaled already,
        and whether its step is skipped), its optimizer step (E1-E2) and pull (E3)."""
        model, cfg = self.parts.models[i], self.parts.config
        if skips is None:
            self._sync(model)
        before = [t.clone() for t in model.tensors]
        for hook in hooks:
            hook.before_update()
        set_lr(model.opt, lr_at(step, self.cfg.training))
        if skips is None or not skips[i]:
            model.opt.step()  # E1
        for hook in hooks:
            hook.after_update()
        update = local_update(model.tensors, before)  # E2
        self.parts.reference.wait_for(step)  # r_t: batches 0 .. step-1 applied
        self.dist2[i] = self._distance(i)
        dilute(model.tensors, self.parts.reference.tensors, cfg.alpha)  # E3
        self.parts.reference.submit(step, update)  # step 3, never blocks

    def _pairs(self, named: dict, ref: dict, aliases: set[str]) -> tuple[list, list]:
        """A model's (weight, reference) pairs: those split over T, the whole ones."""
        tp = self.state.tp
        pairs: tuple[list, list] = ([], [])
        for k, p in named.items():
            if k not in aliases:
                split = tp is not None and tp.split_of(k) is not None
                pairs[0 if split else 1].append((p.detach(), ref[k].detach()))
        return pairs

    def _distance(self, i: int) -> float:
        """Model ``i``'s squared distance from r_t on this stage: the whole parameters'
        here, the split ones' summed over the T group (collective there where T > 1)."""
        split, whole = self.pairs[i]
        d = squared_distance(whole)
        if self.state.tp is None:
            return d
        part = torch.tensor([squared_distance(split)], dtype=torch.float64, device=comm_device())
        dist.all_reduce(part, group=self.state.topo.tp_group)
        return d + float(part)

    def heartbeat(self, stats: StepStats) -> dict:
        """Compute fields and ``avg_dist2``: model i's squared distance from r_t on this
        stage, after its local update and before the pull (E3) of the step reported."""
        return {**super().heartbeat(stats), "avg_dist2": list(self.dist2)}

    def eval_loss(self, eval_data, done: int) -> float | None:
        """The eval loss of the reference model, once it has applied batch ``done - 1``."""
        self.parts.reference.wait_for(done)
        ref = self.parts.reference.stage
        view = executor_for(self.executor, ref, self.shard)
        with self.compute():
            return eval_loss(view, dataclasses.replace(self.state, stage=ref), eval_data)
