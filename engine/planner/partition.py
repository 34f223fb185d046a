"""Exact contiguous partition of cut-point costs into pipeline stages.

A pipeline runs at the pace of its slowest stage, so the partition minimises the
largest stage cost (the bottleneck). This is the classic linear-partition problem,
solved exactly: the optimal bottleneck is one of the O(n^2) contiguous sums; binary
search over them with a greedy feasibility check finds it in O(n^2 log n) worst case
(O(n log S) typical). Among partitions with the optimal bottleneck we take the one that
also minimises the second criterion a greedy fill would ignore: the sum of squared
stage costs, by a small DP restricted to the bottleneck.

The last stage may cost differently per block (``last``): under Varuna's schedule it
does not recompute, so a block costs it forward + backward where it costs every other
stage forward, recompute and backward. The bottleneck is then the least cap for which
the shortest last stage within the cap leaves a prefix that fits the other stages.
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


def bottleneck(costs: list[float], parts: int, last: list[float] | None = None) -> float:
    """Smallest achievable max stage cost when cutting ``costs`` into ``parts`` runs
    (the last run priced by ``last``, default ``costs``)."""
    last = costs if last is None else last
    prefix = [0.0, *accumulate(costs)]
    tail = [0.0, *accumulate(last)]
    n = len(costs)
    sums = {prefix[j] - prefix[i] for i in range(n) for j in range(i + 1, n + 1)}
    sums |= {tail[n] - tail[i] for i in range(n)}
    candidates = sorted(sums)
    lo, hi = 0, len(candidates) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if _fits_with_last(costs, tail, parts, candidates[mid] * (1 + 1e-12)):
            hi = mid
        else:
            lo = mid + 1
    return candidates[lo]


def _fits_with_last(costs: list[float], tail: list[float], parts: int, cap: float) -> bool:
    """Is there a last run within ``cap`` (priced by ``tail``'s prefix sums) whose prefix
    fits the other ``parts - 1`` runs? The shortest such prefix is the easiest."""
    n = len(costs)
    j = next((j for j in range(n) if tail[n] - tail[j] <= cap), None)
    if j is None:
        return False
    j = max(j, parts - 1)  # every earlier run needs a block
    if parts == 1:
        return j == 0
    return j < n and _fits(costs[:j], parts - 1, cap)


def partition(costs: list[float], parts: int, last: list[float] | None = None) -> list[list[int]]:
    """Split indices ``0..n-1`` into ``parts`` non-empty contiguous runs, min-max optimal
    (the last run priced by ``last`` when given).

    Raises ``ValueError`` when ``parts`` exceeds the number of cut-point sections.
    """
    n = len(costs)
    if not 1 <= parts <= n:
        raise ValueError(f"cannot split {n} blocks into {parts} stages (1..{n} possible)")
    last = costs if last is None else last
    cap = bottleneck(costs, parts, last) * (1 + 1e-9) + 1e-15
    prefix = [0.0, *accumulate(costs)]
    tail = [0.0, *accumulate(last)]
    inf = float("inf")
    # best[k][j]: min sum of squares splitting the first j items into k runs each <= cap.
    best = [[inf] * (n + 1) for _ in range(parts + 1)]
    cut = [[0] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = 0.0
    for k in range(1, parts + 1):
        for j in range(k, n - (parts - k) + 1):
            pre = tail if k == parts else prefix
            lo_i = bisect_right(pre, pre[j] - cap - 1e-15, 0, j)
            for i in range(max(lo_i, k - 1), j):
                if best[k - 1][i] == inf:
                    continue
                run = tail[j] - tail[i] if k == parts else prefix[j] - prefix[i]
                if run > cap:
                    continue
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
