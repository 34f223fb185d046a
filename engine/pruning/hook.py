"""Pruning as a plug-in of the training loop (a ``runtime.hook.StepHook``).

Before the first step of a fresh run (a schedule may start at step 0) and after every
step, the :class:`~jobctl.engine.pruning.pruner.Pruner` prunes if the schedule says so;
around each optimizer update it keeps pruned gradients and weights at zero; the step
after a pruning step is profiled per block.
"""

from __future__ import annotations

import contextlib

from jobctl.engine.pruning.pruner import Pruner
from jobctl.engine.runtime.hook import Relayout, StepEnd, StepHook


class PruningHook(StepHook):
    """Drives one rank's :class:`Pruner` from the training loop."""

    def __init__(self, pruner: Pruner):
        self.pruner = pruner
        self._profiling = contextlib.ExitStack()

    def before_step(self, step: int) -> None:
        if step == 0:
            self.pruner.maybe_prune(0)  # a schedule may start before the first step
        self._profiling.enter_context(self.pruner.profile_step(step))

    def before_update(self) -> None:
        self.pruner.mask_grads()

    def after_update(self) -> None:
        self.pruner.after_step()
        self._profiling.close()  # the step's compute is over: the profile is complete

    def after_step(self, end: StepEnd) -> Relayout | None:
        self.pruner.maybe_prune(end.done)  # after step `done`'s optimizer step
        return None
