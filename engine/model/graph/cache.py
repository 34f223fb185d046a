"""The traced and sharded graph of a model, cached on disk (Merak sec. 4.2, Table 2).

Tracing a 1.5B-parameter model takes seconds and depends only on the model, the
micro-batch shape and the library versions, never on the layout, so the result is
kept under the state home's ``cache/graphs/`` keyed by all of those. The graph is
stored as plain node records (op, name, target, arguments), not a pickled
``GraphModule`` (whose loading re-traces its code and takes longer than it saves),
with each parameter's and buffer's shape and dtype and each node's value shape
(``meta["val"]`` as meta tensors: tensor parallelism's walk reads it); buffers'
values are not kept.
A cache entry that cannot be read is ignored and traced anew.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import operator
import os
import pickle
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import fx

from jobctl.engine.core.home import default_home
from jobctl.engine.model.graph.shard import Shard

VERSION = 4  # bump when the record, the tracer or the sharding changes


@dataclass
class Traced:
    """What a trace and shard produced, without the model's weights."""

    gm: fx.GraphModule
    shards: list[Shard]
    shapes: dict[str, tuple[tuple[int, ...], torch.dtype, bool]]  # name -> shape, dtype, param
    groups: dict[str, str]  # tied name -> canonical
    task: str
    config: dict  # the model config's fields the batch needs (image size, mask id)


def key(parts: dict) -> str:
    """A cache key over the model's description, the shape and the library versions."""
    versions = {"torch": torch.__version__, "version": VERSION}
    with contextlib.suppress(ImportError):
        import transformers

        versions["transformers"] = transformers.__version__
    text = json.dumps({**parts, **versions}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def path_of(k: str) -> Path:
    return default_home() / "cache" / "graphs" / f"{k}.pkl"


def load(k: str) -> Traced | None:
    """The cached record of key ``k``, or None."""
    path = path_of(k)
    try:
        with path.open("rb") as f:
            data = pickle.load(f)  # noqa: S301 -- our own cache under the state home
        gm = _rebuild(data["nodes"], data["shapes"])
        shards = [Shard(**s) for s in data["shards"]]
        return Traced(gm, shards, data["shapes"], data["groups"], data["task"], data["config"])
    except Exception:  # noqa: BLE001 -- a damaged or stale entry is traced anew
        return None


def save(k: str, t: Traced) -> None:
    """Write the record of key ``k`` (atomically; a failure only loses the cache)."""
    data = {
        "nodes": [_record(n) for n in t.gm.graph.nodes],
        "shards": [asdict(s) for s in t.shards],
        "shapes": t.shapes,
        "groups": t.groups,
        "task": t.task,
        "config": t.config,
    }
    path = path_of(k)
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        with tmp.open("wb") as f:
            pickle.dump(data, f)
        tmp.replace(path)


def _record(node: fx.Node) -> tuple:
    target, args, kwargs = _target(node.target), _encode(node.args), _encode(node.kwargs)
    return (node.op, node.name, target, args, kwargs, _shape_of(node.meta.get("val")))


def _shape_of(val):
    if isinstance(val, torch.Tensor):
        return (tuple(val.shape), val.dtype)
    if isinstance(val, (list, tuple)):
        return [_shape_of(v) for v in val]
    return None


def _meta_of(shape):
    if isinstance(shape, tuple):
        return torch.empty(shape[0], dtype=shape[1], device="meta")
    return None if shape is None else [_meta_of(s) for s in shape]


def _target(target):
    if isinstance(target, torch._ops.OpOverload):
        return ("op", target._schema.name, target._overloadname)
    if target is operator.getitem:
        return ("getitem",)
    if isinstance(target, str):
        return target
    raise TypeError(f"cannot cache a graph calling {target!r}")


def _encode(value):
    if isinstance(value, fx.Node):
        return ("node", value.name)
    if isinstance(value, (list, tuple)):
        return ("seq", type(value) is tuple, [_encode(v) for v in value])
    if isinstance(value, dict):
        return ("dict", {k: _encode(v) for k, v in value.items()})
    return ("value", value)


def _decode(value, env: dict):
    kind = value[0]
    if kind == "node":
        return env[value[1]]
    if kind == "seq":
        items = [_decode(v, env) for v in value[2]]
        return tuple(items) if value[1] else items
    if kind == "dict":
        return {k: _decode(v, env) for k, v in value[1].items()}
    return value[1]


def _resolve(target):
    if isinstance(target, str):
        return target
    if target[0] == "getitem":
        return operator.getitem
    namespace, _, name = target[1].partition("::")
    packet = getattr(getattr(torch.ops, namespace), name)
    return getattr(packet, target[2] or "default")


def _rebuild(nodes: list, shapes: dict) -> fx.GraphModule:
    graph = fx.Graph()
    env: dict[str, fx.Node] = {}
    for op, name, target, args, kwargs, shape in nodes:
        node = graph.create_node(
            op, _resolve(target), _decode(args, env), _decode(kwargs, env), name=name
        )
        if shape is not None:
            node.meta["val"] = _meta_of(shape)
        env[name] = node
    root = {
        n.target: torch.empty(
            shapes[_plain(n.target)][0], dtype=shapes[_plain(n.target)][1], device="meta"
        )
        for n in graph.nodes
        if n.op == "get_attr"
    }
    return fx.GraphModule(root, graph)


def _plain(target: str) -> str:
    return target.removeprefix("model.")
