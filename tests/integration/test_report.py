"""`jobctl report` of a real run (tests/unit/test_report.py: reports of archives
written by the tests)."""

from __future__ import annotations

import pytest

from jobctl.engine.state.db import StateDB

from ..jobrun import events, run_cli, run_job, tiny_spec
from ..report_pages import check_html, check_pngs, series_points


@pytest.mark.multiproc
def test_report_of_a_real_run(tmp_path):
    steps = 12
    spec = tiny_spec(
        **{
            "training.steps": steps,
            "checkpoint.interval": 4,
            "checkpoint.remote": f"file://{tmp_path / 'remote'}",
        }
    )
    home = tmp_path / "home"
    run, outcome = run_job(spec, home)
    assert outcome.ok, outcome.message
    r = run_cli(home, "report", run.id, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    path = run.dir / "report.html"
    assert f"wrote {path}" in r.stdout
    text = path.read_text()
    check_html(text)
    assert series_points(text, "throughput") == steps and series_points(text, "loss") == steps
    recs = events(run.dir)
    ckpts = sum(e["kind"] == "checkpoint" for e in recs)
    ups = sum(e["kind"] == "uploaded" for e in recs)
    assert ckpts >= 3 and ups >= 1
    # Upload progress: bytes of each (step, part) as they go, the last one complete.
    progress = [e for e in recs if e["kind"] == "upload"]
    for e in progress:
        assert e["part"] == "all" and 0 <= e["rank"] < 4
        assert 0 <= e["bytes_done"] <= e["bytes_total"] and e["bytes_total"] > 0
    for up in (e for e in recs if e["kind"] == "uploaded"):
        last = [e for e in progress if e["step"] == up["step"]][-1]
        assert last["bytes_done"] == last["bytes_total"], last
    assert text.count('data-kind="checkpoint"') == 2 * ckpts
    assert text.count('data-kind="upload"') == 2 * ups
    assert 'src="data:image/png;base64,' in text and "simulated" in text
    row = StateDB(home).get_run(run.id)
    assert row["plan"].split()[0] in text
    check_pngs(text, path)
    assert "plan: the run&#x27;s plan" in text

    out = tmp_path / "elsewhere.html"
    r = run_cli(home, "report", run.id, "-o", str(out), timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"wrote {out}" in r.stdout
    assert series_points(check_html(out.read_text()) and out.read_text(), "loss") == steps
    check_pngs(out.read_text(), out)  # elsewhere-*.png beside it

    bad = run_cli(home, "report", "nope", timeout=60)
    assert bad.returncode == 2 and "no run 'nope'" in bad.stderr
