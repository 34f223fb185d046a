"""``jobctl plan``: the stage table (the blocks each row hosts) and the idle share."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from jobctl.engine.calibration.cache import calibration_for
from jobctl.engine.planner.resolver import make_plan
from jobctl.engine.views.tables import _block_ranges, print_plan

from ..jobrun import tiny_spec


def test_block_ranges_name_every_block_and_only_those():
    assert _block_ranges([0, 3, 4]) == "0,3-4"  # a Mobius rank: stages 0 and 2 of 4
    assert _block_ranges([0, 1, 2, 3]) == "0-3"
    assert _block_ranges([5]) == "5"
    assert _block_ranges([0, 2, 4, 5, 6]) == "0,2,4-6"


def test_a_mobius_plan_lists_each_ranks_blocks_without_action_lists():
    spec = tiny_spec(
        **{
            "hardware.nodes": 1,
            "hardware.processes_per_node": 2,
            "parallelism.pipeline_stages": 4,
            "parallelism.data_parallel": 1,
            "parallelism.schedule": "mobius",
        }
    )
    plan = make_plan(spec, 2, calibration_for(spec, None))
    assert plan.mobius is not None
    out = io.StringIO()
    print_plan(Console(file=out, width=80), plan)
    text = out.getvalue()
    for st in plan.stages:
        assert f"{_block_ranges(st.blocks)}: " in text
    assert "action lists" not in text
    tables = [line for line in text.splitlines() if line[:1] in "┏┃┡│└"]
    assert tables and max(map(len, tables)) <= 80  # (prose lines wrap in the terminal)


def test_jobctl_plan_says_once_that_devices_re_plans_the_layout(tmp_path):
    from typer.testing import CliRunner

    from jobctl.engine.cli.app import app

    from ..jobrun import QUICKSTART

    got = CliRunner().invoke(
        app, ["plan", str(QUICKSTART), "--devices", "1", "--home", str(tmp_path)]
    )
    assert got.exit_code == 0, got.output
    assert got.output.count("--devices 1: the spec fixes P x D") == 1


def test_idle_is_a_share_of_the_step_never_above_100_or_negative():
    """#47: `plan` printed Merak's bubble ratio (idle over compute) as `bubble 137.7 %`
    and `-0.0 %`; it shows the busiest device's idle share of the step, in [0, 1)."""
    from jobctl.engine.core.plan import idle_share

    assert idle_share(1.377) == pytest.approx(1.377 / 2.377)
    assert idle_share(0.0) == 0.0 and str(100 * idle_share(-0.0)) == "0.0"
    assert str(idle_share(-1e-17)) == "0.0" and idle_share(None) is None
    assert all(0.0 <= idle_share(r) < 1.0 for r in (0.0, 0.5, 1.0, 10.0, 1e6))
    spec = tiny_spec(**{"parallelism.pipeline_stages": 4, "parallelism.data_parallel": 1})
    plan = make_plan(spec, 4, calibration_for(spec, None))
    out = io.StringIO()
    print_plan(Console(file=out, width=200), plan)
    text = out.getvalue()
    assert f"idle {100 * plan.prediction.idle_share:.1f} % of the step" in text
    assert "bubble" not in text and "-0.0 %" not in text


def test_a_pool_with_no_price_shows_no_cost(tmp_path):
    """#47: the quickstart (no hardware.price_per_hour) printed `$0.0000 per 1k samples`
    and a cost table of $0.0000 rows; a priced pool keeps both."""
    from typer.testing import CliRunner

    from jobctl.engine.cli.app import app

    from ..jobrun import QUICKSTART, ROOT

    home = ["--home", str(tmp_path)]
    got = CliRunner().invoke(app, ["plan", str(QUICKSTART), *home], env={"COLUMNS": "200"})
    assert got.exit_code == 0, got.output
    assert "$" not in got.output and "cost" not in got.output
    spot = ROOT / "jobs" / "gpt-small-spot.yaml"
    got = CliRunner().invoke(app, ["plan", str(spot), *home], env={"COLUMNS": "200"})
    assert "per 1k samples" in got.output and "$ to finish" in got.output


def test_a_resumed_runs_estimate_counts_the_steps_left():
    """#47: `resume` of a run checkpointed at step 72 of 300 predicted all 300 steps."""
    from jobctl.engine.views.prediction import print_end_to_end

    spec = tiny_spec()
    plan = make_plan(spec, 4, calibration_for(spec, None))
    out = io.StringIO()
    print_end_to_end(Console(file=out, width=200), plan, 300, done=72)
    step = f"{plan.prediction.step_time_s:.4g} s"
    assert f"+ 228 steps left of 300 x {step}" in out.getvalue()
    out = io.StringIO()
    print_end_to_end(Console(file=out, width=200), plan, 300)
    assert f"+ 300 steps x {step}" in out.getvalue()  # a new run: all of them
