"""Exact contiguous partition of cut-point costs into pipeline stages.

A pipeline runs at the pace of its slowest stage, so the partition minimises the
largest stage cost (the bottleneck). This is the classic linear-partition problem,
solved exactly: the optimal bottleneck is one of the O(n^2) contiguous sums; binary
search over them with a greedy feasibility check finds it in O(n^2 log n) worst case
(O(n log S) typical). Among partitions with the optimal bottleneck we take the one that
also minimises the second criterion a greedy fill would ignore: the sum of squared
stage costs, by a small DP restricted to the bottleneck.
"""

from __future__ import annotations

from bisect import bisect_right
from itertools import accumulate


def _fits(costs: list[float], parts: int, cap: float) -> bool:
    """Can ``costs`` be cut into at most ``parts`` contiguous runs, each <= cap?"""
    used, run = 1, 0.0
    for c in costs:
        if c > cap:
            return False
        if run + c > cap:
            used, run = used + 1, c
            if used > parts:
                return False
        else:
            run += c
    return True


def bottleneck(costs: list[float], parts: int) -> float:
    """Smallest achievable max stage cost when cutting ``costs`` into ``parts`` runs."""
    prefix = [0.0, *accumulate(costs)]
    n = len(costs)
    candidates = sorted({prefix[j] - prefix[i] for i in range(n) for j in range(i + 1, n + 1)})
    lo, hi = 0, len(candidates) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if _fits(costs, parts, candidates[mid] + 1e-12 * candidates[mid]):
            hi = mid
        else:
            lo = mid + 1
    return candidates[lo]


def partition(costs: list[float], parts: int) -> list[list[int]]:
    """Split indices ``0..n-1`` into ``parts`` non-empty contiguous runs, min-max optimal.

    Raises ``ValueError`` when ``parts`` exceeds the number of cut-point sections.
    """
    n = len(costs)
    if not 1 <= parts <= n:
        raise ValueError(f"cannot split {n} blocks into {parts} stages (1..{n} possible)")
    cap = bottleneck(costs, parts) * (1 + 1e-9) + 1e-15
    prefix = [0.0, *accumulate(costs)]
    inf = float("inf")
    # best[k][j]: min sum of squares splitting the first j items into k runs each <= cap.
    best = [[inf] * (n + 1) for _ in range(parts + 1)]
    cut = [[0] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = 0.0
    for k in range(1, parts + 1):
        for j in range(k, n - (parts - k) + 1):
            lo_i = bisect_right(prefix, prefix[j] - cap - 1e-15, 0, j)
            for i in range(max(lo_i, k - 1), j):
                if best[k - 1][i] == inf:
                    continue
                run = prefix[j] - prefix[i]
                val = best[k - 1][i] + run * run
                if val < best[k][j]:
                    best[k][j], cut[k][j] = val, i
    bounds, j = [], n
    for k in range(parts, 0, -1):
        i = cut[k][j]
        bounds.append(list(range(i, j)))
        j = i
    return bounds[::-1]


def stage_costs(costs: list[float], stages: list[list[int]]) -> list[float]:
    """Total cost of each stage."""
    return [sum(costs[i] for i in s) for s in stages]
