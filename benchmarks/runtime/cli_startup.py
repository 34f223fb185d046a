"""Start-up time of the ``jobctl`` commands that neither train nor calibrate.

Each command runs as a fresh process (``python -m jobctl.engine.cli.app ...``, what
the ``jobctl`` script runs) ``--rounds`` times, the commands interleaved round by
round so a busy machine slows them alike; prints the median wall time of each against
the 0.5 s target (issue 24, item 9) and the CPU time (user + system) of the median
run, which a loaded machine inflates less than wall time. The state home is a
temporary folder with one run and a few events, so ``status``, ``logs`` and
``events`` read a real state DB.

With ``--baseline DIR`` (a folder holding another checkout as ``DIR/jobctl``, e.g.
``git archive REV | tar -x -C DIR/src; ln -s DIR/src DIR/jobctl``), each command is
also run from there (``PYTHONPATH=DIR``), interleaved with this checkout's run, and
the table adds the baseline's median (wall, CPU) and the wall ratio new / baseline.

    python -m benchmarks run cli_startup [--rounds 5] [--baseline DIR]
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

QUESTION = "Do the jobctl commands that neither train nor calibrate start within 0.5 s?"
BASELINE = "The 0.5 s target; with --baseline DIR, another checkout interleaved."

TARGET_S = 0.5
ROOT = Path(__file__).resolve().parents[2]
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
    done = subprocess.run(
        [sys.executable, "-m", "jobctl.engine.cli.app", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"jobctl {' '.join(args)} exited {done.returncode}: {done.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def measure(rounds: int, baseline: str | None) -> dict[str, dict[str, list]]:
    """Wall and CPU times by command, for this checkout (``new``) and the baseline."""
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        env = {**os.environ, "JOBCTL_HOME": str(home), "COLUMNS": "80"}
        env.pop("JOBCTL_DB_URL", None)
        envs = {"new": env}
        if baseline:
            envs["base"] = {**env, "PYTHONPATH": baseline}
        cmds = commands(seed(home))
        times = {k: {which: [] for which in envs} for k in cmds}
        for _ in range(rounds):
            for label, args in cmds.items():
                for which, e in envs.items():
                    times[label][which].append(time_once(args, e))
    return times


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--baseline", help="folder holding another checkout as jobctl/")
    a = ap.parse_args(argv)
    times = measure(a.rounds, a.baseline)
    extra = f" {'base s':>7} {'cpu':>6} {'ratio':>6}" if a.baseline else ""
    print(f"{'command':<12} {'wall median s':>13} {'cpu s':>7} {'target s':>9}  ok{extra}")
    medians = []
    for label, by in times.items():
        wall, cpu = sorted(by["new"])[len(by["new"]) // 2]  # the median run (odd rounds)
        medians.append(wall)
        line = f"{label:<12} {wall:>13.3f} {cpu:>7.3f} {TARGET_S:>9.1f}  "
        line += "yes" if wall < TARGET_S else "NO "
        if a.baseline:
            base, base_cpu = sorted(by["base"])[len(by["base"]) // 2]
            line += f" {base:>7.3f} {base_cpu:>6.3f} {wall / base:>6.2f}"
        print(line)
    print(
        f"slowest median {max(medians):.3f} s; mean of medians "
        f"{statistics.mean(medians):.3f} s (target {TARGET_S} s)"
    )


if __name__ == "__main__":
    main()
