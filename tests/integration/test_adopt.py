"""Kill the supervisor mid-run: the workers keep training, `jobctl resume` adopts them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from jobctl.engine.channel.host import read_host
from jobctl.engine.core.process import descendants, kill_tree, pid_alive
from jobctl.engine.state.db import StateDB
from jobctl.engine.supervise.adoption import archive_offset, catch_up, finished_unsupervised
from jobctl.engine.worker.reference import reference_train

from ..jobrun import ROOT, events, start_apply, tiny_spec, wait_for, write_spec

STEPS = 150
JOBCTL = [sys.executable, "-m", "jobctl.engine.cli.app"]


def _steps(run_dir) -> list[dict]:
    return [e for e in events(run_dir) if e["kind"] == "step"]


def test_archive_offset_points_after_the_last_recorded_step(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [
        '{"kind": "step", "step": 1}\n',
        '{"kind": "heartbeat", "step": 2}\n',
        '{"kind": "step", "step": 2}\n',
        '{"kind": "step", "step": 1}\n',  # a later attempt trained step 1 again
        '{"kind": "step", "step": 2}\n',
        '{"kind": "heartbeat", "step": 3}\n',
    ]
    path.write_text("".join(lines))
    assert archive_offset(path, 2) == sum(map(len, lines[:5]))
    assert archive_offset(path, None) == 0
    assert archive_offset(path, 9) == 0
    assert archive_offset(tmp_path / "missing.jsonl", 2) == 0


def test_a_foreign_zombie_node_counts_as_ended():
    """The node scripts of a SIGKILLed supervisor are reparented to a process that may
    never reap them: `jobctl resume` must not adopt a run whose node is such a zombie."""
    from jobctl.backends.local import LocalBackend

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    wait_for(lambda: not pid_alive(child.pid), 30, "the child's end")
    os.kill(child.pid, 0)  # a zombie: still signalable, not yet reaped
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        got = [s.exit_code for s in LocalBackend().status([str(child.pid), str(live.pid)])]
        assert got == [-1, None]
    finally:
        live.kill()
        live.wait()
        child.wait()


def _spec():
    return tiny_spec(
        **{
            "training.optimizer": "sgd",
            "training.lr": 0.3,
            "training.momentum": 0.9,
            "training.steps": STEPS,
            "checkpoint.interval": 25,
        }
    )


def _orphan_run(tmp_path, spec):
    """Start `jobctl apply`, let it train, SIGKILL only it; the workers train on."""
    home = tmp_path / "home"
    env = {**os.environ, "JOBCTL_HOME": str(home), "COLUMNS": "200"}
    env.pop("JOBCTL_CHANNEL", None)
    spec_file = write_spec(spec, tmp_path / "job.yaml")
    proc = start_apply(spec_file, home, unset=("JOBCTL_CHANNEL",))
    run_dir = wait_for(lambda: next(iter((home / "runs").glob("*")), None), what="run folder")
    wait_for(lambda: len(_steps(run_dir)) >= 5, what="five steps")
    handles = [int(h) for h in StateDB(home).get_run(run_dir.name)["pids"].split(",")]
    workers = {p for h in handles for p in descendants(h)}
    host = read_host(run_dir)
    os.kill(proc.pid, signal.SIGKILL)  # the supervisor only; nodes and run host live on
    proc.wait(timeout=30)
    killed_at = len(_steps(run_dir))
    # Without any supervisor the workers keep training and reporting.
    wait_for(lambda: len(_steps(run_dir)) >= killed_at + 5, 120, "training without supervisor")
    assert pid_alive(host.pid) and all(pid_alive(h) for h in handles)
    assert StateDB(home).get_run(run_dir.name)["phase"] == "training"
    return env, home, run_dir, handles, workers, host


def _resume(env, name):
    r = subprocess.run(
        [*JOBCTL, "resume", name], env=env, cwd=ROOT, capture_output=True, text=True, timeout=400
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return r


def _check_losses(spec, steps):
    ref_losses, _ = reference_train(spec)
    assert sorted({e["step"] for e in steps}) == list(range(1, STEPS + 1))
    for e in steps:
        assert e["loss"] == pytest.approx(ref_losses[e["step"] - 1], abs=1e-5), e


@pytest.mark.multiproc
@pytest.mark.chaos
def test_resume_adopts_live_workers_after_supervisor_sigkill(tmp_path):
    spec = _spec()
    env, home, run_dir, handles, workers, host = _orphan_run(tmp_path, spec)
    r = _resume(env, spec.name)
    assert "adopting live run" in r.stdout
    db = StateDB(home)
    row = db.get_run(run_dir.name)
    assert row["phase"] == "completed" and row["step"] == STEPS
    kinds = [e["kind"] for e in db.events(row["id"])]
    assert "adopt" in kinds and "resume" not in kinds  # re-attached, nothing relaunched
    assert not pid_alive(host.pid)

    steps = _steps(run_dir)
    assert [e["step"] for e in steps] == list(range(1, STEPS + 1))  # each loss once
    # The same worker processes reported every step, before and after the adoption.
    srcs = {e["src"] for e in events(run_dir) if "src" in e}
    assert {int(s.split("-")[2]) for s in srcs} <= workers  # rank-R-PID-EPOCH
    assert len({e["src"] for e in steps}) == 1
    _check_losses(spec, steps)
    assert row["loss"] == pytest.approx(steps[-1]["loss"])


@pytest.mark.multiproc
@pytest.mark.chaos
def test_resume_relaunches_when_a_node_died_meanwhile(tmp_path):
    """Supervisor killed, then a node: no adoption; the rest of the old attempt is ended
    (its survivors must not keep writing to the archive) and the run relaunches."""
    spec = _spec()
    env, home, run_dir, handles, workers, host = _orphan_run(tmp_path, spec)
    wait_for(lambda: any(e["kind"] == "checkpoint" for e in events(run_dir)), 120, "a checkpoint")
    kill_tree(handles[1], signal.SIGKILL)
    wait_for(lambda: not pid_alive(handles[1]), 30, "node 1 gone")
    r = _resume(env, spec.name)
    assert "adopting" not in r.stdout
    assert not pid_alive(host.pid) and not any(pid_alive(p) for p in workers)
    db = StateDB(home)
    row = db.get_run(run_dir.name)
    assert row["phase"] == "completed" and row["step"] == STEPS
    kinds = [e["kind"] for e in db.events(row["id"])]
    assert "resume" in kinds and "adopt" not in kinds  # relaunched from the checkpoint
    # Nothing from the old attempt reached the archive after the relaunch started.
    old = {f"-{p}" for p in workers}
    resumed_at = next(e["ts"] for e in db.events(row["id"]) if e["kind"] == "resume")
    late = [e for e in events(run_dir) if e["ts"] > resumed_at and "src" in e]
    assert not [e for e in late if any(e["src"].endswith(o) for o in old)]
    _check_losses(spec, _steps(run_dir))


def test_catch_up_reads_what_ran_unsupervised(tmp_path):
    """#46 item 1: the records a run wrote while no supervisor ran reach the DB."""
    db = StateDB(tmp_path)
    run_dir = db.runs_dir / "q-1"
    run_dir.mkdir(parents=True)
    db.create_run("q-1", "quickstart", run_dir, total_steps=30, devices=4)
    db.set_phase("q-1", "launching")
    db.set_phase("q-1", "training")
    db.update_run("q-1", step=6, loss=3.0, last_checkpoint=5)
    recs = [
        {"kind": "step", "ts": float(s), "step": s, "loss": 4 - s / 10, "samples_per_s": 9.0}
        for s in range(1, 31)
    ]
    recs += [{"kind": "checkpoint", "ts": 40.0 + s, "step": s, "path": "x"} for s in (10, 30)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    row = catch_up(db, db.get_run("q-1"))
    assert (row["step"], row["loss"], row["last_checkpoint"]) == (30, 1.0, 30)
    assert finished_unsupervised(row)
    (event,) = [e for e in db.events("q-1") if e["kind"] == "caught_up"]
    assert "step 30" in event["message"] and "last_checkpoint 30" in event["message"]
    assert catch_up(db, row) == row  # nothing new the second time


@pytest.mark.multiproc
@pytest.mark.chaos
def test_resume_of_a_run_that_finished_unsupervised_completes_it(tmp_path):
    """#46 item 1: supervisor SIGKILLed, the nodes trained on to the end; `resume` then
    relaunched them and recorded an early step and 'final loss nan'. It reads their
    records instead: completed at the last step with its loss, nothing relaunched."""
    spec = _spec()
    env, home, run_dir, handles, _, _ = _orphan_run(tmp_path, spec)
    wait_for(lambda: not any(pid_alive(h) for h in handles), 300, "the nodes' end")
    r = _resume(env, spec.name)
    db = StateDB(home)
    row = db.get_run(run_dir.name)
    steps = _steps(run_dir)
    assert row["phase"] == "completed" and row["step"] == STEPS == row["last_checkpoint"]
    assert row["loss"] == pytest.approx(steps[-1]["loss"])
    assert f"final loss {steps[-1]['loss']:.4f}" in r.stdout and "nan" not in r.stdout
    kinds = [e["kind"] for e in db.events(row["id"])]
    assert "caught_up" in kinds and "resume" not in kinds and "adopt" not in kinds
    assert [e["step"] for e in steps] == list(range(1, STEPS + 1))  # none trained twice
    _check_losses(spec, steps)
