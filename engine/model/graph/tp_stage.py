"""A stage's subgraphs made tensor parallel: local weight shards and the collectives.

Why not ``torch.distributed.tensor.parallel.parallelize_module``: a stage here is a
``torch.export`` graph of aten ops (``subgraph``), with no ``nn.Linear`` submodules
for ``ColwiseParallel``/``RowwiseParallel`` to act on (they raise for anything
else), and the head counts are literal sizes in its ``view``/``expand``/``split``
arguments, which DTensor's local outputs would not change; running the graph on
DTensors instead would all-gather at GPT-2's fused q/k/v ``split`` (its column
shards mix q, k and v). So the minimal own part is Megatron's two operators as
graph modules, on the tensor-parallel process group: ``Copy`` (``f``: identity
forward, gradient all-reduced backward) before a column linear, ``Reduce`` (``g``:
partial sums all-reduced forward, identity backward) after a row linear, with the
row linear's bias added once after it. PyTorch's API is used where it fits: the
``DeviceMesh`` over (D, P, T) that gives every group, and DTensor's ``full_tensor``
that gathers the shards into whole tensors for checkpoints (``full_state``), so a
run saved at T = 2 resumes at T = 1. All of it runs on gloo (CPU) and NCCL alike.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import fx, nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Shard

from jobctl.engine.model.graph.subgraph import Subgraph
from jobctl.engine.model.graph.tp_plan import LINEARS, Split, TPPlan, discover
from jobctl.engine.model.graph.tp_subpipeline import SubPipeline

aten = torch.ops.aten


class _CopyFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        x = x.contiguous().clone()  # the product's output may be saved: sum a copy
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class Copy(nn.Module):
    """Megatron's ``f``: the value as is; its gradient summed over the T group."""

    def __init__(self, group) -> None:
        super().__init__()
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _CopyFn.apply(x, self.group)


class Reduce(nn.Module):
    """Megatron's ``g``: partial sums all-reduced over the T group; gradient as is."""

    def __init__(self, group) -> None:
        super().__init__()
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ReduceFn.apply(x, self.group)


class Narrow(nn.Module):
    """This rank's 1/T of a whole value along ``dim`` (a bias over all heads)."""

    def __init__(self, dim: int, rank: int, T: int) -> None:
        super().__init__()
        self.dim, self.rank, self.T = dim, rank, T

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        size = x.shape[self.dim] // self.T
        return x.narrow(self.dim, self.rank * size, size)


def tp_mesh(P: int, D: int, T: int, device: str = "cpu") -> DeviceMesh:
    """The (D, P, T) mesh: rank = (d P + p) T + t, so a T group is T consecutive
    ranks, inside one node when T divides the processes per node."""
    return init_device_mesh(device, (D, P, T), mesh_dim_names=("dp", "pp", "tp"))


def shard_of(full: torch.Tensor, split: Split, rank: int, T: int) -> torch.Tensor:
    """Rank ``rank``'s shard of a whole tensor: 1/T of each fused part along ``dim``."""
    parts = full.chunk(split.parts, dim=split.dim)
    return torch.cat([p.chunk(T, dim=split.dim)[rank] for p in parts], dim=split.dim)


def whole_of(gathered: torch.Tensor, split: Split, T: int) -> torch.Tensor:
    """The whole tensor from the ranks' shards laid end to end (``shard_of``'s inverse)."""
    per_rank = [c.chunk(split.parts, dim=split.dim) for c in gathered.chunk(T, split.dim)]
    return torch.cat([r[p] for p in range(split.parts) for r in per_rank], dim=split.dim)


def parallelize(module: fx.GraphModule, plan: TPPlan, mesh: DeviceMesh) -> None:
    """Make one subgraph tensor parallel in place on the 1-D T mesh (``tp_mesh(...)
    ["tp"]``): its split parameters become this rank's shards and its graph gets the
    collectives and the per-rank sizes."""
    plan = plan.for_subgraph(module)
    group, rank = mesh.get_group(), mesh.get_local_rank()
    for name, split in plan.params.items():
        owner, leaf = _owner(module, name)
        whole = getattr(owner, leaf)
        local = shard_of(whole.detach(), split, rank, plan.T).clone()
        setattr(owner, leaf, nn.Parameter(local, requires_grad=whole.requires_grad))
    rewrite(module, plan, group, rank)


def rewrite(module: fx.GraphModule, plan: TPPlan, group, rank: int) -> None:
    """The graph side of ``parallelize`` alone (``plan`` already ``module``'s): the
    collectives and the per-rank sizes; its parameters are left as they are."""
    module.add_module("tp_copy", Copy(group))
    module.add_module("tp_reduce", Reduce(group))
    _rewrite(module, plan, rank)
    module.graph.lint()
    module.recompile()


def _owner(module: nn.Module, name: str) -> tuple[nn.Module, str]:
    path, _, leaf = name.rpartition(".")
    return (module.get_submodule(path) if path else module), leaf


