"""Profiling after pruning (DynPipe sec. 3.0.3): per-block time and stage memory.

Only during the profiling step, hooks time every block of the stage: a forward pre/post
hook pair times the forward; for the backward, a hook on each block's output marks
when that block's backward starts, and a callback queued on the autograd engine marks
when the whole backward call ends. A stage runs its blocks one after another, so block
``i``'s backward lasts from its own mark to the next one (or to the end of the call).
The hooks are removed when the step ends; other steps run the untouched fast path.
"""

from __future__ import annotations

import time

import torch
from torch.autograd import Variable

from jobctl.engine.core.events import Kind
from jobctl.engine.runtime.vitals import max_rss_mb


def _tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class BlockProfiler:
    """Context manager timing each block's forward and backward over one step."""

    def __init__(self, pruner, step: int, active: bool):
        self.pruner, self.step, self.active = pruner, step, active
        self.fwd: dict[int, float] = {}
        self.bwd: dict[int, float] = {}
        self._handles: list = []
        self._starts: dict[int, float] = {}
        self._marks: list[tuple[float, int]] = []

    def __enter__(self) -> BlockProfiler:
        if not self.active:
            return self
        for b, mod in self.blocks():
            self.fwd[b], self.bwd[b] = 0.0, 0.0
            self._handles.append(mod.register_forward_pre_hook(self._pre(b)))
            self._handles.append(mod.register_forward_hook(self._post(b)))
        return self

    def blocks(self) -> list[tuple[int, torch.nn.Module]]:
        """The blocks timed, by global index: the pruner's stage's."""
        stage = self.pruner.stage
        return [(b, stage.layers[str(b)]) for b in stage.block_ids]

    def _pre(self, b: int):
        def hook(module, args):
            self._starts[b] = time.perf_counter()

        return hook

    def _post(self, b: int):
        def hook(module, args, out):
            self.fwd[b] += time.perf_counter() - self._starts.pop(b)
            if torch.is_tensor(out) and out.requires_grad:
                out.register_hook(self._grad_hook(b))

        return hook

    def _grad_hook(self, b: int):
        def hook(grad):
            if not self._marks:  # first block of this backward call: watch for its end
                Variable._execution_engine.queue_callback(self._backward_done)
            self._marks.append((time.perf_counter(), b))

        return hook

    def _backward_done(self) -> None:
        end = time.perf_counter()
        marks = sorted(self._marks)
        for (t, b), nxt in zip(marks, [m[0] for m in marks[1:]] + [end], strict=True):
            self.bwd[b] += nxt - t
        self._marks = []

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        if self.active and exc[0] is None:
            self.pruner.last_profile = self.report()
            self.pruner.profile_at = None
            events = self.pruner.events
            if events is not None:
                events.write(Kind.PROFILE, **self.pruner.last_profile)

    def report(self) -> dict:
        """The ``profile`` event: per-block seconds over the step, and stage memory."""
        p = self.pruner
        sp = p.block_sparsity()
        params = {id(t): t for t in p.named.values()}.values()
        optim = [v for t in params for v in p.opt.state.get(t, {}).values() if torch.is_tensor(v)]
        return {
            "step": self.step,
            "rank": p.topo.rank,
            "stage": p.topo.stage,
            "replica": p.topo.replica,
            "blocks": {
                str(b): {"fwd_s": self.fwd[b], "bwd_s": self.bwd[b], "sparsity": sp.get(b, 0.0)}
                for b in self.fwd
            },
            "memory": {
                "param_bytes": sum(_tensor_bytes(t) for t in params),
                "optim_bytes": sum(_tensor_bytes(v) for v in optim),
                "mask_bytes": sum(_tensor_bytes(m) for m in p.masks.values()),
                "nonzero_params": sum(int(t.count_nonzero()) for t in params),
                "max_rss_mb": max_rss_mb(),
                **_device_peak(next(iter(p.named.values()), None)),
            },
        }


def _device_peak(param: torch.Tensor | None) -> dict:
    """Peak accelerator memory of this process, where there is an accelerator."""
    if param is not None and param.device.type == "cuda":
        return {"device_max_allocated_bytes": torch.cuda.max_memory_allocated(param.device)}
    return {}
