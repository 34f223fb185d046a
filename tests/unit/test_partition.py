"""The stage partition is the exact min-max optimum (checked against brute force)."""

from __future__ import annotations

import random

import pytest

from jobctl.engine.planner.partition import bottleneck, partition, stage_costs

from ..partition_oracle import brute_force


@pytest.mark.parametrize("seed", range(40))
def test_partition_matches_brute_force(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 11)
    costs = [rng.choice([rng.random(), float(rng.randint(1, 9))]) for _ in range(n)]
    parts = rng.randint(1, n)
    stages = partition(costs, parts)
    assert len(stages) == parts and all(stages)
    assert [i for s in stages for i in s] == list(range(n))
    assert max(stage_costs(costs, stages)) == pytest.approx(brute_force(costs, parts), rel=1e-12)
    assert bottleneck(costs, parts) == pytest.approx(brute_force(costs, parts), rel=1e-12)


def test_partition_prefers_even_split_among_optimal():
    # embed, 4 equal blocks, heavy head: bottleneck is the head; the rest spread evenly
    stages = partition([0.1, 1, 1, 1, 1, 2.5], 3)
    assert stages == [[0, 1, 2], [3, 4], [5]]


def test_too_many_parts_is_an_error():
    with pytest.raises(ValueError, match="cannot split 3 blocks into 4 stages"):
        partition([1, 1, 1], 4)
