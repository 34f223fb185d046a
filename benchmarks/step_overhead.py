"""A CPU rank's fixed per-step costs beside its compute, measured in one process.

schedule_throughput's model and partition (P=2, M=8, m=2), one thread. Per round,
interleaved: the bare compute of a step (each stage's forward and backward of its M
micro-batches, the data included, and both Adam updates), from which the 1F1B bound
``max stage * (M + P - 1) / M + update`` follows; and the runtime's fixed costs of a
step, old and new form side by side: the step's RNG seed (``torch.manual_seed``
against ``runtime.step.seed_rng`` on a CPU, called 30 frames deep as in a worker,
where ``manual_seed``'s traceback capture grows with the depth) and the heartbeat's
RSS (a pathlib read of ``/proc/self/statm`` against ``runtime.vitals``' kept file).
Each figure is the median over rounds; compare the bound with schedule_throughput's
``jobctl 1f1b`` on the same machine.

    python -m benchmarks.step_overhead [--rounds 15]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.schedule_throughput import _spec
from jobctl.engine.data.dataset import make_data
from jobctl.engine.model.blocks import Stage, model_def
from jobctl.engine.planner.resolver import make_plan
from jobctl.engine.runtime import vitals
from jobctl.engine.runtime.optim import build_optimizer
from jobctl.engine.runtime.step import seed_rng

P, M, m = 2, 8, 2
CPU = torch.device("cpu")


def _deep(n: int, f) -> None:
    return _deep(n - 1, f) if n else f()


def _per_call_us(f, calls: int = 200) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        _deep(30, f)
    return (time.perf_counter() - t0) / calls * 1e6


def _pathlib_rss() -> float:
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * resource.getpagesize() / 2**20


class Bare:
    """The two stages, their optimizers and the data of schedule_throughput's job."""

    def __init__(self) -> None:
        spec = _spec(P, M, m, 25, "1f1b", "none")
        plan = make_plan(spec, home=Path(tempfile.mkdtemp(prefix="jobctl-overhead-")))
        mdef = model_def(spec.model, spec.training.seed)
        self.stages = [Stage(mdef, s.blocks, s.keep_blocks) for s in plan.stages]
        self.opts = [build_optimizer(list(s.parameters()), spec.training) for s in self.stages]
        self.data = make_data(spec)

    def step(self, k: int) -> tuple[float, float, float]:
        """Seconds of stage 0, stage 1 and the two updates in step ``k``."""
        s0 = s1 = 0.0
        for o in self.opts:
            o.zero_grad(set_to_none=True)
        first, last = self.stages
        for i in range(M):
            t0 = time.perf_counter()
            x, y = self.data.batch((k * M + i) * m, m)
            a = first(x, first.batch(x, y, 0))
            t1 = time.perf_counter()
            x1 = a.detach().requires_grad_(True)
            _, y1 = self.data.batch((k * M + i) * m, m)  # the last stage reads its targets
            b1 = last.batch(x, y1, 0)
            (last.loss(last(x1, b1), y1, b1) / M).backward()
            t2 = time.perf_counter()
            a.backward(x1.grad)
            s0 += (t1 - t0) + (time.perf_counter() - t2)
            s1 += t2 - t1
        t3 = time.perf_counter()
        for o in self.opts:
            o.step()
        return s0, s1, time.perf_counter() - t3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(1)
    bare, rows = Bare(), []
    for k in range(3):
        bare.step(k)  # warm-up
    for k in range(args.rounds):
        rows.append(
            (
                *bare.step(k),
                _per_call_us(lambda: torch.manual_seed(1234)),
                _per_call_us(lambda: seed_rng(1234, CPU)),
                _per_call_us(_pathlib_rss),
                _per_call_us(vitals._rss_mb),
            )
        )
    s0, s1, upd, seed_old, seed_new, rss_old, rss_new = (
        statistics.median(col) for col in zip(*rows, strict=True)
    )
    bound = max(s0, s1) * (M + P - 1) / M + upd / 2
    print(f"P={P} M={M} m={m}, one thread, median of {args.rounds} rounds:")
    print(
        f"  bare compute per step: stage 0 {1e3 * s0:.1f} ms, stage 1 {1e3 * s1:.1f} ms,"
        f"\n  updates {1e3 * upd:.1f} ms; 1F1B bound {1e3 * bound:.1f} ms/step"
    )
    print(
        f"  step seed: torch.manual_seed {seed_old:.0f} us, seed_rng {seed_new:.0f} us "
        f"({seed_old / seed_new:.0f}x)"
    )
    print(
        f"  heartbeat RSS: pathlib {rss_old:.1f} us, kept statm {rss_new:.1f} us "
        f"({rss_old / rss_new:.0f}x)"
    )


if __name__ == "__main__":
    main()
