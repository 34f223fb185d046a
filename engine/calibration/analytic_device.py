"""Achievable time of a GPT block on a known accelerator, from public device facts.

A peak FLOP/s figure is not what a training step sustains. For a device named in
``spec.devices`` this module prices each operation of a block the way the hardware
runs it, with no constant fitted to any measured step time:

* matrix multiplies (``gemm``): the FLOPs at the tensor-core peak for the precision
  times the share of it cuBLAS was measured to reach (``gemm_fraction``), further
  reduced by tile quantization (each output tile is ``TILE`` x ``TILE``, so a dimension
  that is not a multiple of it computes padding) and wave quantization (tiles run in
  waves of one per SM, the last wave partly idle); never faster than moving the
  operands and result at the achievable memory bandwidth (roofline);
* memory-bound operations (layer norm, softmax, bias + GeLU, dropout, residual adds,
  the copies of the attention heads, cross-entropy, the optimizer): their bytes read
  and written at the measured achievable bandwidth (``stream``);
* a launch cost per kernel;
* what jobctl's runtime adds around the kernels under mixed precision
  (``runtime.step.autocast``: fp32 master weights and gradients under
  ``torch.autocast``). Per micro-batch, each weight's half-precision gradient is cast
  back to fp32 (autograd's ``ToCopyBackward``: read half, write fp32) and added into
  the fp32 ``.grad`` (``AccumulateGrad``: read two, write one): 18 bytes a weight at
  fp16/bf16, 12 at fp32 (a 3072-wide GPT-2 layer moves 2.0 GB of it per micro-batch
  at fp16, 24 % of its backward at m = 1 on a V100). The casts of the weights
  themselves are cached for the whole step (one autocast region), except on a rank
  that recomputes: a recompute runs on autograd's device thread, whose autocast exit
  clears the process-wide cast cache, so each recomputed micro-batch casts the
  weights again (read fp32, write half), priced on its first forward. The embedding
  is not autocast: its lookup, its dense zero-filled vocabulary x hidden gradient and
  that gradient's accumulation run in fp32. The loss runs as ``runtime``'s
  ``lm_loss`` does: the logits cast to fp32, ``log_softmax`` (three reads and a write: max, sum
  of exponentials, output), and back (the gradient zero-filled by ``nll_loss``,
  ``log_softmax``'s backward: two reads of the gradient, one of the output, a write;
  the cast back to half).

Backward runs two matrix multiplies per forward one (input and weight gradients) and
moves about twice the forward's element-wise bytes. ``TILE`` is cuBLAS's common 128 x
128 thread-block tile for Volta tensor-core kernels (CUTLASS documentation, "Efficient
GEMM in CUDA": 128 x 128 thread-block tiles).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from jobctl.spec.devices import DeviceFacts

TILE = 128
MASTER_BYTES = 4  # fp32 master weights and gradients under autocast
ELEMENT_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}


@dataclass(frozen=True)
class Roofline:
    """Achievable rates of one device at one precision."""

    flops: float  # peak FLOP/s at the precision
    gemm_fraction: float
    bandwidth: float  # achievable B/s
    sms: int
    launch_s: float
    elt: int  # bytes per element

    @classmethod
    def of(cls, facts: DeviceFacts, precision: str) -> Roofline:
        peak = facts.peak_tflops.get(precision)
        if peak is None:
            raise ValueError(
                f"training.precision {precision!r} has no peak rate for this accelerator "
                f"(it lists {', '.join(facts.peak_tflops)}): pick one of those"
            )
        return cls(
            flops=peak * 1e12,
            gemm_fraction=facts.gemm_fraction if precision != "fp32" else 1.0,
            bandwidth=facts.memory_gbps * 1e9 * facts.bandwidth_fraction,
            sms=facts.sms,
            launch_s=facts.launch_us * 1e-6,
            elt=ELEMENT_BYTES[precision],
        )

    def gemm(self, M: int, N: int, K: int, batch: int = 1) -> float:
        """Seconds of ``batch`` (M x K) @ (K x N) products."""
        tiles = math.ceil(M / TILE) * math.ceil(N / TILE) * batch
        waves = math.ceil(tiles / self.sms)
        useful = M * N * batch / (tiles * TILE * TILE)  # tile quantization
        occupancy = tiles / (waves * self.sms)  # wave quantization
        math_s = 2.0 * M * N * K * batch / (self.flops * self.gemm_fraction * useful * occupancy)
        bytes_s = (M * K + K * N + M * N) * batch * self.elt / self.bandwidth
        return max(math_s, bytes_s) + self.launch_s

    def stream(self, elements: float, kernels: int) -> float:
        """Seconds of element-wise kernels that read and write ``elements`` in all."""
        return elements * self.elt / self.bandwidth + kernels * self.launch_s

    @property
    def half(self) -> bool:
        """Whether compute runs below the fp32 master weights (autocast)."""
        return self.elt < MASTER_BYTES

    @property
    def cast_bytes(self) -> int:
        """Bytes per element of a cast between fp32 and the compute precision, either
        way (one read, one write); 0 at fp32, where nothing is cast."""
        return self.elt + MASTER_BYTES if self.half else 0

    def accumulate(self, weights: float) -> float:
        """Seconds to add one micro-batch's gradient of ``weights`` into the fp32
        ``.grad``: under autocast first cast back from half (read half, write fp32),
        then added in place (read two fp32, write one)."""
        kernels = 2 if self.half else 1
        per_weight = self.cast_bytes + 3 * MASTER_BYTES
        return weights * per_weight / self.bandwidth + kernels * self.launch_s

    def cast(self, weights: float) -> float:
        """Seconds to cast fp32 master ``weights`` to the compute precision (0 at fp32)."""
        if not self.half:
            return 0.0
        return weights * self.cast_bytes / self.bandwidth + self.launch_s


@dataclass(frozen=True)
class GptShape:
    """The shapes of the builtin GPT at micro-batch size m."""

    t: int  # sequence length
    h: int  # hidden size
    a: int  # attention heads
    v: int  # vocabulary
    dropout: bool


def layer_times(r: Roofline, g: GptShape, m: int) -> tuple[float, float]:
    """(forward, backward) seconds of one transformer layer at micro-batch size m."""
    n, h, t, a = m * g.t, g.h, g.t, g.a
    linears = [(n, 3 * h, h), (n, h, h), (n, 4 * h, h), (n, h, 4 * h)]
    fwd_gemm = sum(r.gemm(*s) for s in linears)
    fwd_gemm += r.gemm(t, t, h // a, m * a) + r.gemm(t, h // a, t, m * a)
    # Backward: input and weight gradient of each product.
    bwd_gemm = sum(r.gemm(M, K, N) + r.gemm(K, N, M) for M, N, K in linears)
    bwd_gemm += 2 * (r.gemm(t, t, h // a, m * a) + r.gemm(t, h // a, t, m * a))
    scores = m * a * t * t
    # Forward element-wise traffic, in elements: two layer norms (read + write),
    # splitting q, k, v into heads and merging them back (copies), scale + mask +
    # softmax over the scores (read + write), bias + GeLU over 4h (read + write), two
    # bias + residual adds (read two, write one); dropout re-reads and writes what it
    # masks (scores and two residual branches).
    elements = 4 * n * h + 2 * 4 * n * h + 2 * scores + 2 * 4 * n * h + 2 * 3 * n * h
    kernels = 12
    if g.dropout:
        elements += 2 * scores + 2 * 2 * n * h
        kernels += 3
    fwd = fwd_gemm + r.stream(elements, kernels)
    bwd = bwd_gemm + r.stream(2 * elements, 2 * kernels) + r.accumulate(12 * h * h + 13 * h)
    return fwd, bwd


def embed_times(r: Roofline, g: GptShape, m: int) -> tuple[float, float]:
    """Token + position embedding, in fp32 (autocast leaves the lookup in its weight's
    dtype): a gather and an add forward, a scatter-add back into a zero-filled dense
    vocabulary x hidden gradient, accumulated."""
    f32 = replace(r, elt=MASTER_BYTES)
    n, table = m * g.t * g.h, g.v * g.h
    return f32.stream(3 * n, 2), f32.stream(3 * n + table, 3) + f32.accumulate(table)


def head_times(r: Roofline, g: GptShape, m: int) -> tuple[float, float]:
    """Final layer norm, the vocabulary projection and ``lm_loss``'s cross-entropy on
    fp32 logits: forward the cast up (half read, fp32 written) and ``log_softmax``'s
    four fp32 passes; backward ``nll_loss``'s zero-filled gradient, ``log_softmax``'s
    four passes and the cast back down."""
    n = m * g.t
    loss_fwd = n * g.v * (r.cast_bytes + 4 * MASTER_BYTES) / r.bandwidth + 3 * r.launch_s
    loss_bwd = n * g.v * (r.cast_bytes + 5 * MASTER_BYTES) / r.bandwidth + 3 * r.launch_s
    fwd = r.gemm(n, g.v, g.h) + r.stream(2 * n * g.h, 2) + loss_fwd
    bwd = r.gemm(n, g.h, g.v) + r.gemm(g.h, g.v, n) + r.stream(2 * n * g.h, 2) + loss_bwd
    return fwd, bwd + r.accumulate(g.v * g.h + 2 * g.h)


def optimizer_time(r: Roofline, params: int, precision: str) -> float:
    """AdamW over ``params`` weights: fp32 reads weight, grad and two moments and writes
    three; mixed precision also reads the half gradient, writes the half weight and
    checks the gradients for overflow (APEX / torch.amp). In 4-byte elements."""
    per_param = 7.0 if precision == "fp32" else 8.5
    return params * per_param * 4 / r.bandwidth + 4 * r.launch_s
