"""`jobctl render --out DIR` writes a folder that runs as written (#24 item 8): DIR/start.sh
starts the rendezvous host and the node scripts from DIR/run/scripts/, with no jobctl
supervisor, and the run trains to its last step and checkpoint."""

from __future__ import annotations

import json
import subprocess

import pytest
from typer.testing import CliRunner

from jobctl.engine.cli.app import app
from jobctl.spec import dump_yaml, load_spec

from ..jobrun import QUICKSTART


@pytest.mark.multiproc
def test_rendered_folder_runs_by_hand(tmp_path):
    spec = load_spec(QUICKSTART, {"training.steps": 4, "checkpoint.interval": 2})
    (tmp_path / "job.yaml").write_text(dump_yaml(spec))
    out = tmp_path / "out"
    r = CliRunner().invoke(app, ["render", str(tmp_path / "job.yaml"), "--out", str(out)])
    assert r.exit_code == 0, r.output
    run = subprocess.run(
        ["bash", str(out / "start.sh")], capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stdout + run.stderr
    steps = [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines()]
    assert max(s["step"] for s in steps if s.get("kind") == "step") == 4
    assert (out / "run" / "checkpoints" / "step-00000004" / "manifest.json").exists()
    assert "step 4 loss" in (out / "run" / "logs" / "rank-3.log").read_text()
