"""Live migration of blocks between ranks (DynPipe sec. 3.0.3): no restart.

Given the plan a run trains under and a new one (other stage boundaries, or fewer
stages after packing; the same D), every block whose owner changes travels, for each
data-parallel replica d, from replica d of its old stage to replica d of its new stage:
its parameters (under the unsplit model's names, tied aliases included), their
optimizer state (momentum buffers, Adam's moments and step) and any extra per-parameter
tensors (pruning masks). Transfers run in one global order that every rank walks, a
rank sending or receiving only in its own pairs, so there is no cycle and no deadlock.

The receiving rank builds its new :class:`Stage` from the blocks it keeps (the very
module objects, so their parameters and optimizer state stay) and the blocks that
arrived, a fresh optimizer over it holding the moved state, the new topology (all ranks
create the new process groups together, freed ranks included) and the new action
list. Values are copied bit for bit, so training continues with identical numerics.
"""

from __future__ import annotations

import copy
import io
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from jobctl.engine.core.actions import Action
from jobctl.engine.core.plan import Plan
from jobctl.engine.model.blocks import ModelDef, Stage
from jobctl.engine.runtime.optim import build_optimizer
from jobctl.engine.runtime.p2p.gloo import comm_device
from jobctl.engine.runtime.topology import Topology, build_topology, tie_blocks
from jobctl.engine.runtime.two_stage import v_rank
from jobctl.spec.sections import TrainingSpec

Tensors = dict[str, torch.Tensor]


@dataclass
class Migrated:
    """One rank's state after a migration (``stage`` None: this rank was freed)."""

    stage: Stage | None
    named: dict[str, nn.Parameter]
    opt: torch.optim.Optimizer | None
    topo: Topology | None
    actions: list[Action]
    extras: Tensors  # extra tensors (masks) that arrived, by unsplit name
    left: list[int]  # blocks that left this rank
    arrived: list[int]  # blocks that arrived
    bytes_sent: int = 0
    seconds: float = 0.0
    live_group: object | None = None  # group of the ranks still training (after a pack)
    copies: list = field(default_factory=list)  # the copies moved too: (stage, named, opt)

    @property
    def freed(self) -> bool:
        return self.stage is None


def owners(plan: Plan) -> dict[tuple[int, int, int], int]:
    """(block, replica, shard t) -> global rank holding it (T > 1: shard t of a block
    travels between the ranks t of its old and new stage's T groups)."""
    return {
        (b, d, t): plan.rank_at(d, p, t)
        for p, st in enumerate(plan.stages)
        for d in range(len(st.ranks))
        for t in range(plan.T)
        for b in st.blocks
    }


def transfers(old: Plan, new: Plan) -> list[tuple[int, int, list[int]]]:
    """(src rank, dst rank, blocks) for every pair that must exchange blocks, sorted."""
    if (old.D, old.T) != (new.D, new.T):
        raise ValueError(f"migration keeps D and T: {old.D}, {old.T} -> {new.D}, {new.T}")
    if sorted(b for s in old.stages for b in s.blocks) != sorted(
        b for s in new.stages for b in s.blocks
    ):
        raise ValueError("old and new plan hold different blocks")
    a, b = owners(old), owners(new)
    pairs: dict[tuple[int, int], list[int]] = {}
    for key, src in sorted(a.items()):
        dst = b[key]
        if src != dst:
            pairs.setdefault((src, dst), []).append(key[0])
    return [(s, d, sorted(bl)) for (s, d), bl in sorted(pairs.items())]


def _state_copy(state: dict) -> dict:
    return {k: (v.detach().clone() if torch.is_tensor(v) else v) for k, v in state.items()}


Copies = list[tuple[nn.Module, object]]  # other copies of a stage: (stage, optimizer or None)


def _pack(stage: Stage, opt, extras: Tensors, blocks: list[int], copies: Copies = ()) -> bytes:
    """Parameters, optimizer state and extras of ``blocks`` (and, under ``c``, each
    copy's parameters and optimizer state) as one byte string."""
    prefixes = tuple(f"layers.{b}." for b in blocks)
    theirs = [dict(st.named_parameters(remove_duplicate=False)) for st, _ in copies]
    payload: dict[str, dict] = {}
    for name, p in stage.named_parameters(remove_duplicate=False):
        if name.startswith(prefixes):
            payload[name] = {
                "p": p.detach().clone(),
                "s": _state_copy(opt.state.get(p, {})),
                "x": extras[name].clone() if name in extras else None,
                "c": [_one(named[name], o) for named, (_, o) in zip(theirs, copies, strict=True)],
            }
    buf = io.BytesIO()
    torch.save(payload, buf)
    return buf.getvalue()


