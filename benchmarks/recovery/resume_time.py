"""Resume time: process start to first training step, a 4-stage checkpoint into 2 stages.

Trains 2 steps as P=4 x D=1 and checkpoints; then (timed) starts a new run as
P=2 x D=2 that loads that checkpoint and trains on. The baseline, in the same
invocation, is a fresh start of the same 2x2 run with nothing to load. Prints both and,
last, the resume time and its ratio to the fresh start.

    python -m benchmarks run resume_time [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.lib.benchlib import events  # noqa: E402
from tests.jobrun import run_job, tiny_spec  # noqa: E402

QUESTION = "How long does resuming a 4-stage checkpoint into 2 stages take to the first step?"
BASELINE = "A fresh start of the same 2 x 2 run with nothing to load."


def _spec(steps: int, P: int, D: int):
    return tiny_spec(
        **{
            "training.steps": steps,
            "checkpoint.interval": 2,
            "parallelism.pipeline_stages": P,
            "parallelism.data_parallel": D,
        }
    )


def time_to_first_step(home: Path, resume_dir: Path | None) -> float:
    t0 = time.time()
    run, outcome = run_job(_spec(4, 2, 2), home, resume_dir=resume_dir)
    if not outcome.ok:
        raise SystemExit(outcome.message)
    first = min(e["ts"] for e in events(run.dir) if e["kind"] == "step")
    return first - t0


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        run, outcome = run_job(_spec(2, 4, 1), Path(tmp) / "first")
        if not outcome.ok:
            raise SystemExit(outcome.message)
        ckpt = run.dir / "checkpoints" / "step-00000002"
        fresh, resumed = [], []
        for k in range(args.repeats):
            fresh.append(time_to_first_step(Path(tmp) / f"fresh{k}", None))
            resumed.append(time_to_first_step(Path(tmp) / f"resume{k}", ckpt))
    f, r = statistics.median(fresh), statistics.median(resumed)
    print(f"fresh start 2x2, to first step:          {f:.2f} s  {[round(x, 2) for x in fresh]}")
    print(f"resume 4x1 checkpoint as 2x2, to step 3: {r:.2f} s  {[round(x, 2) for x in resumed]}")
    print(f"resume time: {r:.2f} s (ratio to a fresh start {r / f:.2f})")


if __name__ == "__main__":
    main()
