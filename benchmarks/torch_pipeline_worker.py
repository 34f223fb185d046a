"""One rank of the PyTorch-pipelining baseline (``torch.distributed.pipelining``).

Run as ``python -m benchmarks.torch_pipeline_worker job.json`` with RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT set; ``run_baseline`` starts the ranks. Each rank builds
exactly the blocks jobctl's partition gives its stage (``model.Stage``, same seeds),
feeds the same data (first and last stage fetch a step's samples), and trains with
``ScheduleGPipe`` or ``Schedule1F1B`` and the same optimizer. The last rank writes its
per-step seconds, measured like jobctl's reporter: the whole optimizer step.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


def run_baseline(
    spec_yaml: str,
    stages: list[list[int]],
    schedule: str,
    micro_batches: int,
    steps: int,
    workdir: Path,
) -> list[float]:
    """Start one process per stage on 127.0.0.1; returns the last rank's step seconds."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "spec.yaml").write_text(spec_yaml)
    job = {
        "spec": str(workdir / "spec.yaml"),
        "stages": stages,
        "schedule": schedule,
        "micro_batches": micro_batches,
        "steps": steps,
        "out": str(workdir / "times.json"),
    }
    (workdir / "job.json").write_text(json.dumps(job))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(len(stages)):
        env = {
            **os.environ,
            "RANK": str(rank),
            "WORLD_SIZE": str(len(stages)),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
        }
        cmd = [sys.executable, "-m", "benchmarks.torch_pipeline_worker", str(workdir / "job.json")]
        procs.append(subprocess.Popen(cmd, env=env))
    codes = [p.wait(timeout=600) for p in procs]
    if any(codes):
        raise RuntimeError(f"torch pipelining baseline failed: exit codes {codes}")
    return json.loads((workdir / "times.json").read_text())


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
    module = Stage(mdef, job["stages"][rank])
    stage = PipelineStage(module, rank, world, torch.device("cpu"))
    schedule = SCHEDULES[job["schedule"]](stage, job["micro_batches"], loss_fn=lm_loss)
    opt = build_optimizer(list(module.parameters()), spec.training)
    data, B = make_data(spec), spec.training.global_batch_size
    first, last = rank == 0, rank == world - 1
    times = []
    for step in range(job["steps"]):
        torch.manual_seed(step)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        x, y = data.batch(step * B, B) if first or last else (None, None)
        if first:
            schedule.step(x)
        elif last:
            schedule.step(target=y, losses=[])
        else:
            schedule.step()
        opt.step()
        times.append(time.perf_counter() - t0)
    if last:
        Path(job["out"]).write_text(json.dumps(times))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(json.loads(Path(sys.argv[1]).read_text()))
