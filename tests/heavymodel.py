"""A user model (``model.import``) with one heavy block: GPT blocks, one of which also
sleeps ``delay_s`` per forward on every rank, so a balancer by measured time sees its
stage overloaded whatever the machine's speed (the planner's analytic costs cannot see
the sleep, so the plan puts it among ordinary blocks)."""

from __future__ import annotations

import time

import torch
from torch import nn

from jobctl.engine.model.blocks import Block, Embedding, Head


class HeavyBlock(Block):
    """A transformer block whose forward takes ``delay_s`` longer."""

    def __init__(self, hidden: int, heads: int, delay_s: float) -> None:
        super().__init__(hidden, heads, 0.0)
        self.delay_s = delay_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.delay_s)
        return super().forward(x)


def _size(hidden: int = 32, heads: int = 4, vocab: int = 256, seq_len: int = 32) -> tuple[int, ...]:
    """The GPT's size: (hidden, heads, vocab, seq_len), these defaults overridden."""
    return hidden, heads, vocab, seq_len


def factory(blocks: int = 5, heavy: int = 2, delay_s: float = 0.02, **size: int) -> list[nn.Module]:
    """Embedding, ``blocks`` transformer blocks (block ``heavy`` sleeps), head; ``size``:
    ``hidden``, ``heads``, ``vocab``, ``seq_len`` (see ``_size``)."""
    hidden, heads, vocab, seq_len = _size(**size)
    body = [
        HeavyBlock(hidden, heads, delay_s) if i == heavy else Block(hidden, heads, 0.0)
        for i in range(1, blocks + 1)
    ]
    return [Embedding(vocab, hidden, seq_len, 0.0), *body, Head(vocab, hidden)]
