"""Mobius's step engine: this rank's stages swapped through the tier below device
memory (``runtime.MobiusRunner``), driven by the one loop (``runtime.trainer``) like
every other engine: the same events, stop vote, checkpoint hook and plug-ins.

A rebalancing re-cut (``mobius.relayout``) hands the loop a :class:`SwappedLayout`,
the new plan and the runner over the new stages; the plug-ins that read the runner
(pruning's masks, the checkpoint hook) read it here, so they follow it.

What it does not offer, and why: a lost peer's step is not handed over (a swapped
stage's state lives in its rank's tier, which goes with the rank; an elastic run
re-plans S over the devices left and resumes from its newest checkpoint), and a
stage's update runs inside the swap (on the stage's next upload, Mobius sec. 3.1),
so the loop's update hooks are called around the step as a whole.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from jobctl.engine.core.plan import Plan
from jobctl.engine.mobius.runtime import MobiusRunner
from jobctl.engine.runtime.executor import StepStats
from jobctl.engine.runtime.failure import StepLedger
from jobctl.engine.runtime.hook import StageState, StepHook
from jobctl.engine.runtime.step import StepTimes


@dataclass(frozen=True)
class SwappedLayout:
    """A re-cut Mobius run: its plan and the runner over its new stages."""

    plan: Plan
    runner: MobiusRunner


class SwappedEngine:
    """One rank of a Mobius run: its stages swapped in and out around each use."""

    state: StageState | None = None  # nothing resident between steps

    def __init__(self, runner: MobiusRunner, plan: Plan, rank: int, device: torch.device):
        self.runner, self._plan, self.rank, self.device = runner, plan, rank, device
        # The stop vote on a group of its own, apart from the links' sends.
        self._vote_group = dist.new_group()
        self._loss: float | None = None
        self._seconds = 0.0

    @property
    def plan(self) -> Plan:
        return self._plan

    @property
    def data(self):
        return self.runner.data

    @property
    def reporter(self) -> bool:
        return self.rank == self._plan.mobius.ranks[-1]  # the last stage's loss

    @property
    def vote_group(self):
        return self._vote_group

    @property
    def scaler(self):
        return self.runner.scaler

    @property
    def hand_over_refusal(self) -> str:
        return "a Mobius stage's state lives in its rank's tier, gone with the rank"

    def prepare(self) -> None:
        """Nothing: the runner built its stages and links."""

    def train(
        self, step: int, hooks: Sequence[StepHook], ledger: StepLedger
    ) -> tuple[StepStats, StepTimes]:
        ledger.begin()
        t0 = time.perf_counter()
        for hook in hooks:
            hook.before_update()
        self._loss = self.runner.step(step)
        for hook in hooks:
            hook.after_update()
        t1 = time.perf_counter()
        self._seconds = t1 - t0
        return StepStats(loss_sum=self._loss or 0.0), StepTimes(t0, t0, t1, t1)

    def global_loss(self, step: int, stats: StepStats, ledger: StepLedger) -> float | None:
        return self._loss  # already the global-batch mean on the last stage's rank

    def eval_loss(self, eval_data, done: int) -> float | None:
        """The validation batch's loss, each stage swapped up once (``MobiusRunner.evaluate``)."""
        return self.runner.evaluate(eval_data)

    def heartbeat(self, stats: StepStats) -> dict:
        """The runner does not split compute from waits: compute_s is the step's."""
        return {"compute_s": self._seconds}

    def relayout(self, state: SwappedLayout) -> None:
        """Train on over a re-cut's stages (the old runner is closed already)."""
        self._plan, self.runner = state.plan, state.runner

    def apply_pending(self, step: int, hooks: Sequence[StepHook]) -> None:
        raise ValueError("a Mobius step is not handed over")

    def cut_links(self) -> None:
        """Nothing: the links are the runner's and close with it."""

    def finish(self, ok: bool) -> None:
        """Close the runner and remove this rank's tier folder."""
        self.runner.close()
        shutil.rmtree(self.runner.cfg.folder / f"rank-{self.rank}", ignore_errors=True)
