"""Measure a traced model's compute: each subgraph (block) timed as a stage runs it.

A traced model (``model.huggingface``, or a ``model.import`` factory returning one
``nn.Module``) has blocks that are the subgraphs of its traced graph
(``model.graph``): a block takes and returns a tuple of tensors (the carrier of the
values live across its cut, integer ids and masks among them) plus the batch's own
inputs. Random floats cannot stand in for those, so each block's inputs are the
preceding subgraphs' outputs on a real micro-batch (``data`` and ``graph.batch``, as
the runtime builds it), and the last block returns the model's own loss.

The runtime traces the model for its micro-batch size, so each m gets its own trace
(the same subgraphs and weights, other shapes). Per m the whole model runs as one
chain, as a stage runs its blocks (``compute``: a block timed alone runs faster):
forward with an autograd graph, forward without one, and backward, each block's
backward ending when the gradients of its inputs exist (hooks on the carrier's
float tensors; the last one to arrive closes the boundary). Times are the median of
``repeats`` chains after ``warmup``, in the record format hand-cut blocks use.
Peak bytes are estimated from state, saved tensors and output, as ``compute`` does on
CPU (also on CUDA here: the chain holds every block at once).
"""

from __future__ import annotations

import torch

from jobctl.engine.calibration.measure.compute import Progress, _Clock, autocast_for
from jobctl.engine.calibration.record import BlockCalibration, Stat
from jobctl.engine.data.dataset import make_data
from jobctl.engine.model.blocks import Stage, model_def
from jobctl.engine.model.graph import boundary
from jobctl.engine.runtime.optim import build_optimizer
from jobctl.spec import JobSpec


class _Chain:
    """A traced model's subgraphs at one micro-batch size, on a real batch."""

    def __init__(self, spec: JobSpec, m: int, device: torch.device) -> None:
        mdef = model_def(spec.model, spec.training.seed, m)
        self.names, self.ties = mdef.names, mdef.ties
        self.stage = Stage(mdef, range(mdef.num_blocks)).to(device).train()
        self.layers = [self.stage.layers[str(i)] for i in range(mdef.num_blocks)]
        x, y = make_data(spec).batch(0, m)
        self.batch = self.stage.batch(x.to(device), y.to(device), 0)
        self.training, self.device, self.m = spec.training, device, m
        self.scale = 1.0 / spec.training.global_batch_size
        self.clock = _Clock(device)
        self.stage.forward(None, self.batch)  # repoints creation ops at the device
        self.stage.zero_grad(set_to_none=True)

    def run(self, i: int, carry: tuple) -> tuple:
        """Block ``i`` on ``carry`` under the job's numerics (the last: its scaled loss)."""
        with autocast_for(self.training, self.device):
            out = self.layers[i].run(carry, self.batch)
        return (out[0] * self.scale,) if i == len(self.layers) - 1 else out

    def once(self) -> tuple[list, list, list]:
        """One forward+backward and one no-graph forward, timed per block."""
        n, clock, stamps = len(self.layers), self.clock, {}

        def stamp(i: int):
            return lambda _grad: stamps.__setitem__(i, clock.now())

        carry, fwd = (), []
        for i in range(n):
            t0 = clock.now()
            carry = self.run(i, carry)
            fwd.append(clock.now() - t0)
            if i < n - 1:
                for t in carry:
                    if isinstance(t, torch.Tensor) and t.requires_grad:
                        t.register_hook(stamp(i))
        start = clock.now()
        carry[0].backward()
        end = clock.now()
        edges = [start, *(stamps.get(i, end) for i in reversed(range(n - 1))), end]
        # A value carried past several cuts closes them together: never below zero.
        bwd = [max(0.0, edges[n - i] - edges[n - 1 - i]) for i in range(n)]
        nograd, carry = [], ()
        with torch.no_grad():
            for i in range(n):
                t0 = clock.now()
                carry = self.run(i, carry)
                nograd.append(clock.now() - t0)
        return fwd, nograd, bwd

    def sizes(self) -> list[tuple[float, float]]:
        """Per block, (bytes autograd saves for backward, bytes of its outputs)."""
        params = {p.data_ptr() for p in self.stage.parameters()}
        out, carry = [], ()
        for i in range(len(self.layers)):
            seen: dict[tuple[int, int], int] = {}

            def pack(t: torch.Tensor, seen=seen) -> torch.Tensor:
                if t.data_ptr() not in params:
                    seen[(t.data_ptr(), t.numel())] = t.numel() * t.element_size()
                return t

            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                carry = self.run(i, carry)
            out.append((float(sum(seen.values())), _carrier_bytes(carry)))
        carry[0].backward()
        self.stage.zero_grad(set_to_none=True)
        return out


