"""Where tensor parallelism splits a traced model: found on its graph (Merak sec. 4.1).

``discover(graph, T)`` walks the whole traced graph once. Each matrix product that
reads a weight (``aten.linear``, ``addmm``, ``mm``; through a ``t`` when the weight is
stored ``[out, in]``) is looked up in the family's feature dict (``tp_features``):
a column-parallel linear keeps 1/T of the output features (weight and bias split on
the output dimension; GPT-2's ``Conv1D`` stores ``[in, out]``, so its dimension 1), a
row-parallel one 1/T of the input features and its partial sums are all-reduced.
Between them every value holds 1/T of one dimension (the heads); the walk follows
that dimension through views, transposes, splits and attention and rewrites the
sizes the trace baked into the graph (``view(x, [2, 8, 12, 64])`` becomes
``[2, 8, 12 / T, 64]``, the fused q/k/v ``split`` 1/T as wide): the graph's form of
torchtitan's "``num_heads`` per rank". A value entering such a region whole (a T5
position bias over all heads) is narrowed to the rank's heads; a floating one is
marked for Megatron's ``f`` (identity forward, all-reduce of its gradient backward).
The result is keyed by the graph's node names, which the subgraphs keep, so
``for_subgraph`` gives a stage's share; an op the walk does not know stops it with
a clear error rather than a wrong split.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field

import torch
from torch import fx

from jobctl.engine.model.graph.source import FixableError
from jobctl.engine.model.graph.tp_features import Features, features_for

aten = torch.ops.aten
#: matrix product -> (input position, weight position, bias position or None)
LINEARS = {
    aten.linear.default: (0, 1, 2),
    aten.addmm.default: (1, 2, 0),
    aten.mm.default: (0, 1, None),
}
TRANSPOSES = (aten.t.default, aten.numpy_T.default)
ATTENTION = (aten.scaled_dot_product_attention.default,)


@dataclass(frozen=True)
class Split:
    """One parameter split over T: the stored dimension and its fused parts."""

    dim: int
    parts: int = 1


@dataclass
class TPPlan:
    """The column/row-parallel plan of a traced model (or one subgraph of it)."""

    T: int
    params: dict[str, Split] = field(default_factory=dict)  # model name -> split
    column: dict[str, str] = field(default_factory=dict)  # node -> module path
    row: dict[str, str] = field(default_factory=dict)  # node -> module (reduce after)
    sharded: dict[str, int] = field(default_factory=dict)  # node -> split dim of its value
    args: dict[str, tuple] = field(default_factory=dict)  # node -> its rewritten args
    copy: dict[str, list[int]] = field(default_factory=dict)  # node -> whole float inputs
    narrow: dict[str, dict[int, int]] = field(default_factory=dict)  # node -> {arg: dim}

    def for_subgraph(self, module: fx.GraphModule) -> TPPlan:
        """The part of the plan whose nodes and parameters ``module`` holds."""
        # the computing nodes only: a carried value's placeholder keeps its name
        names = {n.name for n in module.graph.nodes if n.op == "call_function"}
        attrs = {n.target for n in module.graph.nodes if n.op == "get_attr"}

        def keep(d: dict) -> dict:
            return {k: v for k, v in d.items() if k in names}

        return TPPlan(
            self.T,
            {k: v for k, v in self.params.items() if k in attrs},
            keep(self.column),
            keep(self.row),
            keep(self.sharded),
            keep(self.args),
            keep(self.copy),
            keep(self.narrow),
        )


def discover(graph, T: int) -> TPPlan:
    """The plan of a ``GraphModel`` at T: its feature dict's linears, then the walk."""
    features = features_for(graph.model)
    plan = TPPlan(T)
    _linears(graph, features, plan)
    if not plan.row:
        raise FixableError(
            "parallelism.tensor_parallel: the feature dict matched no linear of the traced model",
            "check the feature dict's module patterns against the model's module names",
        )
    _walk(graph.gm, plan)
    return plan


def _weight_of(node: fx.Node) -> tuple[fx.Node, bool] | None:
    """A product's weight ``get_attr`` and whether it is read transposed."""
    if node.op == "get_attr":
        return node, False
    if node.op == "call_function" and node.target in TRANSPOSES:
        inner = node.args[0]
        if isinstance(inner, fx.Node) and inner.op == "get_attr":
            return inner, True
    return None


