"""`jobctl report`: a self-contained HTML page with throughput, events, loss and timeline,
from archives written here (tests/integration/test_report.py: the report of a real run)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from jobctl.engine.cli.report import write_report
from jobctl.engine.planner.resolver import make_plan
from jobctl.engine.state.db import StateDB
from jobctl.engine.supervise.figures import RunFigures
from jobctl.engine.supervise.report_data import collect
from jobctl.engine.views.report import render_html
from jobctl.spec import load_spec

from ..jobrun import QUICKSTART
from ..report_pages import check_html, check_pngs, png_size, series_points


def _beat(ts: float, step: int, rank: int) -> dict:
    """A heartbeat with every field a real one carries (the report skips one without)."""
    return {"kind": "heartbeat", "ts": ts, "step": step, "rank": rank, "stage": 0, "node": 0} | {
        "compute_s": 0.1
    }


def test_series_devices_and_markers_from_an_archive(tmp_path):
    """Two attempts (4 then 2 devices) trained steps 1-3 and 3-4; markers from both sources."""
    run_dir = tmp_path
    lines = []
    for step, ts, ranks in [
        (1, 100.0, 4),
        (2, 101.0, 4),
        (3, 102.0, 4),
        (3, 130.0, 2),
        (4, 131, 2),
    ]:
        for r in range(ranks):
            lines.append(_beat(ts, step, r))
        lines.append(
            {
                "kind": "step",
                "ts": ts,
                "step": step,
                "loss": 5.0 - step,
                "step_time_s": 0.5,
                "samples_per_s": 32.0,
            }
        )
        if step == 2:
            lines.append({"kind": "checkpoint", "ts": ts + 0.1, "step": 2, "path": "x"})
            lines.append({"kind": "uploaded", "ts": ts + 0.5, "step": 2})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    db_events = [
        {"ts": 110.0, "kind": "preemption", "message": "lost node(s) [1]; 2 device(s) left"},
        {"ts": 125.0, "kind": "resume", "message": "from step 2 (local) as P=1 D=2"},
        {"ts": 131.0, "kind": "recovery", "message": "training again 21 s after"},
        {"ts": 99.0, "kind": "phase", "message": "training"},
    ]
    s = collect(run_dir, db_events, devices_now=2)
    assert [p["step"] for p in s.steps] == [1, 2, 3, 3, 4]
    assert [p["dev"] for p in s.steps] == [4, 4, 4, 2, 2]
    kinds = sorted(m.kind for m in s.markers)
    assert kinds == ["checkpoint", "morph", "preemption", "recovery", "upload"]
    assert s.skipped == 0
    assert min(m.x for m in s.markers) == pytest.approx(1.1)  # seconds after the first step
    row = {
        "id": "r<&>",
        "phase": "completed",
        "step": 4,
        "total_steps": 4,
        "loss": 1.0,
        "plan": "P=1 D=2",
        "devices": 2,
    }
    text = render_html(row, s, db_events, None)
    check_html(text)
    assert "r&lt;&amp;&gt;" in text and "r<&>" not in text
    assert series_points(text, "throughput") == 5 and series_points(text, "loss") == 5
    runs = re.findall(r'class="series per-device"[^>]*points="([^"]*)"', text)
    assert len(runs) == 2  # the 28 s between the attempts breaks the line (#47)
    ys = [float(p.split(",")[1]) for run in runs for p in run.split()]
    assert ys[0] == ys[1] == ys[2] and ys[3] < ys[0]  # 8 samples/s/device, then 16: higher
    assert s.gaps == [(2.0, 30.0)] and text.count('class="gap"') == 2
    assert text.count('data-kind="checkpoint"') == 2  # on both throughput charts
    money = RunFigures(eta_s=60.0, cost_usd=1.5, usd_per_step=0.002, usd_to_finish=0.25)
    text = render_html(row, s, db_events, None, figures=money)
    for cell in (
        "$ so far</th><td>$1.50",
        "$ per step (now)</th><td>$0.002",
        "$ to finish (current rate)</th><td>$0.2500",
        "ETA</th><td>0:01:00",
    ):
        assert cell in text, cell
    # #47: no price, no dollars; the loss shown to 4 decimals (the data keeps them all)
    text = render_html({**row, "loss": 2.718281828459045}, s, db_events, None, figures=RunFigures())
    assert "$" not in text.split("<svg")[0] and "ETA</th><td>-" in text
    assert "loss</th><td>2.7183</td>" in text and "2.71828" not in text


def _run_with_plan(tmp_path, plan_overrides: dict | None):
    """A run folder (quickstart spec: P=2 x D=2) with an archive of 6 steps and, unless
    ``plan_overrides`` is None, a plan.json planned from the spec with those overrides."""
    db = StateDB(tmp_path / "home", clock=lambda: 1000.0)
    run_dir = db.runs_dir / "quick-1"
    run_dir.mkdir(parents=True)
    (run_dir / "spec.yaml").write_text(QUICKSTART.read_text())
    if plan_overrides is not None:
        plan = make_plan(load_spec(QUICKSTART, plan_overrides), 4)
        (run_dir / "plan.json").write_text(plan.model_dump_json(indent=2))
    recs = [
        {
            "kind": "step",
            "ts": 1000.0 + s,
            "step": s,
            "loss": 6.0 - 0.5 * s,
            "step_time_s": 1.0,
            "samples_per_s": 16.0,
        }
        for s in range(1, 7)
    ]
    recs.append({"kind": "checkpoint", "ts": 1003.5, "step": 3, "path": "x"})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    db.create_run("quick-1", "quickstart", run_dir, total_steps=6, devices=4, plan="P=1 D=4")
    return db, db.get_run("quick-1")


def test_report_writes_pngs_and_draws_the_runs_own_plan(tmp_path):
    # Re-planning the spec gives P=2 x D=2; the run's plan.json says P=1 x D=4.
    db, row = _run_with_plan(
        tmp_path, {"parallelism.pipeline_stages": 1, "parallelism.data_parallel": 4}
    )
    out = tmp_path / "out" / "r.html"
    out.parent.mkdir()
    path = write_report(db, row, out, tmp_path / "home")
    text = path.read_text()
    check_html(text)
    pngs = check_pngs(text, path)
    assert "P=1 D=4 m=2 N_m=2 1f1b, simulated" in text and "P=2 D=2" not in text
    assert f"plan: the run&#x27;s plan ({row['run_dir']}/plan.json)" in text
    assert "re-planned" not in text
    one_stage = png_size(pngs["timeline"])[1]

    # Without plan.json the page re-plans (P=2 x D=2) and says so.
    (Path(row["run_dir"]) / "plan.json").unlink()
    text = write_report(db, row, out, tmp_path / "home").read_text()
    check_html(text)
    check_pngs(text, path)
    assert "P=2 D=2 m=2 N_m=4 1f1b, simulated" in text
    assert "plan: re-planned for 4 device(s): the run has no plan.json" in text
    assert png_size(pngs["timeline"])[1] > one_stage  # a Gantt row per stage: taller


def test_report_png_charts_carry_the_archive(tmp_path):
    """The throughput PNG differs with the event markers: they are drawn, not only SVG."""
    from jobctl.engine.supervise.report_data import Marker
    from jobctl.engine.views.png import draw_png
    from jobctl.engine.views.svg import Chart, Series

    plain = Chart("Throughput", "t", "samples/s", [Series("s", [0, 1, 2], [1, 2, 3])])
    marked = Chart(**{**plain.__dict__, "markers": [Marker(1.0, "checkpoint", "ckpt 1")]})
    a, b = draw_png(plain, tmp_path / "a.png"), draw_png(marked, tmp_path / "b.png")
    assert png_size(a) == png_size(b) == (960, 280)
    assert a.read_bytes() != b.read_bytes()


def _stopped_then_resumed(run_dir: Path) -> list[dict]:
    """Ctrl-C at step 4 (the workers' SIGTERM records, a checkpoint), `jobctl resume`
    150 s later on the same 4 devices, steps 5-8: the archive and the DB events."""
    lines = []
    for step in range(1, 9):
        ts = 100.0 + step + (150.0 if step > 4 else 0.0)
        lines += [_beat(ts, step, r) for r in range(4)]
        lines.append(
            {"kind": "step", "ts": ts, "step": step, "loss": 6.0 - step / 4}
            | {"step_time_s": 0.5, "samples_per_s": 11.0}
        )
        if step == 4:
            lines += [{"kind": "sigterm", "ts": 104.2, "rank": r, "node": r // 2} for r in (0, 2)]
            lines.append({"kind": "checkpoint", "ts": 104.5, "step": 4, "path": "x"})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return [
        {"ts": 104.1, "kind": "stop", "message": "stop requested (Ctrl-C)"},
        {"ts": 105.0, "kind": "stopped", "message": "stopped at step 4, checkpoint 4"},
        {"ts": 253.0, "kind": "resume", "message": "from step 4 (local) as P=2 D=2"},
    ]


def test_a_stopped_then_resumed_run_shows_the_gap_and_only_what_happened(tmp_path):
    """#47: such a run was drawn as continued throughput, with a morph marker and a
    preemption in the legend; the x axis began 4 s in under 'since the first step'."""
    db_events = _stopped_then_resumed(tmp_path)
    s = collect(tmp_path, db_events, devices_now=4)
    assert s.gaps == [(3.0, 154.0)]  # steps 4 -> 5: 150 s with no training
    kinds = sorted({m.kind for m in s.markers})
    assert kinds == ["checkpoint", "resume", "stop"]  # no morph, no preemption
    assert s.steps[0]["ts"] - s.t0 == 0.0  # x = 0 is the first step
    row = {"id": "r", "phase": "completed", "step": 8, "total_steps": 8, "plan": "P=2 D=2"}
    text = render_html({**row, "loss": 4.0, "devices": 4}, s, db_events, None)
    check_html(text)
    assert series_points(text, "throughput") == 8
    assert len(re.findall(r'class="series throughput"', text)) == 2  # broken at the gap
    assert "no training for 151 s" in text  # step 4 ended at 3 s, step 5 at 154 s
    assert 'data-kind="morph"' not in text and 'data-kind="preemption"' not in text
    assert ">preemption<" not in text and ">morph<" not in text  # nor in the legend


def test_the_timeline_shows_the_simulated_step_beside_the_measured_one(tmp_path):
    from jobctl.engine.views.report import predicted_vs_measured

    s = collect(tmp_path, _stopped_then_resumed(tmp_path), devices_now=4)
    said = predicted_vs_measured(0.25, s)
    assert (
        said
        == "simulated 0.25 s/step; measured 0.5 s/step (median of 8 steps), 2.00x the simulation"
    )


@pytest.mark.parametrize(
    "bad",
    [
        {"ts": None},
        {"ts": "soon"},
        {"ts": float("inf")},
        {"rank": "0"},
    ],
)
def test_a_record_without_a_usable_time_is_skipped_and_counted(tmp_path, bad):
    """#46: a heartbeat a worker on a shared disk appended without "ts" (no channel
    stamped it) crashed `jobctl report` with KeyError 'ts'; it is skipped and counted,
    as the monitor skips and counts a malformed record, and the page says so."""
    db, row = _run_with_plan(tmp_path, {})
    beat = {"kind": "heartbeat", "step": 6, "rank": 0, "stage": 0, "node": 0}
    beat |= {"fwd_ms": 1.0, "bwd_ms": 1.0, "compute_s": 0.002}
    beat = {k: v for k, v in (beat | bad).items() if v is not None}  # None: no such field
    with open(Path(row["run_dir"]) / "metrics.jsonl", "a") as f:
        f.write(json.dumps(beat) + "\n")
        f.write(json.dumps({"kind": "step", "step": 7, "loss": 1.0, "samples_per_s": 1}) + "\n")
    s = collect(row["run_dir"], db.events(row["id"]), devices_now=4)
    assert s.skipped == 2 and [p["step"] for p in s.steps] == [1, 2, 3, 4, 5, 6]
    text = write_report(db, row).read_text()
    assert "records skipped</th><td>2 unreadable in metrics.jsonl" in text
