"""Measure per-block compute with torch: forward, backward, optimizer, memory, data.

Each block is built (Varuna sec. 4.3: "running a few micro-batches using random input
values to mock the previous stages") in training mode, under the job's numerics, on
the job's device kind, its input the previous block's output on real data, so shapes
and the last block's loss are exactly the runtime's. Alone, a block gives its sizes,
memory and optimizer step. Its times (forward with an autograd graph, forward without
one, the first pass of a recomputed micro-batch, and backward) come from the whole
model run as one chain, as a stage runs its blocks, each the median of ``repeats``
runs after warm-up; gradients accumulate across runs as across micro-batches.
Activation bytes are the tensors autograd saves for backward; peak memory is measured
by the CUDA allocator, or on CPU estimated from weights, gradients, saved tensors and
output.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from jobctl.engine.calibration.record import BlockCalibration, Stat
from jobctl.engine.data.dataset import make_data
from jobctl.engine.model.blocks import lm_loss, model_def
from jobctl.engine.runtime.optim import build_optimizer
from jobctl.engine.runtime.step import autocast
from jobctl.spec import JobSpec, TrainingSpec

Progress = Callable[[str, float], None]  # (what, fraction of blocks done)


class _Clock:
    """The time compute takes, as robust to other work on the machine as possible.

    On CUDA, the device's own timeline: each mark is a CUDA event recorded on the
    stream, and a difference waits for the later one. Nothing synchronises between
    marks, so the host queues kernels ahead as a training step does; a clock that
    synchronised at every mark would charge each block its launch latency in full
    (measured on an H200: a 12-layer GPT at m=4 calibrated 1.5x slower than it ran). On CPU,
    this thread's CPU time: workers run one intra-op thread, so it is the compute
    itself, and it does not grow when other processes take the core for a while;
    sharing cores with the job's own processes is calibrated separately (host
    slowdown) and modelled by the planner.
    """

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def now(self) -> float | _CudaMark:
        if self.cuda:
            return _CudaMark()
        return time.thread_time()


class _CudaMark:
    """A point on the current CUDA stream; ``later - earlier`` is seconds between them."""

    __slots__ = ("event",)

    def __init__(self) -> None:
        self.event = torch.cuda.Event(enable_timing=True)
        self.event.record()

    def __sub__(self, earlier: _CudaMark) -> float:
        self.event.synchronize()
        return earlier.event.elapsed_time(self.event) / 1e3


def autocast_for(training: TrainingSpec, device: torch.device):
    """The trainer's numerics: its autocast at the spec's precision (bf16, fp16)."""
    return autocast(training.precision, device)


def measure_blocks(
    spec: JobSpec,
    ms: list[int],
    device: torch.device,
    repeats: int = 15,
    warmup: int = 3,
    progress: Progress | None = None,
) -> list[BlockCalibration]:
    """Calibrate every block of the spec's model at every micro-batch size in ``ms``.

    Each block alone gives its sizes, memory and optimizer step; its times come from
    the whole model run as one chain (``_chain_times``): that is how a stage runs its
    blocks, and a block timed alone, its weights hot in cache, runs its forward up to
    a fifth faster. Where the whole model does not fit the device, the times of each
    block alone are kept.
    """
    mdef = model_def(spec.model, spec.training.seed)
    data = make_data(spec)
    tokens = {m: data.batch(0, m) for m in ms}
    inputs = {m: tokens[m][0].to(device) for m in ms}
    tied = _tied_bytes(mdef)
    benches, timings = [], []
    for i in range(mdef.num_blocks):
        if progress:
            progress(f"block {i + 1}/{mdef.num_blocks} ({mdef.names[i]})", i / mdef.num_blocks)
        block = mdef.block(i).to(device).train()
        last = i == mdef.num_blocks - 1
        benches.append(_BlockBench(spec.training, block, device, last, repeats, warmup))
        timings.append({m: benches[i].run(inputs[m], tokens[m][1].to(device)) for m in ms})
        inputs = {m: timings[i][m].output for m in ms}
    try:
        for m in ms:
            x, y = (t.to(device) for t in tokens[m])
            for t, (fwd, nograd, bwd) in zip(timings, _chain_times(benches, x, y), strict=True):
                t[m].forward, t[m].nograd, t[m].backward = fwd, nograd, bwd
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
    return [_record(mdef.names[i], b, timings[i], tied.get(i, 0.0)) for i, b in enumerate(benches)]


def _chain_times(benches: list[_BlockBench], x: torch.Tensor, y: torch.Tensor) -> list:
    """Per block (forward, forward without graph, backward) Stats from the whole model
    run as one chain, ``warmup`` + ``repeats`` times."""
    bench = benches[0]
    runs = [_chain_once(benches, x, y) for _ in range(bench.warmup + bench.repeats)]
    runs = runs[bench.warmup :]
    return [
        tuple(Stat.of([run[kind][i] for run in runs]) for kind in range(3))
        for i in range(len(benches))
    ]


def _chain_once(benches: list[_BlockBench], x: torch.Tensor, y: torch.Tensor) -> tuple:
    """One forward+backward and one no-graph forward of the chain, timed per block.

    Backward times come from hooks that fire as the gradient crosses each block
    boundary: block i's backward ends when the gradient of block i-1's output exists.
    """
    n, clock = len(benches), benches[0].clock
    stamps: dict[int, float] = {}

    def stamp(i: int):
        return lambda _grad: stamps.__setitem__(i, clock.now())

    h, fwd = x, []
    for i, b in enumerate(benches):
        t0 = clock.now()
        h = b.forward(h, y)
        fwd.append(clock.now() - t0)
        if i < n - 1 and h.requires_grad:
            h.register_hook(stamp(i))
    start = clock.now()
    h.backward()
    end = clock.now()
    # A boundary no gradient crosses (no weights below it) closes at the end.
    edges = [start, *(stamps.get(i, end) for i in reversed(range(n - 1))), end]
    bwd = [edges[n - i] - edges[n - 1 - i] for i in range(n)]
    nograd, h = [], x
    with torch.no_grad():
        for b in benches:
            t0 = clock.now()
            h = b.forward(h, y)
            nograd.append(clock.now() - t0)
    return fwd, nograd, bwd


def _record(name: str, bench: _BlockBench, timings: dict, tied: float) -> BlockCalibration:
    """The calibration of one block from its timings at every m."""
    big = max(timings)
    params = list(bench.block.parameters())
    return BlockCalibration(
        name=name,
        params=sum(p.numel() for p in params),
        param_bytes=float(sum(p.numel() * p.element_size() for p in params)),
        state_bytes=bench.state_bytes(),
        tied_bytes=tied,
        act_bytes=timings[big].saved_bytes / big,
        boundary_bytes=timings[big].out_bytes / big,
        forward={m: t.forward for m, t in timings.items()},
        forward_nograd={m: t.nograd for m, t in timings.items()},
        backward={m: t.backward for m, t in timings.items()},
        optimizer=bench.optimizer_step(),
        peak_bytes={m: t.peak_bytes for m, t in timings.items()},
    )


def measure_data(spec: JobSpec, ms: list[int], repeats: int = 15) -> dict[int, Stat]:
    """Seconds to fetch one micro-batch of m samples, as the first and last stage do."""
    data = make_data(spec)
    out = {}
    for m in ms:
        times = []
        for r in range(repeats):
            t0 = time.thread_time()  # CPU work in this thread, as for compute (_Clock)
            data.batch(r * m, m)
            times.append(time.thread_time() - t0)
        out[m] = Stat.of(times)
    return out


class _Timings:
    """One block at one micro-batch size."""

    def __init__(self, forward, nograd, backward, saved, out_bytes, peak, output) -> None:
        self.forward, self.nograd, self.backward = forward, nograd, backward
        self.saved_bytes, self.out_bytes, self.peak_bytes = saved, out_bytes, peak
        self.output = output


class _BlockBench:
    """Times one block the way the executor runs it."""

    def __init__(
        self, training: TrainingSpec, block, device, last: bool, repeats: int, warmup: int
    ) -> None:
        self.training, self.block, self.device, self.last = training, block, device, last
        self.repeats, self.warmup = repeats, warmup
        self.clock = _Clock(device)
        self.opt = build_optimizer(list(block.parameters()), training)
        self.scale = 1.0 / training.global_batch_size

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The block on ``x``; the last block also takes the loss against ``y``."""
        with autocast_for(self.training, self.device):
            out = self.block(x)
            return lm_loss(out, y) * self.scale if self.last else out

    def run(self, x: torch.Tensor, y: torch.Tensor) -> _Timings:
        fwd, nograd, bwd = [], [], []
        grad = None
        for r in range(self.warmup + self.repeats):
            xin = x.detach().requires_grad_(x.is_floating_point())
            t0 = self.clock.now()
            out = self.forward(xin, y)
            t1 = self.clock.now()
            if grad is None:
                grad = torch.randn_like(out) * 1e-3 if not self.last else None
            out.backward(grad)
            t2 = self.clock.now()
            with torch.no_grad():
                self.forward(x, y)
            t3 = self.clock.now()
            if r >= self.warmup:
                fwd.append(t1 - t0)
                bwd.append(t2 - t1)
                nograd.append(t3 - t2)
        saved, peak = self._memory(x, y)
        with torch.no_grad(), autocast_for(self.training, self.device):
            output = self.block(x)
        return _Timings(
            Stat.of(fwd),
            Stat.of(nograd),
            Stat.of(bwd),
            saved,
            float(output.numel() * output.element_size()),
            peak,
            output.detach(),
        )

    def _memory(self, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
        """Bytes autograd saves for backward, and peak bytes of one forward+backward."""
        seen: dict[tuple[int, int], int] = {}
        params = {p.data_ptr() for p in self.block.parameters()}

        def pack(t: torch.Tensor) -> torch.Tensor:
            if t.data_ptr() not in params:
                seen[(t.data_ptr(), t.numel())] = t.numel() * t.element_size()
            return t

        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
            base = torch.cuda.memory_allocated(self.device)
        xin = x.detach().requires_grad_(x.is_floating_point())
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = self.forward(xin, y)
        saved = float(sum(seen.values()))
        out.backward(torch.zeros_like(out) if not self.last else None)
        state = self.state_bytes()
        if cuda:
            return saved, float(torch.cuda.max_memory_allocated(self.device) - base) + state
        return saved, state + saved + 2.0 * out.numel() * out.element_size()

    def state_bytes(self) -> float:
        """Weights, gradients and optimizer state (after at least one step)."""
        if not self.opt.state:
            self.opt.step()
        total = 0.0
        for p in self.block.parameters():
            total += 2 * p.numel() * p.element_size()
            for v in self.opt.state.get(p, {}).values():
                if torch.is_tensor(v):
                    total += v.numel() * v.element_size()
        return total

    def optimizer_step(self) -> Stat:
        """Seconds of one optimizer step over the block's parameters."""
        times = []
        for r in range(self.warmup + self.repeats):
            t0 = self.clock.now()
            self.opt.step()
            t1 = self.clock.now()
            if r >= self.warmup:
                times.append(t1 - t0)
        return Stat.of(times)


def _tied_bytes(mdef) -> dict[int, float]:
    """Per block, bytes of weights whose gradient is summed with another block's."""
    out: dict[int, float] = {}
    for tie in mdef.ties:
        owner = int(tie.canonical.split(".")[1])
        alias = int(tie.alias.split(".")[1])
        leaf = tie.canonical.split(".", 2)[2]
        param = mdef.block(owner).get_parameter(leaf)
        size = float(param.numel() * param.element_size())
        out[owner] = out.get(owner, 0.0) + size
        out[alias] = out.get(alias, 0.0) + size
    return out
