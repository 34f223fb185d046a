"""Mobius's MIP partition (sec. 3.2): solve time on a 48-layer model and its step time
against even splits.

A 48-layer GPT (hidden 4096, about 9.7B parameters; 50 blocks with embedding and
head) priced by the analytic calibration of a V100-PCIe (16 GB), on N devices with
M = N micro-batches and the host tier at ``--tier-gbps`` (PCIe 3.0 x16 by default);
the weights alone do not fit the devices, so S > N. The MIP is solved with identical
layers merged (``--max-units``, the paper's merging) and, once, unmerged (every block
a unit; same optimum or better, slower to solve). Printed: the solve times (target:
under 5 s merged; wall and CPU seconds, as this host's cores may be shared), the
MIP's predicted step time, and for comparison the even split
(same number of blocks per stage) at every feasible S, the best of them, and the
paper's baselines of sec. 4.3: minimum-stage (one block per stage) and
maximum-stage (as many blocks per stage as fit). All step times are the partition's
own model (``mobius.planning.costs.step_time``), not a measured run.

    python -m benchmarks run mobius_partition [--devices 4] [--memory-gb 16] [--unmerged]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from jobctl.engine.calibration.analytic import (  # noqa: E402
    analytic_calibration,
    analytic_fingerprint,
)
from jobctl.engine.mobius.planning.costs import (  # noqa: E402
    MobiusConfig,
    even_sizes,
    fits,
    layer_costs,
    merge_identical,
    stage_sums,
    step_time,
)
from jobctl.engine.mobius.planning.partition import mobius_partition  # noqa: E402
from jobctl.spec import load_spec  # noqa: E402

QUESTION = (
    "How long does Mobius's MIP partition take on a 48-layer model, and how much faster "
    "is its step than simpler splits?"
)
BASELINE = (
    "Even splits at every feasible S and the paper's minimum- and maximum-stage "
    "partitions, all priced by the same step model."
)

ROOT = Path(__file__).resolve().parents[2]
GB = 1024**3
MODEL = {
    "model.layers": 48,
    "model.hidden": 4096,
    "model.heads": 32,
    "model.seq_len": 1024,
    "model.vocab": 50257,
    "training.precision": "fp16",
    "training.micro_batch_size": 1,
    "hardware.accelerator": "v100-pcie-16gb",
    "hardware.device": "cuda",
}


def max_stage_sizes(layers, cfg: MobiusConfig) -> list[int]:
    """Greedy: each stage takes as many blocks as fit the device (sec. 4.3)."""
    sizes: list[int] = []
    start = 0
    while start < len(layers):
        n = 1
        while start + n < len(layers) and fits(stage_sums(layers[start:], [n + 1]), cfg):
            n += 1
        sizes.append(n)
        start += n
    return sizes


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, default=4)
    ap.add_argument("--memory-gb", type=float, default=16.0)
    ap.add_argument("--tier-gbps", type=float, default=12.0, help="host tier, GB/s")
    ap.add_argument("--max-units", type=int, default=16, help="MobiusConfig.max_units")
    ap.add_argument("--unmerged", action="store_true", help="also solve every block a unit")
    args = ap.parse_args(argv)
    spec = load_spec(ROOT / "jobs" / "quickstart.yaml", overrides=MODEL)
    cal = analytic_calibration(spec, analytic_fingerprint(spec.hardware, "bench"))
    N = args.devices
    layers = layer_costs(cal, 1, N)
    cfg = MobiusConfig(
        devices=N,
        memory_bytes=args.memory_gb * GB,
        tier_Bps=args.tier_gbps * 1e9,
        micro_batches=N,
        max_units=args.max_units,
    )
    weights = sum(x.upload_b for x in layers) / GB  # a backward upload: the weights alone
    print(f"{len(layers)} blocks, fp16 weights {weights:.1f} GiB, N={N} x {args.memory_gb} GiB")
    part = _solve("merged", layers, cfg)
    print(f"  stage sizes {part.sizes}; re-priced {step_time(layers, part.sizes, cfg):.3f} s")
    if args.unmerged:
        _solve("unmerged", layers, cfg.model_copy(update={"max_units": len(layers)}))
    _compare(layers, cfg, part.step_time_s)


def _solve(name: str, layers, cfg: MobiusConfig):
    """Solve and print wall and CPU seconds (CPU: what an idle core would take, on a
    host whose cores other processes share)."""
    cpu = time.process_time()
    part = mobius_partition(layers, cfg)
    cpu = time.process_time() - cpu
    print(
        f"MIP ({name}, {part.group} blocks/unit): {part.solve_s:.2f} s wall, {cpu:.2f} s CPU,"
        f" S={len(part.stages)}, step {part.step_time_s:.3f} s"
        + ("" if part.optimal else " (time limit: not proven optimal)")
    )
    return part


def _compare(layers, cfg: MobiusConfig, mip: float) -> None:
    rows = []
    for S in range(1, len(layers) + 1):
        t = step_time(layers, even_sizes(len(layers), S), cfg)
        if math.isfinite(t):
            rows.append((f"even S={S}", t))
    best = min(rows, key=lambda r: r[1])
    units, g = merge_identical(layers, cfg.max_units)
    merged = min(
        (step_time(units, even_sizes(len(units), S), cfg), S) for S in range(1, len(units) + 1)
    )
    rows = [r for r in rows if r[0] in {f"even S={k * cfg.devices}" for k in (2, 4, 8)}]
    rows += [("even, best S: " + best[0].split()[-1], best[1])]
    rows += [(f"even {g}-block units, best S={merged[1]}", merged[0])]
    rows += [("min-stage (1 block each)", step_time(layers, [1] * len(layers), cfg))]
    rows += [("max-stage (greedy fill)", step_time(layers, max_stage_sizes(layers, cfg), cfg))]
    print(f"{'partition':<28}{'step s':>10}{'vs MIP':>10}")
    print(f"{'MIP':<28}{mip:>10.3f}{1.0:>10.3f}")
    for name, t in rows:
        print(f"{name:<28}{t:>10.3f}{t / mip:>10.3f}")


if __name__ == "__main__":
    main()
