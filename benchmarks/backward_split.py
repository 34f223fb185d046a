"""What splitting the backward into B and W costs: jobctl's split against PyTorch's.

One stage of the schedule_throughput model (the last of P=2: two blocks and the head),
one thread, a micro-batch of m samples. Per round, interleaved: the forward and whole
backward; jobctl's B (``runtime.backward.input_grads``) and W (``weight_grads``) after a
forward through its deferred linear layers; PyTorch's ``stage_backward_input`` and
``stage_backward_weight`` (what its zero-bubble schedules run). Each figure is the
minimum over rounds (the machine is shared: the least disturbed run).

    python -m benchmarks.backward_split [--rounds 200] [--micro-batch 2]

2026-11-26, ms (min of 200): whole F 1.31, B 1.91; jobctl's split with an
``autograd.Function`` per linear layer F 1.43, B 1.46, W 0.77 (B + W 1.14x the whole
backward); with gradient edges recorded in the forward and W fused by ``addmm_``
F 1.32, B 1.42, W 0.73 (1.13x: W's own Python, ~20 us a layer, is what is left);
PyTorch's stage_backward_input/weight F 1.26, B 1.64, W 1.61 (1.70x).
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight

from benchmarks.schedule_throughput import MODEL
from jobctl.engine.model.blocks import Stage, gpt_def
from jobctl.engine.runtime.backward import (
    WeightStore,
    defer_linear_weights,
    input_grads,
    weight_grads,
)

BLOCKS = [3, 4, 5]  # the last stage of P=2 in schedule_throughput


def _stage() -> Stage:
    h, layers = MODEL["model.hidden"], MODEL["model.layers"]
    return Stage(gpt_def(layers, h, MODEL["model.heads"], MODEL["model.seq_len"], 256), BLOCKS)


def _round(stages: dict[str, Stage], store: WeightStore, others: list, x0, times: dict) -> None:
    for kind, stage in stages.items():
        stage.zero_grad(set_to_none=True)
        x = x0.clone().requires_grad_(True)
        t0 = time.perf_counter()
        store.recording = 0 if kind == "jobctl" else None
        out = stage(x)
        store.recording = None
        g = torch.ones_like(out)
        t1 = time.perf_counter()
        if kind == "whole":
            torch.autograd.backward(out, g)
        elif kind == "jobctl":
            input_grads(out, g, x, others, store, 0)
        else:
            _, groups = stage_backward_input([out], [g], [x], iter(list(stage.parameters())))
        t2 = time.perf_counter()
        if kind == "jobctl":
            weight_grads(store, 0)
        elif kind == "torch":
            stage_backward_weight(iter(list(stage.parameters())), groups)
        t3 = time.perf_counter()
        for name, dt in (("F", t1 - t0), ("B", t2 - t1), ("W", t3 - t2)):
            key = (kind, name)
            times[key] = min(times.get(key, float("inf")), dt)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--micro-batch", type=int, default=2, help="m")
    args = parser.parse_args()
    torch.set_num_threads(1)
    stages = {kind: _stage() for kind in ("whole", "jobctl", "torch")}
    store = WeightStore()
    deferred = defer_linear_weights(stages["jobctl"], store)
    others = [p for p in stages["jobctl"].parameters() if p not in deferred]
    x0 = torch.randn(args.micro_batch, MODEL["model.seq_len"], MODEL["model.hidden"])
    times: dict = {}
    for _ in range(args.rounds):
        _round(stages, store, others, x0, times)
    whole = times["whole", "B"]
    print(f"stage blocks {BLOCKS}, m={args.micro_batch}, min over {args.rounds} rounds (ms):")
    for kind in stages:
        f, b, w = (1e3 * times[kind, k] for k in "FBW")
        print(
            f"  {kind:<7} F {f:6.3f}  B {b:6.3f}  W {w:6.3f}  "
            f"B+W / whole backward {(b + w) / (1e3 * whole):.2f}x"
        )


if __name__ == "__main__":
    main()