def _rewrite(module: fx.GraphModule, plan: TPPlan, rank: int) -> None:
    graph = module.graph
    copies: dict[fx.Node, fx.Node] = {}  # one f per value and subgraph: one all-reduce
    by_name = {n.name: n for n in graph.nodes}
    for node in list(graph.nodes):
        if node.name in plan.args:  # the walk's args name the whole graph's nodes
            node.args = fx.map_arg(plan.args[node.name], lambda a: by_name[a.name])
        for i in plan.copy.get(node.name, []):
            _wrap_input(module, node, i, copies)
        for i, dim in plan.narrow.get(node.name, {}).items():  # after f: its grad summed
            _narrow_input(module, node, i, Narrow(dim, rank, plan.T))
        if node.name in plan.row:
            _reduce_after(graph, node)


def _wrap_input(module: fx.GraphModule, node: fx.Node, i: int, copies: dict) -> None:
    source = node.args[i]
    if source not in copies:  # before its first reader: every later reader follows
        with module.graph.inserting_before(node):
            copies[source] = module.graph.call_module("tp_copy", (source,))
    node.update_arg(i, copies[source])


def _narrow_input(module: fx.GraphModule, node: fx.Node, i: int, narrow: Narrow) -> None:
    name = f"tp_narrow_{narrow.dim}"
    if not hasattr(module, name):
        module.add_module(name, narrow)
    with module.graph.inserting_before(node):
        node.update_arg(i, module.graph.call_module(name, (node.args[i],)))


def _reduce_after(graph: fx.Graph, node: fx.Node) -> None:
    """``x W (+ b)`` -> ``reduce(x W) (+ b)``: the bias added once, after the sum."""
    x, w, b = LINEARS[node.target]
    bias = node.args[b] if b is not None and len(node.args) > b else None
    if node.target == aten.addmm.default:
        node.target, node.args = aten.mm.default, (node.args[x], node.args[w])
    elif bias is not None:
        node.args = (node.args[x], node.args[w])
    with graph.inserting_after(node):
        summed = graph.call_module("tp_reduce", (node,))
    last = summed
    if bias is not None:
        with graph.inserting_after(summed):
            last = graph.call_function(aten.add.Tensor, (summed, bias))
    node.replace_all_uses_with(last, delete_user_cb=lambda user: user is not summed)


def full_state(module: nn.Module, plan: TPPlan, mesh: DeviceMesh) -> dict[str, torch.Tensor]:
    """``module``'s state with every split parameter gathered whole (DTensor's
    ``full_tensor`` over the T group, then the fused parts put back in order)."""
    state = {}
    for name, value in module.state_dict().items():
        split = plan.params.get(name)
        if split is not None:
            gathered = DTensor.from_local(value, mesh, [Shard(split.dim)]).full_tensor()
            value = whole_of(gathered, split, plan.T)
        state[name] = value
    return state


