"""Mobius's MIP partition (sec. 3.2): the step-time model, merging, and the MIP equal to
enumerating every partition on small instances."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from jobctl.engine.calibration.analytic import analytic_calibration, analytic_fingerprint
from jobctl.engine.mobius.planning.costs import (
    LayerCost,
    MobiusConfig,
    layer_costs,
    merge_identical,
    step_time,
    unit_layers,
)
from jobctl.engine.mobius.planning.partition import mobius_partition
from tests.jobrun import tiny_spec


def compositions(n: int):
    """Every split of n layers into consecutive non-empty stages (2^(n-1) of them)."""
    for cuts in itertools.product((False, True), repeat=n - 1):
        sizes, run = [], 1
        for cut in cuts:
            if cut:
                sizes.append(run)
                run = 1
            else:
                run += 1
        yield [*sizes, run]


def brute_force(layers: list[LayerCost], cfg: MobiusConfig) -> tuple[float, list[int]]:
    return min((step_time(layers, s, cfg), s) for s in compositions(len(layers)))


def instance(rng: random.Random, runtime: bool = False) -> tuple[list[LayerCost], MobiusConfig]:
    """Random layers; the memory between the largest layer and a third of the model,
    so that stages are swapped (S > N) and the prefetch is limited by memory.
    ``runtime``: with the runtime's terms too (update, recompute, reloads, stores)."""
    n = rng.randint(3, 8)
    layers = []
    for i in range(n):
        w, a, f = rng.uniform(1, 4), rng.uniform(0.2, 2), rng.uniform(0.5, 3)
        extra = (
            {
                "update_s": rng.uniform(0, 1),
                "recompute_s": f,
                "grad_down": w,
                "reload": rng.uniform(0, 2) if i else 0.0,
            }
            if runtime
            else {}
        )
        layers.append(
            LayerCost(
                forward_s=f,
                backward_s=rng.uniform(1, 6),
                upload_f=w,
                upload_b=w + a,
                memory_f=w + a + 0.5,
                memory_b=2 * w + a + 0.5,
                boundary=0.0 if i == n - 1 else rng.uniform(0.1, 3),
                **extra,
            )
        )
    big = max(max(x.memory_f, x.memory_b) for x in layers)
    total = sum(x.memory_b for x in layers)
    cfg = MobiusConfig(
        devices=rng.randint(1, 3),
        memory_bytes=rng.uniform(big, max(big * 1.01, total / rng.uniform(1, 3))),
        tier_Bps=rng.uniform(0.5, 6),
        link_Bps=rng.choice([None, rng.uniform(1, 10)]),
        micro_batches=rng.randint(1, 4),
        max_units=64,
    )
    return layers, cfg


@pytest.mark.parametrize("runtime", [False, True])
def test_mip_equals_brute_force_on_random_instances(runtime: bool) -> None:
    rng = random.Random(27)
    swapped = multi = 0
    for _ in range(16):
        layers, cfg = instance(rng, runtime)
        best, sizes = brute_force(layers, cfg)
        part = mobius_partition(layers, cfg)
        assert part.optimal
        assert part.step_time_s == pytest.approx(best, rel=1e-6)
        assert step_time(layers, part.sizes, cfg) == pytest.approx(best, rel=1e-6)
        assert [i for r in part.stages for i in r] == list(range(len(layers)))
        assert part.devices == tuple(s % cfg.devices for s in range(len(part.stages)))
        swapped += len(sizes) > cfg.devices
        multi += max(sizes) > 1
    assert swapped >= 4 and multi >= 4  # the instances exercise swapping and grouping


def test_step_time_by_hand() -> None:
    """Two one-layer stages on one device, one micro-batch, B = 1 B/s, G = 10 B.
    Forward: stage 0 uploads 2 s, runs 2-3; stage 1 prefetches 1 B during stage 0's
    1 s, uploads the other 1 B (3-4), sending 1 B takes 1 s too: forward at 4-5.
    Backward: stage 1 is resident (5-7); stage 0 prefetches 2 B of its 3 during stage
    1's backward (2 s), the last byte 7-8, and runs 8-10."""
    layer = LayerCost(1.0, 2.0, 2.0, 3.0, 4.0, 5.0, 1.0)
    last = LayerCost(1.0, 2.0, 2.0, 3.0, 4.0, 5.0, 0.0)
    cfg = MobiusConfig(devices=1, memory_bytes=10.0, tier_Bps=1.0, micro_batches=1)
    assert step_time([layer, last], [1, 1], cfg) == pytest.approx(10.0)
    # G = 5.5: 0.5 B free beside stage 1's backward, so 2.5 B of stage 0 come after it.
    tight = cfg.model_copy(update={"memory_bytes": 5.5})
    assert step_time([layer, last], [1, 1], tight) == pytest.approx(11.5)
    no_room = cfg.model_copy(update={"memory_bytes": 5.0})  # nothing prefetched: 3 s after
    assert step_time([layer, last], [1, 1], no_room) == pytest.approx(12.0)
    # B = 0.5: stage 0 up 0-4, runs 4-5; stage 1: 0.5 B prefetched, 1.5 B take 5-8,
    # runs 8-9, backward 9-11; stage 0: 1 B prefetched, 2 B take 11-15, runs 15-17.
    slow = cfg.model_copy(update={"tier_Bps": 0.5})
    assert step_time([layer, last], [1, 1], slow) == pytest.approx(17.0)
    assert step_time([layer, last], [2], no_room) == math.inf  # 10 B does not fit


