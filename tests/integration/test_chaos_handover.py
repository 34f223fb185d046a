"""Preemption without rollback: a node lost mid-step while every stage keeps a replica.

A 2 x 2 job placed pipeline-major (node 0 runs replica 0's two stages, node 1 replica
1's), started with ``jobctl apply``; one rank of node 1 SIGKILLs its whole node (script,
torchrun agent, both workers) the moment it is inside a forward, the gradient
all-reduce, the optimizer update or a checkpoint write (``JOBCTL_CHAOS``,
engine/worker/chaos.py). The survivors on node 0 hand the step they hold over as an
emergency checkpoint and the run morphs onto them from that step, re-formed in place
(their own processes train on, engine/worker/reform.py), or relaunched where they
cannot re-form: every step is recorded once, in order (none trained twice), with the
loss an uninterrupted single process gets, and the recovery says 0 steps lost. With
D = 1 a lost node takes a stage with it: the run falls back to its newest checkpoint
and says so.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest

from jobctl.engine.core.env import CHAOS
from jobctl.engine.core.process import descendants, kill_tree
from jobctl.engine.state.db import StateDB
from jobctl.engine.worker.reference import reference_train

from ..jobrun import JOBCTL, cli_env, events, start_apply, tiny_spec, wait_for, write_spec

STEPS = 12


def _spec(**extra):
    return tiny_spec(
        **{
            "training.optimizer": "sgd",
            "training.lr": 0.3,
            "training.momentum": 0.9,
            "training.steps": STEPS,
            "checkpoint.interval": 3,
            "elasticity.enabled": True,
            "parallelism.placement": "pipeline_major",
            **extra,
        }
    )


def _run(tmp_path, monkeypatch, spec, chaos: str):
    """Run ``spec`` with ``JOBCTL_CHAOS=chaos`` to its end; the DB, run id and folder."""
    monkeypatch.setenv(CHAOS, chaos)
    home = tmp_path / "home"
    proc = start_apply(write_spec(spec, tmp_path / "job.yaml"), home, output=True)
    out, _ = proc.communicate(timeout=400)
    assert proc.returncode == 0, out
    run_dir = wait_for(lambda: next((home / "runs").glob("*"), None), 5, "the run folder")
    db = StateDB(home)
    row = db.get_run(run_dir.name)
    assert row["phase"] == "completed" and row["step"] == STEPS, out
    return db, row["id"], run_dir


def _status(tmp_path, run_id) -> str:
    r = subprocess.run(
        [*JOBCTL, "status", run_id],
        env=cli_env(tmp_path / "home"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout


def _data(db, run_id, kind):
    evs = [e for e in db.events(run_id) if e["kind"] == kind]
    assert evs, f"no {kind} event"
    return json.loads(evs[-1]["data"])


def _check_each_step_once(spec, run_dir):
    """Every step recorded exactly once, in order (a step trained twice would be
    recorded by both attempts), each with the single-process loss."""
    ref, _ = reference_train(spec)
    steps = [e for e in events(run_dir) if e["kind"] == "step"]
    assert [e["step"] for e in steps] == list(range(1, spec.training.steps + 1))
    for e in steps:
        assert e["loss"] == pytest.approx(ref[e["step"] - 1], abs=1e-5), e


@pytest.mark.multiproc
@pytest.mark.chaos
@pytest.mark.parametrize(
    "chaos",
    ["3:4:forward", "2:4:allreduce", "3:4:optimizer", "2:5:checkpoint"],
    ids=["forward", "allreduce", "optimizer", "checkpoint-write"],
)
def test_lost_node_hands_over_its_step(tmp_path, monkeypatch, chaos):
    spec = _spec()
    db, run_id, run_dir = _run(tmp_path, monkeypatch, spec, chaos)
    handed = _data(db, run_id, "emergency")
    assert handed["step"] is not None and handed["survivors"] == [0, 1], handed
    resumed = _data(db, run_id, "resume")
    assert resumed["step"] == handed["step"] >= int(chaos.split(":")[1])
    assert resumed["in_place"]  # the survivors' own processes trained on (no relaunch)
    recovery = _data(db, run_id, "recovery")
    assert recovery["steps_lost"] == 0 and recovery["source"] == "emergency checkpoint"
    assert db.get_run(run_id)["plan"].startswith("P=1 D=2")  # morphed onto node 0
    _check_each_step_once(spec, run_dir)
    kinds = [e["kind"] for e in db.events(run_id)]
    assert "released" in kinds  # the survivors' agents, freed from torchrun's exit barrier
    if "forward" in chaos:  # what the user sees
        assert "(0 steps lost)" in _status(tmp_path, run_id)


@pytest.mark.multiproc
@pytest.mark.chaos
def test_survivors_that_cannot_re_form_are_relaunched_from_their_step(tmp_path, monkeypatch):
    """The survivors leave instead of re-forming (no word in 0 s): after its bound the
    supervisor relaunches from the same emergency checkpoint; still no step lost."""
    monkeypatch.setenv("JOBCTL_REFORM_WAIT_S", "0")  # the survivors' wait for the word
    monkeypatch.setenv("JOBCTL_REFORM_SETTLE_S", "3")  # the supervisor's for their answers
    spec = _spec()
    db, run_id, run_dir = _run(tmp_path, monkeypatch, spec, "3:4:forward")
    handed = _data(db, run_id, "emergency")
    failed = [e for e in db.events(run_id) if e["kind"] == "reform"]
    assert failed and "re-forming in place failed" in failed[0]["message"]
    resumed = _data(db, run_id, "resume")
    assert resumed["step"] == handed["step"] and not resumed.get("in_place")
    assert _data(db, run_id, "recovery")["steps_lost"] == 0
    _check_each_step_once(spec, run_dir)


def _in_place(db, run_id) -> list[dict]:
    return [
        json.loads(e["data"])
        for e in db.events(run_id)
        if e["kind"] == "resume" and json.loads(e["data"] or "{}").get("in_place")
    ]


@pytest.mark.multiproc
@pytest.mark.chaos
def test_a_second_loss_re_forms_the_re_formed_survivors(tmp_path):
    """3 single-process nodes, pure data parallel: node 2 is lost, the two left re-form
    in place; then node 1: the one left, re-formed once already, hands over and re-forms
    again (the next epoch's keys in the same run host's store). No step lost, twice."""
    spec = _spec(
        **{
            "hardware.nodes": 3,
            "hardware.processes_per_node": 1,
            "parallelism.pipeline_stages": 1,
            "parallelism.data_parallel": 3,
            "training.global_batch_size": 12,
            "training.steps": 60,
            # rank 0 sleeps in every forward, so the run is still going when the test acts
            "model.import": "tests.slowmodel:factory",
            "model.family": None,
            "model.import_args": {"slow_rank": 0, "delay_s": 0.03},
        }
    )
    home = tmp_path / "home"
    proc = start_apply(write_spec(spec, tmp_path / "job.yaml"), home, output=True)
    run_dir = wait_for(
        lambda: next((home / "runs").glob("*"), None) if (home / "runs").exists() else None,
        what="the run folder",
    )
    wait_for(lambda: any(e["kind"] == "checkpoint" for e in events(run_dir)), what="a checkpoint")
    db = StateDB(home)
    kill_tree(int(db.get_run(run_dir.name)["pids"].split(",")[2]), signal.SIGKILL)
    wait_for(lambda: _in_place(db, run_dir.name), what="the first re-formation")
    first = _in_place(db, run_dir.name)[0]["step"]
    wait_for(lambda: db.get_run(run_dir.name)["step"] >= first + 2, what="training on")
    kill_tree(int(db.get_run(run_dir.name)["pids"].split(",")[1]), signal.SIGKILL)
    out, _ = proc.communicate(timeout=400)
    assert proc.returncode == 0, out
    resumes = _in_place(db, run_dir.name)
    assert [r["epoch"] for r in resumes] == [1, 2] and db.get_run(run_dir.name)["devices"] == 1
    lost = [
        json.loads(e["data"])["steps_lost"]
        for e in db.events(run_dir.name)
        if e["kind"] == "recovery"
    ]
    assert lost == [0, 0]
    _check_each_step_once(spec, run_dir)


@pytest.mark.multiproc
@pytest.mark.chaos
def test_without_a_replica_it_falls_back_to_the_checkpoint(tmp_path, monkeypatch):
    spec = _spec(
        **{"hardware.processes_per_node": 1, "parallelism.data_parallel": 1},
    )
    db, run_id, run_dir = _run(tmp_path, monkeypatch, spec, "1:8:forward")
    handed = _data(db, run_id, "emergency")
    assert handed["step"] is None and "no live replica of stage(s) [1]" in handed["why"]
    resumed = _data(db, run_id, "resume")
    recovery = _data(db, run_id, "recovery")
    # The newest complete checkpoint: step 6's, or step 3's when the killed node had not
    # yet written its part of step 6 (its writer runs in the background; on a loaded
    # machine it can be two steps behind). The losses below show it resumed right.
    start = resumed["step"]
    assert recovery["source"] == "checkpoint" and recovery["resumed"] == start in (3, 6)
    # completed steps of the first attempt: its records (the reporter's step records
    # died with node 1, the other rank's heartbeats say which steps completed)
    relaunched = next(e["ts"] for e in db.events(run_id) if e["kind"] == "resume")
    trained = max(
        e["step"]
        for e in events(run_dir)
        if e["kind"] in ("step", "heartbeat") and e["ts"] < relaunched
    )
    # The steps after the checkpoint that some record says completed (step 7 may or may
    # not have been reported before rank 1 took its node down: both counts agree).
    assert recovery["steps_lost"] == trained - start >= 0
    assert f"({trained - start} steps lost)" in _status(tmp_path, run_id)
    ref, _ = reference_train(spec)
    for e in events(run_dir):
        if e["kind"] == "step":
            assert e["loss"] == pytest.approx(ref[e["step"] - 1], abs=1e-5), e


@pytest.mark.multiproc
@pytest.mark.chaos
def test_a_hung_node_is_ended_and_its_survivors_hand_over(tmp_path):
    """Heartbeats stop (the node's processes frozen, SIGSTOP: a hung machine): the
    survivors wait in a collective that fails only once the supervisor, on the heartbeat
    timeout, ends the hung node (one ``heartbeat_timeout`` naming it, then a
    ``preemption``); they then hand their step over as for a SIGKILL. (Was also
    tests/integration/test_channel_heartbeat.py, the same freeze under stage-major
    placement; its fallback to a checkpoint after a lost stage is the SIGKILL path of
    test_chaos_elastic.py::test_lost_node_morphs_onto_the_rest.)"""
    spec = _spec(**{"training.steps": 40, "elasticity.heartbeat_timeout_s": 6.0})
    home = tmp_path / "home"
    proc = start_apply(write_spec(spec, tmp_path / "job.yaml"), home, output=True)
    run_dir = wait_for(lambda: next((home / "runs").glob("*"), None), what="the run folder")
    wait_for(lambda: any(e["kind"] == "checkpoint" for e in events(run_dir)), what="a checkpoint")
    node1 = int(StateDB(home).get_run(run_dir.name)["pids"].split(",")[1])
    for pid in [node1, *descendants(node1)]:
        os.kill(pid, signal.SIGSTOP)
    out, _ = proc.communicate(timeout=400)
    assert proc.returncode == 0, out
    db = StateDB(home)
    run_id = db.get_run(run_dir.name)["id"]
    evs = db.events(run_id)
    timeouts = [e for e in evs if e["kind"] == "heartbeat_timeout"]
    assert len(timeouts) == 1 and "node(s) [1]" in timeouts[0]["message"]
    assert any(e["kind"] == "preemption" for e in evs)
    assert db.get_run(run_id)["phase"] == "completed"
    handed = _data(db, run_id, "emergency")
    assert handed["step"] is not None and _data(db, run_id, "resume")["step"] == handed["step"]
    assert _data(db, run_id, "recovery")["steps_lost"] == 0
    ref, _ = reference_train(spec)
    steps = [e for e in events(run_dir) if e["kind"] == "step"]
    assert [e["step"] for e in steps] == list(range(1, 41))
    for e in steps:
        assert e["loss"] == pytest.approx(ref[e["step"] - 1], abs=1e-5), e
