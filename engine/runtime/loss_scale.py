"""Dynamic loss scaling for ``training.precision: fp16``, one scale for the pipeline.

fp16 keeps 5 exponent bits: small gradients underflow to zero unless the loss is
multiplied by a large scale S before backward. The last stage multiplies each
micro-batch's loss by S (``StepExecutor``'s backward root), so every gradient that
flows back through the pipeline's boundaries is scaled too and the other stages need
nothing there. Before the update every rank divides its (summed) gradients by S and
looks for inf/NaN; the found-inf flag is agreed by a MAX over the whole world (every
stage and replica), so all ranks skip the same step or update identically, and all
move S by the same rule: torch.amp.GradScaler's (backoff x0.5 on an overflow, growth
x2 after 2000 clean steps in a row). A skipped step still counts as a step.

S and the clean-step count are the same on every rank, so a checkpoint keeps them once
in ``meta.json`` (``LossScaler.record``), readable under any layout.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from jobctl.engine.runtime.p2p.gloo import comm_device
from jobctl.spec.precision import LossScaleSpec
from jobctl.spec.sections import TrainingSpec


@dataclass(frozen=True)
class LossScaleConfig:
    """The scale's rule (torch.amp.GradScaler's defaults)."""

    init_scale: float = 2.0**16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000  # clean steps in a row before S grows

    @classmethod
    def from_spec(cls, spec: LossScaleSpec) -> LossScaleConfig:
        """The rule a spec's ``training.loss_scale`` asks for."""
        return cls(spec.init_scale, spec.growth_factor, spec.backoff_factor, spec.growth_interval)


class LossScaler:
    """One rank's copy of the pipeline-wide loss scale S (see the module docstring)."""

    def __init__(self, config: LossScaleConfig | None = None) -> None:
        self.config = config or LossScaleConfig()
        self.scale = float(self.config.init_scale)
        self.growth_tracker = 0  # clean steps since S last changed
        self.skipped = False  # was the latest step skipped (an overflow somewhere)?
        self.found_here = False  # this rank's own flag of the step being unscaled
        self.agreed = True  # the world's flag of the latest unscaled step is known

    def scaled(self, loss: torch.Tensor) -> torch.Tensor:
        """The backward root of a last-stage micro-batch: its loss times S."""
        return loss * self.scale

    def unscale(self, params: list[nn.Parameter]) -> bool:
        """Divide ``params``' gradients by S in place; True if any is inf or NaN here.

        1 / S is a power of two, so unscaling is exact: the order of summing and
        unscaling (replicas sum scaled gradients) does not change a bit. GradScaler's
        own fused kernel: one pass, one device sync for the flag."""
        # each gradient once, however many names reach it
        grads = list({id(p.grad): p.grad for p in params if p.grad is not None}.values())
        found = False
        if grads:
            flag = torch.zeros(1, device=grads[0].device)
            inv = torch.full((1,), 1.0 / self.scale, device=grads[0].device)
            torch._amp_foreach_non_finite_check_and_unscale_(grads, flag, inv)
            found = bool(flag.item())
        self.found_here, self.agreed = found, False
        return found

    def update(self, found_inf: bool) -> None:
        """Move S after a step whose agreed flag is ``found_inf`` (GradScaler's rule)."""
        cfg = self.config
        self.skipped, self.agreed = found_inf, True
        if found_inf:
            self.scale *= cfg.backoff_factor
            self.growth_tracker = 0
            return
        self.growth_tracker += 1
        if self.growth_tracker == cfg.growth_interval:
            self.scale *= cfg.growth_factor
            self.growth_tracker = 0

    def pending_skip(self) -> bool:
        """Is the update a survivor applies late (``Trainer._apply_pending``) skipped?
        The world's flag; where the peer was lost before the flag was agreed, this
        rank's own (and S moves by it): the best it knows."""
        if not self.agreed:
            self.update(self.found_here)
        return self.skipped

    def record(self) -> dict:
        """S and its clean-step count, as a checkpoint's ``meta.json`` keeps them."""
        return {"scale": self.scale, "growth_tracker": self.growth_tracker}

    def restore(self, record: dict) -> None:
        """Continue from a checkpoint's :meth:`record`."""
        self.scale = float(record["scale"])
        self.growth_tracker = int(record["growth_tracker"])


def loss_scaler(training: TrainingSpec) -> LossScaler | None:
    """The scaler a spec's ``training.precision`` needs (fp16 only: bf16 has fp32's
    exponent range, fp32 needs none)."""
    if training.precision != "fp16":
        return None
    return LossScaler(LossScaleConfig.from_spec(training.loss_scale))


def agree_found_inf(found: bool, group=None) -> bool:
    """The whole world's found-inf flag: a MAX all-reduce of this rank's over ``group``
    (used where no step commit carries it; see ``runtime.failure.commit_step``)."""
    flag = torch.tensor([1 if found else 0], dtype=torch.int32, device=comm_device())
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
    return bool(flag.item())


def attach_scaler(executor, scaler: LossScaler | None) -> None:
    """Give a rank's executor (or both executors of a ZB-V rank, ``by_stage``) the
    loss scale its last stage multiplies each loss by before backward."""
    for ex in getattr(executor, "by_stage", {0: executor}).values():
        ex.scaler = scaler
