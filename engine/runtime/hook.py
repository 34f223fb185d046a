"""How plug-ins (pruning, rebalancing) join the training loop: one small protocol.

The trainer owns the one loop, over any step engine; a :class:`StepHook` is told where
the loop is and may hand back a :class:`Relayout` (a new stage layout it migrated to),
which the trainer applies. Hooks are built and handed to the trainer by the layer above
(``engine.worker``): pruning, rebalancing and checkpointing, in that order, so the
runtime knows no plug-in by name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

from jobctl.engine.core.actions import Action
from jobctl.engine.core.plan import Plan
from jobctl.engine.model.blocks import Stage
from jobctl.engine.runtime.executor import StepStats
from jobctl.engine.runtime.topology import Topology


@dataclass
class StageState:
    """What one rank trains under: the plan, its stage and the stage's optimizer,
    topology and action list, and the group of ranks still training."""

    plan: Plan
    stage: Stage
    named: dict[str, nn.Parameter]
    opt: torch.optim.Optimizer
    topo: Topology
    actions: list[Action]
    live_group: object | None = None  # None: every rank (packing frees some)
    tp: object | None = None  # T > 1: the stage's split (model.graph.tp_stage.StageShards)
    scaler: object | None = None  # fp16: the loss scale (runtime.loss_scale.LossScaler)


@dataclass
class StepEnd:
    """A trained and reported step, as the hooks see it."""

    done: int  # optimizer steps done
    stats: StepStats
    seconds: float  # the step's own wall seconds (train, loss)
    plan: Plan  # the layout the step ran under
    state: StageState | None  # the resident stage state (None: a swapped engine's)
    stopping: bool = False  # every rank stops after this step (the stop vote agreed)
    scaler: object | None = None  # fp16: the run's loss scale (the engine's)


@dataclass
class Relayout:
    """A new stage state a hook migrated this rank to; the trainer applies it
    (``StepEngine.relayout``): a resident engine's :class:`StageState`, or the engine's
    own layout (Mobius: ``mobius.engine.SwappedLayout``).

    ``settled`` is called once the trainer trains again under it, with the seconds it
    took to resume (the new executor and a barrier over the live ranks), or with None
    when ``state`` is None: the rank was packed away and leaves the loop.
    """

    state: StageState | object | None
    settled: Callable[[float | None], None]


class StepHook(Protocol):
    """A plug-in of the training loop; every live rank calls every method. A hook
    subclasses this and overrides what it needs: the others do nothing."""

    def before_step(self, step: int) -> None:
        """Loop step ``step`` (0-based) is about to train."""

    def before_update(self) -> None:
        """Gradients are summed; the optimizer has not stepped yet."""

    def after_update(self) -> None:
        """The optimizer stepped (the step's last work before its loss is summed)."""

    def after_step(self, end: StepEnd) -> Relayout | None:
        """Step ``end.done`` is reported; a new layout for the trainer, if any."""

    def on_stop(self, stopped: bool) -> None:
        """The loop is over: trained to the end, packed away, or ``stopped`` on request
        (a preempted machine has little time left)."""
