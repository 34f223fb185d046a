"""The model of ``benchmarks/runtime/rebalance_gain.py``: a GPT whose blocks differ in weight scale.

Global magnitude pruning (DynPipe Alg. 2) makes pipeline stages uneven only where layers
differ in magnitude, as they do in trained transformers (weight norms drift apart
with depth; depth-scaled initialisations such as GPT-2's residual scaling or DeepNet's
start them apart on purpose). Here the linear weights of transformer block ``i`` (1 ..
``layers``) are drawn from N(0, (std * ratio^(i - layers))^2): the deepest block has
GPT-2's 0.02, each shallower one ``ratio`` times less. One global threshold then
prunes the shallow blocks first and hardest, so as the model goes to 52 %, 85 % and
90 % more of the first stage's layers pass the CSR crossover and compute faster,
while the deep blocks stay dense: the imbalance grows with sparsity, as in DynPipe
Fig. 1.1. Nothing else differs from the builtin GPT family (same block code, biases
zero, embedding and head at 0.02, no tied weights).
"""

from __future__ import annotations

import torch
from torch import nn

from jobctl.engine.model.blocks import Block, Embedding, Head


def factory(
    layers: int = 8,
    hidden: int = 256,
    heads: int = 4,
    seq_len: int = 64,
    vocab: int = 256,
    std: float = 0.02,
    ratio: float = 1.5,
) -> list[nn.Module]:
    """Embedding, ``layers`` transformer blocks (depth-scaled weights), head."""
    blocks: list[nn.Module] = [Embedding(vocab, hidden, seq_len, 0.0)]
    for i in range(1, layers + 1):
        block = Block(hidden, heads, 0.0)
        scale = std * ratio ** (i - layers)
        with torch.no_grad():
            for mod in block.modules():
                if isinstance(mod, nn.Linear):
                    mod.weight.normal_(0.0, scale)
                    mod.bias.zero_()
        blocks.append(block)
    return [*blocks, Head(vocab, hidden)]
