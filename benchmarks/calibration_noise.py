"""The calibration's own noise: how far back-to-back calibrations of one model disagree.

A plan is only as steady as the calibration under it. On this VM the speed moves by a
tenth or more for seconds at a time, so two calibrations taken a minute apart time
the same blocks differently, and the planner's predicted order of layouts moves with
them: a decision the real runs (``simulator_accuracy``) can be measured against no
better than the calibrations agree with each other.

This takes ``--calibrations`` calibrations of ``simulator_accuracy``'s model as
shipped and, with ``--compare N``, as many that time the blocks in N passes instead
of ``runner.COMPUTE_PASSES`` (the same 30 timed runs per block spread over them, the
least disturbed pass kept per micro-batch size), interleaved so both ways see the
machine's good and bad minutes alike. Printed per way:

* per micro-batch size m, the spread ((largest - smallest) / median) of the whole
  model's forward + backward time as timed (before the probes' drift scaling);
* per configuration of ``simulator_accuracy.CONFIGS``, the spread of its predicted
  step time; the median and largest over configurations;
* Kendall's tau between the predicted throughput orders of every two calibrations
  (1: the same order): median and smallest;
* the calibration's seconds.

Measured 2026-11-27, ``--calibrations 4 --compare 6``: 2 passes (shipped) block
spread 22-30 %, predicted step spread median 13 % (max 29 %), tau median 0.73 (min
0.58); 6 passes 12-19 %, 25 % (43 %), 0.74 (0.66): the blocks agree better, the plans
do not, so 2 stays. Two calibrations a minute apart order the 12 layouts with tau
0.73: a real run's order can be matched no better than that on this VM.

No real training runs: about a minute per calibration.

    python -m benchmarks.calibration_noise [--calibrations 4] [--compare PASSES]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import tempfile
from pathlib import Path

from benchmarks.decision_quality import kendall_tau
from benchmarks.jobbench import job_spec, layout, wait_quiet
from benchmarks.simulator_accuracy import CONFIGS, MODEL
from jobctl.engine.calibration.measure.runner import COMPUTE_PASSES, calibrate
from jobctl.engine.calibration.record import Calibration
from jobctl.engine.planner.resolver import make_plan


def spread(xs: list[float]) -> float:
    """(largest - smallest) / median."""
    return (max(xs) - min(xs)) / statistics.median(xs)


def whole_model_ms(cal: Calibration, m: int) -> float:
    """The whole model's forward + backward at m as the blocks were timed (ms)."""
    drift = cal.runtime.drift if cal.runtime is not None else 1.0
    return 1e3 * sum(b.forward[m].median + b.backward[m].median for b in cal.blocks) / drift


def predictions(cal: Calibration) -> list[float]:
    """Predicted step seconds of every configuration of ``simulator_accuracy``."""
    out = []
    for P, D, m, batch, schedule, extra in CONFIGS:
        spec = job_spec(
            **MODEL,
            **{
                "training.steps": 30,
                "training.global_batch_size": batch,
                **layout(P, D, m, schedule, **extra),
            },
        )
        out.append(make_plan(spec, calibration=cal).prediction.step_time_s)
    return out


def take(k: int, ways: dict[str, int], home: Path) -> dict[str, list[Calibration]]:
    """``k`` calibrations each way (name -> passes), interleaved, each after the CPU
    went quiet."""
    spec = job_spec(**MODEL, **{"training.steps": 30})
    cals: dict[str, list[Calibration]] = {name: [] for name in ways}
    for i in range(k):
        for name, passes in ways.items():
            wait_quiet()
            cal, _ = calibrate(spec, home / f"{i}-{passes}", passes=passes)
            cals[name].append(cal)
            print(f"  {name}: calibration {i + 1}/{k} in {cal.seconds:.0f} s", flush=True)
    return cals


def summarise(name: str, cals: list[Calibration]) -> dict[str, float]:
    """Print and return one way's spreads and agreement."""
    ms = cals[0].micro_batch_sizes
    per_m = {m: spread([whole_model_ms(c, m) for c in cals]) for m in ms}
    preds = [predictions(c) for c in cals]
    per_config = [spread(list(xs)) for xs in zip(*preds, strict=True)]
    batches = [c[3] for c in CONFIGS]
    orders = [[b / t for b, t in zip(batches, p, strict=True)] for p in preds]
    taus = [kendall_tau(a, b) for a, b in itertools.combinations(orders, 2)]
    out = {
        "block": statistics.median(per_m.values()),
        "block_max": max(per_m.values()),
        "pred": statistics.median(per_config),
        "pred_max": max(per_config),
        "tau": statistics.median(taus),
        "tau_min": min(taus),
        "seconds": statistics.mean(c.seconds for c in cals),
    }
    shown = " ".join(f"m={m} {100 * s:.0f}%" for m, s in per_m.items())
    print(f"{name}:\n  whole-model time spread per m: {shown}")
    print(
        f"  predicted step spread over {len(CONFIGS)} configs: median "
        f"{100 * out['pred']:.0f} %, max {100 * out['pred_max']:.0f} %"
    )
    print(
        f"  Kendall tau between calibrations' orders: median {out['tau']:.2f}, "
        f"min {out['tau_min']:.2f} ({len(taus)} pairs); {out['seconds']:.0f} s each"
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calibrations", type=int, default=4, help="per way (at least 2)")
    parser.add_argument(
        "--compare",
        type=int,
        default=None,
        metavar="PASSES",
        help="also calibrate with this many block-timing passes",
    )
    args = parser.parse_args()
    if args.calibrations < 2:
        parser.error("--calibrations must be at least 2: the noise is between calibrations")
    ways = {f"shipped ({COMPUTE_PASSES} passes)": COMPUTE_PASSES}
    if args.compare is not None:
        ways[f"{args.compare} passes"] = args.compare
    with tempfile.TemporaryDirectory(prefix="jobctl-calnoise-") as tmp:
        cals = take(args.calibrations, ways, Path(tmp))
    found = [summarise(name, cals[name]) for name in ways]
    if len(found) == 2:
        base, other = found
        print(
            f"{args.compare} passes / shipped: block spread "
            f"{other['block'] / base['block']:.2f}x, predicted spread "
            f"{other['pred'] / base['pred']:.2f}x, tau {base['tau']:.2f} -> "
            f"{other['tau']:.2f}"
        )


if __name__ == "__main__":
    main()
