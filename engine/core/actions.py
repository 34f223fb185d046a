"""Pipeline actions: the data every schedule is made of.

A schedule gives each pipeline stage an ordered list of actions. The simulator, the
runtime, the plots and the tests all consume the same lists, so the schedule is the one
source of truth for what runs where and when. Sends and receives are implied by data
flow: a forward on stage s > 0 needs the activation of stage s-1, a backward on stage
s < P-1 needs the gradient from stage s+1.

Compact string form, one stage per line: ``F0 F1 R0 B0 F2 B1 ...`` where ``F`` is a
forward, ``R`` a recompute of a forward whose activations were not kept, ``B`` a
backward, ``W`` a weight-gradient pass, and the number is the micro-batch index.

The zero-bubble split (arXiv 2401.10241): on a stage whose list holds a ``W`` for a
micro-batch, its ``B`` computes only the gradient of the stage input (what the
previous stage waits for) and ``W`` computes the weight gradients later; the
activations stay until ``W``. Without ``W``, ``B`` is the whole backward.
"""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass


class Op(str, enum.Enum):
    """Kinds of pipeline work."""

    FORWARD = "F"
    RECOMPUTE = "R"
    BACKWARD = "B"
    WEIGHT = "W"


@dataclass(frozen=True, order=True)
class Action:
    """One unit of work on one stage: an op applied to one micro-batch."""

    op: Op
    micro_batch: int

    def __str__(self) -> str:
        return f"{self.op.value}{self.micro_batch}"

    @classmethod
    def parse(cls, text: str) -> Action:
        """Parse ``F3`` / ``R3`` / ``B3`` / ``W3``."""
        text = text.strip()
        if len(text) < 2 or text[0] not in "FRBW" or not text[1:].isdigit():
            raise ValueError(f"bad action {text!r}: expected F<n>, R<n>, B<n> or W<n>")
        return cls(Op(text[0]), int(text[1:]))


def F(i: int) -> Action:  # noqa: N802 - names from the papers
    """Forward of micro-batch ``i``."""
    return Action(Op.FORWARD, i)


def R(i: int) -> Action:  # noqa: N802
    """Recompute of micro-batch ``i`` (re-runs the forward, keeping activations)."""
    return Action(Op.RECOMPUTE, i)


def B(i: int) -> Action:  # noqa: N802
    """Backward of micro-batch ``i``."""
    return Action(Op.BACKWARD, i)


def W(i: int) -> Action:  # noqa: N802
    """Weight-gradient pass of micro-batch ``i`` (its ``B`` then computes input grads only)."""
    return Action(Op.WEIGHT, i)


def format_actions(actions: list[Action]) -> str:
    """Compact string form of one stage's actions."""
    return " ".join(str(a) for a in actions)


def parse_actions(text: str) -> list[Action]:
    """Inverse of :func:`format_actions`."""
    return [Action.parse(tok) for tok in text.split()]


def format_schedule(stages: list[list[Action]]) -> str:
    """One line per stage: ``S0: F0 F1 B0 B1``."""
    return "\n".join(f"S{s}: {format_actions(a)}" for s, a in enumerate(stages))


def recomputed(actions: list[Action]) -> set[int]:
    """Micro-batches whose forward on this stage is recomputed (forward kept no graph)."""
    return {a.micro_batch for a in actions if a.op is Op.RECOMPUTE}


def weight_split(actions: list[Action]) -> set[int]:
    """Micro-batches whose backward is split into B (input gradient) and W (weights)."""
    return {a.micro_batch for a in actions if a.op is Op.WEIGHT}


def weight_follows(actions: list[Action]) -> set[int]:
    """Micro-batches whose W comes right after their B in ``actions``:
    nothing runs in between, so a stage no one waits on gains nothing from the split."""
    return {
        b.micro_batch
        for b, w in itertools.pairwise(actions)
        if b.op is Op.BACKWARD and w.op is Op.WEIGHT and w.micro_batch == b.micro_batch
    }
