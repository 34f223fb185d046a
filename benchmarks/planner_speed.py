"""How fast the planner's full search is for an 8.3B GPT-like model on 1,024 and 8,192 GPUs.

The model and pool are analytic (a laptop plans the job): 72 blocks of width 3072,
seq 1024, vocab 50257 (Varuna's 8.3B GPT-2), 16 GB GPUs at 125 TFLOP/s, 4 per node,
global batch 8192, everything ``auto``: m by F(m)/m, P swept from the smallest that
fits to 74, every schedule simulated where its bound can still win. Targets: under
1 s for G=1024 and under 10 s for G=8192; for scale, PipeDream's optimizer takes 8 s
for 16 GPUs and Varuna's simulator 376-660 ms per single configuration for 128 GPUs
(Varuna sec. 4 and 7.2). Each figure is the best of ``--repeat`` runs.

    python benchmarks/planner_speed.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import time

from jobctl.engine.planner.resolver import make_plan
from jobctl.spec import load_spec_text

GPT_8B = """
name: gpt-8b
model: {family: gpt, layers: 72, hidden: 3072, heads: 32, seq_len: 1024, vocab: 50257}
training: {global_batch_size: 8192, micro_batch_size: auto, steps: 1000, precision: bf16}
hardware:
  backend: slurm
  nodes: 2048
  processes_per_node: 4
  device: cuda
  memory_gb: 16
  flops_tflops: 125
  price_per_hour: 0.9
  interconnect: {intra_node_gbps: 128, inter_node_gbps: 25, latency_us: 30}
parallelism: {pipeline_stages: auto, data_parallel: auto, schedule: auto, recompute: auto}
"""
TARGETS_S = {1024: 1.0, 8192: 10.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure (best is kept)")
    repeat = parser.parse_args().repeat
    spec = load_spec_text(GPT_8B)
    ratios = []
    for G, target in TARGETS_S.items():
        best = float("inf")
        for _ in range(repeat):
            start = time.perf_counter()
            plan = make_plan(spec, G)
            best = min(best, time.perf_counter() - start)
        pr = plan.prediction
        simulated = sum(1 for a in plan.alternatives if a.step_time_s is not None) + 1
        print(
            f"G={G:>5}: {best:6.3f} s  -> {plan.summary()} on {plan.world_size} GPUs, "
            f"{pr.step_time_s:.2f} s/step, {pr.samples_per_s:.0f} samples/s "
            f"({len(plan.explanation)} reasoning lines, >= {simulated} layouts simulated)"
        )
        ratios.append(f"G={G}: {target / best:.1f}x under its {target:.0f} s target")
    print("planner full search vs targets: " + ", ".join(ratios))


if __name__ == "__main__":
    main()
