"""Real runs (the quickstart, 2x2 on 4 local worker processes) held to a budget: a tiny
``budget.max_total_usd`` checkpoints and stops it, the step it stopped at saved
(nothing trained is lost); a ``budget.max_hourly_usd`` below its 4 devices morphs it
onto 2. Each writes a ``budget`` event carrying the figures."""

from __future__ import annotations

import json
import time

import pytest
from rich.console import Console

from jobctl.engine.checkpoint.resume import find_resume_point
from jobctl.engine.planner.resolver import make_plan
from jobctl.engine.state.db import StateDB
from jobctl.engine.supervise.figures import run_figures
from jobctl.engine.supervise.service import ApplyOptions, launch
from jobctl.engine.worker.reference import reference_train

from ..jobrun import events, tiny_spec

PRICE = 36.0  # USD per device-hour: 4 devices cost $0.04 a second
CAP = 1.5  # the start-up (billed: the devices are held) and some seconds of steps


def budget_message(db: StateDB, run_id: str) -> str:
    return "; ".join(e["message"] for e in db.events(run_id) if e["kind"] == "budget")


@pytest.mark.multiproc
def test_a_tiny_total_budget_checkpoints_and_stops_at_it(tmp_path):
    base = {
        "training.steps": 5000,  # far more than the budget pays for
        "checkpoint.interval": 5000,  # no checkpoint but the one the stop asks for
        "hardware.price_per_hour": PRICE,
    }
    spec = tiny_spec(**base, **{"budget.max_total_usd": CAP})
    # Planned without the budget (`plan` would refuse the whole job: it is predicted
    # above it), so that the run itself meets the cap: P=2 x D=2 as the spec pins.
    plan = make_plan(tiny_spec(**base))
    db = StateDB(tmp_path)
    opts = ApplyOptions(deadline_s=240.0, show_progress=False)
    run, outcome = launch(spec, plan, db, None, opts, Console(quiet=True))
    assert outcome.kind == "stopped", outcome.message
    row = db.get_run(run.id)
    assert row["phase"] == "stopped"
    trained = max([r["step"] for r in events(run.dir) if r["kind"] == "step"], default=0)
    assert 0 < trained < 5000, budget_message(db, run.id)
    # nothing lost: the newest complete checkpoint is the last step trained
    point = find_resume_point(spec.checkpoint, run.dir / "checkpoints")
    assert point is not None and point.step == trained == row["last_checkpoint"]
    (budget,) = [e for e in db.events(run.id) if e["kind"] == "budget"]
    data = budget["data"] if isinstance(budget["data"], dict) else json.loads(budget["data"])
    assert data["max_total_usd"] == CAP
    margin = data["usd_per_step"] + data["usd_to_next_check"]
    # stopped as the cap came within reach (a loaded host can make a check late)
    assert CAP - margin <= data["usd"] <= CAP + margin
    # status bills until the run ends: the stop's checkpoint and exit (seconds) too
    f = run_figures(row, db.events(run.id), time.time())
    assert data["usd"] <= f.cost_usd <= data["usd"] + 30 * PRICE * 4 / 3600


@pytest.mark.multiproc
def test_an_hourly_cap_below_the_devices_running_morphs_the_job_down(tmp_path):
    spec = tiny_spec(
        **{
            "training.steps": 80,
            "training.optimizer": "sgd",
            "training.lr": 0.3,
            "training.momentum": 0.9,
            "hardware.price_per_hour": 1.0,
            "budget.max_hourly_usd": 2.5,  # pays for 2 devices, not 4
        }
    )
    # Planned without the cap: 4 devices ($4/h), as after a scale-up past it.
    plan = make_plan(
        spec.model_copy(update={"budget": spec.budget.model_copy(update={"max_hourly_usd": None})})
    )
    assert plan.world_size == 4
    db = StateDB(tmp_path)
    opts = ApplyOptions(deadline_s=300.0, show_progress=False)
    run, outcome = launch(spec, plan, db, None, opts, Console(quiet=True))
    assert outcome.ok, outcome.message
    row = db.get_run(run.id)
    assert (row["phase"], row["step"], row["devices"]) == ("completed", 80, 2)
    (budget,) = [e for e in db.events(run.id) if e["kind"] == "budget"]
    data = budget["data"] if isinstance(budget["data"], dict) else json.loads(budget["data"])
    assert (data["devices"], data["target"], data["max_hourly_usd"]) == (4, 2, 2.5)
    morphs = [e for e in db.events(run.id) if e["kind"] == "morph"]
    assert len(morphs) == 1 and "4 -> 2 device(s)" in morphs[0]["message"]
    # the morph loses nothing: every step once more or once, each loss as one process
    ref, _ = reference_train(spec)
    steps = [e for e in events(run.dir) if e["kind"] == "step"]
    assert sorted({e["step"] for e in steps}) == list(range(1, 81))
    for e in steps:
        assert e["loss"] == pytest.approx(ref[e["step"] - 1], abs=1e-5), e
