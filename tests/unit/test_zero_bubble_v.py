"""ZB-V (arXiv 2401.10241 sec. 6): two stages per device in V shape, the device-list
format and its checks, memory per device, and the bubble from the device simulator."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from jobctl.engine.core.actions import B, F, W
from jobctl.engine.planner.search import schedule_options
from jobctl.engine.planner.simulator.devices import simulate_devices
from jobctl.engine.planner.simulator.simulation import CostModel, simulate
from jobctl.engine.runtime.two_stage import v_links, v_topology
from jobctl.engine.schedule.checks import peak_activations
from jobctl.engine.schedule.generators import generate, one_f_one_b
from jobctl.engine.schedule.placement import (
    Placed,
    device_peaks,
    format_devices,
    stage_lists,
    v_placement,
    validate_devices,
)
from jobctl.engine.schedule.zero_bubble import zb_h1, zb_v

from ..jobrun import tiny_spec

SIZES = [(P, M) for P in (1, 2, 3, 4, 8) for M in (1, P, 2 * P - 1, 2 * P, 3 * P + 1)]


def test_v_placement_pairs_first_and_last_stages() -> None:
    assert v_placement(4) == [(0, 7), (1, 6), (2, 5), (3, 4)]
    assert v_placement(1) == [(0, 1)]
    with pytest.raises(ValueError, match="P >= 1"):
        v_placement(0)


def test_zb_v_device_order_p2() -> None:
    """P=2, M=4: warm-up on the first chunk, F B W rounds, W's deferred to the end."""
    got = format_devices(zb_v(2, 4)).splitlines()
    assert got[0] == (
        "D0: F0@0 F1@0 F2@0 F0@3 B0@3 W0@3 F1@3 B1@3 W1@3 F3@0 B0@0 W0@0 F2@3 B2@3 "
        "W2@3 B1@0 W1@0 F3@3 B3@3 W3@3 B2@0 W2@0 B3@0 W3@0"
    )
    assert got[1].startswith("D1: F0@1 F0@2 F1@1 F1@2 B0@2 W0@2 F2@1 B0@1 W0@1")
    assert got[1].endswith("B2@1 B3@2 B3@1 W2@1 W3@2 W3@1")


@pytest.mark.parametrize(("P", "M"), SIZES)
@pytest.mark.parametrize("recompute", [False, True])
def test_zb_v_is_valid_with_1f1b_memory(P: int, M: int, recompute: bool) -> None:
    devices = zb_v(P, M, recompute=recompute)
    validate_devices(devices, v_placement(P), M)
    stages = stage_lists(devices, 2 * P)
    assert all(len(acts) == (4 if recompute else 3) * M for acts in stages)
    # A chunk is half a 1F1B stage: 2P chunk micro-batches are 1F1B's first-stage peak.
    first_1f1b = peak_activations(one_f_one_b(P, M)[0]).full
    for peak in device_peaks(devices):
        assert max(peak.full, peak.stashed) <= 2 * first_1f1b
        if M >= 2 * P - 1 and not recompute:
            assert peak.full == 2 * P
    if recompute:
        assert all(p.stashed <= 2 * P and p.full < 2 * P for p in device_peaks(devices))


@pytest.mark.parametrize(("P", "M"), [(P, M) for P, M in SIZES if P > 1 and M >= 2 * P - 1])
def test_zb_v_bubble_near_zero(P: int, M: int) -> None:
    """T_F = T_B = T_W = 1 per chunk: every device computes 6M, and the step takes
    6M + P - 1 (the first micro-batch's P-1 chunk forwards down to the last device, no
    other idle time): bubble (P-1)/(6M), half ZB-H1's and a sixth of 1F1B's on the
    same model (stages of two chunks: f=2, b=4, w=2)."""
    chunks = CostModel.uniform(2 * P, f=1.0, b=2.0, w=(1.0,) * (2 * P))
    v = simulate_devices(zb_v(P, M), chunks)
    assert v.busy == (6.0 * M,) * P
    assert v.pipeline_time == pytest.approx(6 * M + P - 1)
    assert v.bubble_ratio == pytest.approx((P - 1) / (6 * M))
    whole = CostModel.uniform(P, f=2.0, b=4.0, w=(2.0,) * P)
    assert simulate(zb_h1(P, M), whole).bubble_ratio == pytest.approx(2 * v.bubble_ratio)
    assert simulate(one_f_one_b(P, M), whole).bubble_ratio == pytest.approx(6 * v.bubble_ratio)


