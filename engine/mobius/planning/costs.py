"""Mobius's per-layer costs and the step time of one partition (Mobius sec. 3.1-3.2).

A Mobius pipeline (Feng et al., Mobius, ASPLOS '23) cuts the model into S stages over
N devices, S possibly above N: stage j runs on device ``j % N``, lives in the slower
memory tier (pinned host memory on a GPU, local disk on a CPU device) and is uploaded
before it runs; the next stage on a device is prefetched into the memory its current
stage leaves free while the current one computes. Each stage runs its M micro-batches
forward, in order, then (after the forward of the last stage) the stages run backward
in reverse; activations go down after a stage's forward and come back before its
backward, so a backward upload is weights plus the stage's stashed activations. The
last stage on each device is still resident when the backward starts: it uploads
nothing. ``planning.plan`` and ``planning.step`` price partitions with it.

``LayerCost`` is one layer's profile (``layer_costs`` builds them from a
``Calibration``), ``MobiusConfig`` the constants of the paper's Table 2 (N, M, G, B),
``merge_identical`` the paper's merging of identical layers, and ``step_time`` prices
one partition with the paper's constraints 4-11 taken as earliest start times (with
the most prefetch each stage allows), on the costs the runtime pays (``as_run``:
the update on upload, the store back, the input reloads, the gradients down and the
recompute, which the paper's model leaves out). The MIP (``planning.partition``) minimises the
same quantity, so its optimum equals the best ``step_time`` over all partitions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from jobctl.engine.calibration.record import Calibration


class MobiusConfig(BaseModel):
    """The constants of the partition problem (Mobius Table 2)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    devices: int = Field(ge=1, description="N: number of devices (GPUs or CPU processes)")
    memory_bytes: float = Field(gt=0, description="G: memory per device, bytes")
    tier_Bps: float = Field(  # noqa: N815
        gt=0, description="B: bandwidth to the slower tier (PCIe on GPU, disk on CPU), B/s"
    )
    link_Bps: float | None = Field(  # noqa: N815
        None, gt=0, description="activation bandwidth between devices, B/s (None: B)"
    )
    micro_batches: int = Field(ge=1, description="M: micro-batches per step")
    # 16: a 48-layer GPT (50 blocks) becomes 14 units and solves in about 2-4 s
    # (benchmarks/planner/mobius_partition.py); 18 units (g = 3) took 6-10 s there.
    max_units: int = Field(
        16, ge=1, description="merge identical layers until at most this many units remain"
    )
    time_limit_s: float = Field(60.0, gt=0, description="HiGHS time limit per MIP, s")

    @property
    def link(self) -> float:
        return self.link_Bps or self.tier_Bps


@dataclass(frozen=True)
class LayerCost:
    """One layer (or merged unit) as the partition sees it; times per micro-batch."""

    forward_s: float
    backward_s: float
    upload_f: float  # bytes uploaded before the stage's forward (its weights)
    upload_b: float  # bytes uploaded before its backward (weights + stashed activations)
    memory_f: float  # device bytes while its stage runs forward
    memory_b: float  # device bytes while its stage runs backward
    boundary: float  # bytes sent to the next layer per micro-batch
    # What the runtime (engine.mobius) adds, as planning.simulator plays it; 0 for
    # the paper's model alone:
    update_s: float = 0.0  # the update on upload, on the link before the forward
    recompute_s: float = 0.0  # the forward re-run in backward (not in the last stage)
    reload: float = 0.0  # bytes of this layer's M inputs, reloaded if it starts a stage
    grad_down: float = 0.0  # bytes of gradients stored down after the backward


