"""The planner: m by F(m)/m, the P sweep ranked by simulation, explicit values, errors."""

from __future__ import annotations

import pytest
import torch

from jobctl.engine.calibration.analytic import analytic_calibration, analytic_fingerprint
from jobctl.engine.calibration.record import (
    AllreduceCalibration,
    Calibration,
    RuntimeCalibration,
    Stat,
)
from jobctl.engine.core.actions import Action
from jobctl.engine.planner.contention import expected_max, replica_skew
from jobctl.engine.planner.layout import Hosting, Layout
from jobctl.engine.planner.resolver import PlanError, action_text, make_plan, plan_and_simulate
from jobctl.engine.planner.search import search
from jobctl.engine.planner.simulator.simulation import simulate
from jobctl.engine.planner.stage_costs import (
    BlockTimes,
    Tables,
    activation_peaks,
    cost_model,
    lower_bound,
    stage_costs,
)
from jobctl.engine.schedule.generators import generate, peak_activations
from jobctl.engine.views.gantt import draw_gantt

from ..jobrun import tiny_spec

AUTO = {
    "parallelism.pipeline_stages": "auto",
    "parallelism.data_parallel": "auto",
    "parallelism.schedule": "auto",
    "training.micro_batch_size": "auto",
}


def auto_spec(**extra):
    return tiny_spec(**{**AUTO, **extra})


def analytic(spec) -> Calibration:
    return analytic_calibration(spec, analytic_fingerprint(spec.hardware, "test"))


def with_times(cal: Calibration, per_sample: dict[int, float]) -> Calibration:
    """Every block takes ``per_sample[m] * m`` forward and twice that backward."""
    blocks = [
        b.model_copy(
            update={
                "forward": {m: Stat(median=t * m) for m, t in per_sample.items()},
                "forward_nograd": {m: Stat(median=t * m) for m, t in per_sample.items()},
                "backward": {m: Stat(median=2 * t * m) for m, t in per_sample.items()},
            }
        )
        for b in cal.blocks
    ]
    return cal.model_copy(update={"blocks": blocks, "micro_batch_sizes": sorted(per_sample)})


def test_m_is_where_per_sample_time_stops_improving():
    spec = auto_spec(**{"training.global_batch_size": 64})
    cal = with_times(analytic(spec), {1: 10e-3, 2: 6e-3, 4: 4e-3, 8: 3.9e-3, 16: 3.8e-3})
    plan = make_plan(spec, calibration=cal)
    assert plan.micro_batch_size == 4  # 4 -> 8 gains only 2.5 %
    assert any(line.startswith("m=4: stops improving") for line in plan.explanation)


def test_m_respects_memory_then_explicit_values():
    spec = auto_spec(**{"training.global_batch_size": 64, "hardware.memory_gb": 0.0021})
    cal = with_times(analytic(spec), {1: 10e-3, 2: 6e-3, 4: 4e-3, 8: 3.9e-3})
    big = [b.model_copy(update={"act_bytes": 2e5}) for b in cal.blocks]
    plan = make_plan(spec, calibration=cal.model_copy(update={"blocks": big}))
    assert plan.micro_batch_size < 4
    assert "does not fit" in next(x for x in plan.explanation if x.startswith("m="))
    fixed = make_plan(tiny_spec(**{**AUTO, "training.micro_batch_size": 8}), calibration=cal)
    assert fixed.micro_batch_size == 8


def test_sweep_ranks_by_simulated_step_time():
    spec = auto_spec()
    plan = make_plan(spec, calibration=analytic(spec))
    simulated = [a for a in plan.alternatives if a.step_time_s is not None]
    assert simulated and all(a.why_not for a in plan.alternatives)
    steps = [a.step_time_s for a in simulated]
    assert steps == sorted(steps) and plan.prediction.step_time_s <= steps[0]
    for a in simulated:
        assert a.samples_per_s == pytest.approx(spec.training.global_batch_size / a.step_time_s)
        assert a.samples_per_s_per_device == pytest.approx(a.samples_per_s / (a.P * a.D))
        assert a.memory_per_stage_gb and a.bubble_ratio is not None
    assert any(line.lstrip().startswith("P=1:") for line in plan.explanation)


