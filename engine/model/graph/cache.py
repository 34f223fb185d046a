"""The traced and sharded graph of a model, cached on disk (Merak sec. 4.2, Table 2).

Tracing a 1.5B-parameter model takes seconds and depends only on the model, the
micro-batch shape and the library versions, never on the layout, so the result is
kept under the state home's ``cache/graphs/`` keyed by all of those. The graph is
stored as JSON data -- plain node records (op, name, target, arguments), never a
pickle, so a planted cache file cannot run code -- with each parameter's and buffer's
shape and dtype and each node's value shape (``meta["val"]`` as meta tensors: tensor
parallelism's walk reads it); buffers' values are not kept, the few literals the
trace lifted out of forward are (``trace.trace_fake``). Loading checks every name
and target before fx generates code from them, and resolves call targets only to
``torch.ops`` overloads and ``operator.getitem``.
A cache entry that cannot be read is ignored and traced anew; an old pickled entry
(``*.pkl``) is never opened, only named in a warning.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import operator
import os
import re
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import fx

from jobctl.engine.core.home import default_home
from jobctl.engine.model.graph.shard import Shard

VERSION = 6  # bump when the record, the tracer or the sharding changes (6: traced on fake CPU)
FORMAT = "jobctl-graph-cache"
OPS = {"placeholder", "get_attr", "call_function", "call_module", "call_method", "output"}
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*")
# torch's enum-like values a traced call may take, stored by name
ENUMS = {"dtype": torch.dtype, "layout": torch.layout, "memory_format": torch.memory_format}


class StaleCacheWarning(UserWarning):
    """An old pickled trace cache entry was found and ignored (never loaded)."""


@dataclass
class Traced:
    """What a trace and shard produced, without the model's weights."""

    gm: fx.GraphModule
    shards: list[Shard]
    shapes: dict[str, tuple[tuple[int, ...], torch.dtype, bool]]  # name -> shape, dtype, param
    groups: dict[str, str]  # tied name -> canonical
    task: str
    config: dict  # the model config's fields the batch needs (image size, mask id)
    literals: dict[str, torch.Tensor] = field(default_factory=dict)  # trace.trace_fake


def key(parts: dict) -> str:
    """A cache key over the model's description, the shape and the library versions."""
    versions = {"torch": torch.__version__, "version": VERSION}
    with contextlib.suppress(ImportError):
        import transformers

        versions["transformers"] = transformers.__version__
    text = json.dumps({**parts, **versions}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def path_of(k: str) -> Path:
    """The cache file of key ``k`` under the state home."""
    return default_home() / "cache" / "graphs" / f"{k}.json"


def load(k: str) -> Traced | None:
    """The cached record of key ``k``, or None (a missing, damaged or foreign entry)."""
    path = path_of(k)
    _warn_pickles(path.parent)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("format") != FORMAT or data.get("version") != VERSION:
            return None
        shapes = {n: _shape_entry(v) for n, v in data["shapes"].items()}
        gm = _rebuild(data["nodes"], shapes)
        shards = [Shard(**s) for s in data["shards"]]
        groups, task = dict(data["groups"]), str(data["task"])
        literals = {n: _tensor_of(v) for n, v in data["literals"].items()}
        return Traced(gm, shards, shapes, groups, task, _decode(data["config"], {}), literals)
    except Exception:  # noqa: BLE001 -- a damaged or stale entry is traced anew
        return None


def save(k: str, t: Traced) -> None:
    """Write the record of key ``k`` (atomically; a failure only loses the cache)."""
    path = path_of(k)
    with contextlib.suppress(OSError, TypeError, ValueError):
        data = {
            "format": FORMAT,
            "version": VERSION,
            "nodes": [_record(n) for n in t.gm.graph.nodes],
            "shards": [asdict(s) for s in t.shards],
            "shapes": {n: [list(s), _enum(d), p] for n, (s, d, p) in t.shapes.items()},
            "groups": t.groups,
            "task": t.task,
            "config": _encode(t.config),
            "literals": {n: _tensor_record(v) for n, v in t.literals.items()},
        }
        text = json.dumps(data)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)


def _warn_pickles(folder: Path) -> None:
    """Name (never open) old pickled entries: loading a pickle can run any code."""
    with contextlib.suppress(OSError):
        old = sorted(p.name for p in folder.glob("*.pkl"))
        if old:
            warnings.warn(
                f"ignoring {len(old)} old pickled trace cache file(s) in {folder} "
                f"({', '.join(old[:3])}{', ...' if len(old) > 3 else ''}): they are never "
                "loaded, as unpickling can run code; delete them (`rm "
                f"{folder}/*.pkl`) to silence this",
                StaleCacheWarning,
                stacklevel=3,
            )


def _tensor_record(value: torch.Tensor) -> dict:
    """A lifted literal (an index list, a scalar: small) as plain JSON values."""
    return {"dtype": _enum(value.dtype), "shape": list(value.shape), "data": value.tolist()}


