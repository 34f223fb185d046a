"""``training.precision``'s numerics: fp16's dynamic loss scale (``training.loss_scale``).

fp16 keeps 5 exponent bits, so training multiplies the loss by a scale S before
backward and divides the gradients by it before the update, skipping the update
where a gradient overflowed (``engine.runtime.loss_scale``). The defaults are
torch.amp.GradScaler's. bf16 (fp32's exponent range) and fp32 need no scale.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pydantic import Field

from .base import SpecModel, Violation
from .limits import MAX_STEPS


class LossScaleSpec(SpecModel):
    """fp16's dynamic loss scale: where it starts and how it moves."""

    init_scale: float = Field(2.0**16, gt=0.0, description="S at the first step.")
    growth_factor: float = Field(
        2.0, gt=1.0, description="S is multiplied by this after growth_interval clean steps."
    )
    backoff_factor: float = Field(
        0.5, gt=0.0, lt=1.0, description="S is multiplied by this on a step that overflowed."
    )
    growth_interval: int = Field(
        2000, ge=1, le=MAX_STEPS, description="Clean steps in a row before S grows."
    )


def loss_scale_violations(training: Any) -> Iterator[Violation]:
    """``training.loss_scale`` changed where nothing scales the loss (``training`` is a
    ``TrainingSpec``). Changed, not merely written: a run's saved spec writes every
    field, the default rule included."""
    if training.loss_scale != LossScaleSpec() and training.precision != "fp16":
        yield Violation(
            "loss_scale",
            f"loss_scale is only used by precision fp16, but precision is {training.precision!r}",
            "remove training.loss_scale or set training.precision: fp16",
        )
