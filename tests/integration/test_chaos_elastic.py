"""Preemption on spot machines: a lost node or a SIGTERM'd node, and `jobctl stop`.

Each "node" is its own process tree on 127.0.0.1; the supervisor is `jobctl apply`
as a subprocess. In every case the final step count is right and every recorded step
has the loss an uninterrupted single process gets at that step (a step trained twice
saw the same data).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from jobctl.engine.core.process import descendants, kill_tree
from jobctl.engine.state.db import StateDB
from jobctl.engine.worker.reference import reference_train

from ..jobrun import events, start_apply, tiny_spec, wait_for, write_spec

STEPS = 30
JOBCTL = [sys.executable, "-m", "jobctl.engine.cli.app"]
# Rank 0 sleeps 50 ms in every forward, so a CLI request (a new Python process) lands
# mid-run even on a fast machine; the single-process reference does not sleep.
SLOW = {
    "model.import": "tests.slowmodel:factory",
    "model.import_args": {"slow_rank": 0, "delay_s": 0.05},
    "model.family": None,
}


def _spec(steps: int = STEPS, **extra):
    return tiny_spec(
        **{
            "training.optimizer": "sgd",
            "training.lr": 0.3,
            "training.momentum": 0.9,
            "training.steps": steps,
            "checkpoint.interval": 3,
            "elasticity.enabled": True,
            **extra,
        }
    )


def _start(tmp_path, spec):
    env = {**os.environ, "JOBCTL_HOME": str(tmp_path / "home"), "COLUMNS": "200"}
    home = tmp_path / "home"
    proc = start_apply(write_spec(spec, tmp_path / "job.yaml"), home, output=True)
    run_dir = wait_for(
        lambda: next((home / "runs").glob("*"), None) if (home / "runs").exists() else None,
        what="the run folder",
    )
    wait_for(
        lambda: any(e["kind"] == "checkpoint" and e["step"] >= 3 for e in events(run_dir)),
        what="a first checkpoint",
    )
    return proc, env, home, run_dir


def _check_losses(spec, run_dir):
    ref, _ = reference_train(spec)
    steps = [e for e in events(run_dir) if e["kind"] == "step"]
    assert sorted({e["step"] for e in steps}) == list(range(1, spec.training.steps + 1))
    for e in steps:
        assert e["loss"] == pytest.approx(ref[e["step"] - 1], abs=1e-5), e


def _node_pids(home, run_dir) -> list[int]:
    return [int(p) for p in StateDB(home).get_run(run_dir.name)["pids"].split(",")]


def _kill_node_and_finish(proc, home, run_dir, node: int, timeout: float):
    """SIGKILL node ``node``'s process tree, then wait for the supervisor, which must end
    well; returns the state DB, the run's row and the supervisor's output."""
    kill_tree(_node_pids(home, run_dir)[node], signal.SIGKILL)
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out
    db = StateDB(home)
    return db, db.get_run(run_dir.name), out


@pytest.mark.multiproc
@pytest.mark.chaos
def test_lost_node_morphs_onto_the_rest(tmp_path):
    spec = _spec()
    proc, _, home, run_dir = _start(tmp_path, spec)
    db, row, _ = _kill_node_and_finish(proc, home, run_dir, 1, timeout=300)
    assert row["phase"] == "completed" and row["step"] == STEPS
    assert row["devices"] == 2 and row["plan"].startswith("P=1 D=2")  # morphed: 2x2 -> 1x2
    kinds = [e["kind"] for e in db.events(row["id"])]
    assert "preemption" in kinds and "resume" in kinds and "recovery" in kinds
    assert row["recovery_s"] > 0
    _check_losses(spec, run_dir)


def _workers(node_pid: int) -> list[int]:
    """The worker processes under one node's process tree: the torchrun agent's
    children, started fresh or forked from it (engine/worker/agent.py; a forked one
    keeps the agent's command line)."""
    tree = descendants(node_pid)
    agents = {p for p in tree if _is_agent(p) and not _is_agent(_ppid(p))}
    return sorted(p for p in tree if _ppid(p) in agents)


def _is_agent(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"jobctl.engine.worker.agent" in f.read().split(b"\0")
    except OSError:
        return False


def _ppid(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return -1


def _resumed_from_last_checkpoint(db, run_dir, checkpointed: int) -> None:
    """The relaunch continued from a checkpoint at least as new as ``checkpointed`` (its
    ``checkpoint`` record may have died with the node that wrote it: the manifest on
    disk is what commits a checkpoint)."""
    evs = db.events(run_dir.name)
    resumed = json.loads(next(e for e in evs if e["kind"] == "resume")["data"])
    assert resumed["step"] >= checkpointed


@pytest.mark.multiproc
@pytest.mark.chaos
def test_losing_node_0_with_rank_0_morphs_onto_the_rest(tmp_path):
    spec = _spec()
    proc, _, home, run_dir = _start(tmp_path, spec)
    done = max(e["step"] for e in events(run_dir) if e["kind"] == "checkpoint")
    db, row, _ = _kill_node_and_finish(proc, home, run_dir, 0, timeout=300)  # rank 0 reports
    assert row["phase"] == "completed" and row["step"] == STEPS
    assert row["devices"] == 2 and row["recovery_s"] > 0
    _resumed_from_last_checkpoint(db, run_dir, done)
    _check_losses(spec, run_dir)  # the loss sequence goes on from the checkpoint


@pytest.mark.multiproc
@pytest.mark.chaos
def test_a_killed_worker_process_drops_its_node(tmp_path):
    spec = _spec()
    proc, _, home, run_dir = _start(tmp_path, spec)
    node1 = _node_pids(home, run_dir)[1]
    workers = wait_for(lambda: _workers(node1), 60, "node 1's workers")
    os.kill(workers[0], signal.SIGKILL)  # one process dies; its node's agent fails
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    db = StateDB(home)
    row = db.get_run(run_dir.name)
    assert row["phase"] == "completed" and row["step"] == STEPS and row["devices"] == 2
    kinds = [e["kind"] for e in db.events(row["id"])]
    assert "process_lost" in kinds and "recovery" in kinds
    _check_losses(spec, run_dir)


@pytest.mark.multiproc
@pytest.mark.chaos
def test_sigterm_node_checkpoints_first_then_morphs(tmp_path):
    spec = _spec()
    proc, _, home, run_dir = _start(tmp_path, spec)
    os.kill(_node_pids(home, run_dir)[0], signal.SIGTERM)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    db = StateDB(home)
    evs = db.events(run_dir.name)
    stopped_at = next(e for e in evs if e["kind"] == "stopped")["message"].split()[-1]
    resumed = json.loads(next(e for e in evs if e["kind"] == "resume")["data"])
    assert resumed["step"] == int(stopped_at)  # nothing lost: resumed at the SIGTERM step
    assert resumed["in_place"]  # node 1's processes trained on, re-formed (#25)
    assert db.get_run(run_dir.name)["phase"] == "completed"
    _check_losses(spec, run_dir)


@pytest.mark.multiproc
@pytest.mark.chaos
def test_stop_then_resume(tmp_path):
    spec = _spec(150, **{**SLOW, "elasticity.enabled": False})  # long enough to stop mid-way
    proc, env, home, run_dir = _start(tmp_path, spec)
    r = subprocess.run([*JOBCTL, "stop", run_dir.name], env=env, capture_output=True, text=True)
    assert r.returncode == 0 and "checkpoint and stop" in r.stdout
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0 and "stopped at step" in out, out
    row = StateDB(home).get_run(run_dir.name)
    assert row["phase"] == "stopped" and row["last_checkpoint"] == row["step"] < 150
    r = subprocess.run(
        [*JOBCTL, "resume", run_dir.name], env=env, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert StateDB(home).get_run(run_dir.name)["phase"] == "completed"
    _check_losses(spec, run_dir)