class StageShards:
    """A run's stage made tensor parallel on its T group: the plan found on the traced
    model, the 1-D mesh over the group's ranks, and the conversions a checkpoint needs
    between a stage parameter (``layers.<block>.<model name>``) and its whole tensor."""

    def __init__(
        self,
        graph,
        T: int,
        group,
        ranks: list[int],
        device: str = "cpu",
        subpipeline: bool = False,
        m: int = 0,
    ) -> None:
        self.graph, self.m = graph, m
        self.plan = discover(graph, T)
        self.mesh = DeviceMesh.from_group(group, device, mesh=ranks)
        self.t = self.mesh.get_local_rank()
        self.requested = subpipeline  # the plan's tp_subpipeline
        self.subpipelined: list[int] = []  # blocks run as two sub-micro-batches
        self.reasons: list[str] = []  # why a block (or the stage) runs plain TMP
        self.half = self._half_trace() if subpipeline else None

    def _half_trace(self):
        if self.m < 2 or self.m % 2:
            self.reasons.append(f"micro-batch {self.m} does not halve: plain TMP")
            return None
        half = type(self.graph)(self.graph.cfg, self.m // 2)
        return half, discover(half, self.plan.T)

    def apply(self, stage: nn.Module, blocks: list[int] | None = None) -> None:
        """Split every subgraph of ``stage`` (its ``layers``) in place; each was built
        whole with the run's seed, so the T ranks' shards are one model's. With
        sub-pipelining, each split subgraph that does not end the model also gets
        its m/2 twin (``tp_subpipeline``). ``blocks``: only those (a migration's
        arrivals)."""
        recomputed = stage.split_kept()[1]
        for key, block in stage.layers.items():
            if blocks is not None and int(key) not in blocks:
                continue  # already split (a migration's kept block)
            parallelize(block, self.plan, self.mesh)
            if self.half is not None:
                why = self._subpipeline(int(key), block, recomputed)
                self.reasons += [f"block {key}: {why}"] if why else []
                self.subpipelined += [] if why else [int(key)]

    def outcome(self) -> str | None:
        """One line for the rank's log: which blocks run sub-pipelined and why each
        other one runs plain TMP (None where the plan did not ask for it), so that
        ``tp_subpipeline: true`` never falls back to plain TMP unseen."""
        if not self.requested:
            return None
        done = ", ".join(str(i) for i in self.subpipelined) or "none"
        plain = "; ".join(self.reasons) or "none"
        return f"sub-pipelined TMP: blocks {done}; plain TMP: {plain}"

    def record(self) -> dict:
        """``outcome`` as an event's fields: the sub-pipelined blocks, the plain reasons."""
        return {"subpipelined": list(self.subpipelined), "plain": list(self.reasons)}

    def _subpipeline(self, i: int, block, recomputed: list[int]) -> str | None:
        if i in recomputed:  # stage-aware recomputation reruns its forward in backward
            return "recomputed in backward: plain TMP"
        return subpipeline(block, i, self.graph, self.half, self.plan, self.mesh)

    def split_of(self, name: str) -> Split | None:
        """How the stage parameter ``name`` is split (None: whole on every rank)."""
        parts = name.split(".", 2)
        return self.plan.params.get(parts[2]) if len(parts) == 3 else None

    def whole(self, name: str, local: torch.Tensor) -> torch.Tensor:
        """The whole tensor of ``name`` from the group's shards (collective over T)."""
        split = self.split_of(name)
        if split is None:
            return local
        gathered = DTensor.from_local(local, self.mesh, [Shard(split.dim)]).full_tensor()
        return whole_of(gathered, split, self.plan.T)

    def local(self, name: str, whole: torch.Tensor) -> torch.Tensor:
        """This rank's shard of ``name``'s whole tensor (a checkpoint's, any T)."""
        split = self.split_of(name)
        return whole if split is None else shard_of(whole, split, self.t, self.plan.T)


def subpipeline(block, i: int, graph, half, plan: TPPlan, mesh: DeviceMesh) -> str | None:
    """Give the split subgraph ``block`` (block ``i`` of ``graph``, traced at m) its
    twin from ``half`` (the m/2 trace and its plan) and run it sub-pipelined from now
    on (``Subgraph.run``); else why not (it then runs plain TMP)."""
    half, half_plan = half
    if not plan.for_subgraph(block).row:
        return "no tensor-parallel linear"
    if not block.shard.carry_out:
        return "computes the model's output (a mean over the batch): plain TMP"
    hs = half.shards[i]
    if _shape_free(hs) != _shape_free(block.shard):
        return "the m/2 trace shards differently: plain TMP"
    mine = block.shard  # the twin's values by position: a size-1 trace drops no-op nodes
    split = _batch_dims(graph, half, mine.carry_in + mine.batch_in, hs.carry_in + hs.batch_in)
    split_out = _batch_dims(graph, half, mine.carry_out, hs.carry_out)
    if None in split + split_out or not any(split):
        return (
            "a value's m/2 trace is not its first dimension halved (nor the same shape): plain TMP"
        )
    tensors = {t: _attr(block, half.original(t)) for t in hs.params}
    twin = Subgraph(half.gm, hs, tensors, half.original)
    group, t = mesh.get_group(), mesh.get_local_rank()
    rewrite(twin, half_plan.for_subgraph(twin), group, t)
    lead = _lead(graph, mine.carry_in + mine.batch_in, split)
    block.subpipeline = SubPipeline(twin, lead, split, split_out, group)
    return None


def _shape_free(shard) -> tuple:
    """What a subgraph's twin at another micro-batch size must share with it."""
    return len(shard.carry_in), shard.batch_in, len(shard.carry_out), sorted(shard.params)


def _batch_dims(full, half, names: list[str], half_names: list[str]) -> list[bool | None]:
    """Is each value (named in ``full``, and in ``half`` at the same place) cut along
    its first dimension in the m/2 trace (``halved``)?"""
    whole = {n.name: n for n in full.gm.graph.nodes}
    halves = {n.name: n for n in half.gm.graph.nodes}
    return [
        halved(_shape(whole[a]), _shape(halves[b])) for a, b in zip(names, half_names, strict=True)
    ]


def _shape(node: fx.Node):
    return getattr(node.meta.get("val"), "shape", None)


def halved(whole, half) -> bool | None:
    """A value's shape at m and at m/2: True where only its first dimension differs,
    by exactly 2x (the halves are ``chunk(2)`` of it); False where they are equal (no
    batch dimension: shared by the halves); None otherwise (a sequence-first value,
    an unknown shape): the block then runs plain TMP rather than split it wrongly."""
    if whole is None or half is None or len(whole) != len(half):
        return None
    if tuple(whole) == tuple(half):
        return False
    if len(whole) and tuple(whole[1:]) == tuple(half[1:]) and whole[0] == 2 * half[0]:
        return True
    return None


def _lead(full, names: list[str], split: list[bool]) -> int:
    """The first dimension of the first split value at the whole micro-batch."""
    node = next(n for n in full.gm.graph.nodes if n.name == names[split.index(True)])
    return int(node.meta["val"].shape[0])


def _attr(module: nn.Module, name: str):
    owner, leaf = _owner(module, name)
    return getattr(owner, leaf)
