"""Sub-pipelined TMP (Merak sec. 5.3): a tensor-parallel subgraph's micro-batch as two
sub-micro-batches, so that one communicates while the other computes.

The subgraph is traced a second time at m/2 (same shards and node names, sizes
halved) and made tensor parallel like the whole one (``tp_stage.rewrite``); its
``get_attr`` reads the whole block's own parameters, so nothing is copied. Megatron's
``f`` (``tp_copy``) and ``g`` (``tp_reduce``) nodes cut the graph into segments run by
a small interpreter, one environment per sub-micro-batch, each segment on detached
inputs (leaves) so that the backward can be run segment by segment in an order we
choose (the autograd engine's own order, by creation, would wait for each all-reduce
at once):

* forward, a phase ends after each ``g``: its all-reduce starts (``async_op=True``)
  and the other sub-micro-batch runs its phase before the first one reads the sum;
* backward, a phase ends at each ``f``: the input gradient's all-reduce starts and
  the other sub-micro-batch back-propagates its phase before this one reads it.

The two halves' results are the whole micro-batch's: outputs with a batch dimension
are concatenated, values without one (a causal mask) are shared, and their
gradients summed. A subgraph that computes the model's loss (the last) is not split
(a mean over the batch), nor is an odd micro-batch: plain TMP there.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import fx

from jobctl.engine.model.graph.subgraph import repoint_devices

COPY, REDUCE = "tp_copy", "tp_reduce"


@dataclass
class Segment:
    """Nodes run together; what they read from before and what later nodes read."""

    nodes: list[fx.Node] = field(default_factory=list)
    inputs: list[fx.Node] = field(default_factory=list)
    outputs: list[fx.Node] = field(default_factory=list)
    before: fx.Node | None = None  # the f or g node that starts the segment


@dataclass
class Half:
    """One sub-micro-batch's values and the pending all-reduces on them."""

    env: dict = field(default_factory=dict)  # node -> value (detached)
    saved: list = field(default_factory=list)  # per segment: (leaves, outputs)
    pending: dict = field(default_factory=dict)  # node -> (work, value to add into)
    grads: dict = field(default_factory=dict)  # node -> summed gradient

    def value(self, node: fx.Node) -> torch.Tensor:
        if node in self.pending:
            self.pending.pop(node)[0].wait()
        return self.env[node]

    def add(self, node: fx.Node, g: torch.Tensor | None) -> None:
        if g is not None:
            self.grads[node] = g if node not in self.grads else self.grads[node] + g

    def flush(self) -> None:
        """Wait for the started gradient all-reduces and add them where they go."""
        for node, (work, g) in list(self.pending.items()):
            work.wait()
            self.add(node, g)
        self.pending.clear()


def segments(graph: fx.Graph) -> list[Segment]:
    """The graph cut at every ``f`` and ``g``, each segment's reads and writes."""
    segs, where = [Segment()], {}
    for node in graph.nodes:
        if node.op in ("placeholder", "output", "get_attr"):
            continue
        if node.op == "call_module" and node.target in (COPY, REDUCE):
            segs.append(Segment(before=node))
            continue
        segs[-1].nodes.append(node)
        where[node] = len(segs) - 1
    for k, seg in enumerate(segs):
        reads = {a for n in seg.nodes for a in n.all_input_nodes if a.op != "get_attr"}
        seg.inputs = [a for a in reads if where.get(a) != k]
        seg.outputs = [n for n in seg.nodes if any(where.get(u) != k for u in n.users)]
    return [s for s in segs if s.nodes or s.before is not None]


