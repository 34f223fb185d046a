"""Cost as a feature: the arithmetic of dollars to finish, the spec's budget and planner
sections, the objective's choice among priced layouts, and `plan`'s budget refusal."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from jobctl.engine.calibration.cache import calibration_for
from jobctl.engine.calibration.startup import record_startup, startup_for
from jobctl.engine.cli.app import app
from jobctl.engine.planner.cost import (
    SNAPSHOT_GBYTES_S,
    CostConfig,
    Measured,
    Pricing,
    cost_config,
    forecast,
    forecasts,
)
from jobctl.engine.planner.objective import BudgetError, frontier, plan_options
from jobctl.engine.planner.resolver import plan_and_simulate, plan_priced
from jobctl.engine.views.cost import frontier_picture
from jobctl.spec import SpecError, load_spec_text

ROOT = Path(__file__).resolve().parents[2]
NO_HOME = Path("/nonexistent-home")  # nothing measured: analytic costs, no start-up
QUICKSTART = (ROOT / "jobs" / "quickstart.yaml").read_text()


def priced(text: str = QUICKSTART, auto: bool = True, extra: str = "", **hw) -> str:
    """The quickstart with a price (and P, D left to the planner when ``auto``)."""
    if auto:
        text = text.replace("pipeline_stages: 2", "pipeline_stages: auto")
        text = text.replace("data_parallel: 2", "data_parallel: auto")
    fields = {"price_per_hour": 2.0, **hw}
    lines = "".join(f"\n  {k}: {v}" for k, v in fields.items())
    return text.replace("memory_gb: 2            # per process", "memory_gb: 2" + lines) + extra


def test_dollars_to_finish_is_wall_time_times_the_pool_price() -> None:
    cfg = CostConfig(steps=1000, pricings=(Pricing("on-demand", 1.5),))
    fc = forecast(0.2, 4, 2, cfg, cfg.pricing())
    assert fc.wall_s == pytest.approx(200.0)
    assert fc.usd == pytest.approx(4 * 1.5 * 200.0 / 3600)
    assert fc.hourly_usd == pytest.approx(6.0) and fc.preemptions == 0


def test_overheads_add_start_up_snapshots_and_the_final_checkpoint() -> None:
    cfg = CostConfig(
        steps=100,
        startup_s=30.0,
        checkpoint_every=25,
        snapshot_s=0.5,
        final_s=2.0,
        pricings=(Pricing("on-demand", 1.0),),
    )
    fc = forecast(1.0, 1, 1, cfg, cfg.pricing())
    # 3 checkpoints inside the run (25, 50, 75) block, the one at step 100 is written whole
    assert fc.parts == {"start-up": 30.0, "steps": 100.0, "checkpoints": 3.5, "preemptions": 0}
    assert fc.wall_s == pytest.approx(133.5)


def test_preemptions_cost_recovery_and_half_an_interval_redone() -> None:
    spot = Pricing("spot", 0.5, preemptions_per_hour=2.0)
    cfg = CostConfig(
        steps=3600, checkpoint_every=100, recovery_s=60.0, pricings=(spot,), paid="spot"
    )
    fc = forecast(1.0, 8, 2, cfg, spot)
    lam = 2.0 * 2 / 3600  # per node-hour, two nodes
    lost = 60.0 + 50.0  # recovery + half of 100 steps of 1 s
    assert fc.wall_s == pytest.approx(3600 / (1 - lam * lost))
    assert fc.preemptions == pytest.approx(lam * fc.wall_s)
    # the fixed point: the expected preemptions' cost is in the wall time itself
    assert fc.wall_s == pytest.approx(3600 + fc.preemptions * lost)
    assert fc.usd == pytest.approx(8 * 0.5 * fc.wall_s / 3600)
    never = forecast(1.0, 8, 40, cfg, spot)  # 80 preemptions/h, each losing 110 s
    assert math.isinf(never.wall_s) and not never.finishes


def test_a_preemption_costs_the_measured_recovery_else_detection_and_a_start_up(tmp_path):
    spec = load_spec_text(priced(spot="true", preemptions_per_hour=1))
    cfg = cost_config(spec, 1e9, Measured(startup_s=20.0, recovery_s=50.0))
    assert (cfg.startup_s, cfg.recovery_s, cfg.paid) == (20.0, 50.0, "spot")
    assert cfg.snapshot_s == pytest.approx(1e9 / (SNAPSHOT_GBYTES_S * 1e9))
    cfg = cost_config(spec, 1e9, Measured(startup_s=20.0))
    assert cfg.recovery_s == spec.elasticity.heartbeat_timeout_s + 20.0
    # the supervisor records each recovery beside the start-ups; plans read the median
    for seconds in (40.0, 70.0, 55.0):
        record_startup(tmp_path, "local:cpu", seconds, kind="recovery")
    assert startup_for(tmp_path, "local:cpu", "recovery") == 55.0
    assert startup_for(tmp_path, "local:cpu") is None


def test_on_demand_and_spot_side_by_side() -> None:
    spec = load_spec_text(priced(spot_price_per_hour=0.5, preemptions_per_hour=0.2, spot="true"))
    p, sim, choice = plan_priced(spec)
    on_demand, spot = choice.pricings
    assert (on_demand.label, spot.label) == ("on-demand", "spot")
    assert on_demand.preemptions == 0 and spot.preemptions > 0
    assert spot.wall_s > on_demand.wall_s and spot.usd < on_demand.usd
    assert p.prediction.finish_usd == pytest.approx(spot.usd)  # the run pays spot


def test_plan_predicts_simulated_step_times_steps_times_price() -> None:
    text = priced(auto=False).replace("interval: 30", "interval: 6000")
    text = text.replace("steps: 60", "steps: 6000")
    spec = load_spec_text(text)
    plan, sim = plan_and_simulate(spec, home=NO_HOME)
    pr = plan.prediction
    assert pr.startup_s is None  # nothing measured under that home
    # one checkpoint (the last) of a few MB: the steps are nearly all of the time
    assert pr.finish_s == pytest.approx(6000 * sim.step_time, rel=1e-3)
    assert pr.finish_usd == pytest.approx(pr.finish_s * 4 * 2.0 / 3600)
    assert pr.hourly_usd == pytest.approx(8.0)


def _finish(spec_text: str) -> tuple[float, float, int]:
    """Wall seconds and USD to finish the planned job, and its devices."""
    plan = plan_priced(load_spec_text(spec_text), home=NO_HOME)[0]
    return plan.prediction.finish_s, plan.prediction.finish_usd, plan.world_size


def gpu_job() -> str:
    """A GPU job (analytic device costs, no shared CPU cores: the same on any machine)
    whose frontier has 4 points, 8 devices fastest and 1 device cheapest."""
    text = (ROOT / "jobs" / "gpt-small-spot.yaml").read_text()
    for old, new in [
        ("nodes: 4", "nodes: 1"),
        ("global_batch_size: 512", "global_batch_size: 64"),
        ("layers: 12", "layers: 6"),
    ]:
        text = text.replace(old, new)
    return text


def test_deadline_picks_a_cheaper_plan_than_throughput() -> None:
    fast_s, fast_usd, _ = _finish(gpu_job())
    cheap_s, cheap_usd, _ = _finish(gpu_job() + "planner:\n  objective: cost\n")
    assert cheap_usd < fast_usd and cheap_s > fast_s  # a cheaper, slower plan exists
    deadline = (fast_s + cheap_s) / 2
    s, usd, _ = _finish(gpu_job() + f"planner:\n  objective: deadline\n  deadline: {deadline}\n")
    assert s <= deadline and cheap_usd < usd < fast_usd  # between the two: on 2 devices
    with pytest.raises(BudgetError, match="planner.deadline"):
        _finish(gpu_job() + f"planner:\n  objective: deadline\n  deadline: {fast_s / 2}\n")


def test_throughput_is_the_fastest_within_the_budget() -> None:
    fast_s, fast_usd, _ = _finish(gpu_job())
    cheap_s, cheap_usd, _ = _finish(gpu_job() + "planner:\n  objective: cost\n")
    budget = (fast_usd + cheap_usd) / 2
    s, usd, _ = _finish(gpu_job() + f"budget:\n  max_total_usd: {budget}\n")
    assert usd <= budget and s > fast_s
    options = plan_options(
        load_spec_text(gpu_job()), calibration_for(load_spec_text(gpu_job()), NO_HOME), 8
    )
    within = [o for o in options if o.forecast.usd <= budget]
    assert s == pytest.approx(min(o.forecast.wall_s for o in within))


def test_an_hourly_cap_keeps_the_plan_to_the_devices_it_pays_for() -> None:
    # $0.45 per GPU-hour: $1 an hour pays for 2 of the 8
    text = gpu_job() + "budget:\n  max_hourly_usd: 1.0\n"
    plan = plan_priced(load_spec_text(text), home=NO_HOME)[0]
    assert plan.world_size == 2 and plan.prediction.hourly_usd == pytest.approx(0.9)
    with pytest.raises(SpecError, match="budget.max_hourly_usd"):
        load_spec_text(gpu_job() + "budget:\n  max_hourly_usd: 0.4\n")  # not one GPU


def test_frontier_keeps_only_options_nothing_beats_on_both() -> None:
    spec = load_spec_text(gpu_job())
    options = plan_options(spec, calibration_for(spec, NO_HOME), 8)
    front = frontier(options)
    assert [f.forecast.devices for f in front] == [8, 4, 2, 1]
    for a, b in zip(front, front[1:], strict=False):
        assert a.forecast.wall_s <= b.forecast.wall_s and a.forecast.usd > b.forecast.usd
    for o in options:  # every option is matched or beaten by a frontier point
        assert any(
            f.forecast.wall_s <= o.forecast.wall_s and f.forecast.usd <= o.forecast.usd
            for f in front
        )
    lines = frontier_picture([(o.forecast.wall_s, o.forecast.usd) for o in front], 0)
    assert max(map(len, lines)) <= 80 and "*" in "".join(lines)


def test_plan_refuses_a_pinned_job_over_budget_naming_the_cheapest_that_fits() -> None:
    text = priced(auto=False).replace("steps: 60", "steps: 100000")
    pinned_usd = _finish(text)[1]
    cheapest_usd = _finish(
        priced().replace("steps: 60", "steps: 100000") + ("planner:\n  objective: cost\n")
    )[1]
    assert cheapest_usd < pinned_usd
    budget = (pinned_usd + cheapest_usd) / 2
    spec_file = Path(__file__).parent / "_budget_job.yaml"
    spec_file.write_text(text + f"budget:\n  max_total_usd: {budget:.6f}\n")
    try:
        r = CliRunner().invoke(app, ["plan", str(spec_file), "--home", str(NO_HOME)])
    finally:
        spec_file.unlink()
    assert r.exit_code == 2
    out = " ".join(r.output.split())
    assert "budget.max_total_usd" in out and "the cheapest plan that fits:" in out
    assert "set parallelism.pipeline_stages:" in out


def test_budget_and_planner_errors_name_the_field() -> None:
    def error(extra: str, **hw) -> str:
        with pytest.raises(SpecError) as info:
            load_spec_text(priced(extra=extra, **hw))
        return str(info.value)

    assert "planner.deadline" in error("planner:\n  objective: deadline\n")
    assert "not a duration" in error("planner:\n  objective: cost\n  deadline: soon\n")
    assert "budget.max_hourly_usd" in error("budget:\n  max_hourly_usd: 1\n")
    assert "hardware.price_per_hour" in error("budget:\n  max_total_usd: 1\n", price_per_hour=0)
    assert "hardware.preemptions_per_hour" in error("", preemptions_per_hour=1)
    spec = load_spec_text(priced(extra="planner:\n  objective: cost\n  deadline: 1h30m\n"))
    assert spec.planner.deadline == 5400.0


def test_cost_forecasts_under_every_pricing() -> None:
    cfg = CostConfig(
        steps=10, pricings=(Pricing("on-demand", 3.0), Pricing("spot", 1.0, 0.1)), paid="spot"
    )
    on_demand, spot = forecasts(1.0, 2, 1, cfg)
    assert on_demand.usd == pytest.approx(2 * 3.0 * 10 / 3600)
    assert cfg.pricing().label == "spot" and spot.preemptions > 0


def test_plan_prints_dollars_to_finish_and_the_frontier_in_80_columns(tmp_path):
    spec_file = tmp_path / "gpt.yaml"
    spec_file.write_text(
        gpu_job().replace(
            "price_per_hour: 0.45", "price_per_hour: 1.5\n  spot_price_per_hour: 0.45"
        )
        + "planner:\n  objective: cost\n"
    )
    r = CliRunner().invoke(
        app, ["plan", str(spec_file), "--home", str(NO_HOME)], env={"COLUMNS": "80"}
    )
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("cost"))
    money = lines[start:]
    assert max(map(len, money)) <= 80
    text = "\n".join(money)
    assert "on-demand" in text and "spot (paid)" in text and "$ to finish" in text
    assert "time vs dollars (objective cost; * = chosen)" in text
    # the frontier: 8, 4, 2 and 1 GPUs, the cheapest (1 GPU) chosen
    legend = [line.split() for line in money if line.startswith("  ") and " dev " in line]
    assert [row[0] for row in legend] == ["a", "b", "c", "*"]
    assert [row[row.index("dev") - 1] for row in legend] == ["8", "4", "2", "1"]
