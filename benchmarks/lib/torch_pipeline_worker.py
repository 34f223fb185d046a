"""One rank of the PyTorch-pipelining baseline (``torch.distributed.pipelining``).

Run as ``python -m benchmarks.lib.torch_pipeline_worker job.json`` with RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT set; ``run_baseline`` starts the ranks. Each rank builds
exactly the blocks jobctl's partition gives its stage (``model.Stage``, same seeds),
feeds the same data (first and last stage fetch a step's samples), and trains with
``ScheduleGPipe`` or ``Schedule1F1B`` and the same optimizer. The rank of the last
stage writes its per-step seconds, measured like jobctl's reporter: the whole
optimizer step.

Zero bubble and interleaving (``MULTI``): ``zb_h1`` is ``ScheduleInterleavedZeroBubble``
with one stage per rank, which is ZB-H1 (jobctl's ``zb_h1`` on the same partition);
``interleaved_1f1b`` and ``interleaved_zb`` host two stages per rank in a loop (rank r:
stages r and r + P), ``zbv`` two in a V (rank r: r and 2P - 1 - r, so rank 0 holds the
first and the last). With two stages per rank ``stages`` lists the 2P stages' blocks.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
    ScheduleZBVZeroBubble,
)

from benchmarks.lib.benchlib import launch_ranks

SCHEDULES = {
    "gpipe": ScheduleGPipe,
    "1f1b": Schedule1F1B,
    "zb_h1": ScheduleInterleavedZeroBubble,
    "interleaved_1f1b": ScheduleInterleaved1F1B,
    "interleaved_zb": ScheduleInterleavedZeroBubble,
    "zbv": ScheduleZBVZeroBubble,
}
# Schedules that take a list of stages, and how they place 2 stages per rank (None: 1).
MULTI = {"zb_h1": None, "interleaved_1f1b": "loop", "interleaved_zb": "loop", "zbv": "v"}


def stage_indices(schedule: str, rank: int, ranks: int) -> list[int]:
    """The stages ``rank`` of ``ranks`` hosts under ``schedule``."""
    style = MULTI.get(schedule)
    if style is None:
        return [rank]
    return [rank, rank + ranks] if style == "loop" else [rank, 2 * ranks - 1 - rank]


def ranks_for(schedule: str, stages: int) -> int:
    """Processes a schedule needs for ``stages`` stages."""
    return stages // 2 if MULTI.get(schedule) else stages


def run_baseline(
    spec_yaml: str,
    stages: list[list[int]],
    schedule: str,
    micro_batches: int,
    steps: int,
    workdir: Path,
) -> list[float]:
    """Start one process per stage on 127.0.0.1; returns the last rank's step seconds."""
    job = {"spec": str(workdir / "spec.yaml"), "stages": stages, "schedule": schedule}
    job |= {"micro_batches": micro_batches, "steps": steps}
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "spec.yaml").write_text(spec_yaml)
    world = ranks_for(schedule, len(stages))
    args = ["-m", "benchmarks.lib.torch_pipeline_worker"]
    return launch_ranks(args, job, world, workdir, "torch pipelining baseline")


def main(job: dict) -> None:
    from jobctl.engine.data.dataset import make_data
    from jobctl.engine.model.blocks import Stage, lm_loss, model_def
    from jobctl.engine.runtime.optim import build_optimizer
    from jobctl.spec import load_spec

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)  # as jobctl's workers (JOBCTL_THREADS=1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=300))
    spec = load_spec(job["spec"])
    mdef = model_def(spec.model, spec.training.seed)
    name, n = job["schedule"], len(job["stages"])
    mine = stage_indices(name, rank, world)
    modules = [Stage(mdef, job["stages"][i]) for i in mine]
    cpu = torch.device("cpu")
    stages = [PipelineStage(m, i, n, cpu) for m, i in zip(modules, mine, strict=True)]
    built = stages if name in MULTI else stages[0]
    schedule = SCHEDULES[name](built, job["micro_batches"], loss_fn=lm_loss)
    opt = build_optimizer([p for m in modules for p in m.parameters()], spec.training)
    data, B = make_data(spec), spec.training.global_batch_size
    first, last = 0 in mine, n - 1 in mine
    times = []
    for step in range(job["steps"]):
        torch.manual_seed(step)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        x, y = data.batch(step * B, B) if first or last else (None, None)
        schedule.step(*([x] if first else []), **({"target": y, "losses": []} if last else {}))
        opt.step()
        times.append(time.perf_counter() - t0)
    if last:
        Path(job["out"]).write_text(json.dumps(times))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(json.loads(Path(sys.argv[1]).read_text()))
