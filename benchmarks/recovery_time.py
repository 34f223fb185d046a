"""Recovery time: a node lost mid-run to the next training step (Varuna sec. 4.6).

A 2 x 2 job (2 "nodes" of 2 processes on 127.0.0.1, elastic) is started with
``jobctl apply``; after its first checkpoint one node is lost, either SIGKILLed with its
whole process tree (a spot VM gone without notice) or sent SIGTERM (a preemption
notice: the node checkpoints first). The supervisor drops the node, re-plans for the 2
devices left with the same global batch and resumes from the newest checkpoint; the
run's ``recovery_s`` (the lost node's last heartbeat, or its SIGTERM, to the first
step of the next attempt) is what ``jobctl status RUN`` shows. The baseline, in the
same invocation, is a fresh ``jobctl apply`` of the 1 x 2 layout it morphs to: process
start to first step.

    python -m benchmarks.recovery_time [--repeats 2]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import tempfile
import time
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
    run_dir = wait_for(lambda: next(runs.glob("*"), None) if runs.exists() else None)
    return proc, run_dir


def recovery(home: Path, sig: signal.Signals) -> float:
    """Seconds from the lost node's last word to the next training step."""
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
    row = StateDB(home).get_run(run_dir.name)
    if row["phase"] != "completed" or not row["recovery_s"]:
        raise SystemExit(f"run {run_dir.name}: phase {row['phase']}, no recovery recorded")
    return float(row["recovery_s"])


def fresh_start(home: Path) -> float:
    """Seconds from ``jobctl apply`` of the morphed-to layout to its first step."""
    home.mkdir(parents=True)
    t0 = time.time()
    proc, run_dir = _apply(home, _spec(3, P=1, D=2, nodes=1))
    if proc.wait(timeout=600) != 0:
        raise SystemExit("fresh run failed")
    return min(e["ts"] for e in events(run_dir) if e["kind"] == "step") - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    got: dict[str, list[float]] = {"SIGKILL": [], "SIGTERM": [], "fresh": []}
    with tempfile.TemporaryDirectory(prefix="jobctl-recovery-") as tmp:
        for k in range(args.repeats):
            got["SIGKILL"].append(recovery(Path(tmp) / f"kill{k}", signal.SIGKILL))
            got["SIGTERM"].append(recovery(Path(tmp) / f"term{k}", signal.SIGTERM))
            got["fresh"].append(fresh_start(Path(tmp) / f"fresh{k}"))
    med = {k: statistics.median(v) for k, v in got.items()}
    for k, label in (
        ("fresh", "fresh start of the 1x2 layout, to first step"),
        ("SIGKILL", "node SIGKILLed (no notice), recovery"),
        ("SIGTERM", "node SIGTERMed (checkpoints first), recovery"),
    ):
        print(f"{label:<48} {med[k]:6.2f} s  {[round(x, 2) for x in got[k]]}")
    print(
        f"recovery time: SIGKILL {med['SIGKILL']:.2f} s ({med['SIGKILL'] / med['fresh']:.2f}x "
        f"a fresh start), SIGTERM {med['SIGTERM']:.2f} s "
        f"({med['SIGTERM'] / med['fresh']:.2f}x a fresh start)"
    )


if __name__ == "__main__":
    main()
