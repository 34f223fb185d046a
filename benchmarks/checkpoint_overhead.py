"""Training step time with a checkpoint every step (uploaded to S3) vs without.

Two real runs of the quickstart model (2x2, 4 worker processes) in one invocation:
baseline checkpoints only at the end; the other checkpoints every step and uploads each
to a local moto S3 server in the background. Wall time per step is taken from the
workers' step events (so it includes the local checkpoint write), median over the steps
after warm-up. Prints both and, last, the overhead in percent (target <= 5 %).

    python benchmarks/checkpoint_overhead.py [--steps 40] [--repeats 2]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.benchlib import moto_bucket, step_times  # noqa: E402
from tests.jobrun import run_job, tiny_spec  # noqa: E402


def per_step(steps: int, interval: int, remote: str | None, batch: int) -> float:
    spec = tiny_spec(
        **{
            "training.steps": steps,
            "checkpoint.interval": interval,
            "checkpoint.remote": remote,
            "training.global_batch_size": batch,
        }
    )
    with tempfile.TemporaryDirectory() as home:
        run, outcome = run_job(spec, Path(home))
        if not outcome.ok:
            raise SystemExit(outcome.message)
        return statistics.median(step_times(run.dir)[5:-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--global-batch", type=int, default=16, help="samples per step")
    ap.add_argument("--remote", choices=["s3", "file"], default="s3")
    args = ap.parse_args()
    base, ckpt = [], []
    with contextlib.ExitStack() as stack:
        if args.remote == "s3":
            url = stack.enter_context(moto_bucket(separate_process=True))
        else:
            url = "file://" + stack.enter_context(tempfile.TemporaryDirectory())
        for k in range(args.repeats):  # interleaved, so drift hits both alike
            base.append(per_step(args.steps, 10_000, None, args.global_batch))
            # a fresh prefix per run, or the run would resume from the previous one
            ckpt.append(per_step(args.steps, 1, f"{url}/{k}", args.global_batch))
    b, c = statistics.median(base), statistics.median(ckpt)
    print(f"global batch {args.global_batch}, remote {args.remote}")
    print(f"baseline (checkpoint at end only): {1000 * b:.1f} ms/step  {base}")
    print(f"checkpoint + upload every step:    {1000 * c:.1f} ms/step  {ckpt}")
    print(f"checkpoint overhead: {100 * (c / b - 1):+.1f} % (ratio {c / b:.3f}; target <= 5 %)")


if __name__ == "__main__":
    main()
