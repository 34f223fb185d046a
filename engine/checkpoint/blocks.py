"""Layout-independent checkpoint content: one file per model block.

Every parameter and its optimizer state is stored under the unsplit model's name
(``layers.<block>.<...>``) in the file of the block that owns it (Varuna sec. 4.5:
each layer is checkpointed independently), so a checkpoint written by any P x D loads
into any other partition. The replicas of a stage share the writing: block ``j`` of a
stage is written by replica ``j mod D``. A tied alias is not stored; it is restored
from its canonical parameter. With T > 1 a split parameter (and its optimizer state)
is gathered whole over its T group and written by shard t = 0 only, so a run saved
at one T resumes at any other (``load_blocks`` keeps each rank's shard).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from torch.utils.serialization import config as serialization

from jobctl.engine.checkpoint.buffers import Buffers
from jobctl.engine.core.plan import Plan
from jobctl.engine.model.blocks import Stage, Tie

FORMAT_VERSION = 1


def block_file(block: int) -> str:
    return f"block-{block:04d}.pt"


def blocks_written_by(plan: Plan, rank: int) -> list[int]:
    """Blocks whose file this rank writes (its stages' blocks, dealt over replicas);
    with T > 1 every rank of a T group gets its t = 0's (they gather, t = 0 writes)."""
    me = plan.rank(rank)
    blocks = [b for st in plan.hosted(rank) for b in st.blocks]
    return [b for k, b in enumerate(blocks) if k % plan.D == me.replica]


def _block_params(stage: Stage, block: int) -> dict[str, nn.Parameter]:
    prefix = f"layers.{block}."
    return {n: p for n, p in stage.named_parameters() if n.startswith(prefix)}


Snapshot = dict[int, dict]  # block -> {"params": {name: tensor}, "optim": {name: state}}
#: (stage parameter name, tensor) -> tensor: a split parameter's whole (or local) tensor
Reshard = Callable[[str, torch.Tensor], torch.Tensor]


def snapshot_blocks(
    stage: Stage,
    opt: torch.optim.Optimizer | None,
    blocks: list[int],
    ties: list[Tie],
    masks: dict[str, torch.Tensor] | None = None,
    whole: Reshard | None = None,
    into: Buffers | None = None,
) -> Snapshot:
    """Copies of the parameters, optimizer state and pruning masks (if any) of ``blocks``
    (the only part of a checkpoint that must happen while training waits), in ``into``'s
    reused host tensors where given (``checkpoint.buffers``), else in new ones. A stage
    without an optimizer (AvgPipe's reference model) saves no optimizer state. With
    ``whole`` (T > 1: collective over the T group) split tensors are saved whole."""
    aliases = {t.alias for t in ties}
    hold = into.copy if into is not None else lambda _, v: v.detach().cpu().clone()
    snap: Snapshot = {}
    states = {} if opt is None else opt.state
    for b in blocks:
        params = {n: p for n, p in _block_params(stage, b).items() if n not in aliases}
        snap[b] = {
            "params": {n: hold((b, n, "param"), _whole(whole, n, p, p)) for n, p in params.items()},
            "optim": {
                n: {
                    k: hold((b, n, k), _whole(whole, n, v, p)) if torch.is_tensor(v) else v
                    for k, v in states.get(p, {}).items()
                }
                for n, p in params.items()
            },
        }
        if masks:
            snap[b]["masks"] = {n: hold((b, n, "mask"), masks[n]) for n in params if n in masks}
    return snap


def _whole(how: Reshard | None, name: str, value: torch.Tensor, like) -> torch.Tensor:
    """``value``, through ``how`` where it is shaped like the parameter (not copied)."""
    if how is not None and value.shape == like.shape:
        return how(name, value.detach())
    return value.detach()


def snapshot_bytes(tree) -> int:  # noqa: ANN001 - a Snapshot, or any part of one
    """Bytes of the tensors a snapshot copied (what training waited for), wherever
    they sit in it (AvgPipe's parallel models under ``parallel`` too)."""
    if torch.is_tensor(tree):
        return tree.numel() * tree.element_size()
    if isinstance(tree, dict):
        return sum(snapshot_bytes(v) for v in tree.values())
    if isinstance(tree, list | tuple):
        return sum(snapshot_bytes(v) for v in tree)
    return 0


def write_snapshot(snap: Snapshot, out_dir: Path) -> list[str]:
    """Write one file per block of ``snap`` into ``out_dir``; returns the file names.
    (To a path, not a hashing stream: torch's file writer runs without the GIL, while
    a Python stream's writes take it per chunk, which doubled a 327 MiB write's wall
    time beside a busy training thread; publishing hashes the files after.) Without
    zip CRC-32s: ``torch.load`` never checks them (a flipped byte loads silently), the
    manifest's sha256 is what verifies a block file, and computing them took a third
    of a 160 MB block's write (#55)."""
    crc, serialization.save.compute_crc32 = serialization.save.compute_crc32, False
    try:
        for b, payload in snap.items():
            torch.save(payload, out_dir / block_file(b))
    finally:
        serialization.save.compute_crc32 = crc
    return [block_file(b) for b in snap]


def _reshard(how: Reshard | None, name: str, value: torch.Tensor, like) -> torch.Tensor:
    """A CPU copy of ``value``, through ``how`` where it is shaped like the parameter."""
    if how is not None and value.shape == like.shape:
        value = how(name, value)
    return value.detach().cpu().clone()


def load_blocks(
    stage: Stage,
    opt: torch.optim.Optimizer | None,
    ckpt_dir: Path | Snapshot,
    ties: list[Tie],
    part: int | None = None,
    local: Reshard | None = None,
) -> None:
    """Load this stage's parameters and optimizer state (if ``opt``) from a checkpoint
    folder, or from a :data:`Snapshot` in memory (blocks moving between ranks); with
    ``part``, those of AvgPipe's parallel model ``part`` instead (a block file's
    ``parallel`` list, ``engine/averaging/checkpoint.py``); with ``local`` (T > 1),
    this rank's shard of each whole tensor."""
    alias_of = {t.alias: t.canonical for t in ties}
    named = dict(stage.named_parameters())
    cache: dict[int, dict] = ckpt_dir if isinstance(ckpt_dir, dict) else {}
    for name, p in named.items():
        source = alias_of.get(name, name)
        block = int(source.split(".")[1])
        if block not in cache:
            cache[block] = _read_block(ckpt_dir, block)
        payload = cache[block] if part is None else cache[block]["parallel"][part]
        if source not in payload["params"]:
            raise KeyError(f"checkpoint {ckpt_dir} has no parameter {source!r}")
        saved = payload["params"][source]
        with torch.no_grad():
            p.copy_(_reshard(local, name, saved, saved))
        state = payload["optim"].get(source)
        if state and opt is not None:
            opt.state[p] = {
                k: (
                    _reshard(local, name, v, saved).to(p.device)
                    if torch.is_tensor(v) and v.dim()
                    else v
                )
                for k, v in state.items()
            }


def _read_block(ckpt_dir: Path | Snapshot, block: int) -> dict:
    if isinstance(ckpt_dir, dict):  # a snapshot holds every block it is asked for
        raise KeyError(f"the blocks received hold no block {block}")
    return torch.load(ckpt_dir / block_file(block), map_location="cpu", weights_only=True)


def load_masks(ckpt_dir: Path, names: list[str], ties: list[Tie]) -> dict[str, torch.Tensor]:
    """Pruning masks saved with the block files for parameters ``names`` (an alias gets
    its canonical's mask); names without a saved mask are left out."""
    alias_of = {t.alias: t.canonical for t in ties}
    cache: dict[int, dict] = {}
    out: dict[str, torch.Tensor] = {}
    for name in names:
        source = alias_of.get(name, name)
        block = int(source.split(".")[1])
        if block not in cache:
            path = ckpt_dir / block_file(block)
            cache[block] = torch.load(path, map_location="cpu", weights_only=True)
        mask = cache[block].get("masks", {}).get(source)
        if mask is not None:
            out[name] = mask
    return out


def write_meta(out_dir: Path, meta: dict) -> str:
    """Write the checkpoint's ``meta.json`` (step, data position, plan, spec hash)."""
    (out_dir / "meta.json").write_text(json.dumps({"format": FORMAT_VERSION, **meta}, indent=2))
    return "meta.json"


def read_meta(ckpt_dir: Path) -> dict:
    meta = json.loads((Path(ckpt_dir) / "meta.json").read_text())
    if meta.get("format") != FORMAT_VERSION:
        raise ValueError(
            f"{ckpt_dir}: checkpoint format {meta.get('format')}, expected {FORMAT_VERSION}"
        )
    return meta


def load_full_state(ckpt_dir: Path) -> dict[str, torch.Tensor]:
    """All parameters of a checkpoint by unsplit name (for tests and export)."""
    out: dict[str, torch.Tensor] = {}
    for f in sorted(Path(ckpt_dir).glob("block-*.pt")):
        out.update(torch.load(f, map_location="cpu", weights_only=True)["params"])
    return out
