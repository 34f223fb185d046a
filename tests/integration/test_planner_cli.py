"""`jobctl calibrate` through the typer CLI, and the plan that uses its record
(tests/unit/test_planner_cli.py: `jobctl plan --explain/--gantt/--json`)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from jobctl.engine.calibration.cache import cache_path, find_cached, fingerprint, load

from ..jobrun import QUICKSTART, tiny_spec

runner = CliRunner()


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
    # step_s is clamped at 0 (solo_costs): on a loaded machine the probe's optimizer
    # step can time faster than the calibrated one and the rest round to nothing
    assert rt.probe["idle"]["measured_s"] > 0 and rt.step_s >= 0 and 0.5 < rt.drift < 2
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
