"""Output at 80 columns and in a pipe (#47): the live progress line never cuts the step
count; ``plan``'s alternatives and ``calibrate``'s per-block table drop columns instead
of cutting a value, and the alternatives' reasons go on lines of their own."""

from __future__ import annotations

import io
import re
import time
from pathlib import Path

import pytest
from rich.console import Console
from rich.table import Table

from jobctl.engine.calibration.analytic import analytic_calibration, analytic_fingerprint
from jobctl.engine.planner.resolver import make_plan
from jobctl.engine.supervise.attempt import SHORT_LABEL, ProgressView
from jobctl.engine.views.fit import fit_table, print_fitted
from jobctl.engine.views.tables import print_alternatives, print_calibration
from jobctl.spec import load_spec

from ..jobrun import ROOT, tiny_spec

TABLE = tuple("┏┃┡│└")  # the first character of a rich table's lines


def _console(width: int = 80, terminal: bool = False) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=width, force_terminal=terminal, color_system=None), out


def _assert_fits(text: str, width: int = 80) -> None:
    for line in text.splitlines():
        assert len(line) <= width, line
        assert "…" not in line, line


def _progress_frame(run_id: str, width: int, total: int = 300) -> str:
    console, out = _console(width, terminal=True)
    view = ProgressView(console, run_id, total=total, start=0)
    view.on_event({"kind": "step", "step": 18, "loss": 5.12345, "samples_per_s": 1173.4})
    view.bar.refresh()
    view.stop()
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())  # cursor controls
    above = text.split("\r")[0].splitlines()[:-1]  # printed before the bar started
    return "\n".join([*above, text.split("\r")[-1]])  # and the bar's last frame


@pytest.mark.parametrize("width", [60, 80, 120])
def test_the_progress_line_never_cuts_the_step_count(width):
    run_id = "pygpt-20261202-055413-94e8"  # 26 columns, as the run
    frame = _progress_frame(run_id, width)
    line = frame.strip("\n").splitlines()[-1]
    assert "18/300" in line and "loss 5.1235" in line and "1173.4 samples/s" in line
    assert "…" not in frame and len(line) <= width
    if width >= 100:  # room for the run id beside the bar
        assert line.startswith(run_id)
    else:  # the run id on a line of its own above a shorter label
        assert f"run {run_id}" in frame and line.startswith(SHORT_LABEL)


def _spot_plan():
    """A plan with alternatives, simulated and rejected, priced (a spot pool)."""
    return make_plan(load_spec(ROOT / "jobs" / "gpt-small-spot.yaml"), None)


def test_alternatives_drop_columns_and_give_reasons_their_own_lines():
    plan = _spot_plan()
    assert plan.alternatives
    console, out = _console(80)
    print_alternatives(console, plan)
    text = out.getvalue()
    _assert_fits(text)
    assert "why not" not in text.split("why not:")[0]  # no reason column in the table
    reasons = text.split("why not:\n")[1].splitlines()
    for i, a in enumerate(plan.alternatives, 1):
        first_words = " ".join(a.why_not.split()[:3])
        assert any(line.strip().startswith(f"#{i} {first_words}") for line in reasons)
    assert "not shown at 80 columns" in text  # what was left out is said


def test_alternatives_show_every_column_where_they_fit():
    console, out = _console(200)
    print_alternatives(console, _spot_plan())
    head = out.getvalue().splitlines()[2]
    for col in ("#", "N_m", "samples/s", "/device", "memory/stage", "idle", "$/1k"):
        assert col in head
    assert "not shown" not in out.getvalue()


def test_a_table_too_wide_drops_the_named_columns_in_order():
    console, _ = _console(40)
    t = Table("name", "a long header", "another long header", "value")
    t.add_row("x" * 10, "1", "2", "0.038/0.076")
    assert fit_table(console, t, ["another long header", "a long header"]) == [
        "another long header",
        "a long header",
    ]
    console, out = _console(40)
    t = Table("name", "value")
    t.add_row("x" * 10, "0.038/0.076")
    assert print_fitted(console, t, ["value"]) == []  # it fits: nothing dropped
    _assert_fits(out.getvalue(), 40)


def test_calibrate_per_block_table_never_cuts_a_time(tmp_path: Path):
    spec = tiny_spec(**{"training.micro_batch_size": 1})
    cal = analytic_calibration(spec, analytic_fingerprint(spec.hardware, "test"))
    cal = cal.model_copy(update={"micro_batch_sizes": [1, 2, 4, 8, 16, 32]})
    console, out = _console(80)
    print_calibration(console, cal, tmp_path / "record.json")
    text = out.getvalue()
    tables = "\n".join(line for line in text.splitlines() if line.startswith(TABLE))
    _assert_fits(tables)
    assert "F/B m=1 (ms)" in tables and "/" in tables.splitlines()[3]


