"""A tiny real pipeline run with the runtime's own code, for the calibration.

Point-to-point ping-pong and compute measured apart miss what the runtime pays when
both meet: a stage that blocks on a receive lets its core go idle and must be woken
when the message lands (on a VM a halted vCPU wakes slowly, and the woken process may
first share the sender's core), the executor's own bookkeeping per message, and the
fixed work of every step (seeding, zero_grad, the executor's setup, the step-end
stop-flag allreduce and metric writes). Varuna's calibration runs "a few
micro-batches" for real; this does the same with jobctl's ``StepExecutor``: ranks
(0, 1) form a 2-stage pipeline of the job's model, running 1F1B, alone ("idle") and,
where the group has 4 ranks, while ranks (2, 3) run a second pipeline at the same
time ("busy": more processes than cores on small hosts). Each rank records per step
the wall seconds of the executor's run, of its compute alone (forward and backward
as the executor times them) and of everything else in its step loop.
``calibration_fit`` turns the samples into per-message and per-step costs by
simulating the same probe with the calibrated compute.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

PROBE_STEPS = 14
PROBE_WARMUP = 4


def probe_pipeline(rank: int, world: int, job: dict, spec) -> dict:
    """Run the probe phases; returns on every rank, per phase, the seconds per step of
    the pipeline's executor run (the later of its two stages), of the rest of the step
    loop, and of each stage's compute: ``{phase: {"run": [...], "rest": [...],
    "compute": [[stage 0...], [stage 1...]]}}``."""
    out: dict[str, dict] = {}
    stages = job.get("probe_stages")
    if not stages:
        return out
    phases = [("idle", 2)] + ([("busy", 4)] if world >= 4 else [])
    for name, active in phases:
        dist.barrier()
        if rank < active:
            samples = _run_pipeline(rank, job, spec, stages)
            if rank < 2:
                out[name] = samples
    gathered: list = [None] * world
    dist.all_gather_object(gathered, out)  # rank 0 writes the results
    first, last = gathered[0], gathered[1]
    # The pipeline's run lasts until its later stage is done (steps start together);
    # compute is per stage.
    return {
        name: {
            "run": _later(first[name]["run"], last[name]["run"]),
            "rest": _later(first[name]["rest"], last[name]["rest"]),
            "compute": [first[name]["compute"], last[name]["compute"]],
        }
        for name in last
    }


def _later(a: list[float], b: list[float]) -> list[float]:
    return [max(x, y) for x, y in zip(a, b, strict=True)]


def _run_pipeline(rank: int, job: dict, spec, stages: list[list[int]]) -> dict:
    from .data import Sharding, make_data
    from .executor import Channels, StepExecutor
    from .model import Stage, model_def
    from .p2p import recv_meta, send_meta
    from .p2p_shm import connect_neighbours
    from .schedules import generate
    from .topology import Topology

    M, m = job["probe_micro_batches"], job["probe_m"]
    stage_index, pair = rank % 2, rank - rank % 2
    mdef = model_def(spec.model, spec.training.seed)
    stage = Stage(mdef, stages[stage_index])
    params = list(stage.parameters())
    topo = Topology(
        rank=rank,
        stage=stage_index,
        replica=0,
        P=2,
        D=1,
        prev=pair if stage_index == 1 else None,
        next=pair + 1 if stage_index == 0 else None,
        dp_ranks=[rank],
        dp_group=None,
        tied_ranks=[],
        tied_group=None,
    )
    shard = Sharding(M * m, 1, m)
    data = make_data(spec)
    x = torch.zeros(m, spec.model.seq_len, dtype=torch.long)
    if stage_index == 1:
        shape, dtype = recv_meta(pair)
        in_shape, in_dtype = shape, dtype
        x = torch.zeros(shape, dtype=dtype)
    else:
        in_shape, in_dtype = None, None
    with torch.no_grad():
        y = stage(x)
    if stage_index == 0:
        send_meta(y, pair + 1)
    chans = Channels(in_shape, in_dtype, tuple(y.shape), y.dtype)
    cpu = torch.device("cpu")
    links = connect_neighbours(topo, chans, cpu, lambda peer: True, 300.0, M)  # as the runtime
    ex = StepExecutor(stage, topo, data, shard, chans, cpu, links=links)
    actions = generate("1f1b", 2, M)[stage_index]
    log = Path(tempfile.gettempdir()) / f"jobctl-probe-{os.getpid()}.jsonl"
    runs, rests, computes = [], [], []
    try:
        for step in range(PROBE_WARMUP + PROBE_STEPS):
            t0 = time.perf_counter()
            torch.manual_seed(step * 4096 + rank)
            for p in params:
                p.grad = None
            t1 = time.perf_counter()
            stats = ex.run(actions, step)
            t2 = time.perf_counter()
            # The trainer's per-step metric lines (its collectives are calibrated apart).
            with open(log, "a") as f:
                f.write(json.dumps({"kind": "heartbeat", "step": step, "ts": time.time()}) + "\n")
            t3 = time.perf_counter()
            _pair_sync(rank, pair)  # as the trainer's stop-flag allreduce, steps start together
            if step >= PROBE_WARMUP:
                runs.append(t2 - t1)
                rests.append(t3 - t2 + t1 - t0)
                computes.append(sum(stats.fwd_s) + sum(stats.bwd_s))
    finally:
        log.unlink(missing_ok=True)
        ex.close()
    return {"run": runs, "rest": rests, "compute": computes}


def _pair_sync(rank: int, pair: int) -> None:
    """A 4-byte exchange between the two ranks of a probe pipeline."""
    peer = pair + 1 if rank == pair else pair
    mine, theirs = torch.zeros(1), torch.zeros(1)
    for req in (dist.isend(mine, peer, tag=1 << 20), dist.irecv(theirs, peer, tag=1 << 20)):
        req.wait()
