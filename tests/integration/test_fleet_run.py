"""Fleets of real runs: six tiny members two at a time, and a fleet whose runner (and a
running member) is killed, then resumed without repeating the completed member."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from jobctl.engine.cli.app import app
from jobctl.engine.core.process import kill_tree
from jobctl.engine.fleet.db import FleetDB
from jobctl.engine.state.db import StateDB
from jobctl.engine.state.leases import JobEvents

from ..jobrun import QUICKSTART, ROOT, events

ONE_DEVICE = (
    "hardware.nodes: 1, hardware.processes_per_node: 2, "
    "parallelism.pipeline_stages: 1, parallelism.data_parallel: 1"
)


def _fleet(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text(f"base: {QUICKSTART}\n" + textwrap.dedent(body))
    return path


def _most_at_once(spans: list[tuple[float, float]]) -> int:
    edges = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    now = most = 0
    for _, step in edges:  # an end at the same instant as a start is counted first
        now += step
        most = max(most, now)
    return most


@pytest.mark.multiproc
def test_six_members_two_at_a_time_all_complete(tmp_path):
    path = _fleet(
        tmp_path,
        f"""\
        name: six
        member_name: "six-{{{{ lr }}}}"
        matrix: {{lr: [0.01, 0.02, 0.03, 0.04, 0.05, 0.06]}}
        set: {{training.lr: "{{{{ lr }}}}", training.steps: 3, checkpoint.interval: 3,
               {ONE_DEVICE}}}
        """,
    )
    home = tmp_path / "home"
    r = CliRunner().invoke(
        app,
        [
            "fleet",
            "apply",
            str(path),
            "--home",
            str(home),
            "--max-concurrent",
            "2",
            "--poll",
            "0.3",
        ],
        env={"COLUMNS": "200"},
    )
    assert r.exit_code == 0, r.output
    db = StateDB(home)
    members = FleetDB(db).members("six")
    assert [m["state"] for m in members] == ["completed"] * 6
    assert all(m["launches"] == 1 and m["exit_code"] == 0 for m in members)
    runs = {m["member"]: db.get_run(m["run_id"]) for m in members}
    for name, run in runs.items():
        assert run["name"] == name and run["phase"] == "completed"
        assert run["step"] == 3 and run["loss"] is not None
    assert len(db.list_runs()) == 6
    # The bound holds for the runner's view and for the runs' own lifetimes.
    assert _most_at_once([(m["started_at"], m["ended_at"]) for m in members]) == 2
    assert _most_at_once([(x["created_at"], x["updated_at"]) for x in runs.values()]) <= 2
    assert "six-0.06" in r.output and "completed" in r.output
    assert FleetDB(db).get("six")["state"] == "completed"


@pytest.mark.multiproc
@pytest.mark.chaos
def test_resume_after_the_runner_is_killed_skips_the_completed_member(tmp_path):
    path = _fleet(
        tmp_path,
        f"""\
        name: pair
        member_name: "pair-{{{{ steps }}}}"
        runs: [{{steps: 3}}, {{steps: 150}}]
        max_concurrent: 1
        set: {{training.steps: "{{{{ steps }}}}", checkpoint.interval: 5, {ONE_DEVICE}}}
        """,
    )
    home = tmp_path / "home"
    env = {**os.environ, "COLUMNS": "200"}
    runner = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jobctl.engine.cli.app",
            "fleet",
            "apply",
            str(path),
            "--home",
            str(home),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    db = StateDB(home)
    deadline = time.monotonic() + 150
    while True:
        assert time.monotonic() < deadline and runner.poll() is None
        run = db.get_run("pair-150") if (home / "state.db").exists() else None
        if run is not None and (run["last_checkpoint"] or 0) >= 5:
            break
        time.sleep(0.3)
    second = FleetDB(db).members("pair")[1]
    kill_tree(runner.pid, signal.SIGKILL)  # the runner and, separately, the running member
    kill_tree(second["pid"], signal.SIGKILL)
    runner.wait(timeout=30)
    steps = events(Path(db.get_run("pair-150")["run_dir"]))
    killed_at = max(e["step"] for e in steps if e["kind"] == "step")
    assert killed_at < 150, "the kill came too late to test anything"
    assert [m["state"] for m in FleetDB(db).members("pair")] == ["completed", "running"]

    r = CliRunner().invoke(
        app, ["fleet", "resume", "pair", "--home", str(home)], env={"COLUMNS": "200"}
    )
    assert r.exit_code == 0, r.output
    first, second = FleetDB(db).members("pair")
    assert (first["state"], first["launches"]) == ("completed", 1)  # skipped, not re-run
    assert (second["state"], second["launches"]) == ("completed", 2)
    assert [x["name"] for x in db.list_runs()].count("pair-150") == 1  # the same run went on
    run = db.get_run("pair-150")
    assert run["phase"] == "completed" and run["step"] == 150
    resumed = [e for e in db.events(run["id"]) if e["kind"] == "resume"]
    assert len(resumed) == 1 and 5 <= json.loads(resumed[0]["data"])["step"] <= killed_at
    fleet_events = [
        (e["kind"], e["message"].split(":")[0]) for e in JobEvents(db, "fleet").list("pair")
    ]
    assert ("skip", "pair-3") in fleet_events
    assert sum(1 for kind, _ in fleet_events if kind == "launch") == 3
