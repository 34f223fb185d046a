"""Start-up time of the ``jobctl`` commands that neither train nor calibrate.

Each command runs as a fresh process (``python -m jobctl.engine.cli.app ...``, what
the ``jobctl`` script runs) ``--rounds`` times, the commands interleaved round by
round so a busy machine slows them alike; prints the median wall time of each against
the 0.5 s target (issue 24, item 9) and the CPU time (user + system) of the median
run, which a loaded machine inflates less than wall time. The state home is a
temporary folder with one run and a few events, so ``status``, ``logs`` and
``events`` read a real state DB.

    python benchmarks/cli_startup.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_S = 0.5
ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "jobs" / "quickstart.yaml"


def commands(run_id: str) -> dict[str, list[str]]:
    """The commands timed, by label."""
    return {
        "--help": ["--help"],
        "--version": ["--version"],
        "validate": ["validate", str(SPEC)],
        "schema": ["schema"],
        "status": ["status"],
        "status RUN": ["status", run_id],
        "logs RUN": ["logs", run_id],
        "events RUN": ["events", run_id],
    }


def seed(home: Path) -> str:
    """A state DB in ``home`` with one run (spec, a log, events); the run's id."""
    from jobctl.engine.state.db import StateDB

    db = StateDB(home)
    run_id = "quickstart-bench-1"
    run_dir = home / "runs" / run_id
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "spec.yaml").write_text(SPEC.read_text())
    (run_dir / "logs" / "rank-0.log").write_text("step 1 loss 10.1\n")
    db.create_run(run_id, "quickstart", run_dir, total_steps=40)
    db.set_phase(run_id, "launching")
    db.set_phase(run_id, "training")
    for step in range(1, 6):
        db.update_run(run_id, step=step, loss=10.0 - step)
    return run_id


def time_once(args: list[str], env: dict) -> tuple[float, float]:
    """Wall and CPU seconds of one fresh ``jobctl ARGS`` process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "jobctl.engine.cli.app", *args], env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"jobctl {' '.join(args)} exited {done.returncode}: {done.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        env = {**os.environ, "JOBCTL_HOME": str(home), "COLUMNS": "80"}
        env.pop("JOBCTL_DB_URL", None)
        cmds = commands(seed(home))
        times: dict[str, list[tuple[float, float]]] = {k: [] for k in cmds}
        for _ in range(a.rounds):
            for label, args in cmds.items():
                times[label].append(time_once(args, env))
    print(f"{'command':<12} {'wall median s':>13} {'cpu s':>7} {'target s':>9}  ok")
    worst = 0.0
    for label, runs in times.items():
        runs.sort()
        wall, cpu = runs[len(runs) // 2]
        worst = max(worst, wall)
        ok = "yes" if wall < TARGET_S else "NO"
        print(f"{label:<12} {wall:>13.3f} {cpu:>7.3f} {TARGET_S:>9.1f}  {ok}")
    print(f"slowest median {worst:.3f} s; mean of medians "
          f"{statistics.mean(r[len(r) // 2][0] for r in times.values()):.3f} s")  # fmt: skip


if __name__ == "__main__":
    main()
