"""How fast ``simulate`` is at the sizes of Varuna's own simulator measurement (sec. 7).

Varuna reports, for a 128-GPU job with a batch size of 8192, 391 ms (P=18), 376 ms
(P=24) and 660 ms (P=36) per simulation. Here G = 128, D = G // P, micro-batch size
m = 4 and M = ceil(8192 / (D * m)) micro-batches, the Varuna schedule, uniform stages
(B = 2F) with jittered sends and allreduce. Each figure is the best of ``--repeat`` runs,
except ``first``: the first strict simulate() of that P in this process (the first row
also pays the simulator's warm-up), what a one-shot ``jobctl plan`` pays per layout.

Then the planner's own settings: m = 1 (sec. 7.2's 1170-2731 micro-batches) and the
layout the planner picks for the 8.3B model on 128 GPUs, through ``steady_simulate``
(what the search calls, on the search's cached schedules) beside the full simulation,
deterministic costs, and with jittered sends (``jitter``: step time against the full
jittered simulation). ``--against REV`` also times the simulator of git revision REV,
interleaved with this one in the same process, and prints the ratio.

    python -m benchmarks run simulator_speed [--repeat 7] [--against REV]
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import math
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.planner.planner_speed import GPT_8B
from jobctl.engine.planner.resolver import make_plan
from jobctl.engine.planner.simulator.simulation import CostModel, simulate
from jobctl.engine.planner.simulator.steady import steady_simulate
from jobctl.engine.planner.stage_costs import generated
from jobctl.engine.schedule.generators import generate
from jobctl.spec import load_spec_text

QUESTION = (
    "How fast does the simulator price one layout at Varuna's sizes, and does the "
    "steady-state shortcut give the full simulation's step?"
)
BASELINE = (
    "Varuna's published 376-660 ms per simulation; the full simulate() beside "
    "steady_simulate(); with --against REV, that revision's simulator."
)

G, GLOBAL_BATCH, MICRO_BATCH_SIZE = 128, 8192, 4
VARUNA_MS = {18: 391.0, 24: 376.0, 36: 660.0}  # Varuna sec. 7, "Simulator"


def best_ms(run: Callable[[], object], repeat: int) -> float:
    """Fastest of ``repeat`` runs, in milliseconds."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return 1e3 * min(times)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7, help="runs per figure (best is kept)")
    parser.add_argument("--against", metavar="REV", help="also time git revision REV's simulator")
    args = parser.parse_args(argv)
    repeat = args.repeat
    print(
        f"{'P':>3} {'D':>3} {'M':>4} {'actions':>8} {'generate':>9} {'first':>8} {'strict':>8} "
        f"{'opportun.':>9} {'Varuna':>7}"
    )
    strict_ratio, full_ratio = [], []
    for P, varuna_ms in VARUNA_MS.items():
        D = G // P
        M = math.ceil(GLOBAL_BATCH / (D * MICRO_BATCH_SIZE))
        start = time.perf_counter()
        stages = generate("varuna", P, M)  # first call: not cached yet
        generate_ms = 1e3 * (time.perf_counter() - start)
        costs = CostModel.uniform(P, comm=0.2, jitter=0.3, ar=(5.0,) * P, opt=(1.0,) * P)
        opportunistic = dataclasses.replace(costs, opportunistic=True)
        first_ms = best_ms(lambda s=stages, c=costs: simulate(s, c, seed=0), 1)
        strict_ms = best_ms(lambda s=stages, c=costs: simulate(s, c, seed=0), repeat)
        opp_ms = best_ms(lambda s=stages, c=opportunistic: simulate(s, c, seed=0), repeat)
        strict_ratio.append(varuna_ms / strict_ms)
        full_ratio.append(varuna_ms / (generate_ms + opp_ms))
        print(
            f"{P:>3} {D:>3} {M:>4} {sum(map(len, stages)):>8} {generate_ms:>7.1f}ms "
            f"{first_ms:>6.1f}ms {strict_ms:>6.1f}ms {opp_ms:>7.1f}ms {varuna_ms:>5.0f}ms"
        )
    strict = f"{min(strict_ratio):.0f}x-{max(strict_ratio):.0f}x"
    full = f"{min(full_ratio):.0f}x-{max(full_ratio):.0f}x"
    print(
        f"Varuna's simulator (376-660 ms) / ours: {strict} for simulate(), {full} for "
        f"generating the schedule plus an opportunistic simulate()"
    )
    at_planner_settings(repeat, args.against)


