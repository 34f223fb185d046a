"""One graph of an unmodified model, traced with ``torch.export`` (Merak sec. 4.1).

Why ``torch.export`` (non-strict) and not ``torch.fx.symbolic_trace``: the model
runs as ordinary Python on fake tensors, so the control flow of Hugging Face code
(mask construction, rotary caches, config branches) resolves at trace time instead of
failing on proxies, and ``transformers`` 5 no longer ships an fx tracer. The model
is built with meta parameters and real buffers (``source.build_model``) and traced
from a copy whose parameters are fake tensors on the CPU device (``trace_fake``): no
memory for weights, yet code that branches on ``device.type`` (transformers'
mixture-of-experts routing) resolves as it runs, a tensor the model computed at
construction sits on one device with its parameters (GPT-J's sin/cos table beside
meta parameters failed), and a tensor made in forward from Python values (Falcon's
``[..., [-2], :]`` index) is lifted with its value (#54). The traced graph keeps every
node's module path (``nn_module_stack``), which names the subgraphs. Shapes are
specialised to the plan's micro-batch size and sequence length.
"""

from __future__ import annotations

import contextlib
import copy
import io
import linecache
import logging
import sys
from collections.abc import Callable

import torch
from torch import fx, nn
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from jobctl.engine.model.graph.source import FixableError

#: Nodes the exported graph adds for its own checks on the traced (meta) inputs.
DROPPED = {"_guards_fn"}
#: The device type a model is traced for (its fake tensors').
TRACE_DEVICE = "cpu"
PREFIX = "model."  # the tracing wrapper's attribute (_CallsOnly.model)


class TraceError(FixableError):
    """A model that cannot be traced; names the module and op where tracing stopped."""


class _CallsOnly(nn.Module):
    """Calls the model with keyword arguments and returns its flat outputs."""

    def __init__(self, model: nn.Module, extra: dict) -> None:
        super().__init__()
        self.model, self.extra = model, extra

    def forward(self, **batch):
        out = self.model(**batch, **self.extra)
        if isinstance(out, torch.Tensor):
            return (out,)
        if isinstance(out, dict):  # a ModelOutput: loss first when labels were given
            return tuple(v for v in out.values() if isinstance(v, torch.Tensor))
        return tuple(v for v in out if isinstance(v, torch.Tensor))


def _quietly(call):
    """``call()`` with what torch writes meanwhile held back (logging's warnings and
    stderr): on a data-dependent branch it prints the partial graph, a hundred lines
    of generated code, before it raises, and the TraceError that follows says what
    the user needs (file, line, fix). What a trace that succeeds wrote is passed on."""
    held = io.StringIO()
    logging.disable(logging.WARNING)
    try:
        with contextlib.redirect_stderr(held):
            got = call()
    finally:
        logging.disable(logging.NOTSET)
    sys.stderr.write(held.getvalue())
    return got


def trace(model: nn.Module, inputs: dict) -> fx.GraphModule:
    """The model's training graph for ``inputs`` (meta tensors)."""
    extra = _call_options(model)
    wrapped = _CallsOnly(model, extra).train()
    try:
        program = _quietly(lambda: torch.export.export(wrapped, (), inputs, strict=False))
    except Exception as exc:  # noqa: BLE001 -- export raises many kinds
        raise TraceError(
            f"torch.export could not trace {type(model).__name__}: {_where(exc)}"
            f"{_located(model, exc)}",
            "make that code independent of tensor values (shapes and Python values are "
            "fine: they are fixed at trace time), or pass a model.import factory that "
            "returns a list of blocks, each one tensor in and out, to cut it by hand",
        ) from exc
    gm = program.module()
    _drop_checks(gm)
    return gm


def _located(model: nn.Module, exc: BaseException) -> str:
    """Where tracing stopped: the innermost module of the model on the traceback, its
    name in the model, and the line (the op) it was running."""
    names = {id(m): n for n, m in model.named_modules()}
    tb, found = exc.__traceback__, None
    while tb is not None:
        owner = tb.tb_frame.f_locals.get("self")
        if isinstance(owner, nn.Module) and id(owner) in names:
            found = (names[id(owner)] or "<model>", type(owner).__name__, tb)
        tb = tb.tb_next
    if found is None:
        return ""
    name, cls, tb = found
    code = tb.tb_frame.f_code
    line = linecache.getline(code.co_filename, tb.tb_lineno).strip()
    return f"\n  in module {name} ({cls}), {code.co_filename}:{tb.tb_lineno}: {line}"