def _tensor_of(record: dict) -> torch.Tensor:
    dtype = _enum_of("dtype", record["dtype"])
    return torch.tensor(record["data"], dtype=dtype).reshape(record["shape"])


def _shape_entry(value) -> tuple[tuple[int, ...], torch.dtype, bool]:
    shape, dtype, param = value
    return tuple(int(d) for d in shape), _enum_of("dtype", dtype), bool(param)


def _record(node: fx.Node) -> list:
    target, args, kwargs = _target(node.target), _encode(node.args), _encode(node.kwargs)
    return [node.op, node.name, target, args, kwargs, _shape_of(node.meta.get("val"))]


def _shape_of(val):
    if isinstance(val, torch.Tensor):
        return {"shape": [int(d) for d in val.shape], "dtype": _enum(val.dtype)}
    if isinstance(val, (list, tuple)):
        return [_shape_of(v) for v in val]
    return None


def _meta_of(shape):
    if isinstance(shape, dict):
        dtype = _enum_of("dtype", shape["dtype"])
        return torch.empty([int(d) for d in shape["shape"]], dtype=dtype, device="meta")
    return None if shape is None else [_meta_of(s) for s in shape]


def _enum(value) -> str:
    return str(value).removeprefix("torch.")


def _enum_of(kind: str, name) -> object:
    value = getattr(torch, name, None) if isinstance(name, str) and NAME.fullmatch(name) else None
    if not isinstance(value, ENUMS[kind]):
        raise ValueError(f"not a torch {kind}: {name!r}")
    return value


def _target(target):
    if isinstance(target, torch._ops.OpOverload):
        return ["op", target._schema.name, target._overloadname]
    if target is operator.getitem:
        return ["getitem"]
    if isinstance(target, str):
        return target
    raise TypeError(f"cannot cache a graph calling {target!r}")


def _encode(value):
    if isinstance(value, fx.Node):
        return ["node", value.name]
    if isinstance(value, (list, tuple)):
        return ["seq", type(value) is tuple, [_encode(v) for v in value]]
    if isinstance(value, dict):
        return ["dict", {_key(k): _encode(v) for k, v in value.items()}]
    if isinstance(value, slice):
        return ["slice", [_encode(v) for v in (value.start, value.stop, value.step)]]
    if value is Ellipsis:
        return ["ellipsis"]
    if isinstance(value, torch.device):
        return ["device", str(value)]
    for kind, cls in ENUMS.items():
        if isinstance(value, cls):
            return [kind, _enum(value)]
    if value is None or isinstance(value, (bool, int, float, str)):
        return ["value", value]
    raise TypeError(f"cannot cache a graph argument {value!r}")


def _key(k) -> str:
    """A keyword or config field name: fx writes kwargs' keys into generated code."""
    if not (isinstance(k, str) and NAME.fullmatch(k)):
        raise ValueError(f"not a name: {k!r}")
    return k


def _decode(value, env: dict):
    kind = value[0]
    if kind == "node":
        return env[value[1]]
    if kind == "seq":
        items = [_decode(v, env) for v in value[2]]
        return tuple(items) if value[1] else items
    if kind == "dict":
        return {_key(k): _decode(v, env) for k, v in value[1].items()}
    if kind == "slice":
        return slice(*(_decode(v, env) for v in value[1]))
    if kind == "ellipsis":
        return ...
    if kind == "device":
        return torch.device(str(value[1]))
    if kind in ENUMS:
        return _enum_of(kind, value[1])
    if kind == "value" and (value[1] is None or isinstance(value[1], (bool, int, float, str))):
        return value[1]
    raise ValueError(f"not a cached graph value: {value!r}")


def _resolve(op: str, target):
    """A node's target: a checked name, or a torch.ops overload or getitem for a call."""
    if op != "call_function":
        if not (isinstance(target, str) and DOTTED.fullmatch(target)):
            raise ValueError(f"not a {op} target: {target!r}")
        return target
    if target == ["getitem"]:
        return operator.getitem
    tag, qualified, overload = target
    namespace, _, name = qualified.partition("::")
    if tag != "op" or not all(NAME.fullmatch(p) for p in (namespace, name, overload or "x")):
        raise ValueError(f"not an operator: {target!r}")
    packet = getattr(getattr(torch.ops, namespace), name)
    resolved = getattr(packet, overload or "default")
    if not isinstance(resolved, torch._ops.OpOverload):
        raise ValueError(f"not an operator: {target!r}")
    return resolved


def _rebuild(nodes: list, shapes: dict) -> fx.GraphModule:
    graph = fx.Graph()
    env: dict[str, fx.Node] = {}
    for op, name, target, args, kwargs, shape in nodes:
        if op not in OPS or not (isinstance(name, str) and NAME.fullmatch(name)):
            raise ValueError(f"not a graph node: {op!r} {name!r}")
        node = graph.create_node(
            op, _resolve(op, target), _decode(args, env), _decode(kwargs, env), name=name
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
