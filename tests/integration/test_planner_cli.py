"""`jobctl plan --explain/--gantt` and `jobctl calibrate` through the typer CLI."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from jobctl.engine.calibration.cache import cache_path, find_cached, fingerprint, load

from ..jobrun import QUICKSTART, tiny_spec

runner = CliRunner()


def _auto_job(tmp_path):
    text = QUICKSTART.read_text()
    for old, new in [
        ("  pipeline_stages: 2", "  pipeline_stages: auto"),
        ("  data_parallel: 2", "  data_parallel: auto"),
        ("  schedule: 1f1b", "  schedule: auto"),
        ("  micro_batch_size: 2 ", "  micro_batch_size: auto "),
    ]:
        assert old in text
        text = text.replace(old, new)
    path = tmp_path / "auto.yaml"
    path.write_text(text)
    return path


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


@pytest.mark.multiproc
def test_calibrate_caches_a_record_that_plan_then_uses(tmp_path):
    from jobctl.engine.cli.app import app

    r = runner.invoke(
        app, ["calibrate", str(QUICKSTART), "--home", str(tmp_path), "--repeats", "3"]
    )
    assert r.exit_code == 0, r.output
    assert "ms per action" in r.output and "slower during the probes" in r.output
    spec = tiny_spec()
    path = cache_path(tmp_path, fingerprint(spec))
    assert path.exists() and f"written to {path}" in r.output.replace("\n", "")
    cal = load(path)
    assert cal.source == "measured" and cal.num_blocks == 6
    assert cal.p2p_intra.source == "measured" and cal.p2p_inter.source == "analytic"
    assert cal.host.source == "measured" and set(cal.host.slowdown) == {2, 3, 4}
    rings = {(p.ring, p.inflight) for p in cal.allreduce_intra.points}
    assert rings == {(2, 1), (2, 2), (3, 1), (4, 1)}
    rt = cal.runtime  # the probes ran the runtime's executor: 1, 2 and 4 stages
    assert rt is not None and rt.source == "measured" and set(rt.probe) == {"idle", "busy"}
    assert rt.probe["idle"]["measured_s"] > 0 and rt.step_s > 0 and 0.5 < rt.drift < 2
    # Negative where shared memory beats the gloo ping-pong, never below a free send.
    assert rt.message_s >= -max(p.median for p in cal.p2p_intra.points.values())
    assert rt.load_idle > 0 and rt.load_busy > 0 and rt.action_s >= 0
    block = cal.blocks[1]
    assert set(block.forward) == {1, 2, 4, 8, 16} and block.forward[2].n == 3
    assert block.act_bytes > 0 and block.boundary_bytes == 4 * 32 * 64
    assert find_cached(spec, tmp_path) is not None
    p = runner.invoke(app, ["plan", str(QUICKSTART), "--home", str(tmp_path), "--explain"])
    assert p.exit_code == 0, p.output
    assert "predicted (calibration)" in p.output and cal.fingerprint.key in p.output