def test_no_partition_fits_raises() -> None:
    layer = LayerCost(1.0, 2.0, 2.0, 3.0, 4.0, 5.0, 0.0)
    cfg = MobiusConfig(devices=2, memory_bytes=4.5, tier_Bps=1.0, micro_batches=2)
    with pytest.raises(ValueError, match="memory"):
        mobius_partition([layer, layer], cfg)


def test_merge_identical_layers_of_a_48_layer_model() -> None:
    head = LayerCost(1.0, 2.0, 5.0, 5.0, 5.0, 5.0, 0.0)
    embed = LayerCost(0.5, 1.0, 5.0, 5.0, 5.0, 5.0, 1.0)
    block = LayerCost(2.0, 4.0, 1.0, 2.0, 3.0, 4.0, 1.0)
    layers = [embed, *[block] * 48, head]
    units, g = merge_identical(layers, 24)
    assert g == 3 and len(units) == 18  # 1 + 48 / 3 + 1; g = 2 would leave 26
    assert units[1] == LayerCost(6.0, 12.0, 3.0, 6.0, 9.0, 12.0, 1.0)
    spans = unit_layers(layers, g)
    assert spans[0] == range(0, 1) and spans[1] == range(1, 4) and spans[-1] == range(49, 50)
    assert merge_identical(layers, 64) == (layers, 1)


def test_merged_solution_is_a_partition_of_the_layers() -> None:
    rng = random.Random(5)
    block = LayerCost(1.0, 2.0, 1.0, 1.5, 2.0, 3.0, 0.3)
    layers = [block] * 11 + [LayerCost(0.5, 1.0, 0.5, 0.5, 1.0, 1.0, 0.0)]
    cfg = MobiusConfig(
        devices=2, memory_bytes=10.0, tier_Bps=rng.uniform(1, 2), micro_batches=2, max_units=5
    )
    part = mobius_partition(layers, cfg)
    assert part.group == 3  # 11 blocks -> 4 units of <= 3, + 1
    assert [i for r in part.stages for i in r] == list(range(12))
    assert part.step_time_s == pytest.approx(step_time(layers, part.sizes, cfg), rel=1e-6)
    # Merging only restricts where stages may be cut: never better than per layer.
    whole = mobius_partition(layers, cfg.model_copy(update={"max_units": 12}))
    assert whole.step_time_s <= part.step_time_s * (1 + 1e-9)


def test_layer_costs_from_a_calibration() -> None:
    spec = tiny_spec()
    cal = analytic_calibration(spec, analytic_fingerprint(spec.hardware, "test"))
    costs = layer_costs(cal, 2, 4)
    assert len(costs) == cal.num_blocks
    b = cal.blocks[1]
    optim = b.state_bytes - 2 * b.param_bytes  # AdamW's two slots
    assert costs[1].upload_f == pytest.approx(3 * b.param_bytes + 2 * optim)  # up + back
    assert costs[1].upload_b == b.param_bytes and costs[1].grad_down == b.param_bytes
    assert costs[1].reload == pytest.approx(cal.blocks[0].boundary_bytes * 2 * 4)
    assert costs[0].reload == 0.0  # the tokens stay
    assert costs[1].update_s == b.optimizer.median
    assert costs[1].recompute_s == costs[1].forward_s
    assert costs[1].forward_s == pytest.approx(cal.forward(1, 2))
    assert costs[1].boundary == pytest.approx(b.boundary_bytes * 2)
    assert costs[-1].boundary == 0.0  # nothing follows the last block


def test_runtime_terms_by_hand() -> None:
    """The by-hand instance below plus what the runtime adds: two one-layer stages on
    one device, M = 1, B = 1 B/s, G = 10 B. Stage 0's forward upload is 2 B and 1 s
    of update (0-3), it runs 3-4; stage 1 (2 B, no update) prefetches 1 B during that
    1 s, the rest 4-5 while stage 0's output is sent (4-5), it runs 5-6 and is
    resident for its backward, 6-8 (the last stage recomputes nothing). Stage 0's
    backward upload is 2 B of weights, 1 B of gradients down and its input reload
    (the tokens: 0 B): 2 B prefetched during stage 1's 2 s, 1 s left (8-9) while the
    gradient comes back (8-9); it runs 1 + 2 s of recompute and backward, 9-12."""
    s0 = LayerCost(1.0, 2.0, 2.0, 2.0, 3.0, 3.0, 1.0, update_s=1.0, recompute_s=1.0, grad_down=1.0)
    s1 = LayerCost(1.0, 2.0, 2.0, 2.0, 3.0, 3.0, 0.0, recompute_s=1.0, reload=5.0)
    cfg = MobiusConfig(devices=1, memory_bytes=10.0, tier_Bps=1.0, micro_batches=1)
    assert step_time([s0, s1], [1, 1], cfg) == pytest.approx(12.0)
    assert mobius_partition([s0, s1], cfg, 2).step_time_s == pytest.approx(12.0)
