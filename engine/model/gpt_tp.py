"""Tensor parallelism for the builtin GPT family: Megatron-LM's column/row plan on its
blocks (Merak sec. 4.1 for traced models is ``model.graph.tp_stage``; this is the same
split where the blocks are hand-written modules).

Per transformer block, on a T group: the fused q/k/v linear is column parallel (each
rank keeps its ``heads / T`` heads of q, k and v: 1/T of each fused part), the
attention runs on those heads, its output linear is row parallel (1/T of its input
features; partial sums all-reduced, the bias added once after); the MLP's first
linear is column parallel, its second row parallel. Megatron's ``f`` (identity
forward, gradient all-reduced backward) comes before each column linear, ``g`` (the
all-reduce) after each row one: 2 + 2 all-reduces of b x s x h per block and step.
Layer norms, the embedding and the head stay whole on every rank (their gradients
are equal across the group: the same inputs, the same output gradients). A split
parameter keeps its name (``layers.<block>.attn.qkv.weight``); checkpoints gather its
whole tensor (``whole``) and a resume at any T takes its shard (``local``), so a run
saved at T = 2 resumes at T = 1 and back.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard

from jobctl.engine.model.blocks import Attention, Block, Mlp
from jobctl.engine.model.graph.tp_plan import Split
from jobctl.engine.model.graph.tp_stage import Copy, Reduce, shard_of, whole_of

#: A block's split parameters (by their name in the block) and how each is cut.
SPLITS = {
    "attn.qkv.weight": Split(0, 3),
    "attn.qkv.bias": Split(0, 3),
    "attn.proj.weight": Split(1),
    "mlp.fc.weight": Split(0),
    "mlp.fc.bias": Split(0),
    "mlp.proj.weight": Split(1),
}


class ColumnLinear(nn.Module):
    """A column-parallel linear: ``f`` on its input, this rank's output features."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, group) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight)
        self.bias = None if bias is None else nn.Parameter(bias)
        self.copy = Copy(group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self.copy(x), self.weight, self.bias)


class RowLinear(nn.Module):
    """A row-parallel linear: this rank's input features, ``g`` over the partial sums,
    then the (whole) bias once."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, group) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight)
        self.bias = None if bias is None else nn.Parameter(bias)
        self.reduce = Reduce(group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.reduce(F.linear(x, self.weight))
        return y if self.bias is None else y + self.bias


def heads_problem(heads: int, T: int) -> str | None:
    """Why T cannot split a GPT block's heads (None: it can; the widths follow)."""
    if heads % T:
        return f"model.heads {heads} is not divisible by tensor_parallel {T}"
    return None


class GPTShards:
    """A run's builtin-GPT stage made tensor parallel on its T group, with the
    conversions a checkpoint needs between a stage parameter and its whole tensor
    (the interface of ``model.graph.tp_stage.StageShards``)."""

    requested = False  # sub-pipelined TMP runs traced subgraphs only (spec refuses it)

    def __init__(self, T: int, group, ranks: list[int], device: str = "cpu") -> None:
        self.T, self.group = T, group
        self.mesh = DeviceMesh.from_group(group, device, mesh=ranks)
        self.t = self.mesh.get_local_rank()

    def apply(self, stage: nn.Module, blocks: list[int] | None = None) -> None:
        """Split every transformer block of ``stage`` (or those of ``blocks``: a
        migration's arrivals) in place (each was built whole from its block's seed, so
        the T ranks' shards are one model's)."""
        for key, block in stage.layers.items():
            if blocks is not None and int(key) not in blocks:
                continue
            if isinstance(block, Block):
                self._attention(block.attn)
                self._mlp(block.mlp)

    def _cut(self, lin: nn.Linear, name: str) -> tuple[torch.Tensor, torch.Tensor | None]:
        w = shard_of(lin.weight.detach(), SPLITS[f"{name}.weight"], self.t, self.T).clone()
        split = SPLITS.get(f"{name}.bias")
        b = (
            lin.bias.detach()
            if split is None
            else shard_of(lin.bias.detach(), split, self.t, self.T)
        )
        return w, b.clone()

    def _attention(self, attn: Attention) -> None:
        attn.qkv = ColumnLinear(*self._cut(attn.qkv, "attn.qkv"), self.group)
        attn.proj = RowLinear(*self._cut(attn.proj, "attn.proj"), self.group)
        attn.heads //= self.T  # this rank's heads: Attention sizes itself from qkv

    def _mlp(self, mlp: Mlp) -> None:
        mlp.fc = ColumnLinear(*self._cut(mlp.fc, "mlp.fc"), self.group)
        mlp.proj = RowLinear(*self._cut(mlp.proj, "mlp.proj"), self.group)

    def outcome(self) -> str | None:
        return None

    def record(self) -> dict:
        return {"subpipelined": [], "plain": []}

    def split_of(self, name: str) -> Split | None:
        """How the stage parameter ``name`` (``layers.<block>.<...>``) is split."""
        parts = name.split(".", 2)
        return SPLITS.get(parts[2]) if len(parts) == 3 else None

    def whole(self, name: str, local: torch.Tensor) -> torch.Tensor:
        """The whole tensor of ``name`` from the group's shards (collective over T)."""
        split = self.split_of(name)
        if split is None:
            return local
        gathered = DTensor.from_local(local, self.mesh, [Shard(split.dim)]).full_tensor()
        return whole_of(gathered, split, self.T)

    def local(self, name: str, whole: torch.Tensor) -> torch.Tensor:
        """This rank's shard of ``name``'s whole tensor (a checkpoint's, any T)."""
        split = self.split_of(name)
        return whole if split is None else shard_of(whole, split, self.t, self.T)
