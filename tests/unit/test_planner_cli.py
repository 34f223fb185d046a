"""`jobctl plan --explain/--gantt/--json` through the typer CLI
(tests/integration/test_planner_cli.py: `jobctl calibrate`, which runs the probes)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from ..jobrun import QUICKSTART, quickstart_with

runner = CliRunner()


def _auto_job(tmp_path):
    return quickstart_with(
        tmp_path / "auto.yaml",
        ("  pipeline_stages: 2", "  pipeline_stages: auto"),
        ("  data_parallel: 2", "  data_parallel: auto"),
        ("  schedule: 1f1b", "  schedule: auto"),
        ("  micro_batch_size: 2 ", "  micro_batch_size: auto "),
    )


def test_plan_explain_prints_the_reasoning_and_alternatives(tmp_path):
    from jobctl.engine.cli.app import app

    job = _auto_job(tmp_path)
    r = runner.invoke(
        app, ["plan", str(job), "--explain", "--home", str(tmp_path)], env={"COLUMNS": "250"}
    )
    assert r.exit_code == 0, r.output
    assert "why this plan" in r.output and "costs: analytic" in r.output
    assert "F(m)/m" in r.output and "P sweep: from 1" in r.output and "winner:" in r.output
    assert "alternatives" in r.output and "slower" in r.output
    assert "predicted (analytic)" in r.output


def test_plan_gantt_writes_a_png(tmp_path):
    from jobctl.engine.cli.app import app

    out = tmp_path / "gantt.png"
    r = runner.invoke(app, ["plan", str(QUICKSTART), "--gantt", str(out), "--home", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert out.read_bytes()[:4] == b"\x89PNG" and f"wrote {out}" in r.output.replace("\n", "")


def test_plan_json_carries_prediction_and_alternatives(tmp_path):
    from jobctl.engine.cli.app import app

    job = _auto_job(tmp_path)
    r = runner.invoke(app, ["plan", str(job), "--json", "--home", str(tmp_path)])
    assert r.exit_code == 0, r.output
    plan = json.loads(r.output)
    assert plan["prediction"]["source"] == "analytic"
    assert plan["alternatives"] and all(a["why_not"] for a in plan["alternatives"])
    assert plan["explanation"][-1].startswith("winner:")


def test_plan_infeasible_memory_exits_2_with_what_would_fit(tmp_path):
    from jobctl.engine.cli.app import app

    job = _auto_job(tmp_path)
    job.write_text(job.read_text().replace("  memory_gb: 2 ", "  memory_gb: 0.000001 "))
    r = runner.invoke(app, ["plan", str(job), "--home", str(tmp_path)])
    assert r.exit_code == 2
    assert "cannot plan" in r.output and "hardware.memory_gb" in r.output


def test_plan_says_its_source_and_adds_the_measured_start_up(tmp_path):
    from jobctl.engine.calibration.startup import record_startup, startup_for
    from jobctl.engine.cli.app import app
    from jobctl.engine.planner.resolver import machine_key, make_plan
    from jobctl.spec import load_spec

    cmd = ["plan", str(QUICKSTART), "--home", str(tmp_path)]
    r = runner.invoke(app, cmd, env={"COLUMNS": "250"})
    assert r.exit_code == 0, r.output
    assert "prediction source: analytic" in r.output and "jobctl calibrate" in r.output
    assert "start-up not measured on this machine yet" in r.output
    spec = load_spec(QUICKSTART)
    key = machine_key(spec)
    for seconds in (40.0, 30.0, 31.0):  # the median of this machine's runs
        record_startup(tmp_path, key, seconds)
    assert startup_for(tmp_path, key) == 31.0
    pr = make_plan(spec, home=tmp_path).prediction
    assert pr.startup_s == 31.0
    assert pr.total_s(spec.training.steps) == 31.0 + spec.training.steps * pr.step_time_s
    r = runner.invoke(app, cmd, env={"COLUMNS": "250"})
    assert "start-up 31 s (measured by earlier runs here)" in r.output
    assert f"+ {spec.training.steps} steps x" in r.output
