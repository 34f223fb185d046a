"""What a user needs from a planner: does it pick the fastest layout, and order them right?

Given, per configuration, the predicted and the measured throughput (samples/s: the
configurations may differ in global batch), ``regret`` is how much slower the measured
throughput of the planner's pick (the highest predicted) is than the best measured
one, and ``kendall_tau`` how well the predicted order agrees with the measured one
(tau-b: 1 the same order, 0 unrelated, -1 reversed; ties count for neither).
``simulator_accuracy`` keeps them in its dated result file (``lib.results``), where
``paper_tables`` reads the newest.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence


def regret(predicted: Sequence[float], measured: Sequence[float]) -> float:
    """1 - measured throughput of the predicted best / the best measured throughput."""
    pick = max(range(len(predicted)), key=lambda i: predicted[i])
    return 1.0 - measured[pick] / max(measured)


def kendall_tau(a: Sequence[float], b: Sequence[float]) -> float:
    """Kendall's tau-b between two orderings of the same items."""
    concordant = discordant = ties_a = ties_b = 0
    n = len(a)
    for i in range(n):
        for j in range(i + 1, n):
            x, y = a[i] - a[j], b[i] - b[j]
            if x == 0 and y == 0:
                continue
            if x == 0:
                ties_a += 1
            elif y == 0:
                ties_b += 1
            elif (x > 0) == (y > 0):
                concordant += 1
            else:
                discordant += 1
    pairs_a = concordant + discordant + ties_b
    pairs_b = concordant + discordant + ties_a
    if pairs_a == 0 or pairs_b == 0:
        return 0.0
    return (concordant - discordant) / math.sqrt(pairs_a * pairs_b)


def summarise(predicted: Sequence[float], measured: Sequence[float]) -> dict:
    """Regret, tau and the absolute error (of throughput) of one benchmark run."""
    errors = sorted(abs(p / m - 1) for p, m in zip(predicted, measured, strict=True))
    mid = len(errors) // 2
    median = errors[mid] if len(errors) % 2 else (errors[mid - 1] + errors[mid]) / 2
    return {
        "created": time.time(),
        "configs": len(errors),
        "regret": regret(predicted, measured),
        "tau": kendall_tau(predicted, measured),
        "median_error": median,
        "max_error": errors[-1],
    }


def report_decisions(runs: Sequence) -> dict:
    """Print and return regret and tau of ``simulator_accuracy``'s runs: (spec, plan,
    tag, measured runs) each; throughput = global batch / step time."""
    predicted, measured = [], []
    for spec, plan, _, seen in runs:
        B = spec.training.global_batch_size
        predicted.append(B / plan.prediction.step_time_s)
        measured.append(B / sorted(x.step_s for x in seen)[len(seen) // 2])
    found = summarise(predicted, measured)
    print(
        f"decision quality over {found['configs']} configs measured interleaved: regret "
        f"{100 * found['regret']:.1f} % (the planner's pick vs the best measured "
        f"throughput; target <= 3 %), Kendall tau {found['tau']:.2f} (target >= 0.8); "
        f"throughput |error| median {100 * found['median_error']:.1f} %, max "
        f"{100 * found['max_error']:.1f} %"
    )
    return found
