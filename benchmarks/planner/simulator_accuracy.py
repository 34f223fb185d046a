"""Simulator accuracy: predicted vs real step time of the runtime (Varuna Table 7).

One calibration of the model on this machine is taken at the start (``calibrate``:
compute per block, point-to-point, allreduce and core sharing in a real process
group; taken again while other work disturbed it). Each configuration is then planned
with it (``make_plan`` with that calibration: the prediction is the simulated step)
and run for real through the local backend, and its median step time after warm-up
is compared with the prediction. Configurations vary P, D, m, the number of
micro-batches and the schedule. Varuna reports its estimates within 5 % of measured
times (Table 7).

    python -m benchmarks run simulator_accuracy [--steps 30] [--rounds 3] [--only 3]
        [--recalibrate K]

The calibration scales its compute to the machine's speed during its pipeline probes
(seconds in the runtime's own processes, as training runs). It is taken again if the
VM's speed moved by more than 10 % between its block timing and its probes: once the
probes ran 36 % slower and every plan came out a third slow, while the runs of the
next minutes were back at the usual speed. ``--recalibrate K`` takes K more
calibrations after the runs and prints how far each prediction moves between them.

The machine has 2 vCPUs shared with other work: absolute times are noisy. Each run
waits (up to 3 minutes) for the CPU to be quiet before it starts; a run during which
other processes took more than 5 % of the CPU is repeated (up to ``--attempts``), and
the least disturbed one counts. The "other" column is that share.

Undisturbed runs still differ: the same configuration, run again a minute later, takes
up to 25 % longer or shorter (the VM's vCPUs land on different host cores; a
single-threaded speed probe does not see it, multi-process runs do). So every
configuration is run ``--rounds`` times, round-robin over all of them so each sees the
machine's good and bad minutes alike; its measured time is the median of its rounds,
and "spread" ((slowest - fastest) / median) shows how far one run alone could be off.
The VM also slows down or speeds up as a whole for minutes at a time (every
configuration of one round 30 % slower than the calibration predicted). The first
configuration (one process, no messages: compute alone) is run at the start of every
round as a baseline; "vs base" is each configuration's error relative to that round's
baseline error (predicted/measured over the baseline's predicted/measured), which
cancels what the whole machine did. Both are printed; the absolute one is the figure.

The calibration fits its runtime costs (per action, per message at two loads, per
step, the step-to-step spread) on real pipelines of this very model: one, two and four
stages at the smallest micro-batch size (``runner.micro_batch_sizes``), D = 1. A
configuration at one of those P with that m is in-sample; every other one is scored
out-of-sample and tagged with what differs: another P, another m (or D > 1), or another
model width (``WIDTH_CONFIGS``: hidden 128, whose block times come from its own
calibration but whose runtime costs are the ones fitted on hidden 96). The two groups
are summarised apart; the last line gives both.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from rich.progress import Progress

from benchmarks.lib import jobbench, results
from benchmarks.lib.decision_quality import report_decisions
from benchmarks.lib.jobbench import Interference, job_spec, layout, measure_best, wait_quiet
from jobctl.engine.calibration.measure.runner import (
    BUSY_PROBE_STAGES,
    calibrate,
    micro_batch_sizes,
)
from jobctl.engine.calibration.record import Calibration
from jobctl.engine.planner.resolver import make_plan

QUESTION = (
    "How close is the simulator's predicted step time to real runs on this machine, and "
    "does the planner pick and order the layouts right?"
)
BASELINE = (
    "The same configurations run for real, interleaved (median of rounds), each round's "
    "one-process run as the machine's drift."
)

MODEL = {"model.hidden": 96, "model.layers": 4, "model.seq_len": 48, "model.heads": 4}
CONFIGS = [  # (P, D, m, global batch, schedule, extra overrides)
    (1, 1, 4, 16, "1f1b", {}),
    (2, 1, 1, 4, "1f1b", {}),  # the 2-stage probe's pipeline: in-sample
    (4, 1, 1, 4, "1f1b", {}),  # the 4-stage probe's pipeline: in-sample
    (1, 2, 2, 16, "1f1b", {}),
    (2, 1, 2, 16, "1f1b", {}),
    (2, 1, 2, 16, "gpipe", {}),
    (2, 2, 2, 16, "1f1b", {}),
    (2, 2, 1, 16, "gpipe", {"parallelism.recompute": "all"}),
    (3, 1, 2, 16, "varuna", {}),
    (3, 1, 4, 24, "shifted_critical_path", {}),
    (4, 1, 2, 16, "1f1b", {}),
    (4, 1, 4, 32, "varuna", {}),
]
WIDTH = {**MODEL, "model.hidden": 128}  # another model width, out-of-sample
WIDTH_CONFIGS = [(2, 1, 2, 16, "1f1b", {}), (3, 1, 2, 16, "varuna", {})]
PROBE_P = (1, 2, BUSY_PROBE_STAGES)  # the calibration's pipeline probes, D = 1


def sample_tag(P: int, D: int, m: int, probe_m: int, width: bool) -> str:
    """'in' for a configuration like the probes the runtime costs were fitted on, else
    what differs from them (P, m, D, width)."""
    differs = [
        name
        for name, other in (
            ("P", P not in PROBE_P),
            ("m", m != probe_m),
            ("D", D != 1),
            ("width", width),
        )
        if other
    ]
    return "in" if not differs else "out:" + "+".join(differs)


def other_width_calibration(cal: Calibration, home: Path, steps: int, attempts: int):
    """A calibration of the WIDTH model whose runtime costs are ``cal``'s (hidden 96)."""
    wide, _ = calibrate_quietly(job_spec(**WIDTH, **{"training.steps": steps}), home, attempts)
    return wide.model_copy(update={"runtime": cal.runtime})