def test_slow_allreduce_favours_deeper_pipelines():
    """Varuna observation 2: a large D pays for the allreduce; a deeper P keeps D small.
    (Untied embeddings: a tied one is summed over the first and last stage, and with
    every D searched, one stage on one device would win.)"""
    spec = auto_spec(
        **{
            "training.global_batch_size": 64,
            "parallelism.schedule": "1f1b",
            "model.tie_embeddings": False,
        }
    )
    cal = analytic(spec)
    fast = make_plan(spec, calibration=cal)
    slow_ar = AllreduceCalibration(source="analytic", latency_s=0.05, bandwidth_Bps=1e5)
    slow = make_plan(spec, calibration=cal.model_copy(update={"allreduce_intra": slow_ar}))
    assert slow.P > fast.P and slow.D < fast.D


def test_prediction_is_the_simulation_of_the_winner():
    spec = auto_spec()
    plan, sim = plan_and_simulate(spec, calibration=analytic(spec))
    assert plan.prediction.step_time_s == sim.step_time
    assert plan.prediction.bubble_ratio == sim.bubble_ratio
    assert [len(x) for x in sim.executed] == [len(s.action_list()) for s in plan.stages]


@pytest.mark.parametrize(
    ("P", "D", "m", "schedule"),
    [(2, 2, 2, "1f1b"), (3, 1, 4, "varuna"), (1, 4, 1, "gpipe"), (2, 1, 8, "advance_forward")],
)
def test_explicit_values_are_honoured(P, D, m, schedule):
    spec = tiny_spec(
        **{
            "parallelism.pipeline_stages": P,
            "parallelism.data_parallel": D,
            "training.micro_batch_size": m,
            "parallelism.schedule": schedule,
        }
    )
    cal = with_times(analytic(spec), {1: 1e-3, 2: 0.6e-3, 4: 0.5e-3, 8: 0.45e-3})
    for plan in (make_plan(spec), make_plan(spec, calibration=cal)):
        assert (plan.P, plan.D, plan.micro_batch_size, plan.schedule) == (P, D, m, schedule)
        assert plan.micro_batches == 16 // (D * m)


def test_recompute_where_memory_requires():
    spec = tiny_spec(
        **{
            "parallelism.schedule": "gpipe",
            "parallelism.recompute": "auto",
            "hardware.memory_gb": 1,
        }
    )
    cal = analytic(spec)
    roomy = make_plan(spec, calibration=cal)
    assert not any(s.recompute for s in roomy.stages)
    big = [b.model_copy(update={"act_bytes": 5e7}) for b in cal.blocks]
    tight = make_plan(spec, calibration=cal.model_copy(update={"blocks": big}))
    assert any(s.recompute for s in tight.stages)
    assert any("does not fit memory" in a.why_not for a in tight.alternatives)


def test_any_d_is_searched_and_planned_for_a_batch_not_divisible_by_d():
    spec = auto_spec(
        **{
            "parallelism.pipeline_stages": 1,
            "hardware.processes_per_node": 3,
            "training.micro_batch_size": 1,
        }
    )
    found = search(spec, 6, analytic(spec), "analytic")
    seen = {c.layout.D for c in found.ranked + found.rejected}
    # D = 6, then every smaller D whose compute alone could beat it (not D = 1 here);
    # 16 samples: D = 3, 5, 6 deal them unevenly.
    assert seen == {2, 3, 4, 5, 6} and found.ranked[0].layout.D < 6
    fixed = auto_spec(
        **{
            "parallelism.pipeline_stages": 1,
            "parallelism.data_parallel": 3,
            "hardware.processes_per_node": 3,
            "training.micro_batch_size": 2,
        }
    )
    plan = make_plan(fixed, 3, calibration=analytic(fixed))
    # 8 micro-batches of 2 over 3 replicas: 3, 3 and 2; the step runs the busiest.
    assert (plan.D, plan.micro_batch_size, plan.micro_batches) == (3, 2, 3)


def test_nothing_fits_memory_explains():
    spec = auto_spec(**{"hardware.memory_gb": 1e-6})
    with pytest.raises(PlanError, match="even with one block per stage.*raise hardware.memory_gb"):
        make_plan(spec, calibration=analytic(spec))


