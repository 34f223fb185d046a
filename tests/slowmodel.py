"""A user model (``model.import``) whose one block is slow on one rank only: a
fail-stutter device, for straggler tests."""

from __future__ import annotations

import os
import time

import torch
from torch import nn

from jobctl.engine.model.blocks import Block, Embedding, Head


class Stutter(nn.Module):
    """Identity, plus ``delay_s`` of sleep per forward on rank ``slow_rank``."""

    def __init__(self, slow_rank: int, delay_s: float) -> None:
        super().__init__()
        self.slow = os.environ.get("RANK") == str(slow_rank)
        self.delay_s = delay_s
        self.scale = nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.slow:
            time.sleep(self.delay_s)
        return x * self.scale


def factory(
    slow_rank: int = 1, delay_s: float = 0.02, hidden: int = 32, vocab: int = 256, seq_len: int = 32
) -> list[nn.Module]:
    return [
        Embedding(vocab, hidden, seq_len, 0.0),
        Stutter(slow_rank, delay_s),
        Block(hidden, 4, 0.0),
        Head(vocab, hidden),
    ]
