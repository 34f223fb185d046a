"""The scheduler daemon as real processes: it resumes a killed job from S3, leaves a
running one alone, never launches a job twice from racing daemons, and its schedules
survive restarts."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from jobctl.engine.cli.app import app
from jobctl.engine.core.process import kill_tree
from jobctl.engine.recurring.book import ScheduleBook
from jobctl.engine.state.db import StateDB
from jobctl.engine.state.leases import JobEvents, Leases
from jobctl.spec import dump_yaml

from ..jobrun import JOBCTL, ROOT, cli_env, events, start_apply, tiny_spec, wait_for

ONE_DEVICE = {
    "hardware.nodes": 1,
    "hardware.processes_per_node": 1,
    "parallelism.pipeline_stages": 1,
    "parallelism.data_parallel": 1,
}


def _daemon(home: Path, log: Path, *extra: str) -> subprocess.Popen:
    cmd = [*JOBCTL, "scheduler", "run", "--home", str(home), "--poll", "0.3", *extra]
    with open(log, "ab") as out:
        return subprocess.Popen(
            cmd,
            env=cli_env(home),
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _stop(proc: subprocess.Popen) -> int:
    proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout=30)


def _events(home: Path, job: str, kind: str | None = None) -> list[dict]:
    return JobEvents(StateDB(home), "scheduler").list(job, kind)


def _cli(home: Path, *args: str) -> str:
    r = CliRunner().invoke(app, [*args, "--home", str(home)], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    return r.output


def _kill_run_midway(spec_file: Path, home: Path) -> tuple[Path, int]:
    """Start `jobctl apply`, kill it and its nodes once a checkpoint is uploaded."""
    proc = start_apply(spec_file, home)

    def uploaded() -> Path | None:
        assert proc.poll() is None, "the run ended before it could be killed"
        for run_dir in (home / "runs").glob("*"):
            if any(e["kind"] == "uploaded" and e["step"] >= 2 for e in events(run_dir)):
                return run_dir
        return None

    run_dir = wait_for(uploaded, 120, "a checkpoint in S3")
    row = StateDB(home).get_run(run_dir.name)
    for pid in [proc.pid, *map(int, row["pids"].split(","))]:
        kill_tree(pid, signal.SIGKILL)
    proc.wait(timeout=30)
    killed_at = max(e["step"] for e in events(run_dir) if e["kind"] == "step")
    return run_dir, killed_at


@pytest.mark.multiproc
@pytest.mark.chaos
@pytest.mark.s3
def test_daemon_resumes_a_killed_job_from_s3_until_it_completes(tmp_path, s3_url):
    steps = 40
    overrides = {"training.steps": steps, "checkpoint.interval": 1, "checkpoint.remote": s3_url}
    spec = tiny_spec(**ONE_DEVICE, **overrides)
    spec_file, home = tmp_path / "job.yaml", tmp_path / "home"
    spec_file.write_text(dump_yaml(spec))
    run_dir, killed_at = _kill_run_midway(spec_file, home)
    assert killed_at < steps
    shutil.rmtree(run_dir / "checkpoints")  # only object storage has them now

    _cli(home, "schedule", "add", spec.name, "--every", "1")
    daemon = _daemon(home, tmp_path / "daemon.log")
    try:
        db = StateDB(home)
        wait_for(
            lambda: db.get_run(run_dir.name)["phase"] == "completed", 150, "the run to complete"
        )
        wait_for(lambda: _events(home, spec.name, "complete"), 30, "a trigger after completion")
    finally:
        assert _stop(daemon) == 0, (tmp_path / "daemon.log").read_text()

    row = db.get_run(spec.name)
    assert row["id"] == run_dir.name and row["step"] == steps
    resumed = [json.loads(e["data"]) for e in db.events(row["id"]) if e["kind"] == "resume"]
    assert len(resumed) == 1 and resumed[0]["source"] == s3_url
    assert 2 <= resumed[0]["step"] <= killed_at
    kinds = [e["kind"] for e in _events(home, spec.name)]
    assert kinds.count("launch") == 1 and kinds.count("exit") == 1
    assert kinds.index("launch") < kinds.index("exit") < kinds.index("complete")
    skips = _events(home, spec.name, "skip")  # the 1 s triggers while it ran did nothing
    assert skips and all(e["message"].startswith("running") for e in skips)
    assert not Leases(db).get(spec.name).live(time.time())
    log = next((home / "scheduler" / "logs").glob(f"{spec.name}-*.log")).read_text()
    assert f"run {run_dir.name} completed" in log


@pytest.mark.multiproc
def test_a_trigger_on_a_running_job_does_nothing(tmp_path):
    spec = tiny_spec(**ONE_DEVICE, **{"training.steps": 5000, "checkpoint.interval": 1000})
    spec_file, home = tmp_path / "job.yaml", tmp_path / "home"
    spec_file.write_text(dump_yaml(spec))
    proc = start_apply(spec_file, home)
    try:
        db = StateDB(home)

        def training() -> bool:
            row = db.get_run(spec.name) if (home / "state.db").exists() else None
            return bool(row and row["phase"] == "training" and (row["step"] or 0) > 0)

        wait_for(training, 90, "the run to train")
        _cli(home, "schedule", "add", str(spec_file), "--every", "0.2")
        time.sleep(0.5)
        _cli(home, "scheduler", "run", "--once")
        assert proc.poll() is None
    finally:
        kill_tree(proc.pid, signal.SIGKILL)
        for pid in (db.get_run(spec.name)["pids"] or "").split(","):
            kill_tree(int(pid), signal.SIGKILL)
        proc.wait(timeout=30)
    kinds = [e["kind"] for e in _events(home, spec.name)]
    assert kinds == ["schedule", "trigger", "skip"]
    skip = _events(home, spec.name, "skip")[0]["message"]
    assert skip.startswith(f"running: run {db.get_run(spec.name)['id']} is training")
    assert not (home / "scheduler" / "logs").exists()  # nothing was launched


@pytest.mark.multiproc
def test_two_racing_daemons_launch_a_job_once(tmp_path):
    spec = tiny_spec(**ONE_DEVICE, **{"training.steps": 3})
    spec_file, home = tmp_path / "job.yaml", tmp_path / "home"
    spec_file.write_text(dump_yaml(spec))
    _cli(home, "schedule", "add", str(spec_file), "--every", "0.5")
    daemons = [_daemon(home, tmp_path / f"daemon-{i}.log") for i in range(2)]
    db = StateDB(home)
    try:
        wait_for(
            lambda: db.list_runs() and db.list_runs()[0]["phase"] == "completed", 120, "the run"
        )
        wait_for(
            lambda: len(_events(home, spec.name, "complete")) > 2, 30, "triggers after completion"
        )
    finally:
        codes = [_stop(d) for d in daemons]
    logs = "\n".join(p.read_text() for p in sorted(tmp_path.glob("daemon-*.log")))
    assert codes == [0, 0], logs

    events = _events(home, spec.name)
    launches = [e for e in events if e["kind"] == "launch"]
    assert len(launches) == 1, logs
    assert len({e["owner"] for e in events if e["kind"] == "trigger"}) == 2  # both fired
    others = [e for e in events if e["kind"] in ("skip", "complete")]
    assert any(e["owner"] != launches[0]["owner"] for e in others)
    kinds = {"schedule", "trigger", "launch", "skip", "exit", "complete"}
    assert {e["kind"] for e in events} <= kinds  # no errors, no lost leases
    assert [r["phase"] for r in db.list_runs()] == ["completed"]  # one run, launched once
    lease = Leases(db).get(spec.name)  # last claimed by a "complete" trigger, released
    assert lease.released_at is not None and not lease.live(time.time())


@pytest.mark.multiproc
def test_schedules_persist_and_follow_changes_across_daemon_restarts(tmp_path):
    home = tmp_path / "home"
    db = StateDB(home)
    db.create_run("done-1", "done", db.runs_dir / "done-1", total_steps=3)
    for phase in ("launching", "training", "completed"):
        db.set_phase("done-1", phase)
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text(dump_yaml(tiny_spec()))
    _cli(home, "schedule", "add", "done", "--every", "0.5")
    _cli(home, "schedule", "pause", "done")
    _cli(home, "schedule", "add", str(spec_file), "--cron", "0 3 * * 1-5", "--timezone", "UTC")
    with ScheduleBook(db) as book:
        before = {r.job: r for r in book.list()}

    first = _daemon(home, tmp_path / "d1.log")
    time.sleep(2.5)
    assert _stop(first) == 0
    assert not _events(home, "done", "trigger")  # paused: never fired
    with ScheduleBook(StateDB(home)) as book:
        after = {r.job: r for r in book.list()}
    assert after == before  # the restart lost and changed nothing

    second = _daemon(home, tmp_path / "d2.log")
    try:
        _cli(home, "schedule", "resume", "done")  # while the daemon runs
        wait_for(lambda: _events(home, "done", "complete"), 20, "a trigger of the resumed schedule")
        _cli(home, "schedule", "remove", "done")
        time.sleep(1.0)  # a pass may have been under way
        fired = len(_events(home, "done", "trigger"))
        time.sleep(1.5)
        assert len(_events(home, "done", "trigger")) == fired  # removal took effect
    finally:
        assert _stop(second) == 0

    third = _daemon(home, tmp_path / "d3.log", "--once")
    assert third.wait(timeout=60) == 0
    with ScheduleBook(StateDB(home)) as book:
        assert [(r.job, r.rule) for r in book.list()] == [
            ("quickstart", "cron '0 3 * * 1-5' (UTC)")
        ]
    assert _events(home, "done", "schedule")[-1]["message"] == "removed"
    assert all("done-1 is complete" in e["message"] for e in _events(home, "done", "complete"))