def _one(p: torch.Tensor, opt) -> dict:
    return {"p": p.detach().clone(), "s": {} if opt is None else _state_copy(opt.state.get(p, {}))}


def _send_bytes(data: bytes, dst: int) -> None:
    dev = comm_device()
    t = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(dev)
    dist.send(torch.tensor([t.numel()], dtype=torch.int64, device=dev), dst)
    dist.send(t, dst)


def _recv_bytes(src: int) -> bytes:
    dev = comm_device()
    n = torch.zeros(1, dtype=torch.int64, device=dev)
    dist.recv(n, src)
    t = torch.empty(int(n), dtype=torch.uint8, device=dev)
    dist.recv(t, src)
    return t.cpu().numpy().tobytes()


class _Reuse(ModelDef):
    """A ModelDef that hands back the modules a rank keeps instead of building them."""

    def __init__(self, mdef: ModelDef, kept: dict[int, nn.Module]):
        super().__init__(mdef.num_blocks, mdef.build, mdef.ties, mdef.seed, mdef.names, mdef.graph)
        self.kept = kept

    def block(self, i: int) -> nn.Module:
        if i in self.kept:
            return self.kept[i]
        with torch.device("meta"):  # shapes only: the values arrive from the old owner
            block = self.build(i)
        if self.graph is not None:
            # A traced model's subgraph is built anew, on the CPU (its own weights): to
            # the meta device in place (a copy would lose its ``shard``: GraphModule's
            # deepcopy rebuilds it from the graph alone).
            return block.to("meta")
        if any(not p.is_meta for p in block.parameters()):
            # A user factory (model.import) hands back the modules it built once, with
            # their initial values: a copy of the shapes, so the sent values fill it.
            block = copy.deepcopy(block).to("meta")
        return block


def _exchange(
    old: Plan,
    new: Plan,
    rank: int,
    stage: Stage,
    opt,
    extras: Tensors,
    device: torch.device,
    copies: Copies = (),
) -> tuple[dict[str, dict], int]:
    """Send this rank's leaving blocks and receive its arriving ones, in the global
    order of ``transfers``; returns what arrived (by unsplit name) and the bytes sent."""
    received: dict[str, dict] = {}
    sent = 0
    for src, dst, blocks in transfers(old, new):
        if src == rank:
            data = _pack(stage, opt, extras, blocks, copies)
            _send_bytes(data, dst)
            sent += len(data)
        elif dst == rank:
            data = _recv_bytes(src)
            received.update(torch.load(io.BytesIO(data), map_location=device, weights_only=True))
    return received, sent


def _optimizer(
    named: dict[str, nn.Parameter], opt, received: dict[str, dict], training: TrainingSpec
) -> torch.optim.Optimizer:
    """A fresh optimizer over the new stage holding the kept and the moved state."""
    new_opt = build_optimizer(list(named.values()), training)
    new_opt.param_groups[0]["lr"] = opt.param_groups[0]["lr"]
    for name, p in named.items():
        if name in received:
            if received[name]["s"]:
                new_opt.state[p] = received[name]["s"]
        elif p in opt.state:  # a kept parameter: same object, same state
            new_opt.state[p] = opt.state[p]
    return new_opt


def migrate(
    old: Plan,
    new: Plan,
    rank: int,
    stage: Stage,
    opt: torch.optim.Optimizer,
    mdef: ModelDef,
    training: TrainingSpec,
    extras: Tensors | None = None,
    device: torch.device | None = None,
    tp=None,
    copies: Copies = (),
) -> Migrated:
    """Move blocks from ``old``'s layout to ``new``'s; collective over all old ranks.
    ``tp`` (T > 1, the stage's split): arriving blocks are split as the stage's are
    before this rank's shards of them fill them. ``copies``: other copies of the
    stage (AvgPipe's parallel models and reference), moved with it block by block
    (``Migrated.copies``)."""
    t0 = time.perf_counter()
    device = device or torch.device("cpu")
    mine_old = set(hosted_blocks(old, rank))
    member = rank < len(new.ranks)
    mine_new = hosted_blocks(new, rank) if member else []
    received, sent = _exchange(old, new, rank, stage, opt, extras or {}, device, copies)
    left = sorted(mine_old - set(mine_new))
    arrived = sorted(set(mine_new) - mine_old)
    topo, live = _groups(old, new, rank, mdef)
    out = Migrated(None, {}, None, topo, [], {}, left, arrived, sent, live_group=live)
    if member:
        kept = {b: stage.layers[str(b)] for b in mine_new if b in mine_old}
        _rebuild(out, new, rank, _Reuse(mdef, kept), mine_new)
        _arrive(out, received, device, tp)
        out.opt = _optimizer(out.named, opt, received, training)
        for k, (st, o) in enumerate(copies):
            out.copies.append(_copy(new, rank, mdef, training, (st, o), received, k, tp))
    out.seconds = time.perf_counter() - t0
    return out


