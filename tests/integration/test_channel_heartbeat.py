"""A node that hangs (processes there, heartbeats gone) is treated as lost: the run morphs."""

from __future__ import annotations

import signal
import threading

import pytest

from jobctl.engine.core.process import kill_tree
from jobctl.engine.state.db import StateDB
from jobctl.engine.worker.reference import reference_train

from ..jobrun import events, run_job, tiny_spec, wait_for

STEPS = 40


@pytest.mark.multiproc
@pytest.mark.chaos
def test_silent_node_is_lost_and_the_run_morphs(tmp_path):
    spec = tiny_spec(
        **{
            "training.optimizer": "sgd",
            "training.lr": 0.3,
            "training.momentum": 0.9,
            "training.steps": STEPS,
            "checkpoint.interval": 3,
            "elasticity.enabled": True,
            "elasticity.heartbeat_timeout_s": 8.0,
        }
    )
    home = tmp_path / "home"
    frozen: list[int] = []

    def freeze_node_1() -> None:
        """SIGSTOP node 1's whole tree once a checkpoint exists: a hung machine."""
        run_dir = wait_for(lambda: next(iter((home / "runs").glob("*")), None), what="run")
        wait_for(
            lambda: any(e["kind"] == "checkpoint" and e["step"] >= 3 for e in events(run_dir)),
            what="a first checkpoint",
        )
        pid = int(StateDB(home).get_run(run_dir.name)["pids"].split(",")[1])
        frozen.append(pid)
        kill_tree(pid, signal.SIGSTOP)

    t = threading.Thread(target=freeze_node_1, daemon=True)
    t.start()
    run, outcome = run_job(spec, home, deadline_s=400)
    t.join(5)
    assert frozen, "node 1 was never frozen"
    assert outcome.ok, outcome.message
    db = StateDB(home)
    row = db.get_run(run.id)
    assert row["phase"] == "completed" and row["step"] == STEPS
    assert row["plan"].startswith("P=1 D=2")  # morphed onto the 2 devices left
    evs = db.events(run.id)
    timeouts = [e for e in evs if e["kind"] == "heartbeat_timeout"]
    assert len(timeouts) == 1 and "node(s) [1]" in timeouts[0]["message"]
    assert any(e["kind"] == "preemption" for e in evs)
    ref, _ = reference_train(spec)
    steps = [e for e in events(run.dir) if e["kind"] == "step"]
    assert sorted({e["step"] for e in steps}) == list(range(1, STEPS + 1))
    for e in steps:
        assert e["loss"] == pytest.approx(ref[e["step"] - 1], abs=1e-5), e
