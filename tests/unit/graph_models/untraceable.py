"""A model torch.export cannot trace: a data-dependent branch in a layer (tests)."""

import torch
from torch import nn


class Gate(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        h = self.lin(x)
        if h.sum() > 0:  # data-dependent control flow
            return h * 2
        return h


class Net(nn.Module):
    def __init__(self, vocab=32):
        super().__init__()
        self.emb = nn.Embedding(vocab, 8)
        self.blocks = nn.ModuleList([Gate(), Gate()])
        self.head = nn.Linear(8, vocab)

    def forward(self, input_ids, labels=None):
        x = self.emb(input_ids)
        for b in self.blocks:
            x = b(x)
        logits = self.head(x)
        flat = logits.reshape(-1, logits.shape[-1])
        return torch.nn.functional.cross_entropy(flat, labels.reshape(-1))


def build(vocab=32):
    return Net(vocab)
