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
   improving) gets a summary line (it picks m > 1, faster than the m = 1 measured).
   Within a VM ranks are placed pipeline-major
   (consecutive stages share a VM and its PCIe links; the paper does not say). PCIe
   3.0 x16 carries 126 Gbit/s (15.75 GB/s, PCI-SIG); the latency (50 us) is jobctl's
   default, the paper gives none.

   The device model prices kernels in isolation (cuBLAS's large-GEMM share of the
   peak, the measured copy bandwidth); alone it is 13-27 % fast on every row. Row by
   row (the busy / idle / tail columns): compute is 93-99.6 % of each step; the bubble
   (M >= 820 micro-batches) is under 1.5 %; the allreduce and optimizer tail 0.2-7 %,
   so neither the NIC share (10 Gbps per VM over its 4 GPUs) nor the bubble explains
   the gap. A whole step sustains a share of the isolated rates (clocks under a
   sustained power cap, host stalls between kernels); no public figure gives it for
   Varuna's stack, so it is calibrated, never on the row it predicts: each row's
   share is the one at which the median predicted / measured ratio of the 11 other
   rows is 1 (leave-one-out), and a stricter split takes it from one model's rows
   and reports the other's. The residual is structural: at P = 36 (8.3B) the
   planner's bottleneck is the last stage (two layers and the 50257-wide head,
   without recompute) and it predicts 3-8 % slow, at P = 18 a middle stage and
   8-10 % fast, so the real head costs less relative to a layer than modelled
   (Varuna's Megatron fork runs unfused attention, which makes layers dearer; the
   spec cannot say so yet).
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
from jobctl.engine.calibration.analytic import analytic_calibration, analytic_fingerprint, derate
from jobctl.engine.calibration.cache import model_hash
from jobctl.engine.calibration.record import Calibration
from jobctl.engine.core.plan import Plan
from jobctl.engine.planner.resolver import plan_priced
from jobctl.engine.planner.simulator.simulation import CostModel, SimResult, simulate
from jobctl.engine.planner.simulator.steady import steady_simulate
from jobctl.engine.planner.stage_costs import generated
from jobctl.spec import JobSpec, load_spec

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
PROBE = 0.5  # each row is also planned at this sustained share (``curves``)
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


def analytic(spec: JobSpec, share: float = 1.0) -> Calibration:
    """The analytic calibration of ``spec`` with its kernels at ``share`` of the device
    model's rates (``calibration.analytic.derate``; 1: the device model as is)."""
    cal = analytic_calibration(spec, analytic_fingerprint(spec.hardware, model_hash(spec)))
    return cal if share == 1.0 else derate(cal, share)


def predict(folder: Path, row: tuple, share: float, m: int | str = 1) -> tuple[Plan, SimResult]:
    """The planner's plan and simulated step of one Table 7 row at ``share``."""
    name, P, D = row[:3]
    spec = load_spec(write_spec(folder, name, P, D, m))
    plan, sim, _ = plan_priced(spec, calibration=analytic(spec, share))
    return plan, sim


def curves(folder: Path) -> list[tuple[float, float]]:
    """Per row, (a, b) with step(k) ~ a + b / k: compute scales with 1 / share, links
    and allreduces do not. From two plans, at share 1 and at ``PROBE``."""
    out = []
    for row in TABLE7:
        one = predict(folder, row, 1.0)[1].step_time
        probe = predict(folder, row, PROBE)[1].step_time
        b = (probe - one) / (1 / PROBE - 1)
        out.append((one - b, b))
    return out


def calibrate(lines: list[tuple[float, float]], rows: list[int]) -> float:
    """The share at which the median predicted / measured ratio over ``rows`` (only
    those: the rows it is tested on are left out) is 1, by bisection (every ratio
    falls as the share grows); 1 where the device model is already slow enough."""

    def ratio(k: float) -> float:
        return statistics.median((lines[i][0] + lines[i][1] / k) / TABLE7[i][4] for i in rows)

    lo, hi = 0.05, 1.0
    if ratio(hi) >= 1.0:
        return hi
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if ratio(mid) > 1.0 else (lo, mid)
    return (lo + hi) / 2


def table7(folder: Path) -> dict[str, list[float]]:
    """Table 7 from the analytic source: the device model alone, then with the sustained
    share calibrated on the 11 other rows (leave-one-out: every error printed is on a
    row the share never saw), and where the time goes; then by model (share from one
    model's rows, errors on the other's). Returns the |errors| by kind."""
    print(f"Varuna Table 7, analytic source, m = 1 ({folder}):")
    print(f"{'model':<5} {'PxD':>5} {'real':>6} {'k=1':>6} {'err':>6} {'share':>5} "
          f"{'pred':>6} {'err':>6} {'busy':>6} {'idle':>5} {'tail':>5}")  # fmt: skip
    lines = curves(folder)
    errors: dict[str, list[float]] = {"device": [], "loo": [], "own": [], "model": []}
    everyone = range(len(TABLE7))
    for i, row in enumerate(TABLE7):
        name, P, D, _, real = row
        k = calibrate(lines, [j for j in everyone if j != i])
        _, sim = predict(folder, row, k)
        device = lines[i][0] + lines[i][1]
        e0, e1 = device / real - 1, sim.step_time / real - 1
        errors["device"].append(abs(e0))
        errors["loo"].append(abs(e1))
        own = predict(folder, row, k, "auto")[0].prediction.step_time_s
        errors["own"].append(abs(own / real - 1))
        busy = max(sim.busy)
        print(f"{name:<5} {P:>2}x{D:<2} {real:>6.1f} {device:>6.1f} {100 * e0:>+5.1f}% "
              f"{k:>5.3f} {sim.step_time:>6.1f} {100 * e1:>+5.1f}% {busy:>6.1f} "
              f"{sim.pipeline_time - busy:>5.1f} {sim.step_time - sim.pipeline_time:>5.1f}",
              flush=True)  # fmt: skip
    print("busy: the busiest stage's compute; idle: its bubble; tail: allreduce + optimizer")
    by_model(folder, lines, errors["model"])
    for key, label in (
        ("device", "device model alone (share 1)"),
        ("loo", "share left-one-out, m = 1"),
        ("own", "share left-one-out, planner's m"),
        ("model", "share from the other model's rows"),
    ):
        med, worst = statistics.median(errors[key]), max(errors[key])
        print(f"{label:<34}: median |error| {100 * med:4.1f} %, max {100 * worst:4.1f} %")
    print(f"({TARGETS}; Varuna's own simulator: 5.6 % max)")
    return errors


def by_model(folder: Path, lines: list[tuple[float, float]], errors: list[float]) -> None:
    """The share calibrated on one model's rows, the errors on the other model's."""
    for source, target in (("2.5B", "8.3B"), ("8.3B", "2.5B")):
        k = calibrate(lines, [i for i, r in enumerate(TABLE7) if r[0] == source])
        rows = [r for r in TABLE7 if r[0] == target]
        errs = [abs(predict(folder, r, k)[1].step_time / r[4] - 1) for r in rows]
        errors += errs
        print(f"share from the {source} rows {k:.3f}: {target} rows median |error| "
              f"{100 * statistics.median(errs):.1f} %, max {100 * max(errs):.1f} %")


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
        # The search's cached schedules (generate() caches nothing; the first steady run
        # below fills the cache): this times the simulator.
        make = lambda n, P=P: generated("varuna", P, n, ())  # noqa: E731
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
