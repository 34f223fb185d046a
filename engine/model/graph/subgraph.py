"""A subgraph as a module that holds only its own parameters.

``extract`` copies a shard's nodes out of the traced graph into a new graph whose
inputs are the carried values and batch inputs and whose outputs are the values the
next subgraph needs (or the model's outputs, on the last). Parameters keep the
model's own names (``transformer.h.3.attn.c_attn.weight``), so the union of every
subgraph's ``state_dict`` is the model's. The trace ran on fake CPU tensors; device
arguments baked into the graph (``arange(..., device=cpu)``) are re-pointed to the
device the subgraph runs on.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import fx

from jobctl.engine.model.graph.shard import Shard

DROPOUTS = (torch.ops.aten.dropout.default, torch.ops.aten.feature_dropout.default)
TRACED = {"cpu", "meta"}  # the device types a trace bakes into its graph (trace.py)


class Subgraph(fx.GraphModule):
    """One shard as a module: ``run(carry, batch) -> carry`` (a tuple of tensors).

    Its parameters sit at the model's own paths (``transformer.h.3.attn.c_attn.weight``):
    ``rename`` maps a traced attribute to that name (a tied one to its group's first).
    """

    def __init__(
        self,
        gm: fx.GraphModule,
        shard: Shard,
        tensors: dict[str, torch.Tensor],
        rename: Callable[[str], str],
    ) -> None:
        graph = _graph(gm, shard, rename)
        super().__init__({rename(t): tensors[t] for t in shard.params}, graph)
        self.shard = shard
        self.subpipeline = None  # a tensor-parallel block's m/2 twin, when sub-pipelined

    def train(self, mode: bool = True) -> Subgraph:
        """Switch the traced dropouts too: the trace baked ``train=True`` into each
        ``aten.dropout`` call, so eval mode rewrites that argument (eval losses without
        dropout, as the unmodified model in ``eval()`` computes them)."""
        super().train(mode)
        changed = False
        for node in self.graph.nodes:
            dropout = node.op == "call_function" and node.target in DROPOUTS
            if dropout and len(node.args) == 3 and node.args[2] != mode:
                node.args = (node.args[0], node.args[1], mode)
                changed = True
        if changed:
            self.recompile()
        return self

    def run(self, carry: tuple, batch: dict) -> tuple:
        """The shard's outputs from the carried values and the batch's inputs."""
        args = list(carry) + [batch[name] for name in self.shard.batch_in]
        if self.subpipeline is not None:  # sub-pipelined TMP (tp_subpipeline)
            return self.subpipeline.run(self, args)
        out = self(*args)
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _graph(gm: fx.GraphModule, shard: Shard, rename: Callable[[str], str]) -> fx.Graph:
    by_name = {n.name: n for n in gm.graph.nodes}
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for name in shard.carry_in + shard.batch_in:
        env[by_name[name]] = graph.placeholder(name)
    readers: dict[str, list[fx.Node]] = {}  # a parameter may have several get_attr nodes
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            readers.setdefault(node.target, []).append(node)
    for name in shard.params:
        for node in readers.get(name, ()):
            env[node] = graph.get_attr(rename(name))
    for name in shard.nodes:
        node = by_name[name]
        env[node] = graph.node_copy(node, lambda a: env[a])
    graph.output(_outputs(gm, shard, env, by_name))
    return graph


def _outputs(gm: fx.GraphModule, shard: Shard, env: dict, by_name: dict):
    if shard.carry_out:
        return tuple(env[by_name[name]] for name in shard.carry_out)
    final = next(n for n in gm.graph.nodes if n.op == "output")
    return fx.map_arg(final.args[0], lambda a: env[a])


def repoint_devices(module: Subgraph, device: torch.device) -> None:
    """Send tensor-creating nodes to ``device`` instead of the trace's device: CPU
    (``trace.TRACE_DEVICE``), or meta in a graph traced before it."""

    def fix(value):
        if isinstance(value, torch.device) and value.type in TRACED:
            return device
        return value

    for node in module.graph.nodes:
        node.args = tuple(fix(a) for a in node.args)
        node.kwargs = {k: fix(v) for k, v in node.kwargs.items()}
    module.recompile()
