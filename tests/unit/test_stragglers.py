"""Fail-stutter devices are flagged by comparison with their stage peers, from the
heartbeat fields (tests/integration/test_stragglers.py: a slowed worker of a real run)."""

from __future__ import annotations

import pytest

from jobctl.engine.runtime.executor import StepStats
from jobctl.engine.runtime.vitals import compute_fields, memory_fields
from jobctl.engine.supervise.stragglers import StragglerDetector, per_micro_batch_s


def _feed(d: StragglerDetector, steps: range, slow_rank: int | None, factor: float) -> None:
    for step in steps:
        for rank in range(4):  # ranks 0,1 = stage 0; ranks 2,3 = stage 1
            t = 0.010 * (factor if rank == slow_rank else 1.0)
            d.observe(step, rank, stage=rank // 2, node=rank // 2, compute_s=t)
        d.close_step(step)


def test_persistently_slow_rank_is_flagged():
    d = StragglerDetector(threshold=0.15, window=10, persistence=0.7)
    _feed(d, range(9), slow_rank=3, factor=1.3)
    assert d.stragglers() == []  # not a full window yet
    _feed(d, range(9, 12), slow_rank=3, factor=1.3)
    assert d.stragglers() == [3] and d.nodes([3]) == [1]


def test_small_or_brief_slowness_is_not_flagged():
    d = StragglerDetector(threshold=0.15, window=10, persistence=0.7)
    _feed(d, range(20), slow_rank=1, factor=1.10)  # under the threshold
    _feed(d, range(20, 25), slow_rank=2, factor=2.0)  # 5 of 10: not persistent
    _feed(d, range(25, 30), slow_rank=None, factor=1.0)
    assert d.stragglers() == []


def test_an_excess_below_a_scheduling_slice_is_noise():
    # 1.6x a sub-millisecond stage (0.6 ms late): not a slow device; 1.6x of 10 ms is.
    d = StragglerDetector(threshold=0.5, window=10, persistence=0.7)
    for step in range(12):
        for rank, t in enumerate([0.001, 0.0016, 0.010, 0.016]):
            d.observe(step, rank, stage=rank // 2, node=rank // 2, compute_s=t)
        d.close_step(step)
    assert d.stragglers() == [3]


def test_a_flagged_rank_stays_flagged_until_it_is_mostly_fast():
    d = StragglerDetector(threshold=0.15, window=10, persistence=0.7)
    _feed(d, range(10), slow_rank=3, factor=1.5)
    assert d.stragglers() == [3]
    _feed(d, range(10, 16), slow_rank=None, factor=1.0)  # 4 of the last 10 still slow
    assert d.stragglers() == [3]
    _feed(d, range(16, 17), slow_rank=None, factor=1.0)  # 3 of 10: mostly fast now
    assert d.stragglers() == []
    _feed(d, range(17, 23), slow_rank=3, factor=1.5)  # 6 of 10: not yet persistent again
    assert d.stragglers() == []
    _feed(d, range(23, 24), slow_rank=3, factor=1.5)
    assert d.stragglers() == [3]


def test_heartbeat_compute_is_per_micro_batch_forward_and_backward():
    # 4 micro-batches: forwards (one recomputed: 5 actions) and backwards of one step.
    stats = StepStats(fwd_s=[0.010, 0.010, 0.012, 0.008, 0.004], bwd_s=[0.02] * 4)
    f = compute_fields(stats, micro_batches=4)
    assert f["fwd_ms"] == pytest.approx(11.0) and f["bwd_ms"] == pytest.approx(20.0)
    assert f["compute_s"] == pytest.approx(0.031)
    assert per_micro_batch_s(f) == pytest.approx(0.031)
    assert per_micro_batch_s({"compute_s": 0.5}) == 0.5  # an older worker's heartbeat


def test_heartbeat_memory_on_cpu_is_the_process_rss():
    import torch

    m = memory_fields(torch.device("cpu"))
    assert m["mem_kind"] == "rss" and 10 < m["mem_mb"] <= m["max_rss_mb"] + 1
