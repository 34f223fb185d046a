"""``jobctl plan``'s stage table: the blocks each row hosts, contiguous or not."""

from __future__ import annotations

import io

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
