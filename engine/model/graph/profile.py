"""What each subgraph costs, from the traced graph's real shapes (no weights needed).

Every subgraph runs once on the meta device under ``FlopCounterMode`` (exact matmul
and attention FLOPs for the traced shapes); parameter elements are the meta
tensors' sizes; the bytes a cut moves are its carrier's (``boundary``); the
activation bytes a subgraph keeps for backward are the float values its nodes
produce (an upper bound: autograd frees some views). All are per traced
micro-batch; ``per_sample`` divides by its size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import fx
from torch.utils.flop_counter import FlopCounterMode

from jobctl.engine.model.graph import boundary
from jobctl.engine.model.graph.batch import example_inputs
from jobctl.engine.model.graph.subgraph import Subgraph, repoint_devices


@dataclass(frozen=True)
class SubgraphCost:
    """One subgraph's size and work for one traced micro-batch."""

    params: int
    flops: float  # forward
    out_bytes: int  # the carrier it hands the next subgraph (0 for the last)
    act_bytes: int


def profile(graph, micro_batch: int) -> list[SubgraphCost]:
    """Costs of every subgraph of ``graph`` (a ``GraphModel``) for one micro-batch."""
    batch = example_inputs(graph.task, micro_batch, graph.cfg.seq_len, config=graph.config)
    carry: tuple = ()
    costs = []
    for shard in graph.shards:
        tensors = {t: graph.meta_tensor(graph.original(t)) for t in shard.params}
        sub = Subgraph(graph.gm, shard, tensors, graph.original)
        repoint_devices(sub, torch.device("meta"))  # run where its tensors are
        counter, sizes = FlopCounterMode(display=False), _Sizes(sub)
        with counter, torch.no_grad():
            out = sizes.run(*carry, *[batch[n] for n in shard.batch_in])
        carry = tuple(out) if isinstance(out, (tuple, list)) else (out,)
        params = sum(
            t.numel() for t in tensors.values() if t.is_floating_point() and t.requires_grad
        )
        last = not shard.carry_out
        out_bytes = 0 if last else boundary.describe(list(carry)).nbytes()
        flops = float(counter.get_total_flops())
        costs.append(SubgraphCost(params, flops, out_bytes, sizes.total))
    return costs


class _Sizes(fx.Interpreter):
    """Runs a subgraph and adds up the bytes of the float values its nodes produce."""

    total = 0

    def run_node(self, n: fx.Node):
        out = super().run_node(n)
        if n.op == "call_function" and isinstance(out, torch.Tensor) and out.is_floating_point():
            self.total += out.numel() * out.element_size()
        return out