def test_device_simulation_costs_sends_only_across_devices() -> None:
    """P=2: the hand-over between stages 1 and 2 (both on device 1) is free; the other
    boundaries cost their send time once per micro-batch on the critical chain."""
    P, M = 2, 3
    free = simulate_devices(zb_v(P, M), CostModel.uniform(4, w=(1.0,) * 4))
    local_only = CostModel(
        f=(1.0,) * 4, b=(2.0,) * 4, w=(1.0,) * 4, act=(0, 5.0, 0), grad=(0, 5.0, 0)
    )
    assert simulate_devices(zb_v(P, M), local_only).pipeline_time == free.pipeline_time
    slow = CostModel(
        f=(1.0,) * 4, b=(2.0,) * 4, w=(1.0,) * 4, act=(0.5, 0, 0.5), grad=(0.5, 0, 0.5)
    )
    assert simulate_devices(zb_v(P, M), slow).pipeline_time > free.pipeline_time
    with_tail = CostModel.uniform(4, w=(1.0,) * 4, ar=(1.0,) * 4, opt=(0.5,) * 4)
    assert simulate_devices(zb_v(P, M), with_tail).step_time == free.pipeline_time + 3.0


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d[0].insert(0, Placed(1, F(9))), "device 0: F9@1 at position 0 is on stage 1"),
        (lambda d: d[0].remove(Placed(3, W(1))), "stage 3: W for micro-batches"),
        (lambda d: d[1].remove(Placed(2, B(0))), "stage 2: no B for micro-batches"),
        (lambda d: d[0].insert(0, d[0].pop(d[0].index(Placed(0, B(0))))), "before F0"),
        (lambda d: d[1].insert(0, d[1].pop(d[1].index(Placed(2, F(1))))), "deadlocks"),
    ],
)
def test_validate_devices_names_the_fault(edit, message: str) -> None:
    devices = zb_v(2, 4)
    validate_devices(devices, v_placement(2), 4)
    edit(devices)
    with pytest.raises(ValueError, match=message):
        validate_devices(devices, v_placement(2), 4)


def test_validate_devices_checks_the_placement() -> None:
    with pytest.raises(ValueError, match="host each of stages"):
        validate_devices(zb_v(2, 2), [(0, 3), (1, 3)], 2)
    with pytest.raises(ValueError, match="3 devices"):
        validate_devices(zb_v(2, 2) + [[]], v_placement(2), 2)


def test_zb_v_is_searched_as_zb_h1_and_not_a_per_stage_generator() -> None:
    """The one-stage-per-device search tries zb_h1's layouts for zb_v (planner.v_shape
    makes the V variant); ``generate`` knows only per-stage schedules."""
    par = tiny_spec(**{"parallelism.schedule": "zb_v", "parallelism.data_parallel": 1})
    assert schedule_options(par.parallelism, 2) == [("zb_h1", False)]
    with pytest.raises(ValueError, match="unknown schedule 'zb_v'"):
        generate("zb_v", 2, 4)


@pytest.mark.parametrize(("P", "M"), [(1, 1), (2, 4), (3, 2), (3, 7), (4, 13)])
def test_zb_v_runs_pytorch_zbv_order(P: int, M: int) -> None:
    """The same per-rank order as PyTorch's ScheduleZBVZeroBubble (its order builder,
    which reads only the sizes, called on them)."""
    from torch.distributed.pipelining.schedules import ScheduleZBVZeroBubble

    ops = {"FORWARD": "F", "BACKWARD_INPUT": "B", "BACKWARD_WEIGHT": "W"}
    sizes = SimpleNamespace(pp_group_size=P, _n_microbatches=M, num_stages=2 * P)
    for d, mine in enumerate(zb_v(P, M)):
        theirs = ScheduleZBVZeroBubble._calculate_single_rank_operations(sizes, d)
        got = [
            (a.stage_index, ops[a.computation_type.name], a.microbatch_index) for a in theirs if a
        ]
        assert got == [(p.stage, p.action.op.value, p.action.micro_batch) for p in mine]


def test_v_topology_links_each_stage_to_its_neighbours_ranks() -> None:
    """P=3 on ranks 10, 11, 12: stage s talks to the ranks of s-1 and s+1; the two
    stages of the last rank (2 and 3) and the ends (0 and 5 on rank 10) have none."""
    got = {
        t.stage: (t.rank, t.prev, t.next, t.is_first, t.is_last)
        for d in range(3)
        for t in v_topology(3, d, lambda d: 10 + d)
    }
    assert got == {
        0: (10, None, 11, True, False),
        5: (10, 11, None, False, True),
        1: (11, 10, 12, False, False),
        4: (11, 12, 10, False, False),
        2: (12, 11, None, False, False),
        3: (12, None, 11, False, False),
    }


def test_v_links_one_per_boundary_in_one_order_on_every_rank() -> None:
    """P=3 on ranks 10, 11, 12: each rank connects its boundaries in order of the
    boundary's lower stage, so the two ends of every boundary meet in the same
    handshake (a rank pair shares two boundaries: the V's down and up legs), and the
    handshakes, played out in that order, never wait on each other in a cycle."""
    calls: dict[int, list] = {}
    links = {}
    for d in range(3):
        topos = v_topology(3, d, lambda d: 10 + d)
        chans = [
            SimpleNamespace(
                in_shape=(t.stage,), in_dtype=None, out_shape=(t.stage + 1,), out_dtype=None
            )
            for t in topos
        ]
        mine = calls.setdefault(10 + d, [])
        links[d] = v_links(topos, chans, lambda p, sh, dt, mine=mine: mine.append((p, sh)) or sh)
    # the boundary (s, s+1) is named by its shape here: (s + 1,)
    assert calls == {
        10: [(11, (1,)), (11, (5,))],
        11: [(10, (1,)), (12, (2,)), (12, (4,)), (10, (5,))],
        12: [(11, (2,)), (11, (4,))],
    }
    assert links[1] == [{10: (1,), 12: (2,)}, {12: (4,), 10: (5,)}]  # stages 1 and 4
    pending = {r: list(c) for r, c in calls.items()}  # play the handshakes out
    while any(pending.values()):
        ready = [r for r, c in pending.items() if c and pending[c[0][0]][:1] == [(r, c[0][1])]]
        assert ready, pending  # someone can always meet its peer
        for r in ready:
            pending[r].pop(0)
