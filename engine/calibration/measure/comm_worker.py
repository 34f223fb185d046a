"""One rank of the communication micro-benchmarks (run by ``comm.measure_comm``).

Started as ``python -m jobctl.engine.calibration.measure.comm_worker job.json`` with RANK,
WORLD_SIZE, MASTER_ADDR and MASTER_PORT set. Rank 0 writes the samples (seconds) to
the job's ``out`` file. Samples of different sizes and process counts are taken in
interleaved rounds, so a burst of other work on the machine spreads over all of them
instead of skewing one.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from jobctl.engine.calibration.measure.probe import probe_pipeline
from jobctl.engine.runtime.optim import allreduce_grads

TIMEOUT_S = 300.0
WARMUP = 3
# Rounds of the core-sharing probe (its 3- and 4-process factors drift by a tenth
# between rounds).
ROUNDS = 6
PROBE_WINDOW_S = 0.25  # each process probes for this long per round and process count
P2P_REPEATS = 3  # ping-pong samples per size, in units of the job's repeats
BURST_S = 0.015  # of compute before each allreduce sample (CPU), at least


def main(job: dict) -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(job["threads"])
    cuda = torch.cuda.is_available() and _spec(job).hardware.device == "cuda"
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(seconds=TIMEOUT_S))
    groups = {}
    for r, k in job["rings"]:
        for j in range(k):
            ring = tuple(range(j * r, (j + 1) * r))
            if ring not in groups:
                groups[ring] = dist.new_group(list(ring))
    probe = None if cuda else _probe(job)
    out = {
        "p2p": _pingpong(rank, job, device, None),
        "p2p_busy": _pingpong(rank, job, device, probe) if probe and world > 2 else {},
        "allreduce": _allreduces(rank, world, job, groups, device, probe),
        "slowdown": _slowdown(rank, world, job, probe) if probe else None,
        "pipeline": {} if cuda else probe_pipeline(rank, world, job, _spec(job)),
    }
    if rank == 0:
        Path(job["out"]).write_text(json.dumps(out))
    dist.barrier()
    dist.destroy_process_group()


def _spec(job: dict):
    from jobctl.spec import load_spec

    return load_spec(job["spec"])


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _pingpong(rank: int, job: dict, device: torch.device, probe) -> dict:
    """One-way seconds per size between ranks 0 and 1 (round trip / 2), with the
    runtime's own isend/irecv; with ``probe``, ranks 2.. compute meanwhile."""
    sizes = job["p2p_bytes"]
    bufs = [torch.zeros(max(1, n // 4), dtype=torch.float32, device=device) for n in sizes]
    out: dict[int, list[float]] = {n: [] for n in sizes}
    dist.barrier()
    stop = Path(job["out"]).with_name("pingpong-done")
    if rank >= 2:
        while probe is not None and not stop.exists():
            probe()
        return out
    # Messages are cheap and their latency bimodal (a halted vCPU wakes slowly): many.
    for r in range(WARMUP + P2P_REPEATS * job["repeats"]):
        for k, (n, buf) in enumerate(zip(sizes, bufs, strict=True)):
            tag = r * len(sizes) + k
            if rank == 0:
                t0 = time.perf_counter()
                dist.isend(buf, 1, tag=tag).wait()
                dist.irecv(buf, 1, tag=tag).wait()
                _sync(device)
                if r >= WARMUP:
                    out[n].append((time.perf_counter() - t0) / 2)
            else:
                dist.irecv(buf, 0, tag=tag).wait()
                dist.isend(buf, 0, tag=tag).wait()
    if rank == 0 and probe is not None:
        stop.touch()  # a file: gloo cannot poll a receive for a stop message
    return out


def _allreduces(
    rank: int, world: int, job: dict, groups: dict, device: torch.device, probe
) -> list[list]:
    """Rows ``[ring, inflight, bytes, seconds]`` measured on rank 0's ring.

    Measured as the runtime meets it: each sample is the runtime's own gradient sync
    (``optim.allreduce_grads``: the gradients copied into one flat bucket, reduced and
    copied back) and, on CPU, follows a burst of the job's own compute (``probe``: the
    model's forward and backward, repeated for at least ``BURST_S``) on every active
    rank, as a step's gradient allreduce follows its backwards. Back-to-back
    allreduces keep every process awake and in step; after compute the ranks arrive
    apart, and one that waited sleeps and must be woken (on a VM, slowly). The burst's
    length matters: a 2 MB allreduce of two CPU processes took 1.3 ms back to back or
    after 5 ms of compute, and 3-4 ms after 10-40 ms. A sample is the time of the
    ring's last arrival (the least of its ranks' times): what the step pays beyond its
    slowest replica's compute, whose wait the simulator models itself.
    """
    rows = []
    for r, k in job["rings"]:
        mine = next((g for ring, g in groups.items() if len(ring) == r and rank in ring), None)
        active = rank < r * k
        for nbytes in job["allreduce_bytes"]:
            numel = max(2, nbytes // 4)
            halves = (numel // 2, numel - numel // 2)
            params = [nn.Parameter(torch.zeros(n, device=device)) for n in halves]
            dist.barrier()
            n = WARMUP + job["repeats"]
            times = _sync_times(params, mine, device, probe, n) if active else []
            gathered: list = [None] * world
            dist.all_gather_object(gathered, times)
            if rank == 0:
                last_arrival = [min(xs) for xs in zip(*gathered[:r], strict=True)]
                rows.append([r, k, nbytes, last_arrival[WARMUP:]])
    return rows


def _sync_times(params: list, group, device: torch.device, probe, n: int) -> list[float]:
    """Seconds of ``n`` gradient syncs of ``params`` over ``group``, each after a burst
    of the job's compute."""
    times = []
    for _ in range(n):
        for p in params:
            p.grad = torch.ones_like(p)
        _burst(probe)
        t0 = time.perf_counter()
        allreduce_grads(params, group)
        _sync(device)
        times.append(time.perf_counter() - t0)
    return times


def _burst(probe) -> None:
    """The job's compute for at least ``BURST_S`` (nothing without a probe)."""
    if probe is None:
        return
    start = time.perf_counter()
    while time.perf_counter() - start < BURST_S:
        probe()


def _slowdown(rank: int, world: int, job: dict, probe) -> dict[int, float]:
    """Time factor of the probe when k processes run it at once, each k against k=1
    measured in the same round.

    Each process's mean time per probe counts, not its median: with more processes
    than cores the scheduler lets one run whole probes and then stops it for a whole
    time slice, so the median probe looks unslowed while the mean is the share of a
    core it got.
    """
    ratios: dict[int, list[float]] = {k: [] for k in range(2, world + 1)}
    probe()  # warm-up
    for _ in range(ROUNDS):
        means = {}
        for k in range(1, world + 1):
            dist.barrier()
            mine = _mean_probe_time(probe) if rank < k else 0.0
            gathered = [0.0] * world
            dist.all_gather_object(gathered, mine)
            means[k] = statistics.median(gathered[:k])
        for k in ratios:
            ratios[k].append(means[k] / means[1])
    return {k: statistics.median(v) for k, v in ratios.items()}


def _mean_probe_time(probe) -> float:
    """Mean seconds per probe over a fixed window: processes that run together for the
    same wall time overlap fully, whatever share of a core each gets."""
    start = time.perf_counter()
    count = 0
    while (elapsed := time.perf_counter() - start) < PROBE_WINDOW_S:
        probe()
        count += 1
    return elapsed / count


def _probe(job: dict):
    """The job's whole model, forward and backward on one micro-batch."""
    from jobctl.engine.data.dataset import make_data
    from jobctl.engine.model.blocks import Stage, model_def

    spec = _spec(job)
    mdef = model_def(spec.model, spec.training.seed)
    stage = Stage(mdef, range(mdef.num_blocks))
    x, y = make_data(spec).batch(0, job["probe_m"])
    batch = stage.batch(x, y, 0)  # a traced model's keyword arguments (None: builtin)

    def run() -> None:
        stage.loss(stage(x, batch), y, batch).backward()

    return run


if __name__ == "__main__":
    main(json.loads(Path(sys.argv[1]).read_text()))