def _linears(graph, features: Features, plan: TPPlan) -> None:
    for node in graph.gm.graph.nodes:
        if node.op != "call_function" or node.target not in LINEARS:
            continue
        _, w, b = LINEARS[node.target]
        found = _weight_of(node.args[w])
        if found is None:
            continue
        weight, transposed = found
        name = graph.original(weight.target)
        module = name.rsplit(".", 1)[0]
        role = features.role(module)
        if role is None:
            continue
        # linear reads [out, in]; addmm/mm read [in, out] unless through a transpose
        out_dim = 0 if (node.target == aten.linear.default) != transposed else 1
        parts = features.parts(module)
        if role == "column":
            plan.column[node.name] = module
            plan.params[name] = Split(out_dim, parts)
            bias = node.args[b] if b is not None and len(node.args) > b else None
            if isinstance(bias, fx.Node) and bias.op == "get_attr":
                plan.params[graph.original(bias.target)] = Split(0, parts)
        else:
            plan.row[node.name] = module
            plan.params[name] = Split(1 - out_dim, parts)


def _walk(gm: fx.GraphModule, plan: TPPlan) -> None:
    """Follow the split dimension from each column linear to its row linears."""
    for node in gm.graph.nodes:
        if node.op == "output":
            leaked = [a.name for a in node.all_input_nodes if a.name in plan.sharded]
            if leaked:
                raise _stuck(node, f"split values {leaked} reach the model's output")
            continue
        if node.op != "call_function":
            continue
        if node.name in plan.column:
            _enter(node, plan)
            continue
        inputs = [a for a in node.all_input_nodes if a.name in plan.sharded]
        if not inputs:
            continue
        if node.name in plan.row:
            x = node.args[LINEARS[node.target][0]]
            if x.name not in plan.sharded or plan.sharded[x.name] != _ndim(x) - 1:
                raise _stuck(node, "a row-parallel linear's input is not split by features")
            continue
        _step(node, inputs[0], plan)


def _enter(node: fx.Node, plan: TPPlan) -> None:
    x = node.args[LINEARS[node.target][0]]
    if x.name in plan.sharded:
        raise _stuck(node, "a column-parallel linear reads an already split value")
    plan.copy[node.name] = [LINEARS[node.target][0]]
    plan.sharded[node.name] = _ndim(node) - 1


def _step(node: fx.Node, first: fx.Node, plan: TPPlan) -> None:
    """The split dimension of ``node``'s value from its split input ``first``."""
    d = plan.sharded[first.name]
    _agree(node, d, plan)
    rule = RULES.get(node.target, _elementwise)
    out, args = rule(node, first, d, plan.T)
    plan.sharded[node.name] = out
    if args is not None:
        plan.args[node.name] = args
    _whole_inputs(node, out, plan)


def _agree(node: fx.Node, d: int, plan: TPPlan) -> None:
    """Split inputs of one op must be split on the same (right-aligned) dimension;
    the q, k and v of attention must all be split."""
    if node.target is operator.getitem:
        return
    split = [a for a in node.all_input_nodes if a.name in plan.sharded]
    first = split[0]
    aligned = {plan.sharded[a.name] - _ndim(a) for a in split}
    if len(aligned) > 1:
        raise _stuck(node, f"its inputs are split on different dimensions ({first.name})")
    q_k_v = node.args[:3]
    if node.target in ATTENTION and not all(a.name in plan.sharded for a in q_k_v):
        raise _stuck(node, "attention whose q, k and v are not all split by heads")


def _whole_inputs(node: fx.Node, out: int, plan: TPPlan) -> None:
    """Inputs that enter the region whole: narrowed if they span the split dim."""
    if node.target is operator.getitem or not isinstance(node.meta.get("val"), torch.Tensor):
        return
    rank = _ndim(node)
    for i, a in enumerate(node.args):
        if not isinstance(a, fx.Node) or a.name in plan.sharded:
            continue
        val = a.meta.get("val")
        if not isinstance(val, torch.Tensor):
            continue
        if val.is_floating_point():
            plan.copy.setdefault(node.name, []).append(i)
        aligned = val.dim() - rank + out
        if aligned >= 0 and val.shape[aligned] != 1:
            plan.narrow.setdefault(node.name, {})[i] = aligned


def _shape(node: fx.Node) -> tuple[int, ...]:
    return tuple(node.meta["val"].shape)


def _ndim(node: fx.Node) -> int:
    return node.meta["val"].dim()


def _stuck(node: fx.Node, why: str) -> FixableError:
    return FixableError(
        f"parallelism.tensor_parallel: cannot split through {node.target} "
        f"(node {node.name}): {why}",
        "set parallelism.tensor_parallel: 1, or correct the family's feature dict "
        "(tp_features.register) so each column linear's output reaches a row linear",
    )


