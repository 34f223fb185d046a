"""What a checkpoint holds, checked before a run resumes from it (#46 item 2).

The manifest's sizes and sha256 prove a checkpoint is the one that was written, not
that it can be loaded: a shard with tensors of the wrong shapes, a foreign pickle or a
nonsense ``meta.json``, re-signed in the manifest (anyone with write access to the
store, or a second job sharing ``checkpoint.local_dir``, can do it), passed that check
and then failed the run in every worker. Here every shard is opened the way the workers
open it (``torch.load(weights_only=True)``, memory-mapped, so nothing is read twice in
full), its layout and format are checked, each parameter's optimizer state must have
its parameter's shape, and a parameter must have the shape it has at the run's other
checkpoint (a model's shapes never change between steps), so ``find_resume_point``
skips such a step with a warning and takes the one before, as for any other damage.
"""

from __future__ import annotations

from pathlib import Path

import torch

from jobctl.engine.checkpoint.blocks import read_meta

Shapes = dict[str, tuple[int, ...]]


def content_problem(ckpt_dir: Path, like: Shapes | None = None) -> tuple[str | None, Shapes]:
    """(why the checkpoint at ``ckpt_dir`` cannot be loaded, or None; its parameters'
    shapes). ``like``: the shapes another checkpoint of the run holds. A folder with
    neither ``meta.json`` nor a block file is no training checkpoint (the store's own
    tests keep other files): only its manifest speaks for it."""
    if not (ckpt_dir / "meta.json").exists() and not any(ckpt_dir.glob("block-*.pt")):
        return None, {}
    try:
        read_meta(ckpt_dir)  # the workers' own check of meta.json and its format
    except (OSError, ValueError, AttributeError) as e:  # AttributeError: not a mapping
        return f"meta.json: {str(e).splitlines()[0][:200]}", {}
    shapes: Shapes = {}
    for shard in sorted(ckpt_dir.glob("block-*.pt")):
        why = _shard_problem(shard, shapes)
        if why is not None:
            return f"{shard.name}: {why}", shapes
    return shape_problem(shapes, like), shapes


def _shard_problem(shard: Path, shapes: Shapes) -> str | None:
    """Why one block file cannot be loaded; its parameters' shapes go into ``shapes``."""
    try:
        payload = torch.load(shard, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:  # noqa: BLE001 - any unreadable shard is a reason to skip it
        return f"not a checkpoint shard ({type(e).__name__}: {str(e).splitlines()[0][:120]})"
    if not isinstance(payload, dict):
        return f"holds a {type(payload).__name__}, not a block's mapping"
    parallel = payload.get("parallel") or []  # AvgPipe: one entry per parallel model
    for part in [payload, *(parallel if isinstance(parallel, list) else [parallel])]:
        why = _part_problem(part, shapes)
        if why is not None:
            return why
    return None


def _part_problem(part: object, shapes: Shapes) -> str | None:
    params = part.get("params") if isinstance(part, dict) else None
    if not isinstance(params, dict) or not all(torch.is_tensor(t) for t in params.values()):
        return "no 'params' mapping of tensors"
    optim = part.get("optim") or {}
    for name, tensor in params.items():
        shape = tuple(tensor.shape)
        if shapes.setdefault(name, shape) != shape:
            return f"{name} has shape {shape} and {shapes[name]} in one checkpoint"
        state = optim.get(name) if isinstance(optim, dict) else None
        for key, value in (state or {}).items():
            if torch.is_tensor(value) and value.dim() and tuple(value.shape) != shape:
                return f"{name} has shape {shape} but its {key} {tuple(value.shape)}"
    return None


def shape_problem(shapes: Shapes, like: Shapes | None) -> str | None:
    """The first parameter whose shape differs from the run's other checkpoint."""
    for name, shape in sorted(shapes.items()):
        if like and name in like and like[name] != shape:
            return f"{name} has shape {shape}, {like[name]} at the run's other checkpoint"
    return None