def layer_costs(cal: Calibration, m: int, micro_batches: int) -> list[LayerCost]:
    """Each calibrated block at micro-batch size m with M = ``micro_batches``, priced
    the way ``engine.mobius.runtime`` runs it (``step.swap_stages``): before a
    forward the record's weights, gradients and optimizer slots come up, the update
    runs and weights and slots go back down; a stage but the last recomputes its
    forward in backward, so its backward upload is the weights and its stage's input
    (each micro-batch's, offloaded after the forward), and its gradients go down after
    it. Memory (constraint 4): activations of all M micro-batches stashed, weights and
    gradients on the device during the backward."""
    out = []
    last = cal.num_blocks - 1
    for i, b in enumerate(cal.blocks):
        acts = b.act_bytes * m * micro_batches
        send = 0.0 if i == last else b.boundary_bytes * m
        optim = max(0.0, b.state_bytes - 2 * b.param_bytes)
        before = cal.blocks[i - 1].boundary_bytes * m * micro_batches if i else 0.0
        out.append(
            LayerCost(
                forward_s=cal.forward(i, m),
                backward_s=cal.backward(i, m),
                upload_f=2 * b.param_bytes + optim + (b.param_bytes + optim),
                upload_b=b.param_bytes,
                memory_f=b.param_bytes + acts + 2 * b.boundary_bytes * m,
                memory_b=2 * b.param_bytes + acts + 2 * b.boundary_bytes * m,
                boundary=send,
                update_s=b.optimizer.median,
                recompute_s=cal.forward(i, m),
                reload=before,
                grad_down=b.param_bytes,
            )
        )
    return out


def merge_identical(layers: list[LayerCost], max_units: int) -> tuple[list[LayerCost], int]:
    """Mobius sec. 3.2: merge runs of identical consecutive layers into units of g
    layers each, with the least g that leaves at most ``max_units`` units (or g = the
    longest run, when even that leaves more). Returns the units and g; a unit's times,
    uploads and memory are its layers' sums, its boundary that of its last layer, so
    a partition of units is a partition of layers cut only at unit edges."""
    runs = _runs(layers)
    longest = max(len(r) for r in runs)
    g = next(
        (g for g in range(1, longest + 1) if sum(math.ceil(len(r) / g) for r in runs) <= max_units),
        longest,
    )
    units = [_sum(run[k : k + g]) for run in runs for k in range(0, len(run), g)]
    return units, g


def unit_layers(layers: list[LayerCost], g: int) -> list[range]:
    """The layer indices each unit of ``merge_identical(layers, .)`` with group g covers."""
    out, start = [], 0
    for run in _runs(layers):
        for k in range(0, len(run), g):
            n = min(g, len(run) - k)
            out.append(range(start + k, start + k + n))
        start += len(run)
    return out


def _runs(layers: list[LayerCost]) -> list[list[LayerCost]]:
    runs: list[list[LayerCost]] = []
    for layer in layers:
        if runs and _same(runs[-1][-1], layer):
            runs[-1].append(layer)
        else:
            runs.append([layer])
    return runs


def _same(a: LayerCost, b: LayerCost) -> bool:
    pairs = zip(_fields(a), _fields(b), strict=True)
    return all(math.isclose(x, y, rel_tol=1e-9) for x, y in pairs)


def _fields(c: LayerCost) -> tuple[float, ...]:
    return (
        c.forward_s,
        c.backward_s,
        c.upload_f,
        c.upload_b,
        c.memory_f,
        c.memory_b,
        c.update_s,
        c.recompute_s,
        c.grad_down,
        c.boundary,
        c.reload,
    )


def _sum(group: list[LayerCost]) -> LayerCost:
    """The layers as one: sums, the last one's output and the first one's input."""
    sums = [sum(x) for x in zip(*(_fields(c) for c in group), strict=True)]
    return LayerCost(
        *sums[:6],
        update_s=sums[6],
        recompute_s=sums[7],
        grad_down=sums[8],
        boundary=group[-1].boundary,
        reload=group[0].reload,
    )


def as_run(stages: list[LayerCost], tier_Bps: float) -> list[LayerCost]:  # noqa: N803
    """The stages as the paper's model prices them, with what the runtime adds folded
    in: the update on upload as link seconds of the forward upload; the stage's input
    reload and its gradients' store down on its backward upload (the link carries the
    store while the next backward uploads); the recompute in every backward but the
    last stage's."""
    last = len(stages) - 1
    return [
        LayerCost(
            forward_s=s.forward_s,
            backward_s=s.backward_s + (s.recompute_s if j < last else 0.0),
            upload_f=s.upload_f + s.update_s * tier_Bps,
            upload_b=s.upload_b + s.reload + s.grad_down,
            memory_f=s.memory_f,
            memory_b=s.memory_b,
            boundary=s.boundary,
        )
        for j, s in enumerate(stages)
    ]