class SubPipeline:
    """``block`` (a tensor-parallel ``Subgraph`` at micro-batch m) run as two halves
    through ``half`` (the same subgraph at m/2); ``split[i]``: input i is cut along
    its first dimension (else shared), ``split_out`` likewise for the outputs;
    ``lead``: the first split input's first dimension at m (m, or m x seq for a
    flattened value): any other size goes to the block itself, as plain TMP."""

    def __init__(
        self, half: fx.GraphModule, lead: int, split: list[bool], split_out: list[bool], group
    ) -> None:
        self.half, self.lead, self.group = half, lead, group
        self.split, self.split_out = split, split_out
        self.placeholders = [n for n in half.graph.nodes if n.op == "placeholder"]
        self.out = next(n for n in half.graph.nodes if n.op == "output")
        self.segs = segments(half.graph)
        # fixed by the trace: cut once here, not on every micro-batch
        self.fwd_phases = self._phases(REDUCE)  # a phase ends where g's all-reduce starts
        self.bwd_phases = self._phases(COPY)  # run backward: a phase ends at f's all-reduce
        self.seg_index = {id(s): k for k, s in enumerate(self.segs)}
        self.block: fx.GraphModule | None = None
        self.device: torch.device | None = None
        self.runs = 0  # micro-batches run as two halves

    def run(self, block: fx.GraphModule, args: list) -> tuple:
        """The block's outputs for ``args`` (the whole micro-batch)."""
        first = next(a for a, s in zip(args, self.split, strict=True) if s)
        if first.shape[0] != self.lead or not torch.is_grad_enabled():  # eval: plain
            out = block(*args)
            return tuple(out) if isinstance(out, (tuple, list)) else (out,)
        if self.half.training != block.training:
            self.half.train(block.training)
        if first.device != self.device:  # the trace ran on meta, as the block's did
            repoint_devices(self.half, first.device)
            self.device = first.device
        self.block, self.runs = block, self.runs + 1
        anchor = torch.zeros((), requires_grad=True)  # the backward runs for the params
        return _Interleaved.apply(self, anchor, *args)

    # forward ---------------------------------------------------------------------
    def forward(self, args: tuple) -> tuple[list[Half], list]:
        halves = [Half(), Half()]
        for i, (a, s) in enumerate(zip(args, self.split, strict=True)):
            parts = a.chunk(2) if s else (a, a)
            for h, p in zip(halves, parts, strict=True):
                h.env[self.placeholders[i]] = p
        phases = self.fwd_phases
        for k, phase in enumerate(phases):
            for h in halves:
                for j, seg in enumerate(phase):
                    self._run_segment(h, seg, boundary=j > 0 or k == 0)
                if k + 1 < len(phases):  # g starts now; its sum is read on h's next turn
                    self._boundary(h, phases[k + 1][0].before)
        outs = [[h.value(n) for n in _flat(self.out)] for h in halves]
        return halves, outs

    def _phases(self, cut: str) -> list[list[Segment]]:
        """The segments in runs that one half runs before the other takes its turn:
        a new run starts at each segment after a ``cut`` node (g forward, f backward)."""
        phases: list[list[Segment]] = []
        for seg in self.segs:
            if not phases or (seg.before is not None and seg.before.target == cut):
                phases.append([])
            phases[-1].append(seg)
        return phases

    def _run_segment(self, h: Half, seg: Segment, boundary: bool = True) -> None:
        if seg.before is not None and boundary:
            self._boundary(h, seg.before)
        leaves = {}
        for n in seg.inputs:
            v = h.value(n)
            grad = isinstance(v, torch.Tensor) and v.is_floating_point()
            leaves[n] = v.detach().requires_grad_(True) if grad else v
        local = dict(leaves)
        with torch.enable_grad():
            for n in seg.nodes:
                local[n] = self._node(n, local)
        outs = {n: local[n] for n in seg.outputs}
        h.env.update({n: _detach(v) for n, v in outs.items()})
        h.saved.append((leaves, outs))

    def _boundary(self, h: Half, node: fx.Node) -> None:
        src = node.args[0]
        if node.target == COPY:  # f: the value as is (its gradient summed in backward)
            h.env[node] = h.value(src)
            return
        summed = h.value(src).contiguous().clone()  # g: the sum, read after the other half
        h.pending[node] = (dist.all_reduce(summed, group=self.group, async_op=True), None)
        h.env[node] = summed

    def _node(self, n: fx.Node, local: dict):
        args = fx.map_arg(n.args, lambda a: self._arg(a, local))
        kwargs = fx.map_arg(n.kwargs, lambda a: self._arg(a, local))
        if n.op == "call_module":
            return self.half.get_submodule(n.target)(*args, **kwargs)
        return n.target(*args, **kwargs)

    def _arg(self, a: fx.Node, local: dict):
        if a.op == "get_attr":  # the whole block's own parameter or buffer
            return _attr(self.block, a.target)
        return local[a]

    # backward --------------------------------------------------------------------
    def backward(self, halves: list[Half], grads: list) -> list[list]:
        """Gradients of each half's inputs from its outputs' gradients."""
        for h, g in zip(halves, grads, strict=True):
            for n, gn in zip(_flat(self.out), g, strict=True):
                h.add(n, gn)
        index = self.seg_index
        for phase in reversed(self.bwd_phases):
            for h in reversed(halves):  # the half that finished its forward last
                h.flush()
                for seg in reversed(phase):
                    self._back_segment(h, seg, index[id(seg)])
        out = []
        for h in halves:
            h.flush()
            out.append([h.grads.get(p) for p in self.placeholders])
        return out

    def _back_segment(self, h: Half, seg: Segment, k: int) -> None:
        leaves, outs = h.saved[k]
        pairs = [
            (outs[n], h.grads.pop(n)) for n in seg.outputs if n in h.grads and outs[n].requires_grad
        ]
        if pairs:
            torch.autograd.backward([t for t, _ in pairs], [g for _, g in pairs])
        for n, leaf in leaves.items():
            if isinstance(leaf, torch.Tensor) and leaf.requires_grad:
                h.add(n, leaf.grad)
        if seg.before is not None:
            self._back_boundary(h, seg.before)

    def _back_boundary(self, h: Half, node: fx.Node) -> None:
        g, src = h.grads.pop(node, None), node.args[0]
        if g is None:
            return
        if node.target == REDUCE:  # g: its gradient as is
            h.add(src, g)
            return
        g = g.clone(memory_format=torch.contiguous_format)  # f: summed over T, async
        h.pending[src] = (dist.all_reduce(g, group=self.group, async_op=True), g)