def baseline_steady(rev: str) -> Callable:
    """``steady_simulate`` of git revision ``rev``: its simulator modules imported as a
    package of their own, so both simulators run in this process, interleaved."""
    root = Path(tempfile.mkdtemp()) / "baseline_simulator"
    root.mkdir()
    repo = Path(__file__).resolve().parents[2]
    for name in ("__init__", "engine", "simulation", "steady"):
        show = ["git", "show", f"{rev}:engine/planner/simulator/{name}.py"]
        text = subprocess.run(show, cwd=repo, capture_output=True, text=True, check=True).stdout
        text = text.replace("jobctl.engine.planner.simulator.", "baseline_simulator.")
        (root / f"{name}.py").write_text(text)
    sys.path.insert(0, str(root.parent))
    return importlib.import_module("baseline_simulator.steady").steady_simulate


def interleaved_ms(runs: list[Callable[[], object]], repeat: int) -> list[float]:
    """Fastest of ``repeat`` rounds of each run, in ms; each round runs every one once."""
    times: list[list[float]] = [[] for _ in runs]
    for _ in range(repeat):
        for spent, run in zip(times, runs, strict=True):
            start = time.perf_counter()
            run()
            spent.append(time.perf_counter() - start)
    return [1e3 * min(spent) for spent in times]


MODES = {"strict": (False, 0.0), "opportun.": (True, 0.0), "jittered": (True, 0.3)}


def at_planner_settings(repeat: int, against: str | None) -> None:
    """m = 1 (Varuna sec. 7.2: D = G // P, M = ceil(8192 / D)) and the planner's own pick
    for the 8.3B model on 128 V100s: the search's steady-state simulation against the
    full one, deterministic costs (the analytic source's) strict and opportunistic, and
    opportunistic with jittered sends (a calibrated source's)."""
    baseline = baseline_steady(against) if against else None
    print(f"\nat m = 1 and the planner's pick: steady-state vs full simulate(), best of {repeat}")
    extra = f" {against[:7]:>7} {'ratio':>6}" if against else ""
    print(f"{'layout':<20} {'M':>5} {'mode':<9} {'steady':>7} {'full':>7} {'error':>8}{extra}")
    spec = load_spec_text(GPT_8B.replace("nodes: 2048", "nodes: 32"))
    pick = make_plan(spec, G)
    shapes = [
        (P, math.ceil(GLOBAL_BATCH / (G // P)), "varuna", f"P={P} D={G // P} m=1")
        for P in VARUNA_MS
    ]
    shapes.append((pick.P, pick.micro_batches, pick.schedule, f"pick {pick.summary()}"[:20]))
    worst = 0.0
    for P, M, name, label in shapes:
        make = lambda n, P=P, name=name: generated(name, P, n, ())  # noqa: E731
        for mode, (opp, jitter) in MODES.items():
            costs = CostModel.uniform(
                P, comm=0.2, ar=(5.0,) * P, opt=(1.0,) * P, opportunistic=opp, jitter=jitter
            )
            fast_t, full_t = steady_simulate(make, M, costs), simulate(make(M), costs)
            error = fast_t.step_time / full_t.step_time - 1
            exact = abs(error) <= 1e-9
            runs = [lambda m=make, c=costs, M=M: steady_simulate(m, M, c)]
            if baseline:
                runs.append(lambda m=make, c=costs, M=M: baseline(m, M, c))
            times = interleaved_ms(runs, repeat)
            full = best_ms(lambda m=make, c=costs, M=M: simulate(m(M), c), max(1, repeat // 3))
            worst = max(worst, times[0])
            row = f"{label:<20} {M:>5} {mode:<9} {times[0]:>5.1f}ms {full:>5.0f}ms "
            row += f"{'exact' if exact else f'{error:+.3%}':>8}"
            if baseline:
                row += f" {times[1]:>5.1f}ms {times[1] / times[0]:>5.2f}x"
            print(row)
    print(f"slowest steady-state simulation {worst:.1f} ms (target: under 20 ms)")


if __name__ == "__main__":
    main()
