"""A user model (``model.import``) whose block fails on purpose on one stage."""

from __future__ import annotations

import torch
from torch import nn

from jobctl.engine.model.blocks import Block, Embedding, Head


class Exploding(nn.Module):
    """Passes activations through until the micro-batch count reaches ``after``."""

    def __init__(self, after: int) -> None:
        super().__init__()
        self.after = after
        self.calls = 0
        self.scale = nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls > self.after:
            raise RuntimeError("boom: this block fails on purpose")
        return x * self.scale


def factory(
    after: int = 3, hidden: int = 32, vocab: int = 256, seq_len: int = 16
) -> list[nn.Module]:
    return [
        Embedding(vocab, hidden, seq_len, 0.0),
        Block(hidden, 4, 0.0),
        Exploding(after),
        Head(vocab, hidden),
    ]