class _Interleaved(torch.autograd.Function):
    """The two halves' interleaved run as one autograd node of the stage."""

    @staticmethod
    def forward(ctx, sp: SubPipeline, anchor, *args):  # noqa: ANN001
        halves, outs = sp.forward(args)
        ctx.sp, ctx.halves = sp, halves
        ctx.shapes = [(a.shape, a.dtype) if isinstance(a, torch.Tensor) else None for a in args]
        merged = []
        for i, s in enumerate(sp.split_out):
            a, b = outs[0][i], outs[1][i]
            merged.append(torch.cat([a, b]) if s else a.clone())
        ctx.mark_non_differentiable(*[t for t in merged if not t.is_floating_point()])
        return tuple(merged)

    @staticmethod
    def backward(ctx, *grads):  # noqa: ANN001
        sp = ctx.sp
        per_half = [[], []]
        for g, s in zip(grads, sp.split_out, strict=True):
            parts = g.chunk(2) if s and g is not None else (g, None)
            per_half[0].append(parts[0])
            per_half[1].append(parts[1])
        ga, gb = sp.backward(ctx.halves, per_half)
        ctx.halves = None
        out = [None, None]
        for a, b, s, shape in zip(ga, gb, sp.split, ctx.shapes, strict=True):
            out.append(_join(a, b, s, shape))
        return tuple(out)


def _join(a, b, split: bool, shape):
    if a is None and b is None:
        return None
    if not split:
        return a if b is None else (b if a is None else a + b)
    ref = a if a is not None else b
    a = torch.zeros_like(ref) if a is None else a
    b = torch.zeros_like(ref) if b is None else b
    return torch.cat([a, b])


def _flat(out: fx.Node) -> list[fx.Node]:
    value = out.args[0]
    return list(value) if isinstance(value, (tuple, list)) else [value]


def _detach(v):
    return v.detach() if isinstance(v, torch.Tensor) else v


def _attr(module, target: str):
    for part in target.split("."):
        module = getattr(module, part)
    return module