def calibrate_quietly(spec, home: Path, attempts: int) -> tuple[Calibration, float]:
    """The one calibration of the run: taken again (up to ``attempts`` times) while other
    processes took more than 5 % of the CPU, or while the VM itself changed speed (its
    probes ran more than 10 % off the block timing, ``RuntimeCalibration.steady``: 36 %
    slower in one, where the next minutes' runs were back at the usual speed), keeping
    the best of them."""
    best: tuple[Calibration, float] | None = None

    def badness(cal: Calibration, other: float) -> tuple[bool, float]:
        return other >= 0.05, unsteadiness(cal)

    for _ in range(attempts):
        wait_quiet()
        with Interference() as other:
            cal, _ = calibrate(spec, home)
        if best is None or badness(cal, other.fraction) < badness(*best):
            best = (cal, other.fraction)
        if best[1] < 0.05 and (best[0].runtime is None or best[0].runtime.steady):
            break
    return best


def unsteadiness(cal: Calibration) -> float:
    """How far the machine's speed moved between the block timing and the probes."""
    return cal.runtime.speed_moved if cal.runtime else 0.0


def calibration_noise(base, home: Path, specs: list, first: Calibration, args) -> None:
    """Calibrate ``args.recalibrate`` more times; print each config's predictions from
    every calibration and their spread ((largest - smallest) / median)."""
    cals = [first]
    for _ in range(args.recalibrate):
        cals.append(calibrate_quietly(base, home, args.attempts)[0])
    spreads = []
    for spec in specs:
        plans = [make_plan(spec, calibration=c) for c in cals]
        times = [p.prediction.step_time_s for p in plans]
        spreads.append((max(times) - min(times)) / statistics.median(times))
        each = " ".join(f"{1e3 * t:.1f}" for t in times)
        print(f"{plans[0].summary():<44} predictions {each} ms: spread {100 * spreads[-1]:.1f} %")
    print(
        f"the calibration's own noise: one config's predictions from {len(cals)} "
        f"calibrations spread by median {100 * statistics.median(spreads):.1f} %, max "
        f"{100 * max(spreads):.1f} %"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="steps per real run")
    parser.add_argument("--rounds", type=int, default=3, help="real runs per config")
    parser.add_argument("--only", type=int, default=None, help="run only the first N configs")
    parser.add_argument(
        "--attempts", type=int, default=3, help="runs per config until one is undisturbed"
    )
    parser.add_argument(
        "--patience", type=float, default=180.0, help="seconds to wait for a quiet CPU per run"
    )
    parser.add_argument(
        "--recalibrate",
        type=int,
        default=0,
        help="after the runs, calibrate this many more times and print how far each "
        "config's prediction moves between calibrations (the calibration's own noise)",
    )
    parser.add_argument(
        "--no-width",
        dest="width",
        action="store_false",
        help="skip the other model width (its calibration and WIDTH_CONFIGS)",
    )
    args = parser.parse_args(argv)
    jobbench.QUIET_PATIENCE_S = args.patience
    base = job_spec(**MODEL, **{"training.steps": args.steps})
    with tempfile.TemporaryDirectory(prefix="jobctl-accuracy-") as tmp:
        home = Path(tmp)
        cal, load = calibrate_quietly(base, home, args.attempts)
        print(f"calibration: {cal.seconds:.1f} s, other load {100 * load:.0f} %")
        if cal.runtime is not None:
            rt = cal.runtime
            probe = ", ".join(
                f"{k} {1e3 * v['measured_s']:.1f} ms measured / {1e3 * v['simulated_s']:.1f} "
                "ms simulated bare"
                for k, v in rt.probe.items()
            )
            print(
                f"runtime costs (pipeline probe: {probe}): per action "
                f"{1e3 * rt.action_s:.3f} ms, per message "
                f"{1e3 * rt.message_s:.2f} ms at load {rt.load_idle:.2f} (cores shared: "
                f"{1e3 * rt.message_busy_s:.2f} ms at load {rt.load_busy:.2f}), "
                f"per step {1e3 * rt.step_s:.2f} ms; step-to-step spread {100 * rt.step_cv:.0f} % "
                f"(cores shared: {100 * rt.step_cv_busy:.0f} %); probes "
                f"{100 * (rt.drift - 1):+.0f} % slower than the block timing (compute scaled "
                "to them)"
            )
        runs = []
        probe_m = micro_batch_sizes(base)[0]
        wide = other_width_calibration(cal, home, args.steps, args.attempts) if args.width else None
        todo = [(c, MODEL, cal) for c in CONFIGS[: args.only]]
        todo += [(c, WIDTH, wide) for c in WIDTH_CONFIGS] if wide else []
        for (P, D, m, B, schedule, extra), model, c in todo:
            spec = job_spec(
                **model,
                **{"training.steps": args.steps, "training.global_batch_size": B},
                **layout(P, D, m, schedule, **extra),
            )
            plan = make_plan(spec, calibration=c)
            tag = sample_tag(P, D, m, probe_m, model is WIDTH)
            runs.append((spec, plan, (" +R" if extra else "") + f" [{tag}]", []))
        with Progress(transient=True) as bar:
            task = bar.add_task("real runs", total=args.rounds * len(runs))
            for _ in range(args.rounds):
                for spec, plan, _, seen in runs:
                    seen.append(measure_best(spec, plan, home, attempts=args.attempts))
                    bar.advance(task)
        if args.recalibrate:
            calibration_noise(base, home, [r[0] for r in runs], cal, args)
        print("config [in-sample, or out: what differs from the probes]")
        print(
            f"{'':<4}{'predicted':>10} {'measured':>10} {'error':>8} {'other':>6} "
            f"{'spread':>7} {'vs base':>8}  rounds"
        )
        base_pred = runs[0][1].prediction.step_time_s
        base_ratio = [base_pred / x.step_s for x in runs[0][3]]  # per round
        errors, spreads, relative, groups = [], [], [], {"in": [], "out": []}
        for _, plan, tag, seen in runs:
            predicted = plan.prediction.step_time_s
            times = [x.step_s for x in seen]
            real = statistics.median(times)
            err = (predicted - real) / real
            spread = (max(times) - min(times)) / real
            rel = statistics.median(
                predicted / t / b - 1.0 for t, b in zip(times, base_ratio, strict=True)
            )
            errors.append(abs(err))
            groups["in" if tag.endswith("[in]") else "out"].append(abs(err))
            spreads.append(spread)
            if plan is not runs[0][1]:
                relative.append(abs(rel))
            each = " ".join(f"{1e3 * t:.1f}" for t in times)
            print(plan.summary() + tag)
            print(
                f"{'':<4}{1e3 * predicted:>8.1f}ms {1e3 * real:>8.1f}ms "
                f"{100 * err:>+7.1f}% {100 * max(x.interference for x in seen):>5.0f}% "
                f"{100 * spread:>6.1f}% {100 * rel:>+7.1f}%  {each}",
                flush=True,
            )
    print(
        f"the machine's own noise: one config's runs spread by median "
        f"{100 * statistics.median(spreads):.1f} %, max {100 * max(spreads):.1f} % "
        f"(slowest - fastest, of the median)"
    )
    if relative:
        print(
            f"relative to the same round's one-process baseline (the machine's drift "
            f"cancelled): median |error| {100 * statistics.median(relative):.1f} %, "
            f"max {100 * max(relative):.1f} % over {len(relative)} configs"
        )
    decisions = report_decisions(runs)
    med, worst = statistics.median(errors), max(errors)
    print(
        f"all {len(errors)} configs (measured: median of {args.rounds} runs): median "
        f"|error| {100 * med:.1f} %, max {100 * worst:.1f} % (targets 3 % / 7 %; Varuna "
        f"Table 7: within 5 %); median ratio to the 3 % target: {med / 0.03:.2f}"
    )
    parts = [
        f"{name} {100 * statistics.median(g):.1f} % median, {100 * max(g):.1f} % max "
        f"({len(g)} configs)"
        if g
        else f"{name}: none run"
        for name, g in (("in-sample", groups["in"]), ("out-of-sample", groups["out"]))
    ]
    print(
        "simulator vs real runtime |error|, in-sample (the probes' P and m, this model) "
        "vs out-of-sample (other P, m, D or width): " + "; ".join(parts)
    )
    figures = {"median_error": med, "max_error": worst, "decisions": decisions}
    figures["configs"] = [
        {"config": plan.summary() + tag, "predicted_s": plan.prediction.step_time_s}
        | {"measured_s": [x.step_s for x in seen]}
        for _, plan, tag, seen in runs
    ]
    results.write("simulator_accuracy", figures)


if __name__ == "__main__":
    main()
