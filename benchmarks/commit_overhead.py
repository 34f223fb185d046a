"""Cost of the step commit (#25): the same job trained by this checkout and by another.

Every step now ends with the commit, one all-reduce of the loss over every live rank
before any rank updates (engine/runtime/failure.py), in place of the last stage's loss
all-reduce over its replicas. This runs the 2 x 2 quickstart job (pipeline-major, as
the handover needs) with ``jobctl apply`` from this checkout and from ``--base`` (a
checkout of the commit before, e.g. ``git worktree add /tmp/base 61f5ec6^``), taking
turns, and prints each one's median step period (``step_time_s`` of the step records,
the first steps left out) and the ratio.

    python -m benchmarks.commit_overhead --base /tmp/base [--rounds 2 --steps 60]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.jobrun import events, tiny_spec, write_spec

WARMUP = 5  # steps whose period includes start-up work


def _spec(steps: int):
    return tiny_spec(
        **{
            "training.steps": steps,
            "checkpoint.interval": steps,
            "parallelism.placement": "pipeline_major",
            "elasticity.enabled": True,  # the jobs that commit (D > 1 too)
        }
    )


def median_period(home: Path, steps: int, pythonpath: str | None) -> float:
    """Median step period of one run of the job with ``jobctl`` from ``pythonpath``
    (None: this checkout)."""
    home.mkdir(parents=True)
    env = {**os.environ, "JOBCTL_HOME": str(home)}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    spec_file = write_spec(_spec(steps), home / "job.yaml")
    cmd = [sys.executable, "-m", "jobctl.engine.cli.app", "apply", str(spec_file)]
    subprocess.run(cmd, env=env, cwd=home, check=True, capture_output=True, timeout=900)
    run_dir = next((home / "runs").glob("*"))
    periods = [e["step_time_s"] for e in events(run_dir) if e["kind"] == "step"]
    return statistics.median(periods[WARMUP:])


def _shim(base: Path, tmp: Path) -> str:
    """A folder whose ``jobctl`` is the base checkout (ahead of the editable install)."""
    (tmp / "shim").mkdir()
    (tmp / "shim" / "jobctl").symlink_to(base.resolve())
    return str(tmp / "shim")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", type=Path, required=True, help="checkout to compare with")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=60)
    args = ap.parse_args()
    got: dict[str, list[float]] = {"base": [], "this": []}
    with tempfile.TemporaryDirectory(prefix="jobctl-commit-") as tmp:
        shim = _shim(args.base, Path(tmp))
        for k in range(args.rounds):  # taking turns: the machine's load hits both
            got["base"].append(median_period(Path(tmp) / f"base{k}", args.steps, shim))
            got["this"].append(median_period(Path(tmp) / f"this{k}", args.steps, None))
    for name, xs in got.items():
        print(
            f"{name:<5} median step period {1e3 * statistics.median(xs):7.2f} ms  "
            f"{[round(1e3 * x, 2) for x in xs]}"
        )
    ratio = statistics.median(got["this"]) / statistics.median(got["base"])
    print(f"this / base: {ratio:.3f}")


if __name__ == "__main__":
    main()
