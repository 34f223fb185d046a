"""Start-up time: from launching a run to its first step, measured on this machine.

A step time alone under-predicts a short run: launching the torchrun agents, the
rendezvous, importing torch in every worker, building the stages and the first
step's warm-up all come first (a fleet predicted at 4 s took 191 s). The supervisor
records, for each attempt it launches, the seconds from the launch to the end of the
first step less one predicted step (``record_startup``); the planner adds the median
of this machine's last ``KEEP`` measurements to a plan's end-to-end prediction
(``startup_for``). Until a run has been measured here there is no figure, and plans
say so. Kept per machine (``cache.device_name`` of the device kind) under the state
home's calibration folder. Recoveries (losing nodes to training again, recorded by
the supervisor after each) are kept the same way (``kind="recovery"``): the cost
forecast prices a preemption with them (``planner.cost``); so are the checkpoint
snapshot rates, GB/s of host copy per attempt (``kind="snapshot"``), which price the
time each checkpoint blocks training, and, where a run checkpointed often enough to
tell, the whole cost of a checkpoint in training time per byte (``kind="checkpoint"``,
``checkpoint_added_s``): the background write, publish and upload share the machine
with training, so a checkpoint costs more steps than its blocking copy (#55).
"""

from __future__ import annotations

import hashlib
import json
import statistics
import time
from pathlib import Path

from jobctl.engine.core.home import default_home
from jobctl.spec.files import read_regular_text

KEEP = 5  # measurements kept per machine


def _path(home: Path | None, machine: str, kind: str = "startup") -> Path:
    key = hashlib.sha256(machine.encode()).hexdigest()[:16]
    return Path(home or default_home()) / "calibration" / f"{kind}-{key}.json"


def record_startup(home: Path | None, machine: str, seconds: float, kind: str = "startup") -> None:
    """Add one launch-to-first-step measurement (seconds) for ``machine`` (``kind``
    ``recovery``: a recovery's, from losing nodes to training again)."""
    path = _path(home, machine, kind)
    samples = _read(path)[-(KEEP - 1) :] + [max(0.0, seconds)]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"machine": machine, "updated": time.time(), "samples": samples}))
    tmp.replace(path)


def startup_for(home: Path | None, machine: str, kind: str = "startup") -> float | None:
    """The median measured start-up (or ``kind`` ``recovery``) of ``machine``, or None
    if none was measured."""
    samples = _read(_path(home, machine, kind))
    return statistics.median(samples) if samples else None


def _read(path: Path) -> list[float]:
    try:
        raw = json.loads(read_regular_text(path))  # never a FIFO's blocking read
        return [float(x) for x in raw["samples"]]
    except (OSError, ValueError, KeyError, TypeError):
        return []


def checkpoint_added_s(step_s: dict[int, float], every: int, min_periods: int = 3) -> float | None:
    """Training seconds one checkpoint added in a run that checkpointed every ``every``
    steps, from its own step times (``step_s``: step -> seconds), free of the drift
    between runs: the mean time of the p-th step after a checkpoint (p = 1 .. every)
    against the quiet half of the period (p > every / 2, when a checkpoint's background
    work is done); None when the run is too short or too sparse to tell."""
    if every < 4:
        return None
    by_position: dict[int, list[float]] = {p: [] for p in range(1, every + 1)}
    for step, seconds in step_s.items():
        by_position[(step - 1) % every + 1].append(seconds)
    if min(len(v) for v in by_position.values()) < min_periods:
        return None
    means = {p: statistics.mean(v) for p, v in by_position.items()}
    quiet = statistics.mean(means[p] for p in means if p > every // 2)
    return max(0.0, sum(means.values()) - every * quiet)