@pytest.mark.parametrize("terminal", [False, True])
def test_status_of_a_run_prints_its_paths_whole_at_80_columns(terminal):
    """`jobctl status RUN` cut run_dir and spec_path with "…" in its 80-column table;
    they are now printed whole, one line each, under it (a pipe gets the same)."""
    from jobctl.engine.views.status import print_run

    run_dir = "/home/someone/projects/" + "deep/" * 12 + "runs/pygpt-20261202-055413-94e8"
    spec_path = "/home/someone/projects/jobs/a-rather-long-job-name-for-python-source.yaml"
    row = {"id": "pygpt-20261202-055413-94e8", "phase": "training", "step": 18}
    console, out = _console(80, terminal=terminal)
    print_run(console, {**row, "run_dir": run_dir, "spec_path": spec_path}, [], now=0.0)
    lines = out.getvalue().splitlines()
    if terminal:  # a path too long beside its key: on a line of its own, whole
        for key, path in (("run_dir", run_dir), ("spec_path", spec_path)):
            assert lines[lines.index(f"{key}:") + 1] == f"  {path}"
        _assert_fits("\n".join(x for x in lines if x not in (f"  {run_dir}", f"  {spec_path}")))
    else:  # a pipe: one line each, as it is
        assert f"run_dir: {run_dir}" in lines and f"spec_path: {spec_path}" in lines
        _assert_fits("\n".join(x for x in lines if not x.startswith(("run_dir:", "spec_path:"))))


def test_plans_prose_wraps_at_words_at_80_columns():
    """#47: the plan, predicted, end-to-end and prediction-source lines ran past 80
    columns in a pipe (106-196 characters); prose now wraps at words, the calibrate
    command is a line of its own."""
    from jobctl.engine.views.tables import print_plan

    plan = make_plan(tiny_spec(), None)
    console, out = _console(80)
    print_plan(console, plan, steps=60)
    text = out.getvalue()
    prose = [x for x in text.splitlines() if not x.startswith("  S")]  # not action lists
    _assert_fits("\n".join(prose))
    words = " ".join(text.split())  # every figure whole, whatever the line breaks
    assert f"m={plan.micro_batch_size} x {plan.micro_batches} per replica" in words
    assert f"{plan.prediction.step_time_s:.4g} s/step" in words
    assert "  measure this machine: jobctl calibrate JOB.yaml" in text.splitlines()


def test_action_lists_wrap_at_actions_and_say_what_is_left_out():
    """A long action list (ZB-V's device lists, a large M) is wrapped at whole actions
    within the width, two lines at most, then how many actions are left out: no
    action is ever cut in half (it was: ``text[:157] + "..."``)."""
    from jobctl.engine.views.tables import action_lines

    text = " ".join(f"F{i}@{i % 4}" for i in range(60))
    lines = action_lines("D0", text, 80)
    assert len(lines) == 3 and all(len(line) <= 80 for line in lines)
    shown = [a for line in lines[:2] for a in line.split()[1 if line is lines[0] else 0 :]]
    assert shown == text.split()[: len(shown)]  # whole actions, in order
    assert lines[2].split()[1] == str(60 - len(shown)) and "plan --json" in lines[2]
    assert action_lines("S0", "F0 B0", 80) == ["  S0: F0 B0"]


def test_events_name_each_run_whole_above_its_events_at_80_columns():
    """`jobctl events` cut the run id to "varuna-20261207-14…" in a source column; each
    source is now a heading line of its own, its events' date in it where they share one."""
    from jobctl.engine.views.schedule import print_timeline

    day = 1796654395.0
    rows = [
        {"ts": day + k, "source": src, "kind": "phase", "message": f"training {k}\nmore"}
        for k, src in enumerate(["varuna-20261207-143947-1551"] * 2 + ["schedule"])
    ]
    rows.append({**rows[0], "ts": day + 86400 * 3, "source": "schedule", "message": "fired"})
    console, out = _console()
    print_timeline(console, rows)
    text = out.getvalue()
    _assert_fits(text)
    headings = [line for line in text.splitlines() if not line.startswith(TABLE)]
    assert (
        headings[0]
        == f"varuna-20261207-143947-1551 ({time.strftime('%Y-%m-%d', time.localtime(day))})"
    )
    assert headings[1] == "schedule"  # two days: each row carries its date
    assert text.count("training 0") == 1 and "more" not in text
    assert re.search(r"│ \d{4}-\d\d-\d\d \d\d:\d\d:\d\d │ phase", text)


def test_the_progress_eta_is_the_one_status_computes():
    """#47, one way of computing each figure: the bar's ETA was Rich's own estimate
    (its speed over 30 s) beside `jobctl status`'s figures.eta_s over the newest step
    records; the bar now asks figures.eta_s too."""
    from jobctl.engine.supervise.figures import eta_s, recent_rate

    console, out = _console(120, terminal=True)
    view = ProgressView(console, "q-1", total=300, start=0)
    records = [
        {"kind": "step", "step": s, "loss": 3.0, "samples_per_s": 16.0, "ts": 100.0 + 0.5 * s}
        for s in range(1, 20)
    ]
    for rec in records:
        view.on_event(rec)
    view.bar.refresh()
    view.stop()
    left = eta_s({"phase": "training", "total_steps": 300, "step": 19}, recent_rate(records))
    assert left == 140.5  # 281 steps at 2 steps/s
    frame = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue()).split("\r")[-1]
    assert "ETA 0:02:20" in " ".join(frame.split()), frame