def test_too_few_devices_for_the_smallest_p_explains():
    spec = auto_spec(**{"hardware.memory_gb": 0.0021})
    with pytest.raises(PlanError, match=r"at least P=\d+ stages .* only G=2 devices"):
        make_plan(spec, 2, calibration=analytic(spec))


def test_explicit_layout_larger_than_the_devices_is_a_plan_error():
    with pytest.raises(PlanError, match=r"P x D = 2 x 2 = 4 devices, but only 2 are available"):
        make_plan(tiny_spec(), 2)


def test_empty_pool_is_an_error():
    with pytest.raises(PlanError, match="pool is empty"):
        make_plan(tiny_spec(), 0)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("recompute", [False, True])
def test_closed_form_activation_peaks_match_the_schedules(schedule, recompute):
    for P in range(1, 7):
        for M in range(1, 12):
            layout = Layout(P, 1, 1, M, schedule, recompute)
            actions = generate(schedule, P, M, recompute=recompute)
            assert activation_peaks(layout, None) == [peak_activations(a) for a in actions]


def test_lower_bound_never_exceeds_the_simulation():
    spec = tiny_spec()
    tables = Tables(analytic(spec))
    for name, P, M in [("gpipe", 3, 5), ("1f1b", 4, 8), ("varuna", 3, 6), ("1f1b", 1, 4)]:
        stages = tables.stages(P, 2)
        layout = Layout(P, 1, 2, M, name)
        host = Hosting(P, 1, 4, "stage_major", one_host=False, share_cores=False)
        actions = generate(name, P, M)
        times = BlockTimes.at(tables.cal, 2)
        bound_costs = stage_costs(tables.cal, layout, stages, host, times).model(layout, None)
        recs = [sum(a.op.value == "R" for a in acts) for acts in actions]
        exact = simulate(actions, cost_model(tables.cal, layout, stages, actions, host))
        assert lower_bound(bound_costs, recs, M) <= exact.step_time * (1 + 1e-9)


def test_hosting_keeps_stage_rings_on_a_node_where_it_can():
    host = Hosting(P=4, D=2, per_node=4, placement="stage_major", one_host=False, share_cores=False)
    assert host.same_node((0, 0), (0, 1))  # ranks 0, 1
    assert not host.same_node((1, 0), (2, 0))  # ranks 2 and 4: a pipeline crosses nodes
    assert host.rings_sharing(0) == 2  # stages 0 and 1 share node 0
    wide = Hosting(P=2, D=8, per_node=4, placement="stage_major", one_host=False, share_cores=False)
    assert not wide.same_node((0, 0), (0, 7)) and wide.rings_sharing(1) == 1
    local = Hosting(P=3, D=1, per_node=1, placement="stage_major", one_host=True, share_cores=True)
    assert local.same_node((0, 0), (2, 0)) and local.rings_sharing(0) == 3


def test_core_sharing_slows_oversubscribed_layouts():
    spec = tiny_spec(**{"parallelism.pipeline_stages": 1, "parallelism.data_parallel": 4})
    cal = analytic(spec)
    assert cal.host.cores >= 1
    shared = make_plan(spec, calibration=cal).prediction.step_time_s
    alone = make_plan(
        spec,
        calibration=cal.model_copy(update={"host": cal.host.model_copy(update={"slowdown": {}})}),
    ).prediction.step_time_s
    if cal.host.cores < 4:
        assert shared > 1.5 * alone
    else:
        assert shared == pytest.approx(alone)


def test_expected_max_of_normal_draws():
    # The known values of the largest of n standard normals.
    assert expected_max(1) == 0.0
    assert expected_max(2) == pytest.approx(1 / 3.141592653589793**0.5, abs=1e-6)
    assert [round(expected_max(n), 3) for n in (3, 4, 8)] == [0.846, 1.029, 1.424]


