"""Shared pieces of the planner benchmarks: specs, a real run of a plan, machine load.

``measure(spec, plan, home)`` runs exactly ``plan`` (not a re-plan) through the local
backend and returns the median step time over the steps after warm-up, as the
runtime's own reporter measured them (``step_time_s`` in metrics.jsonl), and how much
CPU other processes took meanwhile (``Interference``): the machine is shared, and a
run that others slowed down says little about the model.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from jobctl.engine.core.plan import Plan
from jobctl.engine.state.db import StateDB
from jobctl.engine.supervise.service import ApplyOptions, launch
from jobctl.spec import load_spec

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "jobs" / "quickstart.yaml"
WARMUP_STEPS = 5
QUIET_PATIENCE_S = 180.0  # how long ``wait_quiet`` waits by default (benchmarks' --patience)


def job_spec(**overrides):
    """The quickstart spec with dotted overrides; checkpoints only at the end."""
    base = {"checkpoint.interval": 100000}
    return load_spec(QUICKSTART, overrides={**base, **overrides})


def layout(P: int, D: int, m: int, schedule: str, **extra) -> dict:
    """Dotted overrides that pin a layout."""
    return {
        "parallelism.pipeline_stages": P,
        "parallelism.data_parallel": D,
        "training.micro_batch_size": m,
        "parallelism.schedule": schedule,
        **extra,
    }


def step_times(run_dir: Path) -> list[float]:
    """Per-step seconds the reporting rank measured, in step order."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    recs = [json.loads(x) for x in lines if x.strip()]
    return [r["step_time_s"] for r in recs if r["kind"] == "step"]


@dataclass(frozen=True)
class Measurement:
    """One real run: its median step time and how much other work shared the CPU."""

    step_s: float
    interference: float  # other processes' CPU time / (wall x cores) during the run


def measure(spec, plan: Plan, home: Path, deadline_s: float = 300.0) -> Measurement:
    """Median step seconds of a real run of ``plan`` after ``WARMUP_STEPS`` steps."""
    db = StateDB(home)
    opts = ApplyOptions(deadline_s=deadline_s, show_progress=False)
    with Interference() as other:
        run, outcome = launch(spec, plan, db, None, opts, Console(quiet=True))
    if not outcome.ok:
        raise RuntimeError(f"run {plan.summary()} failed: {outcome.message}")
    times = step_times(run.dir)[WARMUP_STEPS:]
    return Measurement(statistics.median(times), other.fraction)


def measure_best(spec, plan: Plan, home: Path, attempts: int = 3, clean: float = 0.05):
    """Up to ``attempts`` runs, each after the CPU went quiet, until one ran with less
    than ``clean`` interference; returns the least disturbed run."""
    best = None
    for _ in range(attempts):
        wait_quiet()
        m = measure(spec, plan, home)
        if best is None or m.interference < best.interference:
            best = m
        if best.interference < clean:
            break
    return best


def _cpu_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine since boot."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


def _own_cpu_s() -> float:
    """CPU seconds of this process and of its finished children (the run's processes)."""
    me, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


class Interference:
    """Measures, around a block, the CPU time other processes on the machine used."""

    def __enter__(self) -> Interference:
        self.busy0, self.total0 = _cpu_jiffies()
        self.own0 = _own_cpu_s()
        return self

    def __exit__(self, *exc) -> None:
        busy1, total1 = _cpu_jiffies()
        tick = os.sysconf("SC_CLK_TCK")
        busy = (busy1 - self.busy0) / tick
        capacity = (total1 - self.total0) / tick  # wall seconds x cores
        own = _own_cpu_s() - self.own0
        self.fraction = max(0.0, busy - own) / max(capacity, 1e-9)


def cpu_busy(seconds: float = 1.0) -> float:
    """Fraction of this machine's CPU time that was busy over ``seconds`` (all processes)."""
    busy0, total0 = _cpu_jiffies()
    time.sleep(seconds)
    busy1, total1 = _cpu_jiffies()
    return (busy1 - busy0) / max(1, total1 - total0)


def wait_quiet(limit: float = 0.05, quiet_s: int = 3, patience_s: float | None = None) -> float:
    """Wait (up to ``patience_s``, default ``QUIET_PATIENCE_S``) until other processes
    left the CPU idle for ``quiet_s`` seconds in a row; returns the busy fraction seen last.

    The machine is shared; a benchmark that starts while something else computes
    measures that instead.
    """
    deadline = time.monotonic() + (QUIET_PATIENCE_S if patience_s is None else patience_s)
    calm = 0
    busy = 1.0
    while calm < quiet_s and time.monotonic() < deadline:
        busy = cpu_busy()
        calm = calm + 1 if busy < limit else 0
    return busy
