"""Ctrl-C on a foreground `jobctl apply` (#24 item 2), with a real SIGINT: the first
asks every rank to checkpoint and stop (says so, records a stop event, the run ends
stopped at a checkpoint, exit 130); a second detaches, leaving the nodes running for
`jobctl resume` to adopt (a detach event; the run is never left failed)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from jobctl.engine.state.db import StateDB
from jobctl.spec import dump_yaml, load_spec

from ..jobrun import QUICKSTART

JOBCTL = [sys.executable, "-m", "jobctl.engine.cli.app"]


def _start(tmp_path):
    spec = load_spec(QUICKSTART, {"training.steps": 2000, "checkpoint.interval": 1000})
    (tmp_path / "job.yaml").write_text(dump_yaml(spec))
    home = tmp_path / "home"
    proc = subprocess.Popen(
        [*JOBCTL, "apply", str(tmp_path / "job.yaml"), "--home", str(home)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # the SIGINT below is the terminal's, to this process only
    )
    db = StateDB(home)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        runs = db.list_runs()
        if runs and (runs[0]["step"] or 0) >= 2:
            return proc, db, runs[0]["id"]
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.5)
    proc.kill()
    pytest.fail("the run never reached step 2")


@pytest.mark.multiproc
def test_first_ctrl_c_checkpoints_and_stops(tmp_path):
    proc, db, rid = _start(tmp_path)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 130, out
    assert "Ctrl-C: asking every rank" in out and "stopped at step" in out
    assert "step 2/2000 loss " in out  # into a pipe: a line per log_every (1) steps
    row = db.get_run(rid)
    assert row["phase"] == "stopped"
    kinds = [e["kind"] for e in db.events(rid)]
    assert "stop" in kinds
    assert any("Ctrl-C" in e["message"] for e in db.events(rid))
    steps = sorted((db.runs_dir / rid / "checkpoints").glob("step-*"))
    assert steps and int(steps[-1].name.split("-")[1]) == row["step"]


@pytest.mark.multiproc
def test_second_ctrl_c_detaches_and_the_nodes_go_on(tmp_path):
    proc, db, rid = _start(tmp_path)
    proc.send_signal(signal.SIGINT)
    # The second once the supervisor has passed the stop on to the nodes (they then
    # stop alone), and before they are done: a fixed 0.5 s let a fast run finish its
    # stop first, and the second Ctrl-C then met a process with nothing to detach.
    _wait_for(db, rid, "stop_signal")
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out
    assert f"detached from run {rid}" in out and f"jobctl resume {rid}" in out
    assert "Traceback" not in out
    assert "detach" in [e["kind"] for e in db.events(rid)]
    assert db.get_run(rid)["phase"] != "failed"
    status = subprocess.run(
        [*JOBCTL, "status", "--json", "--home", str(db.home)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    (shown,) = json.loads(status.stdout)
    assert shown["id"] == rid and shown["unsupervised"] is True  # status says so
    # The nodes were asked to stop by the first Ctrl-C; they checkpoint and exit alone.
    pids = [int(p) for p in (db.get_run(rid)["pids"] or "").split(",") if p.isdigit()]
    deadline = time.monotonic() + 120
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not any(_alive(p) for p in pids)
    assert sorted((db.runs_dir / rid / "checkpoints").glob("step-*"))


def _wait_for(db: StateDB, rid: str, kind: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while kind not in [e["kind"] for e in db.events(rid)]:
        assert time.monotonic() < deadline, f"no {kind} event"
        time.sleep(0.02)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
