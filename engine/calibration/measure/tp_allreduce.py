"""Measure tensor parallelism's all-reduce (Megatron's g and f) on this machine.

A tensor-parallel block all-reduces each row linear's output (b x s x h at the
micro-batch size m) among the T ranks of its group, inside one node. This times
exactly that: ``dist.all_reduce`` of one activation-sized tensor among T local
processes (gloo on CPU, NCCL on CUDA), at each size the model's stages reduce
(``tp_costs.facts``: each row output's bytes per sample, times every calibrated m),
for each T > 1 the planner may choose for the spec (``tp_search.options``: T divides
``hardware.processes_per_node`` and the model's heads and widths). One group of the
largest T is started once; each smaller T is a subgroup of its first ranks. The
ranks reduce back to back, as a block's ranks meet at g after the same compute.
A sample is rank 0's wall time of one all-reduce; few repeats, a few seconds in all.
"""

from __future__ import annotations

import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from jobctl.engine.calibration.measure.comm import _allreduce
from jobctl.engine.calibration.record import AllreduceCalibration
from jobctl.engine.core.process import free_port
from jobctl.spec import JobSpec

REPEATS = 5
WARMUP = 2
MAX_SIZES = 4
TIMEOUT_S = 120.0  # the whole group, start-up (torch imports) included


def admissible(spec: JobSpec) -> list[int]:
    """The T > 1 the planner may choose for the spec (none for hand-cut blocks)."""
    from jobctl.engine.planner.tp_search import options, with_T

    per_node = spec.hardware.processes_per_node
    Ts, _why = options(with_T(spec, "auto"), per_node)
    if spec.hardware.device == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        Ts = [t for t in Ts if t <= count]
    return [t for t in Ts if t > 1]


def reduce_sizes(spec: JobSpec, T: int, ms: list[int]) -> list[int]:
    """Bytes of the all-reduces a T group's blocks run: each row output at every m
    (at most ``MAX_SIZES`` of them, ends kept)."""
    from jobctl.engine.model.blocks import model_def
    from jobctl.engine.model.graph.tp_plan import discover
    from jobctl.engine.planner.tp_costs import facts

    graph = model_def(spec.model, spec.training.seed).graph
    per_sample = {b for f in facts(graph, discover(graph, T)) for b in f.reduce_bytes}
    sizes = sorted({int(b * m) for b in per_sample for m in ms if b > 0})
    if len(sizes) <= MAX_SIZES:
        return sizes
    step = (len(sizes) - 1) / (MAX_SIZES - 1)
    return sorted({sizes[round(k * step)] for k in range(MAX_SIZES)})


def measure_tp_allreduce(spec: JobSpec, ms: list[int]) -> AllreduceCalibration | None:
    """The all-reduce of every admissible T at its sizes; None where no T > 1 is."""
    Ts = admissible(spec)
    if not Ts:
        return None
    job = [(T, reduce_sizes(spec, T, ms)) for T in Ts]
    rows = run_group(job, spec.hardware.device == "cuda")
    return _allreduce(rows) if rows else None


def run_group(job: list[tuple[int, list[int]]], cuda: bool, repeats: int = REPEATS) -> list:
    """Rows ``[T, 1, bytes, seconds]`` from a group of the largest T's processes."""
    world = max(T for T, _ in job)
    # CPU ranks fork (a fresh torch import per rank took 10-25 s on a busy 2-core VM);
    # CUDA cannot be forked once initialised.
    ctx = mp.get_context("spawn" if cuda else "fork")
    queue = ctx.Queue()
    addr = f"tcp://127.0.0.1:{free_port()}"
    procs = [
        ctx.Process(target=_worker, args=(r, world, addr, job, cuda, repeats, queue), daemon=True)
        for r in range(world)
    ]
    for p in procs:
        p.start()
    try:
        rows = queue.get(timeout=TIMEOUT_S)
    finally:
        for p in procs:
            p.join(timeout=10.0)
            if p.is_alive():
                p.terminate()
    return rows


def _worker(rank: int, world: int, addr: str, job: list, cuda: bool, repeats: int, queue):
    """One rank: every T's all-reduces, rank 0 putting the rows on ``queue``."""
    torch.set_num_threads(1)
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group(
        "nccl" if cuda else "gloo",
        init_method=addr,
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=TIMEOUT_S),
    )
    groups = {T: dist.new_group(list(range(T))) for T, _ in job}  # every rank creates each
    rows = []
    for T, sizes in job:
        for nbytes in sizes:
            dist.barrier()
            if rank < T:
                times = _times(torch.ones(max(1, nbytes // 4), device=device), groups[T], repeats)
                rows.append([T, 1, nbytes, times])
    if rank == 0:
        queue.put(rows)
    dist.barrier()
    dist.destroy_process_group()


def _times(x: torch.Tensor, group, repeats: int) -> list[float]:
    """Wall seconds of ``repeats`` all-reduces of ``x`` over ``group`` after ``WARMUP``."""
    out = []
    for r in range(WARMUP + repeats):
        t0 = time.perf_counter()
        dist.all_reduce(x, group=group)
        if x.is_cuda:
            torch.cuda.synchronize(x.device)
        if r >= WARMUP:
            out.append(time.perf_counter() - t0)
    return out
