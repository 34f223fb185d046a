"""Where a stage's training state sits in its flat record (Mobius sec. 3.1).

A stage's parameters, gradients and optimizer state live below device memory as one
flat fp32 record: ``[parameters | gradients | slot 1 | slot 2 ...]``, each section
``n`` elements long (``n``: the stage's distinct parameter elements). Sections are
contiguous so a forward upload reads the parameters alone, a backward writes the
gradients alone, and the update on load reads all of it (Mobius's optimizer runs
where the state lives; here the tier is a file or pinned memory, so it runs on the
record once uploaded).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from jobctl.spec.sections import TrainingSpec

#: Bytes of one element of the record (fp32: the builtin model's parameter dtype).
ELEMENT = 4


def slots_of(training: TrainingSpec) -> tuple[str, ...]:
    """The optimizer's per-parameter state tensors, as torch names them."""
    if training.optimizer in ("adam", "adamw"):
        return ("exp_avg", "exp_avg_sq")
    return ("momentum_buffer",) if training.momentum else ()


@dataclass(frozen=True)
class Span:
    """One parameter's place in a section: ``[offset, offset + numel)`` elements."""

    name: str
    offset: int
    numel: int
    shape: tuple[int, ...]


@dataclass(frozen=True)
class StageLayout:
    """The flat record of one stage."""

    spans: tuple[Span, ...]
    slots: tuple[str, ...]

    @property
    def n(self) -> int:
        """Elements per section (the stage's distinct parameter elements)."""
        return sum(s.numel for s in self.spans)

    @property
    def sections(self) -> int:
        """Parameters, gradients and one section per optimizer slot."""
        return 2 + len(self.slots)

    @property
    def nbytes(self) -> int:
        return self.sections * self.n * ELEMENT

    def section(self, k: int) -> tuple[int, int]:
        """Byte range ``(start, length)`` of section ``k`` (0 params, 1 grads, 2+ slots)."""
        return k * self.n * ELEMENT, self.n * ELEMENT

    def span(self, name: str) -> Span:
        return next(s for s in self.spans if s.name == name)


def layout_of(stage: nn.Module, slots: tuple[str, ...]) -> StageLayout:
    """The record layout of ``stage``'s distinct parameters (a co-located tie is one)."""
    spans, offset = [], 0
    for name, p in stage.named_parameters():
        if p.dtype != torch.float32:
            raise ValueError(
                f"parameter {name} is {p.dtype}; the Mobius runtime keeps fp32 records "
                "(training.precision: bf16 computes in bf16 over fp32 weights)"
            )
        spans.append(Span(name, offset, p.numel(), tuple(p.shape)))
        offset += p.numel()
    return StageLayout(tuple(spans), slots)
