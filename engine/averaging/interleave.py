"""The N parallel pipelines of a rank interleaved in one action list (AvgPipe sec. 3.2,
Fig. 4: the pipelines share the devices at the same time, so one's bubbles hold the
others' work).

A step runs the plan's action list once, over all of the batch's micro-batches: the
plan's M is already B / (m D), that is N times a parallel pipeline's share. Replica d's
micro-batch j is the batch's micro-batch g = (its first micro-batch) + j, exactly as in
a synchronous step, and belongs to parallel pipeline i = g // (B / (N m)): pipeline
i's share is the contiguous samples [tB + iB/N, tB + (i+1)B/N), as before. Each
forward and backward runs on parallel model i's stage, so its gradients accumulate in
model i only; every loss is weighted m / (B / N), the mean over model i's share.

Why g // (B / (N m)) and not g mod N: the bubble is the same, (P-1)/(NM+P-1) for 1F1B-
like lists, either way, and so is the number of micro-batches in flight (the list
decides it, not the owner). Contiguous owners switch weights N - 1 times per step
instead of at every micro-batch (better cache reuse on CPUs), keep each pipeline's
samples those of the sequential run, and finish model i's backwards before model
i+1's in 1F1B order.

Only the order of independent work changes (model i's gradient is the same sum over
the same micro-batches), so a step equals the one-after-another run of the pipelines.

``on_done(i)`` is called right after pipeline i's last backward (its last W on a
split-backward list) on this rank: model i's gradient is complete and no later action
of the step touches model i, so the trainer runs model i's update there (AvgPipe sec.
4.2: the update fills the bubble while the later pipelines drain) instead of after
the whole list. Contiguous owners finish in the order 0 .. N-1 on every schedule, so
the updates reach the reference in that order, as before.

A V rank (ZB-V, two stages) interleaves each of its stages so
(``InterleavedTwoStage``): model i's update waits for both stages' last action of
pipeline i.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from jobctl.engine.core.actions import Action, Op
from jobctl.engine.data.dataset import Sharding
from jobctl.engine.model.blocks import Stage
from jobctl.engine.runtime.backward import defer_linear_weights
from jobctl.engine.runtime.executor import StepExecutor, StepStats
from jobctl.engine.runtime.two_stage import TwoStageExecutor


@dataclass(frozen=True)
class InterleavedShare(Sharding):
    """The whole batch's micro-batches (a synchronous step's), each owned by one of the
    ``N`` parallel pipelines and weighted as part of that pipeline's share."""

    N: int = 1

    @property
    def loss_scale(self) -> float:
        """m / (B / N): model i's loss and gradient are the mean over its share."""
        return self.micro_batch * self.N / self.global_batch

    def pipeline(self, replica: int, micro: int) -> int:
        """The parallel pipeline that owns ``replica``'s micro-batch ``micro``."""
        g = self.first_sample(0, replica, micro) // self.micro_batch
        return g // (self.global_batch // self.N // self.micro_batch)


class InterleavedExecutor(StepExecutor):
    """A :class:`StepExecutor` that runs each micro-batch on its owner's stage."""

    def __init__(self, ex: StepExecutor, stages: list[Stage], share: InterleavedShare):
        self.__dict__.update(vars(ex))  # the same channels, links and data as ``ex``
        self.stages, self.shard = stages, share
        self.in_bs: list = []
        self.on_done: Callable[[int], None] | None = None
        self.left: Counter = Counter()

    def begin(self, actions: list[Action], step: int, fuse: bool = True) -> list[Action]:
        """Open the step; on a split-backward list every model's linear layers leave
        their weight gradients to W in the one store (it is keyed by layer)."""
        self.stage = self.stages[0]
        actions = super().begin(actions, step, fuse)
        if self.split:
            self.in_bs = [self.in_b]
            for stage in self.stages[1:]:
                deferred = defer_linear_weights(stage, self.weights)
                self.in_bs.append([p for p in stage.parameters() if p not in deferred])
        mine = self.topo.replica
        self.left = Counter(
            self.shard.pipeline(mine, a.micro_batch) for a in actions if self._last(a)
        )
        return actions

    def _last(self, a: Action) -> bool:
        """Is ``a`` the last action of its micro-batch (its B, or its W if split)?"""
        return a.op is Op.WEIGHT or (a.op is Op.BACKWARD and a.micro_batch not in self.split)

    def _do(self, a: Action, stats: StepStats) -> None:
        i = self.shard.pipeline(self.topo.replica, a.micro_batch)
        self.stage = self.stages[i]
        if self.split:
            self.in_b = self.in_bs[i]
        super()._do(a, stats)
        if self._last(a):
            self.left[i] -= 1
            if self.left[i] == 0 and self.on_done is not None:
                self.on_done(i)  # model i's gradient is complete


class InterleavedTwoStage(TwoStageExecutor):
    """A V rank's two stages under the N parallel models (ZB-V): each stage's executor
    runs every micro-batch on its owner's copy of that stage (``InterleavedExecutor``),
    and ``on_done(i)`` comes once both stages are done with pipeline i."""

    def __init__(self, ex: TwoStageExecutor, models: list, share: InterleavedShare):
        subs = [
            InterleavedExecutor(e, [m.parts[k] for m in models], share)
            for k, e in enumerate(ex.by_stage.values())
        ]
        super().__init__(subs)
        self.on_done: Callable[[int], None] | None = None
        self.fired: set[int] = set()
        for sub in subs:
            sub.on_done = self._stage_done

    def _stage_done(self, i: int) -> None:
        if i in self.fired or any(sub.left[i] for sub in self.by_stage.values()):
            return
        self.fired.add(i)
        if self.on_done is not None:
            self.on_done(i)

    def run(self, placed: list, step: int) -> StepStats:
        self.fired = set()
        return super().run(placed, step)
