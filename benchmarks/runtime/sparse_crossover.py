"""Where CSR linear layers start to beat dense ones on this machine (DynPipe Fig. 3.2).

For the transformer-block linear shapes of a job spec (qkv, attention proj, mlp fc, mlp
proj at one micro-batch of tokens), one training micro-batch of every layer is timed
dense (``F.linear`` forward + backward) and CSR (``CsrLinearFn`` forward + backward,
plus gathering the CSR values once per optimizer step, amortised over the micro-batches
one replica runs per step: B / (m x D) with the m and D the job is planned with, as the
trainer amortises it), at a ladder of sparsities, one thread per worker as the runtime
uses. The shapes' tokens are the planned m x seq_len, the key ``auto`` looks up.
Prints the CSR / dense time ratio per sparsity and shape and, last, each shape's
crossover (the lowest sparsity from which CSR takes at most 90 % of dense time at every
higher one). The crossovers are written to the state home's calibration cache, where
``pruning.sparse_threshold: auto`` reads them (a run measures a missing shape itself).

    python -m benchmarks run sparse_crossover [jobs/pruning.yaml] [--hidden 512] [--repeat 20]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from jobctl.engine.planner.resolver import make_plan
from jobctl.engine.pruning.crossover import (
    SPARSITIES,
    entry,
    load,
    measure,
    record_path,
    save,
    shape_key,
)
from jobctl.spec import load_spec

QUESTION = (
    "From what sparsity do CSR linear layers beat dense ones on this machine (the "
    "crossovers pruning.sparse_threshold: auto reads)?"
)
BASELINE = "Dense F.linear forward + backward of the same shapes."


def shapes(hidden: int, tokens: int) -> list[tuple[int, int, int]]:
    """(out, in, tokens) of a GPT block's four linear layers."""
    h = hidden
    return [(3 * h, h, tokens), (h, h, tokens), (4 * h, h, tokens), (h, 4 * h, tokens)]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("spec", nargs="?", default="jobs/pruning.yaml")
    ap.add_argument("--hidden", type=int, default=None, help="override the model width")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--home", type=Path, default=None, help="state home (cache) to write")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    spec = load_spec(args.spec)
    hidden = args.hidden or spec.model.hidden
    plan = make_plan(spec)  # the m and D the trainer runs with (pruner._per_step)
    micro = plan.micro_batch_size
    tokens = micro * spec.model.seq_len
    per_step = max(1, spec.training.global_batch_size // (micro * plan.D))
    device = torch.device("cpu")
    path = record_path(args.home, device)
    records = load(path)
    title = f"CSR / dense fwd+bwd time, {tokens} tokens, gather / {per_step} micro-batches"
    table = Table(title=f"{title} (m={micro}, D={plan.D})")
    table.add_column("shape (out x in)")
    for s in SPARSITIES:
        table.add_column(f"{100 * s:.0f} %", justify="right")
    table.add_column("crossover", justify="right")
    for shape in shapes(hidden, tokens):
        ratios = measure(shape, per_step, args.repeat, device, stop_early=False)
        records[shape_key(shape)] = entry(ratios)
        x = records[shape_key(shape)]["crossover"]
        table.add_row(
            f"{shape[0]} x {shape[1]}",
            *(f"{ratios[s]:.2f}" for s in SPARSITIES),
            "none" if x is None else f"{100 * x:.0f} %",
        )
    save(path, records, device)
    console = Console()
    console.print(table)
    console.print(f"wrote {path} (read by pruning.sparse_threshold: auto)", highlight=False)
    for shape in shapes(hidden, tokens):
        x = records[shape_key(shape)]["crossover"]
        where = "none: dense always wins" if x is None else f"{100 * x:.0f} % sparsity"
        console.print(f"crossover {shape[0]} x {shape[1]}: {where}", highlight=False)


if __name__ == "__main__":
    main()
