"""The run-time budget: the total cap asks the run to stop (a checkpoint first), the
hourly cap leaves a scale request for fewer devices; each records a ``budget`` event
with the figures. (tests/integration/test_budget_run.py: a real run stopping at it.)"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from jobctl.engine.core.process import pid_alive, process_token
from jobctl.engine.state.db import StateDB
from jobctl.engine.supervise.budget import BudgetWatch
from jobctl.engine.supervise.scaling import read_request
from jobctl.spec import dump_yaml, load_spec

QUICKSTART = Path(__file__).resolve().parents[2] / "jobs" / "quickstart.yaml"


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _run(tmp_path, **overrides):
    """A run of the quickstart (4 devices) training since t=1000, 1 s a step."""
    clock = Clock(990.0)
    db = StateDB(tmp_path, clock=clock)
    spec = load_spec(QUICKSTART, overrides=overrides)
    run_dir = db.runs_dir / "q-1"
    run_dir.mkdir(parents=True)
    (run_dir / "spec.yaml").write_text(dump_yaml(spec))
    steps = [{"kind": "step", "ts": 1000.0 + s, "step": s, "loss": 1.0} for s in range(1, 6)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steps))
    db.create_run("q-1", "quickstart", run_dir, total_steps=60, devices=4)
    db.set_phase("q-1", "launching", "P=2 D=2")
    clock.t = 1000.0
    db.set_phase("q-1", "training", "pid 1 supervising 2 node(s)")
    db.update_run("q-1", step=5)
    me = os.getpid()  # this process supervises it (a stop reaches it through the DB)
    assert db.claim_supervisor("q-1", me, pid_alive, process_token(me)) is None
    return db, clock, spec, run_dir


def test_total_cap_stops_the_run_before_the_next_step_passes_it(tmp_path):
    # $36 per device-hour: 4 devices cost $0.04 a second, a step (1 s) $0.04
    db, clock, spec, _ = _run(
        tmp_path, **{"hardware.price_per_hour": 36.0, "budget.max_total_usd": 0.5}
    )
    watch = BudgetWatch(db, "q-1", spec)
    clock.t = 1010.0  # $0.40 spent, the next step would make $0.44: still within
    assert watch.check() is None
    assert db.get_run("q-1")["stop_requested"] is None
    clock.t = 1010.5  # checked at most once a second
    assert watch.check() is None
    clock.t = 1011.5  # $0.46 + $0.04 reaches $0.50
    assert watch.check() == "stop"
    row = db.get_run("q-1")
    assert row["stop_requested"] == 1011.5 and row["phase"] == "stopping"
    (event,) = [e for e in db.events("q-1") if e["kind"] == "budget"]
    data = json.loads(event["data"]) if isinstance(event["data"], str) else event["data"]
    assert data["usd"] == pytest.approx(0.46)
    assert data["usd_per_step"] == pytest.approx(0.04)
    assert data["max_total_usd"] == 0.5 and data["step"] == 5
    assert "budget.max_total_usd $0.5 reached" in event["message"]
    clock.t = 1020.0
    assert watch.check() is None  # asked once


def test_hourly_cap_asks_for_a_morph_to_the_devices_it_pays_for(tmp_path):
    db, clock, spec, run_dir = _run(
        tmp_path, **{"hardware.price_per_hour": 1.0, "budget.max_hourly_usd": 2.5}
    )
    watch = BudgetWatch(db, "q-1", spec)
    clock.t = 1002.0
    assert watch.check() == "shrink"  # 4 devices at $1/h = $4/h > $2.5/h
    req = read_request(run_dir)
    assert (req.devices, req.reason) == (2, "budget.max_hourly_usd")
    (event,) = [e for e in db.events("q-1") if e["kind"] == "budget"]
    assert "4 device(s) cost $4/h; morphing to 2 device(s) ($2/h)" in event["message"]
    clock.t = 1004.0
    assert watch.check() is None  # the request is pending: not asked twice
    db.update_run("q-1", devices=2)
    clock.t = 1006.0
    assert watch.check() is None and db.get_run("q-1")["stop_requested"] is None


def test_no_budget_no_checks(tmp_path):
    db, clock, spec, run_dir = _run(tmp_path, **{"hardware.price_per_hour": 100.0})
    clock.t = 5000.0
    assert BudgetWatch(db, "q-1", spec).check() is None
    assert read_request(run_dir) is None and db.get_run("q-1")["stop_requested"] is None
