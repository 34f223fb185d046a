"""Recovery time: a node lost mid-run to the next training step (Varuna sec. 4.6).

A 2 x 2 job (2 "nodes" of 2 processes on 127.0.0.1, elastic) is started with
``jobctl apply``; after its first checkpoint one node is lost, either SIGKILLed with its
whole process tree (a spot VM gone without notice) or sent SIGTERM (a preemption
notice: the node checkpoints first). The supervisor drops the node, re-plans for the 2
devices left with the same global batch and resumes from the newest checkpoint; the
run's ``recovery_s`` (the lost node's last heartbeat, or its SIGTERM, to the first
step of the next attempt) is what ``jobctl status RUN`` shows. Like is
compared with like: the relaunch part of a recovery (the supervisor's ``plan`` event of
the new attempt to its first step) against a fresh ``jobctl apply`` of the 1 x 2 layout
it morphs to, in the same invocation, from its ``plan`` event to its first step (the
CLI's imports and start-up before it are left out of both). Steps lost: the
``steps_lost`` of the run's ``recovery`` event, or where it has none, the newest step
trained before the loss minus the step the next attempt resumed from (``resume``).

    python -m benchmarks.recovery_time [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import tempfile
from pathlib import Path

from jobctl.engine.core.process import kill_tree
from jobctl.engine.state.db import StateDB
from tests.jobrun import events, start_apply, tiny_spec, wait_for, write_spec


def _spec(steps: int, P: int = 2, D: int = 2, nodes: int = 2):
    return tiny_spec(
        **{
            "training.steps": steps,
            "checkpoint.interval": 5,
            "elasticity.enabled": True,
            "hardware.nodes": nodes,
            "hardware.processes_per_node": P * D // nodes,
            "parallelism.pipeline_stages": P,
            "parallelism.data_parallel": D,
            # each node a whole pipeline: a lost node leaves every stage a live replica,
            # whose survivors hand their step over (#25; stage-major would lose a stage)
            "parallelism.placement": "pipeline_major",
        }
    )


def _apply(home: Path, spec) -> tuple[subprocess.Popen, Path]:
    proc = start_apply(write_spec(spec, home / "job.yaml"), home)
    runs = home / "runs"
    found = lambda: next(runs.glob("*"), None) if runs.exists() else None  # noqa: E731
    run_dir = wait_for(found, timeout=600, what="the run folder")  # a loaded machine
    return proc, run_dir


def _plan_to_first_step(db: StateDB, run_id: str, first: float) -> float:
    """Seconds from the newest ``plan`` event before the step at time ``first`` to it."""
    plans = [e["ts"] for e in db.events(run_id) if e["kind"] == "plan" and e["ts"] < first]
    return first - max(plans)


def recovery(home: Path, sig: signal.Signals) -> tuple[float, float, int]:
    """Seconds from the lost node's last word to the next training step, the relaunch
    part of them (re-plan to that step), and the steps trained again."""
    home.mkdir(parents=True)
    proc, run_dir = _apply(home, _spec(40))
    wait_for(lambda: any(e["kind"] == "checkpoint" for e in events(run_dir)), what="checkpoint")
    pids = [int(p) for p in StateDB(home).get_run(run_dir.name)["pids"].split(",")]
    if sig == signal.SIGKILL:
        kill_tree(pids[1], signal.SIGKILL)
    else:
        os.kill(pids[1], signal.SIGTERM)
    if proc.wait(timeout=600) != 0:
        raise SystemExit(f"run {run_dir.name} failed (exit {proc.returncode})")
    db = StateDB(home)
    row = db.get_run(run_dir.name)
    if row["phase"] != "completed" or not row["recovery_s"]:
        raise SystemExit(f"run {run_dir.name}: phase {row['phase']}, no recovery recorded")
    rec = _data(db, row["id"], "recovery")
    steps = [e for e in events(run_dir) if e["kind"] == "step"]
    relaunch = _plan_to_first_step(db, row["id"], rec["first_step_at"])  # the next attempt's
    lost = rec.get("steps_lost")  # the supervisor's own count, where it records one
    resumed = _data(db, row["id"], "resume").get("step")
    if lost is None and resumed is not None:  # the newest step trained before, minus it
        trained = [e["step"] for e in steps if e["ts"] < rec["first_step_at"]]
        lost = max(0, max(trained, default=0) - resumed)
    return float(row["recovery_s"]), relaunch, lost


def _data(db: StateDB, run_id: str, kind: str) -> dict:
    """The data of the run's newest event of ``kind`` ({} if it has none)."""
    found = [e for e in db.events(run_id) if e["kind"] == kind and e["data"]]
    return json.loads(found[-1]["data"]) if found else {}


def fresh_start(home: Path) -> float:
    """Seconds from the ``plan`` event of a fresh ``jobctl apply`` of the morphed-to
    layout to its first step."""
    home.mkdir(parents=True)
    proc, run_dir = _apply(home, _spec(3, P=1, D=2, nodes=1))
    if proc.wait(timeout=600) != 0:
        raise SystemExit("fresh run failed")
    db = StateDB(home)
    run_id = db.get_run(run_dir.name)["id"]
    first = min(e["ts"] for e in events(run_dir) if e["kind"] == "step")
    return _plan_to_first_step(db, run_id, first)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    got: dict[str, list] = {"SIGKILL": [], "SIGTERM": [], "fresh": []}
    with tempfile.TemporaryDirectory(prefix="jobctl-recovery-") as tmp:
        for k in range(args.repeats):
            got["SIGKILL"].append(recovery(Path(tmp) / f"kill{k}", signal.SIGKILL))
            got["SIGTERM"].append(recovery(Path(tmp) / f"term{k}", signal.SIGTERM))
            got["fresh"].append(fresh_start(Path(tmp) / f"fresh{k}"))
    fresh = statistics.median(got["fresh"])
    print(f"fresh start of the 1x2 layout, plan event to first step: {fresh:6.2f} s  "
          f"{[round(x, 2) for x in got['fresh']]}")  # fmt: skip
    print(f"{'lost node':<10} {'recovery':>9} {'relaunch':>9} {'steps lost':>11}")
    relaunch = {}
    for sig in ("SIGKILL", "SIGTERM"):
        total, relaunch[sig] = (statistics.median(x[i] for x in got[sig]) for i in (0, 1))
        lost = [x[2] for x in got[sig]]
        print(f"{sig:<10} {total:>8.2f}s {relaunch[sig]:>8.2f}s {str(lost):>11}")
    print("recovery: lost node's last word to first step; relaunch: re-plan to first step")
    print(
        f"relaunch / fresh start (plan event to first step): "
        f"SIGKILL {relaunch['SIGKILL'] / fresh:.2f}x, SIGTERM {relaunch['SIGTERM'] / fresh:.2f}x"
    )


if __name__ == "__main__":
    main()