def stage_sums(layers: list[LayerCost], sizes: list[int]) -> list[LayerCost]:
    """The stages of consecutive runs of ``sizes`` layers, each as one summed cost."""
    out, start = [], 0
    for n in sizes:
        out.append(_sum(layers[start : start + n]))
        start += n
    return out


def fits(stages: list[LayerCost], cfg: MobiusConfig) -> bool:
    """Constraint 4: every stage's forward and backward fit the device's memory."""
    return all(max(s.memory_f, s.memory_b) <= cfg.memory_bytes for s in stages)


def step_time(layers: list[LayerCost], sizes: list[int], cfg: MobiusConfig) -> float:
    """Seconds of one step with stages of ``sizes`` consecutive layers (constraints 5-11
    at their earliest start times); ``math.inf`` when a stage does not fit (4)."""
    stages = stage_sums(layers, sizes)
    if not fits(stages, cfg):
        return math.inf
    stages = as_run(stages, cfg.tier_Bps)
    tf = _forward(stages, cfg)
    tb = _backward(stages, cfg, tf)
    return tb[0][-1] + stages[0].backward_s


def _prefetch(upload: float, free: float, span: float, cfg: MobiusConfig) -> float:
    """Seconds of upload left after prefetching during ``span`` seconds into ``free``
    bytes (constraints 5-6; the prefetch is at most the stage's data)."""
    done = min(upload, free, cfg.tier_Bps * span)
    return (upload - done) / cfg.tier_Bps


def _forward(stages: list[LayerCost], cfg: MobiusConfig) -> list[list[float]]:
    """Start time of each stage's forward on each micro-batch (constraints 8-10)."""
    N, M, B = cfg.devices, cfg.micro_batches, cfg.tier_Bps
    t: list[list[float]] = []
    for j, s in enumerate(stages):
        if j < N:
            ready = s.upload_f / B
        else:
            p = stages[j - N]
            span = p.forward_s + t[j - N][-1] - t[j - N][0]  # D^f of the stage before
            free = cfg.memory_bytes - p.memory_f
            ready = t[j - N][-1] + p.forward_s + _prefetch(s.upload_f, free, span, cfg)
        row: list[float] = []
        for m in range(M):
            start = ready if m == 0 else row[-1] + s.forward_s
            if j:
                prev = stages[j - 1]
                start = max(start, t[j - 1][m] + prev.forward_s + prev.boundary / cfg.link)
            row.append(start)
        t.append(row)
    return t


def _backward(
    stages: list[LayerCost], cfg: MobiusConfig, tf: list[list[float]]
) -> list[list[float]]:
    """Start time of each stage's backward on each micro-batch (constraints 8-11)."""
    N, M, S = cfg.devices, cfg.micro_batches, len(stages)
    t: list[list[float]] = [[] for _ in stages]
    for j in range(S - 1, -1, -1):
        s = stages[j]
        ready = tf[j][-1] + s.forward_s
        if j + N < S:  # not resident: uploaded after the device's previous stage
            q, tq = stages[j + N], t[j + N]
            span = q.backward_s + tq[-1] - tq[0]
            left = _prefetch(s.upload_b, cfg.memory_bytes - q.memory_b, span, cfg)
            ready = max(ready, tq[-1] + q.backward_s + left)
        row: list[float] = []
        for m in range(M):
            start = ready if m == 0 else row[-1] + s.backward_s
            if j < S - 1:
                nxt = stages[j + 1]
                start = max(start, t[j + 1][m] + nxt.backward_s + s.boundary / cfg.link)
            row.append(start)
        t[j] = row
    return t


def even_bounds(layers: int, stages: int) -> list[int]:
    """Where each stage of the even split of ``layers`` into ``stages`` starts, and the
    end (larger stages last)."""
    return [round(k * layers / stages) for k in range(stages + 1)]


def even_sizes(layers: int, stages: int) -> list[int]:
    """Stage sizes of the even split of ``layers`` into ``stages`` (larger ones last)."""
    bounds = even_bounds(layers, stages)
    return [b - a for a, b in zip(bounds, bounds[1:], strict=False)]
