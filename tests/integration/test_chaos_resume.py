"""Kill a whole run (supervisor and every node tree) mid-training and mid-upload;
`jobctl resume` finishes it with nothing lost beyond the last complete checkpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from jobctl.engine.core.process import kill_tree
from jobctl.engine.state.db import StateDB
from jobctl.engine.worker.reference import reference_train
from jobctl.spec import dump_yaml

from ..jobrun import ROOT, events, final_weights, start_apply, tiny_spec

STEPS = 40


def _wait_for_upload(home: Path, proc: subprocess.Popen, timeout: float = 180.0) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the run ended before it could be killed"
        for run_dir in (home / "runs").glob("*"):
            if any(e["kind"] == "uploaded" and e["step"] >= 2 for e in events(run_dir)):
                return run_dir
        time.sleep(0.2)
    raise AssertionError("no checkpoint reached the remote store in time")


@pytest.mark.multiproc
@pytest.mark.chaos
@pytest.mark.s3
@pytest.mark.parametrize("again", ["resume", "apply"])
def test_kill_everything_then_resume(tmp_path, s3_url, again):
    spec = tiny_spec(
        **{
            "training.optimizer": "sgd",
            "training.lr": 0.3,
            "training.momentum": 0.9,
            "training.steps": STEPS,
            "checkpoint.interval": 1,
            "checkpoint.remote": s3_url,
        }
    )
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text(dump_yaml(spec))
    home = tmp_path / "home"
    env = {**os.environ, "JOBCTL_HOME": str(home), "COLUMNS": "200"}
    jobctl = [sys.executable, "-m", "jobctl.engine.cli.app"]
    proc = start_apply(spec_file, home)
    run_dir = _wait_for_upload(home, proc)
    row = StateDB(home).get_run(run_dir.name)
    for pid in [proc.pid, *map(int, row["pids"].split(","))]:
        kill_tree(pid, signal.SIGKILL)
    proc.wait(timeout=30)
    killed_at = max((e["step"] for e in events(run_dir) if e["kind"] == "step"), default=0)
    assert killed_at < STEPS, "the kill came too late to test anything"

    r = subprocess.run(
        [*jobctl, "resume", spec.name] if again == "resume" else [*jobctl, "apply", str(spec_file)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    db = StateDB(home)
    row = db.get_run(run_dir.name)
    assert row["phase"] == "completed" and row["step"] == STEPS
    resumed = [e for e in db.events(row["id"]) if e["kind"] == "resume"]
    assert len(resumed) == 1
    from_step = json.loads(resumed[0]["data"])["step"]
    assert 2 <= from_step <= killed_at

    ref_losses, ref_weights = reference_train(spec)
    steps = [e for e in events(run_dir) if e["kind"] == "step"]
    assert sorted({e["step"] for e in steps}) == list(range(1, STEPS + 1))  # nothing skipped
    for e in steps:  # a step trained twice saw the same data and gave the same loss
        assert e["loss"] == pytest.approx(ref_losses[e["step"] - 1], abs=1e-5), e
    weights = final_weights(run_dir, STEPS)
    for name, w in ref_weights.items():
        torch.testing.assert_close(weights[name], w, atol=1e-5, rtol=0, msg=name)
