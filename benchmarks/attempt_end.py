"""Attempt end: seconds from a run's final checkpoint to the run completed.

After the last step every worker, its torchrun agent and the run host exit, and the
supervisor concludes once all are gone; every attempt (a run, a morph, a resume) pays
this. Runs the 4-step quickstart (2 nodes x 2 processes) ``--repeats`` times and prints,
per run, launch to first step and final checkpoint to completed (the state DB's event
times), then the medians. With ``--against DIR`` (a checkout of another revision, e.g.
``git worktree add /tmp/base HEAD~1``) each repeat also runs that tree's code, in turn
with this one, and the ratio is printed last.

    python benchmarks/attempt_end.py [--repeats 4] [--against DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHILD = """
import sys, tempfile
from pathlib import Path
sys.path.insert(0, ".")
from jobctl.engine.state.db import StateDB
from tests.jobrun import events, run_job, tiny_spec

home = Path(tempfile.mkdtemp(prefix="attempt-end-"))
run, outcome = run_job(tiny_spec(**{"training.steps": 4}), home)
evs = StateDB(home).events(run.id)
step1 = min(e["ts"] for e in events(run.dir) if e["kind"] == "step")
ckpt = max(e["ts"] for e in evs if e["kind"] == "checkpoint")
done = max(e["ts"] for e in evs if e["kind"] == "phase" and e["message"].startswith("completed"))
launch = min(e["ts"] for e in evs if e["kind"] == "phase" and e["message"].startswith("launch"))
print("RESULT", outcome.ok, step1 - launch, done - ckpt, done - launch)
"""


def _tree_env(tree: Path, work: Path) -> dict[str, str]:
    """The environment that imports ``jobctl`` from ``tree`` (a folder laid out as this
    repository: engine/, backends/, spec/, templates/) instead of the installed one."""
    if tree == ROOT:
        return dict(os.environ)
    pkg = work / "jobctl"
    pkg.mkdir(parents=True, exist_ok=True)
    for sub in ("engine", "backends", "spec", "templates"):
        link = pkg / sub
        if not link.exists():
            link.symlink_to(tree / sub)
    return {**os.environ, "PYTHONPATH": str(work)}


def _once(tree: Path, env: dict[str, str]) -> tuple[float, float, float]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT")), None)
    if line is None or line.split()[1] != "True":
        raise SystemExit(f"{tree}: the run failed\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    _, _, startup, end, total = line.split()
    return float(startup), float(end), float(total)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--against", type=Path, default=None, help="another checkout to compare")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="attempt-end-trees-"))
    trees = {"this": ROOT} if args.against is None else {"this": ROOT, "other": args.against}
    envs = {name: _tree_env(tree.resolve(), work / name) for name, tree in trees.items()}
    got: dict[str, list[tuple[float, float, float]]] = {name: [] for name in trees}
    print(f"{'tree':<6} {'launch->step 1 s':>17} {'ckpt->completed s':>18} {'run s':>7}")
    for k in range(args.repeats):
        order = list(trees) if k % 2 == 0 else list(reversed(trees))  # interleaved
        for name in order:
            startup, end, total = _once(trees[name].resolve(), envs[name])
            got[name].append((startup, end, total))
            print(f"{name:<6} {startup:>17.2f} {end:>18.2f} {total:>7.2f}", flush=True)
    med = {n: [statistics.median(x[i] for x in got[n]) for i in range(3)] for n in got}
    for name, (startup, end, total) in med.items():
        print(
            f"median {name}: launch->step 1 {startup:.2f} s, ckpt->completed {end:.2f} s, "
            f"run {total:.2f} s"
        )
    if "other" in med:
        print(
            f"ckpt->completed this/other: {med['this'][1] / med['other'][1]:.2f}; "
            f"run this/other: {med['this'][2] / med['other'][2]:.2f}"
        )


if __name__ == "__main__":
    main()