def _div(node: fx.Node, size: int, T: int) -> int:
    if size == -1:
        return -1
    if size % T:
        raise _stuck(node, f"size {size} does not divide by T = {T}")
    return size // T


def _view(node, first, d, T):
    src, out = _shape(first), _shape(node)
    prefix, acc, k = math.prod(src[:d]), 1, 0
    while acc < prefix:
        acc, k = acc * out[k], k + 1
    while k < len(out) - 1 and out[k] == 1:
        k += 1
    if acc != prefix or k >= len(out) or out[k] % T:
        raise _stuck(node, f"view {src} -> {out} mixes the split dimension {d}")
    sizes = list(node.args[1])
    sizes[k] = _div(node, sizes[k], T)
    return k, (node.args[0], sizes, *node.args[2:])


def _expand(node, first, d, T):
    sizes = list(node.args[1])
    k = d + len(sizes) - _ndim(first)
    sizes[k] = _div(node, sizes[k], T)
    return k, (node.args[0], sizes, *node.args[2:])


def _split(node, first, d, T):
    dim = node.args[2] if len(node.args) > 2 else 0
    if dim % _ndim(first) != d:
        return d, None
    size = node.args[1]
    size = [_div(node, s, T) for s in size] if isinstance(size, list) else _div(node, size, T)
    return d, (node.args[0], size, *node.args[2:])


def _getitem(node, first, d, T):
    return d, None


def _transpose(node, first, d, T):
    n = _ndim(first)
    a, b = node.args[1] % n, node.args[2] % n
    return {a: b, b: a}.get(d, d), None


def _permute(node, first, d, T):
    return [p % _ndim(first) for p in node.args[1]].index(d), None


def _unsqueeze(node, first, d, T):
    return d + (1 if node.args[1] % _ndim(node) <= d else 0), None


def _elementwise(node, first, d, T):
    """A shape-preserving op, broadcast aligned right (its scalars are not dims)."""
    out = _ndim(node) - _ndim(first) + d
    if out < 0 or _shape(node)[out] != _shape(first)[d]:
        raise _stuck(node, "no rule for this op on a split value")
    return out, None


def _along(node, first, d, T):
    """An op along ``args[1]`` (slice, softmax, a reduction): not the split dim."""
    dims = node.args[1] if isinstance(node.args[1], (list, tuple)) else [node.args[1]]
    if any(x % _ndim(first) == d for x in dims):
        raise _stuck(node, f"it works along the split dimension {d}")
    if _ndim(node) != _ndim(first):
        raise _stuck(node, "a reduction that drops a dimension of a split value")
    return d, None


def _cat(node, first, d, T):
    dim = node.args[1] if len(node.args) > 1 else 0
    if dim % _ndim(first) == d:
        raise _stuck(node, f"it concatenates along the split dimension {d}")
    return d, None


def _attention(node, first, d, T):
    return d, None


def _matmul(node, first, d, T):
    """A product of values (attention scores, or a linear the feature dict does not
    name): fine over split batch dims, refused where it contracts the split one."""
    a, b = node.args[node.target is aten.addmm.default :][:2]
    if first is a and d == _ndim(a) - 1 or first is b and d == max(_ndim(b) - 2, 0):
        raise _stuck(
            node,
            "a product contracts the split dimension (a linear missing "
            "from the feature dict's row list?)",
        )
    return _ndim(node) - _ndim(first) + d, None


RULES = {
    aten.view.default: _view,
    aten.reshape.default: _view,
    aten._unsafe_view.default: _view,
    aten.expand.default: _expand,
    aten.split.Tensor: _split,
    aten.split_with_sizes.default: _split,
    operator.getitem: _getitem,
    aten.transpose.int: _transpose,
    aten.permute.default: _permute,
    aten.unsqueeze.default: _unsqueeze,
    aten.scaled_dot_product_attention.default: _attention,
    aten.cat.default: _cat,
    **dict.fromkeys(
        (
            aten.matmul.default,
            aten.bmm.default,
            aten.mm.default,
            aten.addmm.default,
            aten.linear.default,
        ),
        _matmul,
    ),
    **dict.fromkeys(
        (
            aten.slice.Tensor,
            aten.select.int,
            aten.narrow.default,
            aten.softmax.int,
            aten._softmax.default,
            aten.log_softmax.int,
            aten.cumsum.default,
            aten.mean.dim,
            aten.sum.dim_IntList,
            aten.amax.default,
        ),
        _along,
    ),
}
