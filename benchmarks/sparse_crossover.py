"""Where CSR linear layers start to beat dense ones on this machine (DynPipe Fig. 3.2).

For the transformer-block linear shapes of a job spec (qkv, attention proj, mlp fc, mlp
proj at one micro-batch of tokens), one training micro-batch of every layer is timed
dense (``F.linear`` forward + backward) and CSR (``CsrLinearFn`` forward + backward,
plus rebuilding the CSR copies once per optimizer step, amortised over the step's
micro-batches), at a range of sparsities, in the same run, one thread per worker as
the runtime uses. Prints the CSR / dense time ratio per sparsity and, last, the
crossover sparsity (the lowest measured sparsity from which CSR is faster at every
higher one), or that CSR never wins at these sizes.

    python benchmarks/sparse_crossover.py [jobs/pruning.yaml] [--hidden 512] [--repeat 20]
"""

from __future__ import annotations

import argparse
import time
import warnings

import torch
import torch.nn.functional as F  # noqa: N812
from rich.console import Console
from rich.table import Table

from jobctl.engine.pruning_sparse import CsrWeights, csr_linear
from jobctl.spec import load_spec

SPARSITIES = [0.5, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99]


def shapes(hidden: int) -> list[tuple[int, int]]:
    """(out, in) of a GPT block's four linear layers."""
    return [(3 * hidden, hidden), (hidden, hidden), (4 * hidden, hidden), (hidden, 4 * hidden)]


def _best(fn, repeat: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def time_layer(out_f, in_f, tokens, sparsity, micro_batches, repeat) -> tuple[float, float]:
    """Seconds per micro-batch (dense, csr) of one layer's forward + backward."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, in_f, generator=g, requires_grad=True)
    w = torch.randn(out_f, in_f, generator=g, requires_grad=True)
    b = torch.zeros(out_f, requires_grad=True)
    mask = torch.rand(out_f, in_f, generator=g) >= sparsity
    with torch.no_grad():
        w.mul_(mask)
    grad = torch.randn(tokens, out_f, generator=g)
    csr = CsrWeights(w, mask)

    def dense():
        F.linear(x, w, b).backward(grad)

    def sparse():
        csr_linear(x, w, b, csr).backward(grad)

    rebuild = _best(lambda: csr.refresh(w), repeat)
    return _best(dense, repeat), _best(sparse, repeat) + rebuild / micro_batches


def crossover(ratios: dict[float, float]) -> float | None:
    """Lowest sparsity from which CSR (ratio < 1) wins at every higher measured one."""
    found = None
    for s in sorted(ratios, reverse=True):
        if ratios[s] >= 1.0:
            break
        found = s
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("spec", nargs="?", default="jobs/pruning.yaml")
    ap.add_argument("--hidden", type=int, default=None, help="override the model width")
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
    torch.set_num_threads(1)
    spec = load_spec(args.spec)
    hidden = args.hidden or spec.model.hidden
    micro = spec.training.micro_batch_size
    micro = micro if isinstance(micro, int) else 1
    tokens = micro * spec.model.seq_len
    per_step = max(1, spec.training.global_batch_size // micro)
    table = Table(title=f"CSR vs dense linear fwd+bwd, hidden {hidden}, {tokens} tokens")
    for col in ("sparsity", "dense ms", "csr ms", "csr / dense"):
        table.add_column(col, justify="right")
    ratios: dict[float, float] = {}
    for s in SPARSITIES:
        dense = csr = 0.0
        for out_f, in_f in shapes(hidden):
            d, c = time_layer(out_f, in_f, tokens, s, per_step, args.repeat)
            dense, csr = dense + d, csr + c
        ratios[s] = csr / dense
        table.add_row(
            f"{100 * s:.0f} %", f"{1e3 * dense:.3f}", f"{1e3 * csr:.3f}", f"{csr / dense:.2f}"
        )
    console = Console()
    console.print(table)
    x = crossover(ratios)
    best = min(ratios, key=ratios.get)
    if x is None:
        console.print(
            f"crossover: none - CSR never beats dense here (best ratio {ratios[best]:.2f} at "
            f"{100 * best:.0f} % sparsity); keep dense (pruning.sparse_threshold is opt-in)"
        )
    else:
        console.print(
            f"crossover: {100 * x:.0f} % sparsity (CSR / dense {ratios[x]:.2f} there, "
            f"{ratios[best]:.2f} at {100 * best:.0f} %)"
        )


if __name__ == "__main__":
    main()
