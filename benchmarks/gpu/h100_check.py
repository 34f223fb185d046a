"""The analytic device model against real H100 runs recorded before it changed.

``python -m benchmarks run paper_tables`` prints it after Table 7; ``run h100_check``
prints it alone. The runs are ``gpu_accuracy``'s one-GPU rows as measured on one H100
80GB, read from the newest ``gpu_accuracy`` result file for that device in
``benchmarks/results`` (the first: ``2026-11-26-gpu_accuracy-h100-sxm-80gb.json``, a
4 x 2048 GPT, sequence 1024, bf16, P = D = 1). The prediction is the analytic plan's
step from the H100's public facts alone, so these measurements were never fitted to;
the 2026-11-26 ones came before the autocast gradient path (cast back, fp32
accumulation, the recompute's re-cast) was priced.

    python -m benchmarks run h100_check
"""

from __future__ import annotations

import argparse
import statistics

from benchmarks.gpu.gpu_accuracy import MODEL, analytic_step
from benchmarks.lib import results
from benchmarks.lib.jobbench import job_spec, layout

QUESTION = "How close is the analytic device model to real H100 runs recorded before it changed?"
BASELINE = (
    "gpu_accuracy's one-GPU runs on one H100 80GB, read from the newest result file in "
    "benchmarks/results."
)
DEVICE = "h100-sxm-80gb"
H100 = {
    "hardware.device": "cuda",
    "hardware.nodes": 1,
    "hardware.processes_per_node": 1,
    "hardware.memory_gb": 72.0,  # 0.9 x the card's 80 GB, as gpu_accuracy.hardware sets
    "hardware.accelerator": DEVICE,
}


def recorded() -> dict:
    """The newest gpu_accuracy result on an H100, or SystemExit saying none is there."""
    found = results.latest("gpu_accuracy", DEVICE)
    if found is None:
        raise SystemExit(f"no gpu_accuracy result for {DEVICE} in {results.folder()}")
    return found


def h100_errors() -> list[tuple[str, float, float]]:
    """(configuration, measured ms, analytic ms) per recorded one-GPU run (its first
    round: the one the analytic model was first compared against)."""
    rows = []
    for row in recorded()["figures"]["configs"]:
        P, D, m, schedule = row["layout"]
        if P * D != 1:
            continue
        run = {"training.steps": 12, "training.global_batch_size": row["global_batch"]}
        over = {**MODEL, **H100, **run, **layout(P, D, m, schedule, **row["overrides"])}
        tag = f"m={m} B={row['global_batch']}" + (" recompute" if row["overrides"] else "")
        rows.append((tag, row["measured_ms"][0], 1e3 * analytic_step(job_spec(**over))))
    return rows


def h100_check() -> list[float]:
    """Print the recorded runs against the analytic model; return the relative errors."""
    rows = h100_errors()
    when = recorded()["date"]
    print("\nthe device model vs real H100 runs (bf16 4 x 2048 GPT, P = D = 1,")
    print(f"benchmarks/results gpu_accuracy {when}; recorded, never fitted):")
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


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    h100_check()


if __name__ == "__main__":
    main()
