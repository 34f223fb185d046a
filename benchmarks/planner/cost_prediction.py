"""Predicted vs measured dollars to finish: the quickstart and a two-member fleet.

Everything runs on this machine (local backend, CPU worker processes) in one fresh
state home, at a price of $1 per device-hour. The quickstart runs twice: the first run
measures this machine's start-up (``calibration.startup``), which every later
prediction includes. For the second quickstart run and for the fleet (2 members of
1 stage x 2 replicas, both at once) it prints the plan's predicted dollars to finish
(``Prediction.finish_usd``: start-up, steps, checkpoints) and the measured dollars
(status's figures: device-hours in training phases x the price), and their ratio
(measured / predicted; 1.0 is exact). With ``--calibrate`` a measured calibration is
taken first (`jobctl calibrate`, minutes), else the plans use the analytic costs, which
on a CPU are often several times optimistic: the ratio says by how much.

    python -m benchmarks run cost_prediction [--steps 60] [--calibrate] [--skip-fleet]

``--skip-fleet``: the quickstart's row only.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from jobctl.engine.fleet.loader import load_fleet  # noqa: E402
from jobctl.engine.fleet.planning import plan_fleet  # noqa: E402
from jobctl.engine.planner.resolver import make_plan  # noqa: E402
from jobctl.engine.state.db import StateDB  # noqa: E402
from jobctl.engine.supervise.figures import run_figures  # noqa: E402
from tests.jobrun import JOBCTL, QUICKSTART, cli_env, run_job, tiny_spec, write_spec  # noqa: E402

QUESTION = "How close are a plan's predicted dollars to finish to what its run cost?"
BASELINE = (
    "The same quickstart job and two-member fleet run for real, priced by their device-hours."
)

PRICE = 1.0  # USD per device-hour

FLEET = """\
name: costbench
member_name: "costbench-{{ lr }}"
params: {lr: 0.01}
matrix: {lr: [0.01, 0.003]}
max_concurrent: 2
pool_devices: 4
template: |
  name: costbench
  model: {family: gpt, layers: 2, hidden: 64, heads: 4, seq_len: 32, vocab: 256}
  data: {source: synthetic}
  training: {global_batch_size: 16, micro_batch_size: 2, steps: STEPS, lr: {{ lr }}}
  hardware: {backend: local, nodes: 1, processes_per_node: 4, device: cpu, memory_gb: 2,
             price_per_hour: PRICE}
  parallelism: {pipeline_stages: 1, data_parallel: 2, schedule: 1f1b}
  checkpoint: {interval: STEPS}
"""


def measured_usd(db: StateDB, run_id: str) -> float:
    row = db.get_run(run_id)
    return run_figures(row, db.events(run_id), time.time()).cost_usd or 0.0


def quickstart(home: Path, steps: int) -> tuple[float, float, str]:
    """The second of two quickstart runs: (predicted, measured) USD and the source."""
    spec = tiny_spec(**{"training.steps": steps, "hardware.price_per_hour": PRICE})
    for _ in range(2):  # the first measures the start-up the second's prediction includes
        pr = make_plan(spec, home=home).prediction
        run, outcome = run_job(spec, home)
        if not outcome.ok:
            raise SystemExit(outcome.message)
    return pr.finish_usd, measured_usd(StateDB(home), run.id), _source(pr)


def fleet(home: Path, steps: int, work: Path) -> tuple[float, float, str]:
    """The fleet's predicted and measured USD (members summed) and the source."""
    path = work / "fleet.yaml"
    path.write_text(FLEET.replace("STEPS", str(steps)).replace("PRICE", str(PRICE)))
    fp = plan_fleet(load_fleet(path))
    done = subprocess.run(
        [*JOBCTL, "fleet", "apply", str(path)],
        env=cli_env(home),
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode:
        raise SystemExit(done.stdout + done.stderr)
    db = StateDB(home)
    runs = [r for r in db.list_runs() if r["name"].startswith("costbench-")]
    got = sum(measured_usd(db, r["id"]) for r in runs)
    return fp.total_cost_usd, got, _source(fp.members[0].plan.prediction)


def _source(pr) -> str:
    start = "no start-up" if pr.startup_s is None else f"start-up {pr.startup_s:.1f} s"
    return f"{pr.source}, {start}"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--calibrate", action="store_true", help="measure a calibration first")
    ap.add_argument("--skip-fleet", action="store_true", help="the quickstart only")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        home, work = Path(tmp) / "home", Path(tmp)
        os.environ["JOBCTL_HOME"] = str(home)  # every plan reads this home's start-up
        if args.calibrate:
            spec_file = write_spec(tiny_spec(), work / "q.yaml")
            subprocess.run([*JOBCTL, "calibrate", str(spec_file)], env=cli_env(home), check=True)
        rows = [("quickstart (2x2)", *quickstart(home, args.steps))]
        if not args.skip_fleet:
            rows.append(("fleet (2 x 1x2)", *fleet(home, args.steps, work)))
    print(
        f"{args.steps} steps at ${PRICE:g} per device-hour; measured = device-hours in "
        f"training phases x price ({QUICKSTART.name})"
    )
    print(f"{'job':<18}{'predicted $':>13}{'measured $':>12}{'ratio':>7}  prediction")
    for name, pred, got, source in rows:
        print(f"{name:<18}{pred:>13.6f}{got:>12.6f}{got / pred:>7.2f}  {source}")


if __name__ == "__main__":
    main()
