"""Simulator accuracy: predicted vs real step time of the runtime (Varuna Table 7).

One calibration of the model on this machine is taken at the start (``calibrate``:
compute per block, point-to-point, allreduce and core sharing in a real process
group; taken again while other work disturbed it). Each configuration is then planned
with it (``make_plan`` with that calibration: the prediction is the simulated step)
and run for real through the local backend, and its median step time after warm-up
is compared with the prediction. Configurations vary P, D, m, the number of
micro-batches and the schedule. Varuna reports its estimates within 5 % of measured
times (Table 7).

    python benchmarks/simulator_accuracy.py [--steps 30] [--only 3] [--attempts 3]

The machine has 2 cores shared with other work: absolute times are noisy. Each run
waits (up to 3 minutes) for the CPU to be quiet before it starts; a run during which
other processes took more than 5 % of the CPU is repeated (up to ``--attempts``), and
the least disturbed one counts. The "other" column is that share.

The VM itself also changes speed over minutes (its host's other tenants; no steal time
shows inside): the same compute took 30 % longer in one run than in the one before.
So a fixed speed probe (the model's forward and backward in this process) is timed
around the calibration and around every real run; "speed" is its time now over
at calibration, and the "drift-corrected" error compares the prediction with the
measured time divided by it. Both errors are printed; the raw one is the figure.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from benchmarks import jobbench
from benchmarks.jobbench import Interference, job_spec, layout, measure_best, wait_quiet
from jobctl.engine.calibration import Calibration
from jobctl.engine.calibration_run import calibrate
from jobctl.engine.data import make_data
from jobctl.engine.model import Stage, lm_loss, model_def
from jobctl.engine.planner import make_plan

MODEL = {"model.hidden": 96, "model.layers": 4, "model.seq_len": 48, "model.heads": 4}
CONFIGS = [  # (P, D, m, global batch, schedule, extra overrides)
    (1, 1, 4, 16, "1f1b", {}),
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


def calibrate_quietly(spec, home: Path, attempts: int) -> tuple[Calibration, float]:
    """The one calibration of the run: taken again (up to ``attempts`` times) while other
    processes took more than 5 % of the CPU, keeping the least disturbed."""
    best: tuple[Calibration, float] | None = None
    for _ in range(attempts):
        wait_quiet()
        with Interference() as other:
            cal, _ = calibrate(spec, home)
        if best is None or other.fraction < best[1]:
            best = (cal, other.fraction)
        if best[1] < 0.05:
            break
    return best


def speed_probe(spec, seconds: float = 0.6) -> float:
    """Median seconds of one forward and backward of the whole model at m=2, one thread."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        mdef = model_def(spec.model, spec.training.seed)
        stage = Stage(mdef, range(mdef.num_blocks))
        x, y = make_data(spec).batch(0, 2)
        times, end = [], time.perf_counter() + seconds
        while time.perf_counter() < end or len(times) < 5:
            t0 = time.perf_counter()
            lm_loss(stage(x), y).backward()
            times.append(time.perf_counter() - t0)
        return statistics.median(times[2:])
    finally:
        torch.set_num_threads(before)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="steps per real run")
    parser.add_argument("--only", type=int, default=None, help="run only the first N configs")
    parser.add_argument(
        "--attempts", type=int, default=3, help="runs per config until one is undisturbed"
    )
    parser.add_argument(
        "--patience", type=float, default=180.0, help="seconds to wait for a quiet CPU per run"
    )
    args = parser.parse_args()
    jobbench.QUIET_PATIENCE_S = args.patience
    base = job_spec(**MODEL, **{"training.steps": args.steps})
    with tempfile.TemporaryDirectory(prefix="jobctl-accuracy-") as tmp:
        home = Path(tmp)
        reference = speed_probe(base)
        cal, load = calibrate_quietly(base, home, args.attempts)
        reference = (reference + speed_probe(base)) / 2  # around the calibration
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
                f"per step {1e3 * rt.step_s:.2f} ms"
            )
        print(
            f"{'config':<44} {'predicted':>10} {'measured':>10} {'error':>8} {'other':>6} "
            f"{'speed':>6} {'corrected':>9}"
        )
        errors, corrected = [], []
        for P, D, m, B, schedule, extra in CONFIGS[: args.only]:
            spec = job_spec(
                **MODEL,
                **{"training.steps": args.steps, "training.global_batch_size": B},
                **layout(P, D, m, schedule, **extra),
            )
            plan = make_plan(spec, calibration=cal)
            predicted = plan.prediction.step_time_s
            before = speed_probe(base)
            real = measure_best(spec, plan, home, attempts=args.attempts)
            speed = (before + speed_probe(base)) / 2 / reference
            err = (predicted - real.step_s) / real.step_s
            fixed = (predicted - real.step_s / speed) / (real.step_s / speed)
            errors.append(abs(err))
            corrected.append(abs(fixed))
            print(
                f"{plan.summary() + (' +R' if extra else ''):<44} {1e3 * predicted:>8.1f}ms "
                f"{1e3 * real.step_s:>8.1f}ms {100 * err:>+7.1f}% {100 * real.interference:>5.0f}% "
                f"{speed:>6.2f} {100 * fixed:>+8.1f}%",
                flush=True,
            )
    print(
        f"drift-corrected (measured / speed): median |error| "
        f"{100 * statistics.median(corrected):.1f} %, max {100 * max(corrected):.1f} %"
    )
    med, worst = statistics.median(errors), max(errors)
    print(
        f"simulator vs real runtime, {len(errors)} configs from one calibration: "
        f"median |error| {100 * med:.1f} %, max {100 * worst:.1f} % "
        f"(targets 3 % / 7 %; Varuna Table 7: within 5 %); "
        f"median ratio to the 3 % target: {med / 0.03:.2f}"
    )


if __name__ == "__main__":
    main()