def _carrier_bytes(values: tuple) -> float:
    """Bytes the carrier of ``values`` moves (``boundary``), as a stage sends it."""
    return float(boundary.describe(list(values)).nbytes())


def _chain_stats(chain: _Chain, repeats: int, warmup: int) -> list[tuple[Stat, Stat, Stat]]:
    """Per block (forward, no-graph forward, backward) Stats of ``repeats`` chains."""
    runs = [chain.once() for _ in range(warmup + repeats)][warmup:]
    return [
        tuple(Stat.of([run[kind][i] for run in runs]) for kind in range(3))
        for i in range(len(chain.layers))
    ]


def _optimizer_stats(chain: _Chain, repeats: int, warmup: int) -> tuple[list[Stat], list]:
    """Per block, seconds of one optimizer step over its parameters, and its state bytes."""
    steps, states = [], []
    for layer in chain.layers:
        params = list(layer.parameters())
        for p in params:
            p.grad = torch.zeros_like(p)
        opt, times = build_optimizer(params, chain.training), []
        for r in range(warmup + repeats):
            t0 = chain.clock.now()
            opt.step()
            t1 = chain.clock.now()
            if r >= warmup:
                times.append(t1 - t0)
        steps.append(Stat.of(times))
        states.append(_state_bytes(params, opt))
    return steps, states


def _state_bytes(params: list, opt: torch.optim.Optimizer) -> float:
    """Weights, gradients and optimizer state of ``params``."""
    total = 0.0
    for p in params:
        total += 2 * p.numel() * p.element_size()
        for v in opt.state.get(p, {}).values():
            if torch.is_tensor(v):
                total += v.numel() * v.element_size()
    return total


def _tied_bytes(chain: _Chain) -> dict[int, float]:
    """Per block, bytes of weights whose gradient is summed with another block's."""
    out: dict[int, float] = {}
    for tie in chain.ties:
        param = chain.stage.get_parameter(tie.canonical)
        size = float(param.numel() * param.element_size())
        for name in (tie.canonical, tie.alias):
            i = int(name.split(".")[1])
            out[i] = out.get(i, 0.0) + size
    return out


def measure_graph_blocks(
    spec: JobSpec,
    ms: list[int],
    device: torch.device,
    repeats: int = 15,
    warmup: int = 3,
    progress: Progress | None = None,
) -> list[BlockCalibration]:
    """Calibrate every subgraph of the spec's traced model at every m in ``ms``."""
    times, sizes, chain = {}, {}, None
    for k, m in enumerate(ms):
        if progress:
            progress(f"traced model at m={m}", k / len(ms))
        chain = _Chain(spec, m, device)
        sizes[m] = chain.sizes()
        times[m] = _chain_stats(chain, repeats, warmup)
    steps, states = _optimizer_stats(chain, repeats, warmup)
    tied, big = _tied_bytes(chain), max(ms)
    out = []
    for i, layer in enumerate(chain.layers):
        params = list(layer.parameters())
        out.append(
            BlockCalibration(
                name=chain.names[i],
                params=sum(p.numel() for p in params),
                param_bytes=float(sum(p.numel() * p.element_size() for p in params)),
                state_bytes=states[i],
                tied_bytes=tied.get(i, 0.0),
                act_bytes=sizes[big][i][0] / big,
                boundary_bytes=sizes[big][i][1] / big,
                forward={m: times[m][i][0] for m in ms},
                forward_nograd={m: times[m][i][1] for m in ms},
                backward={m: times[m][i][2] for m in ms},
                optimizer=steps[i],
                peak_bytes={m: states[i] + sizes[m][i][0] + 2.0 * sizes[m][i][1] for m in ms},
            )
        )
    return out