def _call_options(model: nn.Module) -> dict:
    """Keyword options that keep a Hugging Face model's outputs tensors only."""
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "use_cache"):
        return {"use_cache": False}
    return {}


def _where(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:400]


def _drop_checks(gm: fx.GraphModule) -> None:
    """Remove export's input guards and metadata asserts (they pin the meta device)."""
    for node in list(gm.graph.nodes):
        dead = node.op == "call_module" and node.target in DROPPED
        dead |= node.op == "call_function" and "_assert_tensor_metadata" in str(node.target)
        if dead and not node.users:
            gm.graph.erase_node(node)
    gm.graph.eliminate_dead_code()
    gm.recompile()


def module_path(node: fx.Node) -> str:
    """The innermost module a node ran in (``transformer.h.3.attn``), or ``''``."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    path = list(stack.values())[-1][0]
    return path.removeprefix("model.").removeprefix("L['self'].model.")


def trace_fake(real: nn.Module, inputs: Callable[[str], dict]) -> tuple[fx.GraphModule, dict]:
    """The graph of ``real`` (meta parameters, real buffers: ``source.build_model``)
    traced with its parameters as fake tensors on ``TRACE_DEVICE`` (a copy; no memory)
    for ``inputs(device)``; and the values of the tensors export lifted out of forward
    (name -> tensor) that ``real`` does not hold. Every attribute of the graph is left
    a meta tensor of its shape, as a cached graph's are."""
    model = copy.deepcopy(real)
    with FakeTensorMode(allow_non_fake_inputs=True):
        _fake_parameters(model)
        batch = inputs(TRACE_DEVICE)
    gm = trace(model.train(), batch)
    held = dict(real.named_parameters(remove_duplicate=False))
    held.update(real.named_buffers(remove_duplicate=False))
    literals: dict[str, torch.Tensor] = {}
    for target in {n.target for n in gm.graph.nodes if n.op == "get_attr"}:
        name, value = target.removeprefix(PREFIX), _attr(gm, target)
        if name not in held:
            literals.update(_lifted(name, value, _attr(real, name)))
        _set_attr(gm, target, _meta_like(value))
    return gm, literals


def _fake_parameters(model: nn.Module) -> None:
    """Each parameter a fake tensor on ``TRACE_DEVICE`` (a tied one stays one)."""
    made: dict[int, nn.Parameter] = {}
    for module in model.modules():
        for name, p in module._parameters.items():
            if p is not None and id(p) not in made:
                fake = torch.empty(p.shape, dtype=p.dtype, device=TRACE_DEVICE)
                made[id(p)] = nn.Parameter(fake, requires_grad=p.requires_grad)
            if p is not None:
                module._parameters[name] = made[id(p)]


def _lifted(name: str, traced, real) -> dict[str, torch.Tensor]:  # noqa: ANN001 - tensors
    """Where the value of a lifted tensor ``name`` is: an attribute the model computed
    at construction (``real`` holds it: {}), or one made from Python values in forward
    (export kept it in ``traced``: ``{name: value}``); ``TraceError`` where neither."""
    if real is not None and real.device.type != "meta":
        return {}
    if real is None and not isinstance(traced, FakeTensor) and traced.device.type != "meta":
        return {name: traced.detach().cpu().clone()}
    raise TraceError(
        f"the trace lifted {name!r}, a tensor the model makes in forward or from its "
        "parameters, but not its value (it is computed from other tensors)",
        "make it a buffer of the module (register_buffer), or pass a model.import "
        "factory that returns a list of blocks to cut the model by hand",
    )


def _attr(root: nn.Module, dotted: str):
    """The tensor at ``dotted`` under ``root`` (None: no such attribute or not one)."""
    obj = root
    for part in dotted.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj if isinstance(obj, torch.Tensor) else None


def _set_attr(root: nn.Module, dotted: str, value: torch.Tensor) -> None:
    owner, _, leaf = dotted.rpartition(".")
    module = root.get_submodule(owner) if owner else root
    if leaf in module._parameters:
        module._parameters[leaf] = nn.Parameter(value, requires_grad=value.requires_grad)
    elif leaf in module._buffers:
        module._buffers[leaf] = value
    else:
        setattr(module, leaf, value)


def _meta_like(value) -> torch.Tensor:  # noqa: ANN001 - a tensor of the traced graph
    grad = isinstance(value, nn.Parameter) and value.requires_grad
    return torch.empty(value.shape, dtype=value.dtype, device="meta", requires_grad=grad)
