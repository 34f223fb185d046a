"""Zero-bubble schedules: the B/W split in the action format, ZB-H1's shape, validity
checks, memory, and the paper's bubble closed forms reproduced by the simulator."""

from __future__ import annotations

import pytest

from jobctl.engine.calibration.analytic import analytic_calibration, analytic_fingerprint
from jobctl.engine.core.actions import Action, B, F, Op, R, W, parse_actions, weight_split
from jobctl.engine.planner.resolver import plan_and_simulate
from jobctl.engine.planner.simulator.simulation import CostModel, simulate
from jobctl.engine.schedule.generators import generate, one_f_one_b, peak_activations, validate
from jobctl.engine.schedule.zero_bubble import zb_h1
from jobctl.engine.views.gantt import COLOURS, draw_gantt

from ..jobrun import tiny_spec

SIZES = [(P, M) for P in (1, 2, 3, 4, 8) for M in (P, P + 1, 2 * P, 3 * P)]


def test_w_parses_and_formats() -> None:
    acts = parse_actions("F0 B0 W0")
    assert acts == [F(0), B(0), W(0)] and str(acts[2]) == "W0"
    assert acts[2] == Action(Op.WEIGHT, 0) and weight_split(acts) == {0}
    with pytest.raises(ValueError, match="W<n>"):
        parse_actions("X1")


def test_zb_h1_stage_shape() -> None:
    """P=4, M=8: 1F1B's warm-up, W delayed by s micro-batches on stage s."""
    got = [" ".join(map(str, a)) for a in zb_h1(4, 8)]
    assert got[0].startswith("F0 F1 F2 F3 B0 W0 F4 B1 W1")
    assert got[1].startswith("F0 F1 F2 B0 F3 B1 W0 F4 B2 W1")
    assert got[3].startswith("F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 B4 W1")
    assert got[3].endswith("B7 W4 W5 W6 W7")


@pytest.mark.parametrize(("P", "M"), SIZES)
@pytest.mark.parametrize("recompute", [False, True])
def test_zb_h1_is_valid_with_1f1b_peak_memory(P: int, M: int, recompute: bool) -> None:
    stages = zb_h1(P, M, recompute=recompute)
    validate(stages, P, M)
    first_1f1b = peak_activations(one_f_one_b(P, M)[0]).full
    for acts in stages:
        peak = peak_activations(acts)
        # Every stage holds at most the first stage's 1F1B peak (F or R to W).
        assert max(peak.full, peak.stashed) <= first_1f1b
        assert weight_split(acts) == set(range(M))
    assert peak_activations(stages[0]).full == (1 if recompute else min(P, M))


@pytest.mark.parametrize(("P", "M"), [(P, M) for P, M in SIZES if M >= P])
def test_zb_h1_bubble_closed_form(P: int, M: int) -> None:
    """T_F = T_B = T_W = 1 (whole backward 2): step 3M + P - 1, bubble (P-1)/(3M),
    against 1F1B's 3(M + P - 1), (P-1)/M; with early recompute 4M + P - 1."""
    costs = CostModel.uniform(P, f=1.0, b=2.0, w=(1.0,) * P)
    zb = simulate(zb_h1(P, M), costs)
    assert zb.pipeline_time == pytest.approx(3 * M + P - 1)
    assert zb.bubble_ratio == pytest.approx((P - 1) / (3 * M))
    assert simulate(one_f_one_b(P, M), costs).bubble_ratio == pytest.approx((P - 1) / M)
    rec = simulate(zb_h1(P, M, recompute=True), costs)
    assert rec.pipeline_time == pytest.approx(4 * M + P - 1)


def test_general_costs_bubble() -> None:
    """The paper's ZB-H1 bubble (P-1)(T_F + T_B - T_W), T_B the input gradient, for
    T_W at most T_F and T_B (a longer W no longer fits the gaps it fills)."""
    P, M, f, b, w = 4, 12, 1.0, 2.2, 0.9
    zb = simulate(zb_h1(P, M), CostModel.uniform(P, f=f, b=b, w=(w,) * P))
    busy = M * (f + b)
    assert zb.busy[0] == pytest.approx(busy)
    assert zb.pipeline_time - busy == pytest.approx((P - 1) * (f + (b - w) - w))


def test_w_costs_split_the_backward() -> None:
    """A stage with W's runs B in b - w and W in w; compute time is unchanged."""
    costs = CostModel.uniform(2, f=1.0, b=3.0, w=(1.0, 1.0))
    r = simulate(zb_h1(2, 4), costs)
    durations = {(e.stage, str(e.action)): e.end - e.start for e in r.events if e.kind == "compute"}
    assert durations[0, "B1"] == pytest.approx(2.0) and durations[0, "W1"] == pytest.approx(1.0)
    assert r.busy == (16.0, 16.0)
    assert not [e for e in r.events if e.kind.startswith("send") and e.action.op is Op.WEIGHT]
    with pytest.raises(ValueError, match="exceeds"):
        CostModel.uniform(2, b=1.0, w=(2.0, 2.0))


@pytest.mark.parametrize(
    ("lists", "message"),
    [
        (["F0 W0 B0 F1 B1 W1"], "W0 at position 1 comes before B0 at 2"),
        (["F0 F1 B0 W0 B1"], r"W for micro-batches \[0\] but not for \[1\]"),
        (["F0 B0 W0 W0 F1 B1 W1"], "W0 appears twice"),
        (["F0 R0 B0 W0 F1 B1 W1"], None),
    ],
)
def test_validate_weight_rules(lists: list[str], message: str | None) -> None:
    stages = [parse_actions(x) for x in lists]
    if message is None:
        validate(stages, 1, 2)
        return
    with pytest.raises(ValueError, match=message):
        validate(stages, 1, 2)


def test_generate_knows_zb_h1() -> None:
    assert generate("zb_h1", 3, 6, recompute=True) == zb_h1(3, 6, recompute=True)
    assert R(0) in generate("zb_h1", 3, 6, recompute=True)[1]


def test_planner_plans_zb_h1_and_gantt_draws_w_in_its_colour(tmp_path) -> None:
    spec = tiny_spec(**{"parallelism.schedule": "zb_h1", "parallelism.data_parallel": 1})
    cal = analytic_calibration(spec, analytic_fingerprint(spec.hardware, "test"))
    plan, sim = plan_and_simulate(spec, calibration=cal)
    assert plan.schedule == "zb_h1" and all("W0" in st.actions for st in plan.stages)
    w_bars = [e for e in sim.events if e.kind == "compute" and e.action.op is Op.WEIGHT]
    assert len(w_bars) == plan.P * plan.micro_batches
    svg = draw_gantt(sim, tmp_path / "zb.svg").read_text().lower()
    assert COLOURS["W"].lower() in svg and "weight grad" in svg
    one = tiny_spec(**{"parallelism.schedule": "1f1b", "parallelism.data_parallel": 1})
    _, sim = plan_and_simulate(one, calibration=cal)
    svg = draw_gantt(sim, tmp_path / "1f1b.svg").read_text().lower()
    assert COLOURS["W"].lower() not in svg and COLOURS["B"].lower() in svg


def test_auto_planner_considers_zb_h1() -> None:
    spec = tiny_spec(**{"parallelism.schedule": "auto", "parallelism.data_parallel": 1})
    cal = analytic_calibration(spec, analytic_fingerprint(spec.hardware, "test"))
    plan, _ = plan_and_simulate(spec, calibration=cal)
    seen = {plan.schedule} | {alt.schedule for alt in plan.alternatives}
    assert "zb_h1" in seen, seen
