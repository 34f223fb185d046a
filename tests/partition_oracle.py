"""The stage partition's oracle, shared by tests/unit/test_partition.py and
benchmarks/planner/partition_optimality.py: the min-max bottleneck by enumerating every cut."""

from __future__ import annotations

import itertools


def brute_force(costs: list[float], parts: int) -> float:
    """Smallest bottleneck over every way to cut ``costs`` into ``parts`` runs."""
    n = len(costs)
    best = float("inf")
    for cuts in itertools.combinations(range(1, n), parts - 1):
        bounds = [0, *cuts, n]
        best = min(best, max(sum(costs[a:b]) for a, b in itertools.pairwise(bounds)))
    return best
