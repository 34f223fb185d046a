"""How a stage of a traced model runs its subgraphs and talks to its neighbours.

A stage receives the carrier of the values the previous stage's last subgraph
produced (``boundary``), runs its subgraphs in order, and packs what the next stage
needs. The first stage starts from the batch; the last returns the model's own loss
(Hugging Face models given ``labels``) rather than logits. The layout of the carrier
a stage receives is learned once, at start-up, from its neighbour
(``runtime.step.probe_channels``), because autocast decides the dtypes at run time.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from jobctl.engine.model.graph import boundary
from jobctl.engine.model.graph.batch import model_inputs
from jobctl.engine.model.graph.losses import compute, split_labels
from jobctl.engine.model.graph.subgraph import repoint_devices


class StageRunner:
    """The graph side of one ``Stage``: which subgraphs, and the carriers in and out."""

    def __init__(self, graph, block_ids: list[int]) -> None:
        self.graph = graph
        self.block_ids = list(block_ids)
        self.first = not self.block_ids or self.block_ids[0] == 0
        self.last = not self.block_ids or self.block_ids[-1] == len(graph.shards) - 1
        self.in_boundary: boundary.Boundary | None = None
        self.out_boundary: boundary.Boundary | None = None
        self.device: torch.device | None = None
        self.needs_batch = self.first or any(graph.shards[i].batch_in for i in self.block_ids)

    def forward(self, stage: nn.Module, x: torch.Tensor | None, batch: dict | None):
        """Run the stage's subgraphs; the carrier for the next stage, or the loss."""
        device = _device_of(stage, x)
        if device != self.device:  # the trace ran on meta; creation ops follow the stage
            for i in self.block_ids:
                repoint_devices(stage.layers[str(i)], device)
            self.device = device
        carry: tuple = ()
        if not self.first:
            if self.in_boundary is None:
                raise RuntimeError("stage input layout unknown: probe_channels did not run")
            carry = tuple(boundary.unpack(self.in_boundary, x))
        kept, rest = stage.split_kept()
        for i in kept:
            carry = stage.layers[str(i)].run(carry, batch or {})
        if rest:  # stage-aware recomputation: inputs kept, the rest recomputed in backward
            carry = checkpoint(self._run, stage, rest, batch or {}, *carry, use_reentrant=False)
        if self.last:
            return carry[0]  # the loss (labels given) or the logits (model.loss named)
        self.out_boundary = boundary.describe(list(carry))
        return boundary.pack(self.out_boundary, list(carry))

    @staticmethod
    def _run(stage: nn.Module, blocks: list[int], batch: dict, *carry) -> tuple:
        for i in blocks:
            carry = stage.layers[str(i)].run(carry, batch)
        return carry

    def batch(self, x: torch.Tensor, y: torch.Tensor, first: int) -> dict:
        """The model's keyword arguments for one micro-batch of tokens."""
        g = self.graph
        batch = model_inputs(g.task, x, y, first, g.cfg.seed, g.mask_id, g.config)
        return split_labels(batch, g.cfg.loss)

    def loss(self, out: torch.Tensor, y: torch.Tensor, batch: dict | None) -> torch.Tensor:
        """The model's own loss (``out``), or ``model.loss`` of its logits."""
        if self.graph.cfg.loss == "auto":
            return out
        return compute(self.graph.cfg.loss, out, y, batch or {})


def _device_of(stage: nn.Module, x: torch.Tensor | None) -> torch.device:
    p = next(stage.parameters(), None)
    if p is not None:
        return p.device
    return x.device if x is not None else torch.device("cpu")
