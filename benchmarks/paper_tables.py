"""The planner against Varuna's published numbers (Table 7, sec. 7.2), and its decisions here.

1. Table 7: Varuna's 12 measured mini-batch times of GPT-2 2.5B and 8.3B on
   commodity VMs, predicted by jobctl's analytic source alone. The specs are written
   here from what the paper states (sec. 7): NC24_v3 VMs, 4 x V100 16 GB on PCIe per
   VM (``hardware.accelerator: v100-pcie-16gb``, public device facts in
   ``spec/devices.py``), 10 Gbps Ethernet between VMs, fp16, global batch 8192, the
   Varuna schedule, the models of Megatron-LM's Table 1 (2.5B: 54 layers of 1920, 20
   heads; 8.3B: 72 of 3072, 32 heads; sequence 1024, GPT-2's vocabulary of 50257). The
   paper states no micro-batch size for Table 7; sec. 7.2's 128-GPU simulations run
   1170-2731 micro-batches of a batch of 8192, i.e. m = 1, so m = 1 is the main column
   and the planner's own m (Varuna's rule: the smallest m at which F(m)/m stops
   improving) is printed beside it. Within a VM ranks are placed pipeline-major
   (consecutive stages share a VM and its PCIe links; the paper does not say). PCIe
   3.0 x16 carries 126 Gbit/s (15.75 GB/s, PCI-SIG); the latency (50 us) is jobctl's
   default, the paper gives none. Nothing is fitted to the table.
2. Simulator speed at m = 1 in sec. 7.2's setting (128 GPUs, batch 8192, P = 18, 24,
   36, D = G // P, M = ceil(8192 / D)): the steady-state simulation and the full one,
   interleaved, strict and opportunistic.
3. Decision quality on this machine: the regret and Kendall's tau of the planner's
   order against real runs, from the last ``python -m benchmarks.simulator_accuracy``
   (its summary file; this script does not start real runs).

    python -m benchmarks.paper_tables [--repeat 5] [--out DIR]
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.decision_quality import SUMMARY, read_summary
from jobctl.engine.planner.resolver import make_plan
from jobctl.engine.planner.simulator.simulation import CostModel, simulate
from jobctl.engine.planner.simulator.steady import steady_simulate
from jobctl.engine.schedule.generators import generate
from jobctl.spec import load_spec

MODELS = {"8.3B": (72, 3072, 32), "2.5B": (54, 1920, 20)}  # layers, hidden, heads
TABLE7 = [  # model, P, D, Varuna's estimate, measured (s per mini-batch)
    ("8.3B", 36, 3, 142.8, 140.3),
    ("8.3B", 36, 2, 198.7, 201.3),
    ("8.3B", 36, 1, 368.3, 390.0),
    ("8.3B", 24, 4, 144.7, 149.9),
    ("8.3B", 24, 2, 272.4, 280.4),
    ("8.3B", 18, 6, 139.6, 139.1),
    ("8.3B", 18, 4, 202.6, 203.1),
    ("8.3B", 18, 3, 266.6, 263.8),
    ("2.5B", 27, 2, 115.7, 116.8),
    ("2.5B", 18, 3, 92.6, 96.6),
    ("2.5B", 9, 7, 68.9, 70.1),
    ("2.5B", 6, 10, 77.5, 75.2),
]
VARUNA_SIM_MS = {18: 391.0, 24: 376.0, 36: 660.0}  # sec. 7.2
TARGETS = "targets: median |error| <= 5 %, max <= 10 %"

SPEC = """\
name: varuna-{name}-{P}x{D}
model: {{family: gpt, layers: {L}, hidden: {h}, heads: {a}, seq_len: 1024, vocab: 50257,
        dropout: 0.1}}
training: {{global_batch_size: 8192, micro_batch_size: {m}, steps: 100, precision: fp16}}
hardware:
  backend: slurm
  nodes: {nodes}
  processes_per_node: 4
  device: cuda
  accelerator: v100-pcie-16gb
  memory_gb: 16
  interconnect: {{intra_node_gbps: 126, inter_node_gbps: 10, latency_us: 50}}
parallelism: {{pipeline_stages: {P}, data_parallel: {D}, schedule: varuna,
              placement: pipeline_major}}
