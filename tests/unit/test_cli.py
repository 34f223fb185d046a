"""The jobctl command line: exit codes, messages and files, in this process
(tests/integration/test_cli.py runs real jobs through it)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from typer.testing import CliRunner

from jobctl.engine.cli.app import app

from ..jobrun import QUICKSTART, quickstart_with

runner = CliRunner()


def test_validate_ok():
    r = runner.invoke(app, ["validate", str(QUICKSTART)])
    assert r.exit_code == 0, r.output
    assert "job 'quickstart'" in r.output


def test_validate_unknown_key_exit_2_with_position(tmp_path):
    p = quickstart_with(tmp_path / "job.yaml", ("  micro_batch_size: 2", "  micro_batch_sise: 2"))
    r = runner.invoke(app, ["validate", str(p)])
    assert r.exit_code == 2
    line = next(i for i, t in enumerate(p.read_text().splitlines(), 1) if "sise" in t)
    assert f"{p}:{line}:3: training.micro_batch_sise" in r.output
    assert "did you mean 'micro_batch_size'" in r.output


@pytest.mark.parametrize(
    ("old", "new", "expect"),
    [
        ("  nodes: 2", "  nodes: 1", "P x D"),
        ("  steps: 60", "  steps: many", "training.steps"),
        ("  micro_batch_size: 2", "  micro_batch_size: 3", "micro_batch_size"),
        ("  pipeline_stages: 2", "  pipeline_stages: 8", "pipeline_stages"),
    ],
)
def test_bad_specs_fail_before_anything_starts(tmp_path, old, new, expect):
    p = quickstart_with(tmp_path / "job.yaml", (old, new))
    for cmd in (["validate", str(p)], ["plan", str(p)], ["apply", str(p), "--home", str(tmp_path)]):
        r = runner.invoke(app, cmd)
        assert r.exit_code == 2, (cmd, r.output)
        assert expect in r.output
    assert not (tmp_path / "runs").exists()


def test_plan_prints_layout():
    r = runner.invoke(app, ["plan", str(QUICKSTART)])
    assert r.exit_code == 0, r.output
    words = " ".join(r.output.split())  # the summary is prose: it wraps at words (#47)
    assert "P=2 x D=2 on 4 device(s), 2 node(s)" in words
    assert "micro-batch m=2 x 4 per replica = global batch 16" in words
    assert "F0 F1 B0 F2 B1 F3 B2 B3" in r.output


def test_plan_json_and_devices():
    r = runner.invoke(app, ["plan", str(QUICKSTART), "--json", "--devices", "4"])
    plan = json.loads(r.output)
    assert (plan["P"], plan["D"], plan["micro_batches"]) == (2, 2, 4)
    assert [s["blocks"] for s in plan["stages"]] == [[0, 1, 2], [3, 4, 5]]
    assert [(x["rank"], x["stage"], x["replica"]) for x in plan["ranks"]] == [
        (0, 0, 0),
        (1, 0, 1),
        (2, 1, 0),
        (3, 1, 1),
    ]


def test_render_writes_scripts(tmp_path):
    r = runner.invoke(app, ["render", str(QUICKSTART), "--out", str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    scripts = tmp_path / "out" / "run" / "scripts"  # the layout of a run's folder
    assert sorted(p.name for p in scripts.iterdir()) == ["node-0.sh", "node-1.sh"]
    assert sorted(p.name for p in scripts.parent.iterdir()) == ["plan.json", "scripts", "spec.yaml"]
    assert os.access(scripts / "node-0.sh", os.X_OK)
    subprocess.run(["bash", "-n", str(scripts / "node-1.sh")], check=True)
    subprocess.run(["bash", "-n", str(tmp_path / "out" / "start.sh")], check=True)


def test_apply_dry_run_starts_nothing(tmp_path):
    r = runner.invoke(app, ["apply", str(QUICKSTART), "--dry-run", "--home", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert "node-0.sh" in r.output and "-m jobctl.engine.worker.agent" in r.output
    assert not (tmp_path / "runs").exists()


def test_schema_is_json():
    r = runner.invoke(app, ["schema"])
    assert r.exit_code == 0
    assert "training" in json.loads(r.output)["properties"]


def test_status_and_logs_without_runs(tmp_path):
    r = runner.invoke(app, ["status", "--home", str(tmp_path)])
    assert r.exit_code == 0 and "no runs yet" in r.output
    r = runner.invoke(app, ["logs", "nope", "--home", str(tmp_path)])
    assert r.exit_code == 2 and "no run 'nope'" in r.output
