"""Tiny real pipeline runs with the runtime's own code, for the calibration.

Point-to-point ping-pong and compute measured apart miss what the runtime pays when
both meet: a stage that blocks on a receive lets its core go idle and must be woken
when the message lands (on a VM a halted vCPU wakes slowly, and with more processes
than cores the woken process, or the one it preempted, waits for a core), the
executor's own bookkeeping per action and message, and the fixed work of every step
(seeding, zero_grad, the optimizer's per-step overhead beyond its per-block cost, the
step-end collectives and metric lines). Varuna's calibration runs "a few
micro-batches" for real; this does the same with jobctl's ``StepExecutor`` and the
trainer's per-step work, in three phases, each 1F1B over the job's model:

* ``solo``: rank 0 alone runs every block as one stage: the executor's cost per
  action and the fixed cost per step, with no message in the way;
* ``idle``: ranks (0, 1) run a 2-stage pipeline: the cost per message with cores to
  spare;
* ``busy``: ranks 0-3 run a 4-stage pipeline (a model of at least 4 blocks, a group of
  4 ranks): the cost per message when a host has more pipeline processes than cores
  (on small hosts), where every message may wake a process that must wait for a core.

The phases run in turn, ``PROBE_ROUNDS`` times, so a few seconds when the machine runs
slow fall on all of them alike. Each rank records per step the wall seconds of the
executor's run, of the optimizer step and of everything else in its step loop.
``calibration_fit`` turns the samples into per-action, per-message and per-step costs
by simulating the same runs with the calibrated compute.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from collections.abc import Callable

    from jobctl.engine.core.actions import Action
    from jobctl.engine.runtime.executor import StepExecutor
    from jobctl.engine.runtime.topology import Topology
    from jobctl.spec.job import JobSpec
    from jobctl.spec.sections import TrainingSpec

PROBE_STEPS = 14
PROBE_WARMUP = 4
# Phases run in turn, this many times: the VM's speed drifts for seconds at a time, and
# one run of each phase measured the 4-stage pipeline anywhere from 18 to 25 ms in
# back-to-back calibrations; each phase's samples are pooled over the rounds.
PROBE_ROUNDS = 4


def probe_phases(job: dict, world: int) -> list[tuple[str, list[list[int]]]]:
    """The phases this group runs: (name, blocks per stage); ``probe_stages`` is the
    2-stage split, ``probe_stages_busy`` the 4-stage one."""
    stages = job.get("probe_stages")
    if not stages:
        return []
    phases = [("solo", [[b for s in stages for b in s]]), ("idle", stages)]
    busy = job.get("probe_stages_busy") or []
    if world >= len(busy) >= 4:
        phases.append(("busy", busy))
    return phases


def probe_pipeline(rank: int, world: int, job: dict, spec: JobSpec) -> dict:
    """Run the probe phases; returns on every rank, per phase, its blocks per stage and
    the seconds per step of the pipeline's executor run (the latest of its stages;
    steps start together), of the rest of the step loop (the latest stage's), and per
    stage of its optimizer step, and for the solo phase the seconds of its model
    between steps (``model_seconds``): ``{phase: {"stages": [[block, ...], ...], "run":
    [...], "rest": [...], "opt": [[stage 0...], ...], "bare": [...], "round": steps}}``
    (the samples are ``round`` steps of each round in turn)."""
    out: dict[str, dict] = {}
    phases = probe_phases(job, world)
    for _ in range(PROBE_ROUNDS):
        for name, stages in phases:
            dist.barrier()
            if rank < len(stages):
                got = _run_pipeline(rank, job, spec, stages)
                mine = out.setdefault(name, {k: [] for k in got})
                for k, v in got.items():
                    mine[k] += v
    gathered: list = [None] * world
    dist.all_gather_object(gathered, out)  # rank 0 writes the results
    result = {}
    for name, stages in phases:
        ranks = [gathered[r][name] for r in range(len(stages))]
        result[name] = {
            "stages": stages,
            "run": _latest([x["run"] for x in ranks]),
            "rest": _latest([x["rest"] for x in ranks]),
            "opt": [x["opt"] for x in ranks],
            "bare": ranks[0]["bare"],
            "round": PROBE_STEPS,  # consecutive samples of one round
        }
    return result


def _latest(per_rank: list[list[float]]) -> list[float]:
    return [max(xs) for xs in zip(*per_rank, strict=True)]


def model_seconds(spec: JobSpec, stage, m: int, M: int):
    """A function timing (this thread's CPU seconds) ``stage``, the job's whole model,
    forward, loss and backward over ``M`` micro-batches of ``m`` (its gradients are
    left summed: zero_grad clears them): the same work in the calibrating process and
    in the solo probe, so the two can be compared for how fast the machine ran at each
    moment (``calibration_fit``)."""
    from jobctl.engine.data.dataset import make_data
    from jobctl.engine.model.blocks import lm_loss

    x, y = make_data(spec).batch(0, m)

    def run() -> float:
        t0 = time.thread_time()
        for _ in range(M):
            lm_loss(stage(x), y).backward()
        return time.thread_time() - t0

    run()  # warm-up
    return run


def _probe_topology(rank: int, P: int) -> Topology:
    """Rank ``rank`` of a P-stage pipeline with one replica and no tied group."""
    from jobctl.engine.runtime.topology import Topology

    return Topology(
        rank=rank,
        stage=rank,
        replica=0,
        P=P,
        D=1,
        prev=None if rank == 0 else rank - 1,
        next=None if rank == P - 1 else rank + 1,
        dp_ranks=[rank],
        dp_group=None,
        tied_ranks=[],
        tied_group=None,
    )


def _run_pipeline(rank: int, job: dict, spec: JobSpec, stages: list[list[int]]) -> dict:
    """This rank's stage of one probe phase: the trainer's step, timed in its parts."""
    from jobctl.engine.data.dataset import Sharding, make_data
    from jobctl.engine.model.blocks import Stage, model_def
    from jobctl.engine.runtime.executor import StepExecutor
    from jobctl.engine.runtime.optim import build_optimizer
    from jobctl.engine.runtime.p2p.shm import connect_neighbours, poll_where_cores_allow
    from jobctl.engine.runtime.step import probe_channels
    from jobctl.engine.schedule.generators import generate

    M, m, P = job["probe_micro_batches"], job["probe_m"], len(stages)
    stage = Stage(model_def(spec.model, spec.training.seed), stages[rank])
    opt = build_optimizer(list(stage.parameters()), spec.training)
    topo, cpu = _probe_topology(rank, P), torch.device("cpu")
    chans = probe_channels(stage, topo, m, spec.model.seq_len, cpu)
    links = connect_neighbours(topo, chans, cpu, lambda peer: True, 300.0, M)  # as the runtime
    poll_where_cores_allow(links, P)
    ex = StepExecutor(stage, topo, make_data(spec), Sharding(M * m, 1, m), chans, cpu, links=links)
    actions = generate("1f1b", P, M)[rank]
    reference = model_seconds(spec, stage, m, M) if P == 1 else None
    try:
        return _probe_steps(ex, actions, opt, spec.training, topo, reference)
    finally:
        ex.close()


def _probe_steps(
    ex: StepExecutor,
    actions: list[Action],
    opt: torch.optim.Optimizer,
    training: TrainingSpec,
    topo: Topology,
    reference: Callable[[], float] | None,
) -> dict:
    """The trainer's step (``runtime.step.train_step``), its collectives aside
    (calibrated apart), then the heartbeat and step lines; per step after the warm-up,
    the seconds of the run, of the update and of the rest."""
    from jobctl.engine.core.events import EventLog, Kind
    from jobctl.engine.runtime.step import train_step
    from jobctl.engine.runtime.vitals import compute_fields, memory_fields

    rank, cpu, M = topo.rank, torch.device("cpu"), ex.shard.micro_batches
    events = EventLog(Path(tempfile.gettempdir()) / f"jobctl-probe-{os.getpid()}.jsonl")
    runs, rests, opts, bare = [], [], [], []
    try:
        for step in range(PROBE_WARMUP + PROBE_STEPS):
            stats, t = train_step(ex, actions, opt, training, step, rank)
            fields = compute_fields(stats, M)
            events.write(Kind.HEARTBEAT, step=step, rank=rank, **fields, **memory_fields(cpu))
            if topo.is_last:
                loss = float(stats.loss_sum)
                events.write(Kind.STEP, step=step, loss=loss, step_time_s=t.updated - t.start)
            t4 = time.perf_counter()
            _pipeline_sync(rank, topo.P)  # as the trainer's stop vote: steps start together
            if step >= PROBE_WARMUP:
                runs.append(t.run_end - t.run_start)
                opts.append(t.updated - t.run_end)
                rests.append(t4 - t.updated + t.run_start - t.start)
                if reference is not None:  # the machine's speed now, between steps
                    bare.append(reference())
    finally:
        events.path.unlink(missing_ok=True)
    return {"run": runs, "rest": rests, "opt": opts, "bare": bare}


def _pipeline_sync(rank: int, P: int) -> None:
    """A 4-byte exchange between rank 0 and each other rank of the probe pipeline."""
    tag = 1 << 20
    if P < 2:
        return
    if rank == 0:
        bufs = [torch.zeros(1) for _ in range(1, P)]
        reqs = [dist.irecv(b, r, tag=tag) for r, b in enumerate(bufs, start=1)]
        reqs += [dist.isend(torch.zeros(1), r, tag=tag) for r in range(1, P)]
    else:
        reqs = [dist.isend(torch.zeros(1), 0, tag=tag), dist.irecv(torch.zeros(1), 0, tag=tag)]
    for req in reqs:
        req.wait()