"""


def write_spec(folder: Path, name: str, P: int, D: int, m: int | str) -> Path:
    """One Table 7 configuration as a job spec file."""
    L, h, a = MODELS[name]
    path = folder / f"varuna-{name}-{P}x{D}-m{m}.yaml"
    nodes = math.ceil(P * D / 4)
    path.write_text(SPEC.format(name=name.replace(".", "-").lower(), P=P, D=D, L=L, h=h,
                                a=a, m=m, nodes=nodes))  # fmt: skip
    return path


def table7(folder: Path) -> None:
    """Print Table 7 with jobctl's analytic predictions at m = 1 and at its own m."""
    print(f"Varuna Table 7, analytic source ({folder}):")
    print(f"{'model':<5} {'PxD':>5} {'Varuna':>7} {'measured':>8} {'m=1':>7} {'err':>6} "
          f"{'own m':>5} {'pred':>7} {'err':>6}")  # fmt: skip
    errors: dict[str, list[float]] = {"1": [], "own": []}
    for name, P, D, varuna, real in TABLE7:
        one = make_plan(load_spec(write_spec(folder, name, P, D, 1)))
        own = make_plan(load_spec(write_spec(folder, name, P, D, "auto")))
        e1, e2 = (p.prediction.step_time_s / real - 1 for p in (one, own))
        errors["1"].append(abs(e1))
        errors["own"].append(abs(e2))
        print(f"{name:<5} {P:>2}x{D:<2} {varuna:>7.1f} {real:>8.1f} "
              f"{one.prediction.step_time_s:>7.1f} {100 * e1:>+5.1f}% "
              f"{own.micro_batch_size:>5} {own.prediction.step_time_s:>7.1f} {100 * e2:>+5.1f}%",
              flush=True)  # fmt: skip
    for key, label in (("1", "m = 1"), ("own", "planner's m")):
        med, worst = statistics.median(errors[key]), max(errors[key])
        print(f"analytic vs measured, {label}: median |error| {100 * med:.1f} %, max "
              f"{100 * worst:.1f} % ({TARGETS}; Varuna's own simulator: 5.6 % max)")  # fmt: skip


def best_ms(run, repeat: int) -> float:
    """Fastest of ``repeat`` runs, in ms."""
    out = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        out.append(time.perf_counter() - start)
    return 1e3 * min(out)


def simulator_speed(repeat: int) -> None:
    """Sec. 7.2's setting at m = 1: steady-state and full simulation, interleaved."""
    print("\nsimulator at m = 1, 128 GPUs, batch 8192 (Varuna sec. 7.2), best of "
          f"{repeat}; schedules generated beforehand:")  # fmt: skip
    print(f"{'P':>3} {'D':>2} {'M':>5} {'mode':<9} {'steady':>8} {'full':>8} {'same':>5} "
          f"{'Varuna':>7}")  # fmt: skip
    worst = 0.0
    for P, varuna_ms in VARUNA_SIM_MS.items():
        D = 128 // P
        M = math.ceil(8192 / D)
        make = lambda n, P=P: generate("varuna", P, n)  # noqa: E731
        for n in {M, *range(2 * P + 12, 2 * P + 12 + 200)}:
            make(n)  # warm the generator's cache: this measures the simulator
        for mode in ("strict", "opportun."):
            costs = CostModel.uniform(P, comm=0.2, ar=(5.0,) * P, opt=(1.0,) * P,
                                      opportunistic=mode != "strict")  # fmt: skip
            fast = steady_simulate(make, M, costs)
            full = simulate(make(M), costs)
            steady_ms = best_ms(lambda m=make, c=costs, M=M: steady_simulate(m, M, c), repeat)
            full_ms = best_ms(lambda m=make, c=costs, M=M: simulate(m(M), c), max(1, repeat // 2))
            same = abs(fast.step_time - full.step_time) <= 1e-9 * full.step_time
            worst = max(worst, steady_ms)
            print(f"{P:>3} {D:>2} {M:>5} {mode:<9} {steady_ms:>6.1f}ms {full_ms:>6.0f}ms "
                  f"{'yes' if same else 'NO':>5} {varuna_ms:>5.0f}ms", flush=True)  # fmt: skip
    print(f"slowest steady-state simulation {worst:.1f} ms (target 20 ms)")


def decisions() -> None:
    """The last simulator_accuracy run's regret and Kendall tau on this machine."""
    found = read_summary()
    print("\ndecision quality on this machine (python -m benchmarks.simulator_accuracy):")
    if found is None:
        print(f"  no summary at {SUMMARY}: run python -m benchmarks.simulator_accuracy")
        return
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(found["created"]))
    print(f"  {when}, {found['configs']} configs: regret {100 * found['regret']:.1f} % "
          f"(target <= 3 %), Kendall tau {found['tau']:.2f} (target >= 0.8), "
          f"absolute |error| median {100 * found['median_error']:.1f} %, max "
          f"{100 * found['max_error']:.1f} %")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs per timing (best kept)")
    parser.add_argument("--out", type=Path, default=None, help="keep the specs here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="jobctl-varuna-") as tmp:
        folder = args.out or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        table7(folder)
    simulator_speed(args.repeat)
    decisions()


if __name__ == "__main__":
    main()