def _copy(new: Plan, rank: int, mdef: ModelDef, training, copy_, received, k: int, tp):
    """Copy ``k`` of the stage rebuilt as the stage was: (stage, parameters, optimizer
    or None), its kept blocks' modules and state, its arrivals' sent values."""
    stage, opt = copy_
    blocks = hosted_blocks(new, rank)
    kept = {b: stage.layers[str(b)] for b in blocks if str(b) in stage.layers}
    part = Migrated(None, {}, None, None, [], {}, [], [], 0)
    part.arrived = [b for b in blocks if b not in kept]
    _rebuild(part, new, rank, _Reuse(mdef, kept), blocks)
    mine = {n: {"p": v["c"][k]["p"], "s": v["c"][k]["s"], "x": None} for n, v in received.items()}
    _arrive(part, mine, next(stage.parameters()).device, tp)
    if opt is None:  # the reference: no gradients
        part.stage.requires_grad_(False)
        return part.stage, part.named, None
    return part.stage, part.named, _optimizer(part.named, opt, mine, training)


def _arrive(out: Migrated, received: dict[str, dict], device: torch.device, tp) -> None:
    """The arrived blocks (built on the meta device) split as the stage's are (T > 1)
    and filled with the values sent; the stage's parameters and arrived extras."""
    parts = getattr(out.stage, "parts", [out.stage])  # a V rank: each stage
    for part in parts if tp is not None else []:
        tp.apply(part, out.arrived)
    _unheld(parts, received)
    for part in parts:
        _fill_arrivals(part, received, device)
    out.named = dict(out.stage.named_parameters())
    out.extras = {n: v["x"] for n, v in received.items() if v["x"] is not None}


def _groups(old: Plan, new: Plan, rank: int, mdef: ModelDef):
    """The new topology and, after a pack, the live ranks' group: every rank of the
    old world creates them, in the same order (a V plan's, two stages a rank, in
    ``v_rank``; packing keeps no V)."""
    topo = None if new.placement is not None else build_topology(new, rank, tie_blocks(mdef.ties))
    live = None
    if new.world_size < old.world_size:
        live = dist.new_group(list(range(new.world_size)))
    return topo, live


def hosted_blocks(plan: Plan, rank: int) -> list[int]:
    """The blocks ``rank`` holds under ``plan`` (a V rank: both its stages')."""
    return [b for sp in plan.hosted(rank) for b in sp.blocks]


def _rebuild(out: Migrated, new: Plan, rank: int, reuse: ModelDef, blocks: list[int]) -> None:
    """The rank's new stage (a V rank's two, with their topology), and action list."""
    if new.placement is not None:
        out.stage, out.topo, out.actions = v_rank(reuse, new, rank)  # type: ignore[assignment]
        return
    out.stage = Stage(reuse, blocks, new.stage_of(rank).keep_blocks)
    out.actions = new.stage_of(rank).action_list()


def _unheld(parts: list[Stage], received: dict[str, dict]) -> None:
    """Fail on a received parameter none of the rank's new stages holds."""
    held = {n for st in parts for n, _ in st.named_parameters(remove_duplicate=False)}
    for name in sorted(set(received) - held):
        raise RuntimeError(f"migration received {name!r}, which this stage does not hold")


@torch.no_grad()
def _fill_arrivals(stage: Stage, received: dict[str, dict], device: torch.device) -> None:
    """Materialise the arrived blocks (built on the meta device) with the sent values.

    Only meta parameters are filled: a tied half that is now co-located with a kept
    half is already bound to the kept Parameter (the two are equal bit for bit).
    """
    all_named = dict(stage.named_parameters(remove_duplicate=False))
    for name in sorted(received):
        if name not in all_named:
            continue  # the V rank's other stage's (``_unheld`` checks the rank's)
        p = all_named[name]
        if not p.is_meta:
            continue
        value = nn.Parameter(received[name]["p"].to(device), requires_grad=p.requires_grad)
        for other, q in all_named.items():  # every name bound to this parameter
            if q is p:
                stage._set_param(other, value)
                all_named[other] = value
    for name, p in stage.named_parameters(remove_duplicate=False):
        if p.is_meta:
            raise RuntimeError(f"migration left {name!r} without a value")
    for buf_name, buf in stage.named_buffers():
        if buf.is_meta:
            raise RuntimeError(f"migration cannot move buffer {buf_name!r}")
