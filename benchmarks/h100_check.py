"""The analytic device model against real H100 runs recorded before it changed.

``python -m benchmarks.paper_tables`` prints it after Table 7. The runs are
``benchmarks.gpu_accuracy``'s one-GPU rows as measured on one H100 80GB on 2026-11-26
(reference results in ``benchmarks/gpu/NOTES.md``: a 4 x 2048 GPT, sequence 1024, bf16,
P = D = 1); the prediction is the analytic plan's step from the H100's public facts
alone, so these measurements were never fitted to, and they came before the autocast
gradient path (cast back, fp32 accumulation, the recompute's re-cast) was priced.
"""

from __future__ import annotations

import statistics

from benchmarks.gpu_accuracy import CONFIGS, MODEL, analytic_step
from benchmarks.jobbench import job_spec, layout

# ms per step on the H100, first round of each configuration (NOTES.md, 2026-11-26), in
# the order of gpu_accuracy.CONFIGS' one-GPU rows.
RECORDED_MS = (64.0, 79.2, 65.9, 111.4, 79.7)
H100 = {
    "hardware.device": "cuda",
    "hardware.nodes": 1,
    "hardware.processes_per_node": 1,
    "hardware.memory_gb": 72.0,  # 0.9 x the card's 80 GB, as gpu_accuracy.hardware sets
    "hardware.accelerator": "h100-sxm-80gb",
}


def h100_errors() -> list[tuple[str, float, float]]:
    """(configuration, measured ms, analytic ms) per recorded run."""
    rows = []
    for (P, D, m, B, schedule, extra), real in zip(CONFIGS, RECORDED_MS, strict=False):
        run = {"training.steps": 12, "training.global_batch_size": B}
        spec = job_spec(**{**MODEL, **H100, **run, **layout(P, D, m, schedule, **extra)})
        tag = f"m={m} B={B}" + (" recompute" if extra else "")
        rows.append((tag, real, 1e3 * analytic_step(spec)))
    return rows


def h100_check() -> list[float]:
    """Print the recorded runs against the analytic model; return the relative errors."""
    rows = h100_errors()
    print("\nthe device model vs real H100 runs (bf16 4 x 2048 GPT, P = D = 1,")
    print("benchmarks/gpu/NOTES.md 2026-11-26; recorded, never fitted):")
    print(f"  {'config':<18} {'measured':>9} {'analytic':>9} {'error':>7}")
    errors = []
    for tag, real, pred in rows:
        errors.append(pred / real - 1)
        print(f"  {tag:<18} {real:>7.1f}ms {pred:>7.1f}ms {100 * errors[-1]:>+6.0f}%")
    print(
        f"  median |error| {100 * statistics.median(abs(e) for e in errors):.0f} %; the "
        "rest is eager PyTorch's host cost per action"
    )
    return errors
