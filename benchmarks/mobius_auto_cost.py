"""What auto's Mobius arm (``mobius_step.faster_mobius``) adds to planning.

For each spec, the ordinary plan (``resolver.plan_and_simulate``) and the Mobius arm
on top of it are timed in interleaved rounds in this process (calibrations cached),
and the arm's median share of the ordinary plan's median is printed with its answer:
``skip`` (not admissible, or the pool at least the model's blocks), ``lost`` (the
even-split estimate or the MIP plan not faster) or ``mobius`` (taken). Specs: the
planner's recorded answers (``tests/unit/test_planner_answers.py``) and the unit
test's V100 specs where Mobius wins (0.1 GB) and where its MIP plan is priced and
loses (0.15 GB).

    python -m benchmarks.mobius_auto_cost [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jobctl.engine.calibration.cache import calibration_for  # noqa: E402
from jobctl.engine.planner.mobius_step import faster_mobius  # noqa: E402
from jobctl.engine.planner.resolver import plan_and_simulate  # noqa: E402
from tests.unit.test_mobius_auto import _one_v100  # noqa: E402
from tests.unit.test_planner_answers import SPECS, _spec  # noqa: E402


def specs() -> list[tuple[str, object, int]]:
    out = [(name, _spec(shape), G) for name, (shape, G) in sorted(SPECS.items())]
    return [*out, ("v100-0.1gb-1", _one_v100(0.1), 1), ("v100-0.15gb-1", _one_v100(0.15), 1)]


def measure(spec, G: int, rounds: int) -> tuple[float, float, str]:
    """Median seconds of the ordinary plan and of the arm, and the arm's answer."""
    cal = calibration_for(spec, None)
    base_t, arm_t, got = [], [], None
    for _ in range(rounds):
        t0 = time.perf_counter()
        base = plan_and_simulate(spec, G, cal)[0]
        t1 = time.perf_counter()
        got = faster_mobius(spec, cal, G, base)
        arm_t.append(time.perf_counter() - t1)
        base_t.append(t1 - t0)
    par = spec.parallelism
    admissible = par.schedule == "auto" and par.pipeline_stages == "auto"
    answer = "mobius" if got else ("lost" if admissible and cal.num_blocks > G else "skip")
    return statistics.median(base_t), statistics.median(arm_t), answer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    print(f"{'spec':<20}{'G':>6}{'plan ms':>10}{'arm ms':>9}{'arm/plan':>10}  answer")
    for name, spec, G in specs():
        base, arm, answer = measure(spec, G, args.rounds)
        print(f"{name:<20}{G:>6}{base * 1e3:>10.1f}{arm * 1e3:>9.2f}{arm / base:>10.4f}  {answer}")


if __name__ == "__main__":
    main()
