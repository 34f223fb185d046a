"""A user model (``model.import``) whose one block is slow on one rank only: a
fail-stutter device, for straggler tests."""

from __future__ import annotations

import os
import time

import torch
from torch import nn

from jobctl.engine.core.env import RESUME_DIR
from jobctl.engine.model.blocks import Block, Embedding, Head


class Stutter(nn.Module):
    """Identity, plus ``delay_s`` of sleep per forward on rank ``slow_rank``; with
    ``first_attempt_only``, not in an attempt that resumes from a checkpoint (a morph's:
    ``JOBCTL_RESUME_DIR`` set), for tests that need a slow run only until they act."""

    def __init__(self, slow_rank: int, delay_s: float, first_attempt_only: bool = False) -> None:
        super().__init__()
        resumed = first_attempt_only and bool(os.environ.get(RESUME_DIR))
        self.slow = os.environ.get("RANK") == str(slow_rank) and not resumed
        self.delay_s = delay_s
        self.scale = nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.slow:
            time.sleep(self.delay_s)
        return x * self.scale


def factory(
    slow_rank: int = 1,
    delay_s: float = 0.02,
    hidden: int = 32,
    vocab: int = 256,
    seq_len: int = 32,
    first_attempt_only: bool = False,
) -> list[nn.Module]:
    return [
        Embedding(vocab, hidden, seq_len, 0.0),
        Stutter(slow_rank, delay_s, first_attempt_only),
        Block(hidden, 4, 0.0),
        Head(vocab, hidden),
    ]
