"""Launch time: ``jobctl apply jobs/quickstart.yaml`` from "launching" to its first step,
with workers started the torchrun way (``JOBCTL_WARM_START=0``: a fresh interpreter per
rank) and warm (the default on CPU: forked from the node's agent, which imported the
worker's modules once; engine/worker/agent.py).

Each round runs the quickstart exactly as the README does (its own spec, plan, micro-batch
size and placement; a fresh temporary state home), once cold and once warm, the order
alternating round by round so a machine that slows down mid-round slows both alike.
Per run: the phase ``launching`` (the plan is made) to the first step record, the
slowest worker's process start to model built (``engine/worker/timeline.py`` marks),
the whole command's wall time and the CPU seconds (user + system) of every process it
waited for. Printed: the median of each, its spread (max - min over the median: the
noise of this machine), and warm / cold ratios; the final losses of both ways must be
equal (the same seeds, data order and plan), or it exits 1.

    python -m benchmarks run launch_time [--rounds 5] [--steps N]

``--steps N`` trains N steps instead of the quickstart's 60 (a copy of its spec, no
other change): launching to the first step is the same, the wall and CPU figures
shorter.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from jobctl.engine.state.db import StateDB
from jobctl.engine.worker.timeline import read_marks
from tests.jobrun import events

QUESTION = (
    "How long does jobctl apply take from launching to the first step, workers forked "
    "warm against started cold?"
)
BASELINE = (
    "The same quickstart with JOBCTL_WARM_START=0 (a fresh interpreter per rank), alternating."
)

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "jobs" / "quickstart.yaml"
MODES = {"cold": "0", "warm": "1"}
FIGURES = ("launch", "workers", "wall", "cpu")
LABELS = {
    "launch": "launching -> first step (s)",
    "workers": "worker process -> built (s)",
    "wall": "jobctl apply, wall (s)",
    "cpu": "jobctl apply, CPU (s)",
}


def quickstart(work: Path, steps: int | None) -> Path:
    """The quickstart's spec, or a copy of it that trains ``steps`` steps."""
    if steps is None:
        return QUICKSTART
    text, n = re.subn(r"(?m)^  steps: \d+", f"  steps: {steps}", QUICKSTART.read_text())
    if n != 1:
        raise SystemExit("jobs/quickstart.yaml changed: no 'training.steps' line")
    (work / "quickstart.yaml").write_text(text)
    return work / "quickstart.yaml"


def one_run(mode: str, home: Path, spec: Path) -> dict[str, float]:
    """The quickstart (``spec``) applied once in ``home``; its figures and final loss."""
    env = {**os.environ, "JOBCTL_HOME": str(home), "JOBCTL_WARM_START": MODES[mode]}
    cmd = [sys.executable, "-m", "jobctl.engine.cli.app", "apply", str(spec)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{mode} run failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    run_dir = next((home / "runs").iterdir())
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall": wall, "cpu": cpu, **_launch(home, run_dir)}


def _launch(home: Path, run_dir: Path) -> dict[str, float]:
    """Launching to the first step, the slowest worker's start, and the final loss."""
    db = StateDB(home)
    run_id = db.get_run(run_dir.name)["id"]
    launching = min(
        e["ts"]
        for e in db.events(run_id)
        if e["kind"] == "phase" and (e["message"] or "").startswith("launching")
    )
    steps = [e for e in events(run_dir) if e["kind"] == "step"]
    marks = [read_marks(f.read_text()) for f in sorted((run_dir / "logs").glob("rank-*.log"))]
    workers = max(m["built"] - m["process"] for m in marks)
    first = min(e["ts"] for e in steps)
    return {"launch": first - launching, "workers": workers, "loss": steps[-1]["loss"]}


def _spread(values: list[float]) -> float:
    med = statistics.median(values)
    return (max(values) - min(values)) / med if med else 0.0


def report(got: dict[str, list[dict]]) -> int:
    """The table; 1 where the two ways' final losses differ."""
    print(f"{'':30} {'cold':>8} {'warm':>8} {'warm/cold':>10} {'spread':>7}")
    for fig in FIGURES:
        cold = statistics.median(r[fig] for r in got["cold"])
        warm = statistics.median(r[fig] for r in got["warm"])
        spread = max(_spread([r[fig] for r in got[m]]) for m in MODES)
        print(f"{LABELS[fig]:30} {cold:8.2f} {warm:8.2f} {warm / cold:9.2f}x {spread:6.0%}")
    losses = {m: {r["loss"] for r in got[m]} for m in MODES}
    print(f"final loss: cold {sorted(losses['cold'])}, warm {sorted(losses['warm'])}")
    if losses["cold"] != losses["warm"] or len(losses["cold"]) != 1:
        print("FAIL: the final losses differ")
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=None, help="train N steps, not 60")
    args = parser.parse_args(argv)
    got: dict[str, list[dict]] = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory(prefix="launch-time-") as tmp:
        spec = quickstart(Path(tmp), args.steps)
        for r in range(args.rounds):
            order = list(MODES) if r % 2 == 0 else list(reversed(MODES))
            for mode in order:
                home = Path(tmp) / f"{mode}-{r}"
                got[mode].append(one_run(mode, home, spec))
                print(f"round {r + 1} {mode}: {got[mode][-1]['launch']:.2f} s", flush=True)
    return report(got)


if __name__ == "__main__":
    raise SystemExit(main())