def _slowest_of(D: int, cv: float, end: float, draws: int = 200_000) -> float:
    """Monte Carlo: the mean, over ``draws`` steps, of the latest end of D replicas
    whose runs each take ``end`` x (1 + cv x a standard normal draw)."""
    g = torch.Generator().manual_seed(D)
    runs = end * (1 + cv * torch.randn(draws, D, generator=g, dtype=torch.float64))
    return runs.max(dim=1).values.mean().item()


def test_replicas_wait_for_the_slowest_before_their_allreduce():
    """With a step-to-step spread measured, each stage's allreduce of D > 1 replicas
    starts when the slowest of D jittered replicas is done (checked against a Monte Carlo
    of D replicas, not the formula): step time grows by that, more with more replicas,
    not at all for one replica or without a spread."""
    spec = tiny_spec(**{"parallelism.pipeline_stages": 2, "parallelism.data_parallel": 2})
    cal = analytic(spec)
    layout = Layout(P=2, D=2, m=2, M=4, schedule="1f1b")
    hosting = Hosting(2, 2, 4, "stage_major", True, False)
    stages = [[0, 1, 2], [3, 4, 5]]
    actions = generate("1f1b", 2, 4)
    costs = cost_model(cal, layout, stages, actions, hosting)
    plain = simulate(actions, costs)
    rt = RuntimeCalibration(
        source="measured", step_cv=0.1, step_cv_busy=0.2, load_idle=1.0, load_busy=3.0
    )
    spread = cal.model_copy(update={"runtime": rt})
    for D, load, cv in ((2, 1.0, 0.1), (2, 2.0, 0.15), (4, 5.0, 0.2)):
        skewed, sim = replica_skew(spread, actions, costs, plain, D, load)
        ends = zip(costs.ar, plain.stage_end, strict=True)
        waits = [late - a for late, a in zip(skewed.ar, costs.ar, strict=True)]
        assert waits == pytest.approx([_slowest_of(D, cv, end) - end for _, end in ends], rel=0.02)
        assert sim.stage_end == plain.stage_end and sim.step_time > plain.step_time
    assert replica_skew(spread, actions, costs, plain, 1, 2.0)[1] is plain
    assert replica_skew(cal, actions, costs, plain, 2, 2.0)[1] is plain  # nothing measured
    two = replica_skew(spread, actions, costs, plain, 2, 2.0)[1].step_time
    four = replica_skew(spread, actions, costs, plain, 4, 2.0)[1].step_time
    assert plain.step_time < two < four


def test_messages_cost_more_with_load_only_where_ranks_outnumber_cores():
    """A measured runtime whose busy probe (more ranks than cores) priced messages far
    above the idle one: a 2-rank pipeline on 2 cores keeps the idle price whatever its
    load, a 4-rank one pays the busy price."""
    rt = RuntimeCalibration(
        source="measured", message_s=1e-4, message_busy_s=5e-3, load_idle=0.5, load_busy=1.0
    )
    base = analytic(tiny_spec())
    base = base.model_copy(
        update={"host": base.host.model_copy(update={"cores": 2, "slowdown": {2: 1.0}})}
    )

    def step(P: int, busy_s: float) -> float:
        spec = tiny_spec(
            **{"parallelism.pipeline_stages": P, "parallelism.data_parallel": 1},
            **{"hardware.processes_per_node": 4},
        )
        cal = base.model_copy(update={"runtime": rt.model_copy(update={"message_busy_s": busy_s})})
        return make_plan(spec, calibration=cal).prediction.step_time_s

    assert step(2, 5e-3) == step(2, 1e-4)
    assert step(4, 5e-3) > step(4, 1e-4) + 10 * (5e-3 - 1e-4)


def test_gantt_png_is_written(tmp_path):
    spec = tiny_spec(**{"parallelism.schedule": "varuna", "parallelism.data_parallel": 1})
    _, sim = plan_and_simulate(spec, calibration=analytic(spec))
    path = draw_gantt(sim, tmp_path / "out" / "step.png", "varuna")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


@pytest.mark.parametrize("schedule", ["varuna", "zb_h1"])
def test_action_text_is_the_compact_form_of_each_action(schedule):
    for actions in generate(schedule, 4, 13):
        text = action_text(actions)
        assert text == " ".join(str(a) for a in actions)
        assert [Action.parse(x) for x in text.split()] == actions
