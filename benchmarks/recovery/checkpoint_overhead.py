"""Training step time with a checkpoint every step (uploaded to S3) vs without.

Real runs of the quickstart model (2x2, 4 worker processes) in one invocation, round
robin: the baseline checkpoints only at the end; the others checkpoint every step (or
every ``--interval`` steps) and
upload each to a local moto S3 server in the background, once with
``checkpoint.coalesce`` on (the default: a write or upload that falls behind is
replaced by the newer one) and once with it off (every checkpoint written and
uploaded; training waits for the writer if it must). Step times are the wall time
between the workers' step events after warm-up (so they include what a checkpoint
blocks). Per configuration it prints the checkpoints asked for, written, skipped
(coalesced away) and uploaded, counted from the run's events; the median, mean and
p95 step; and the training time each checkpoint asked for added (mean step minus the
baseline's mean step, times the steps per checkpoint). Last, the overhead in percent of
the mean step, with and without coalescing (target <= 5 %).

    python -m benchmarks run checkpoint_overhead [--steps 40] [--repeats 2] [--interval 1]

``--interval 10`` measures a checkpoint every 10 steps instead (issue #55's target:
at most 5 % of the mean step).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.lib.benchlib import events, moto_bucket, step_times  # noqa: E402
from tests.jobrun import run_job, tiny_spec  # noqa: E402

QUESTION = "What does a checkpoint every step, uploaded to S3, add to the step time?"
BASELINE = "The same job checkpointing only at the end; coalescing on against off."

WARMUP = 5


@dataclass
class RunStats:
    """One run: step times after warm-up and its checkpoint counts."""

    steps: list[float]
    by_step: dict[int, float]  # step -> its wall seconds (after warm-up, not the last)
    asked: int
    written: int
    skipped: int
    uploaded: int


def _steps_of(recs: list[dict], kind: str) -> set[int]:
    return {int(e["step"]) for e in recs if e["kind"] == kind and "step" in e}


def one_run(steps: int, interval: int, remote: str | None, batch: int, coalesce: bool):
    spec = tiny_spec(
        **{
            "training.steps": steps,
            "checkpoint.interval": interval,
            "checkpoint.remote": remote,
            "checkpoint.coalesce": coalesce,
            "training.global_batch_size": batch,
        }
    )
    with tempfile.TemporaryDirectory() as home:
        run, outcome = run_job(spec, Path(home))
        if not outcome.ok:
            raise SystemExit(outcome.message)
        recs = events(run.dir)
        ts = {int(e["step"]): e["ts"] for e in recs if e["kind"] == "step"}
        by_step = {s: ts[s] - ts[s - 1] for s in ts if s - 1 in ts and WARMUP < s < steps}
        # A skip is written by each rank that dropped its snapshot; a step counts once.
        return RunStats(
            steps=step_times(run.dir)[WARMUP:-1],
            by_step=by_step,
            asked=len(range(interval, steps + 1, interval)) if interval <= steps else 1,
            written=len(_steps_of(recs, "checkpoint")),
            skipped=len(_steps_of(recs, "checkpoint_skipped")),
            # An upload's last progress event has every byte sent (``uploaded`` events
            # only name the newest committed step a rank saw, not every one).
            uploaded=len(
                {
                    e["step"]
                    for e in recs
                    if e["kind"] == "upload" and e["bytes_done"] >= e["bytes_total"]
                }
            ),
        )


def p95(xs: list[float]) -> float:
    return statistics.quantiles(xs, n=20)[-1] if len(xs) > 1 else xs[0]


def report(name: str, runs: list[RunStats], base_mean: float, interval: int) -> float:
    """One table row (counts summed over the repeats); returns the mean step."""
    times = [t for r in runs for t in r.steps]
    mean = statistics.mean(times)
    counts = [sum(getattr(r, k) for r in runs) for k in ("asked", "written", "skipped")]
    uploaded = sum(r.uploaded for r in runs)
    added = f"{1e3 * (mean - base_mean) * interval:.1f}" if interval else "-"
    up = "-" if name == "baseline" else str(uploaded)
    print(
        f"{name:<13}{counts[0]:>5} {counts[1]:>5} {counts[2]:>5} {up:>5} "
        f"{1e3 * statistics.median(times):>7.1f} {1e3 * mean:>6.1f} {1e3 * p95(times):>6.1f} "
        f"{added:>8}"
    )
    return mean


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--global-batch", type=int, default=16, help="samples per step")
    ap.add_argument("--remote", choices=["s3", "file"], default="s3")
    ap.add_argument("--interval", type=int, default=1, help="steps between checkpoints")
    args = ap.parse_args(argv)
    every = args.interval
    got: dict[str, list[RunStats]] = {"baseline": [], "coalesce on": [], "coalesce off": []}
    with contextlib.ExitStack() as stack:
        if args.remote == "s3":
            url = stack.enter_context(moto_bucket(separate_process=True))
        else:
            url = "file://" + stack.enter_context(tempfile.TemporaryDirectory())
        for k in range(args.repeats):  # interleaved, so drift hits all alike
            got["baseline"].append(one_run(args.steps, 10_000, None, args.global_batch, True))
            # a fresh prefix per run, or the run would resume from the previous one
            for name, coalesce in (("coalesce on", True), ("coalesce off", False)):
                remote = f"{url}/{k}-{coalesce}"
                got[name].append(one_run(args.steps, every, remote, args.global_batch, coalesce))
    print(
        f"global batch {args.global_batch}, remote {args.remote}, {args.steps} steps x "
        f"{args.repeats} runs; checkpoint counts summed, step times in ms after warm-up"
    )
    print(
        f"{'':<13}{'asked':>5} {'wrote':>5} {'skip':>5} {'up':>5} "
        f"{'median':>7} {'mean':>6} {'p95':>6} {'ms/ckpt':>8}"
    )
    base = report("baseline", got["baseline"], 0.0, 0)
    on = report("coalesce on", got["coalesce on"], base, every)
    off = report("coalesce off", got["coalesce off"], base, every)
    print("ms/ckpt: training time each checkpoint asked for added (mean step - baseline)")
    rounds(got)
    for name in ("coalesce on", "coalesce off"):
        in_run(name, got[name], every)
    print(
        f"checkpoint + upload every {every} step(s), overhead of the mean step: "
        f"{100 * (on / base - 1):+.1f} % with coalescing, {100 * (off / base - 1):+.1f} % "
        f"without (target <= 5 %)"
    )


def rounds(got: dict[str, list[RunStats]]) -> None:
    """Each round's ratio to the baseline run beside it, and the noise: how far the
    baseline's own round means stray from their mean (the VM's speed wanders)."""
    base = [statistics.mean(r.steps) for r in got["baseline"]]
    for name in ("coalesce on", "coalesce off"):
        ratios = [
            100 * (statistics.mean(r.steps) / b - 1) for r, b in zip(got[name], base, strict=True)
        ]
        spread = statistics.stdev(ratios) if len(ratios) > 1 else 0.0
        shown = " ".join(f"{x:+.1f}" for x in ratios)
        print(f"{name}: per round {shown} % (mean {statistics.mean(ratios):+.1f}, sd {spread:.1f})")
    if len(base) > 1:
        noise = 100 * (max(base) - min(base)) / statistics.mean(base)
        print(f"noise: the baseline's round means span {noise:.1f} % of their mean")


def in_run(name: str, runs: list[RunStats], every: int) -> None:
    """The overhead measured inside the checkpointing runs, free of the drift between
    runs: the mean wall time of the p-th step after a checkpoint (p = 1 .. k, step
    s - 1 being the checkpointed one), against the quiet half of the period (p > k / 2,
    by when the background write and upload of a checkpoint this small are long done:
    the row shows whether they are); overhead = sum over p / (k x quiet) - 1."""
    if every < 4:
        return
    pos: dict[int, list[float]] = {p: [] for p in range(1, every + 1)}
    for r in runs:
        for s, t in r.by_step.items():
            pos[(s - 1) % every + 1].append(t)
    means = {p: statistics.mean(v) for p, v in pos.items() if v}
    quiet = statistics.mean([means[p] for p in means if p > every // 2])
    over = sum(means.values()) / (len(means) * quiet) - 1
    print(f"{name}, ms by step after a checkpoint (1..{every}):")
    ordered = [f"{1e3 * means[p]:.1f}" for p in sorted(means)]
    for row in range(0, len(ordered), 10):  # ten to a line: 80 columns
        print("  " + " ".join(ordered[row : row + 10]))
    print(f"  in-run overhead vs the quiet half: {100 * over:+.1f} % of the mean step")


if __name__ == "__main__":
    main()
