"""Every figure a view prints has its definition in docs/figures.md (#47).

Each view is rendered here from fabricated data (no run, no planner search beyond the
quickstart's), wide enough that nothing is dropped or wrapped, and every label it
prints is looked up in the page: a table's column headers, the row labels of
`jobctl status RUN`'s table, of the cost table and of the report's summary, the
progress line's fields, the chart titles and axes, and the pieces of the prose lines
between their numbers (``predicted (...): N s/step, N samples/s ...``).

A label is documented when it is a `code span` in a table row of the page (the pieces
of a prose line: inside one). Digits count as one ``N`` on both sides, so
``F/B m=4 (ms)`` is documented by `F/B m=N (ms)`. A figure added to a view without a
row in the page fails here; so does a field added to ``RunFigures`` without a value in
``FULL`` below (a new figure of `jobctl status`)."""

from __future__ import annotations

import dataclasses
import html
import io
import re
from pathlib import Path

import pytest
from rich.console import Console
from rich.progress import TextColumn

from jobctl.engine.supervise.figures import RunFigures
from jobctl.engine.supervise.report_data import RunSeries

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "figures.md"
WIDE = 400  # columns: every table column shown, no cell wrapped
NOW = 10_000.0

NUMBER = re.compile(r"\d+")
# a value inside a prose line: a [list], or a number with its $, sign, decimals, /total
# or x ("2.00x the simulation"), not one inside a word ("1k samples")
VALUE = re.compile(r"\[[^\]]*\]|[$+-]?\d[\d,]*(?:\.\d+)?(?:/\d+)?(?:x(?= ))?(?![\w.])")
PIECES = re.compile(r"[,;:()]")

ROW = {
    "id": "demo-20261207-000000-abcd",
    "phase": "training",
    "step": 45,
    "total_steps": 100,
    "loss": 3.0,
    "samples_per_s": 4.0,
    "devices": 2,
    "plan": "P=2 D=1 m=2 N_m=4 1f1b",
    "last_checkpoint": 40,
    "last_upload": 30,
    "exit_code": None,
    "message": "training: pid 1 supervising 1 node(s)",
    "updated_at": NOW - 5,
    "run_dir": "/tmp/demo",
    "spec_path": "/tmp/demo/spec.yaml",
    "stragglers": "[1]",
    "uploading_step": 40,
    "unsupervised": True,
}
# Every field set, so every row that depends on one is printed.
FULL = RunFigures(
    steps_per_s=0.25,
    samples_per_s=4.0,
    eta_s=220.0,
    device_hours=0.5,
    cost_usd=1.0,
    usd_per_step=0.002,
    usd_to_finish=0.11,
    uploaded_at=NOW - 30,
    lag_steps=10,
    lag_s=40.0,
    recoveries=[12.5],
    steps_lost=[3],
    straggler_nodes=[1],
    epoch=2,
    eval_loss=(40, 3.1),
    avg_distance=(40, [0.1, 0.2]),
)
HEARTBEAT = {
    "rank": 0,
    "stage": 0,
    "node": 0,
    "step": 45,
    "fwd_ms": 2.0,
    "bwd_ms": 4.0,
    "slowdown": 0.2,
    "mem_mb": 150.0,
    "mem_kind": "rss",
}


def _norm(label: str) -> str:
    return NUMBER.sub("N", " ".join(label.split()))


def _documented() -> tuple[set[str], list[str]]:
    """(every code span in the Label column of the page's tables, normalised; the same
    spans as a list)."""
    spans = [
        _norm(span)
        for line in DOC.read_text().splitlines()
        if line.startswith("|")
        for span in re.findall(r"`([^`]+)`", line.split("|")[1])  # the Label column
    ]
    return set(spans), spans


def _console() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=WIDE, color_system=None), out


def _cells(line: str, bar: str) -> list[str]:
    return [c.strip() for c in line.strip().strip(bar).split(bar)]


def _headers(text: str) -> list[str]:
    """Every column header of every table in ``text`` (no header wraps at WIDE)."""
    return [c for line in text.splitlines() if line.startswith("┃") for c in _cells(line, "┃")]


def _first_cells(text: str) -> list[str]:
    """The first cell of each row of the first table in ``text``."""
    rows = []
    for line in text.splitlines():
        if line.startswith("└"):
            break
        if line.startswith("│"):
            rows.append(_cells(line, "│")[0])
    return rows


def _pieces(line: str) -> list[str]:
    """A prose line's words between its values and punctuation."""
    parts = PIECES.split(VALUE.sub("|", line))
    return [p.strip() for chunk in parts for p in chunk.split("|") if re.search("[a-z]", p)]


def _missing(labels: list[str], pieces: list[str] = ()) -> list[str]:
    exact, spans = _documented()
    out = [x for x in labels if x and _norm(x) not in exact]
    out += [p for p in pieces if not any(_norm(p) in s for s in spans)]
    return sorted(set(out))


def test_the_fabricated_figures_set_every_field():
    """A new RunFigures field is a new figure: give it a value in FULL (then its row
    shows in the renders below, and the page must define it)."""
    for f in dataclasses.fields(RunFigures):
        default = f.default_factory() if callable(f.default_factory) else f.default
        assert getattr(FULL, f.name) != default, f"FULL.{f.name} is not set"


def test_status_table_one_run_rows_and_rank_columns_are_defined():
    from jobctl.engine.views.status import RUN_COLUMNS, print_ranks, print_run, print_runs

    PATHS = (ROW["run_dir"], ROW["spec_path"])  # printed under the table: "run_dir: PATH"

    labels = list(RUN_COLUMNS)
    console, out = _console()
    print_runs(console, [ROW], {ROW["id"]: FULL}, NOW)
    labels += _headers(out.getvalue())
    for figures in (FULL, dataclasses.replace(FULL, cost_usd=None)):  # priced, unpriced
        console, out = _console()
        print_run(console, ROW, [], figures, None, NOW)
        labels += _first_cells(out.getvalue())
        labels += _headers(out.getvalue())  # the recent events' table
        labels += [x.split(": ")[0] for x in out.getvalue().splitlines() if x.endswith(PATHS)]
    console, out = _console()
    print_ranks(console, [HEARTBEAT])
    labels += _headers(out.getvalue())
    assert "steps/s (recent)" in labels and "fwd ms/mb" in labels and "$ so far" in labels
    assert _missing(labels) == []


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    """The quickstart's plan, priced, with a start-up measured and an alternative."""
    from jobctl.engine.core.plan import Alternative
    from jobctl.engine.planner.resolver import make_plan
    from jobctl.spec import load_spec

    home = tmp_path_factory.mktemp("home")  # no calibration or start-up of this machine
    p = make_plan(load_spec(ROOT / "jobs" / "quickstart.yaml"), None, home=home)
    other = Alternative(
        P=1,
        D=4,
        micro_batch_size=2,
        micro_batches=2,
        schedule="1f1b",
        step_time_s=0.02,
        samples_per_s=800.0,
        samples_per_s_per_device=200.0,
        memory_per_stage_gb=[0.01],
        bubble_ratio=0.1,
        cost_per_1k_samples=0.005,
        why_not="9.6 % slower",
    )
    pr = p.prediction.model_copy(update={"cost_per_1k_samples": 0.004, "startup_s": 6.0})
    return p.model_copy(update={"prediction": pr, "alternatives": [other]})


def test_plan_tables_and_prediction_lines_are_defined(plan):
    from jobctl.engine.views.tables import print_plan

    console, out = _console()
    print_plan(console, plan, steps=60)
    text = out.getvalue()
    labels = _headers(text)
    lines = text.splitlines()
    predicted = next(x for x in lines if x.startswith("predicted ("))
    pieces = _pieces(predicted)
    for line in lines:  # the other prose lines' lead: "end to end: ...", "prediction source: ..."
        lead = re.match(r"([a-z][a-z -]+): ", line)
        if lead:
            labels.append(lead.group(1))
    assert "s/step" in pieces and "per 1k samples" in pieces and "end to end" in labels
    assert _missing(labels, pieces) == []


def test_cost_pruning_rebalancing_and_tuning_tables_are_defined():
    from jobctl.engine.planner.cost import Forecast
    from jobctl.engine.pruning.preview import PruningPreview, PruningStep
    from jobctl.engine.rebalance.preview import RebalancePreview, Row
    from jobctl.engine.views.averaging_tuning import HEAD
    from jobctl.engine.views.cost import print_costs
    from jobctl.engine.views.pruning import print_pruning
    from jobctl.engine.views.rebalance import print_rebalancing
    from jobctl.spec import load_spec

    parts = {"start-up": 6.0, "steps": 90.0, "checkpoints": 4.0, "preemptions": 1.0}
    found = [
        Forecast(label, 4, 1, 0.1, 101.0, usd, 8.0, 0.1, parts)
        for label, usd in (("on-demand", 1.0), ("spot", 0.4))
    ]
    console, out = _console()
    print_costs(console, 60, found, "spot")
    labels = _headers(out.getvalue()) + _first_cells(out.getvalue().split("┡", 1)[1])

    spec = load_spec(ROOT / "jobs" / "pruning.yaml")
    console, out = _console()
    print_pruning(
        console, PruningPreview([PruningStep(10, 0.5, 50, 50, 0.5)], 100, 120, 45, spec.pruning)
    )
    rows = [
        Row(
            20,
            0.5,
            "uniform",
            [1.0, 1.0],
            [1.0, 1.0],
            [[0, 1], [2]],
            [0.3, 0.2],
            [0.2, 0.2],
            0.01,
            0.009,
            2,
        )
    ]
    print_rebalancing(
        console, RebalancePreview(rows, spec.rebalancing.model_copy(update={"pack": True}), None)
    )
    labels += _headers(out.getvalue())
    labels += [x for x in re.split(r"\s{2,}", HEAD.strip())]
    assert "$ to finish" in labels and "of the rest" in labels and "idle %" in labels
    assert _missing(labels) == []


def test_calibration_table_is_defined():
    from jobctl.engine.calibration.analytic import analytic_calibration, analytic_fingerprint
    from jobctl.engine.views.tables import print_calibration
    from jobctl.spec import load_spec

    spec = load_spec(ROOT / "jobs" / "quickstart.yaml")
    cal = analytic_calibration(spec, analytic_fingerprint(spec.hardware, "test"))
    console, out = _console()
    print_calibration(console, cal, Path("/tmp/record.json"))
    labels = _headers(out.getvalue())
    assert "act/sample" in labels
    assert _missing(labels) == []


def test_apply_progress_line_is_defined():
    from jobctl.engine.supervise.attempt import ProgressView, progress_columns

    fields = [
        NUMBER.sub("", re.sub(r"\{[^}]*\}", "", c.text_format)).strip()
        for c in progress_columns(200, "run", 60)
        if isinstance(c, TextColumn)
    ]
    console, out = _console()  # not a terminal: a line per step, as in a pipe
    view = ProgressView(console, "run", total=60, start=0)
    view.on_event({"kind": "step", "step": 1, "loss": 5.1, "samples_per_s": 1173.4})
    pieces = _pieces(out.getvalue().strip())
    assert "ETA" in fields and "samples/s" in pieces
    assert _missing(fields, pieces) == []


def test_report_summary_charts_and_caption_are_defined():
    from jobctl.engine.views.report import _summary_html, charts, predicted_vs_measured

    s = RunSeries(
        t0=0.0,
        steps=[
            {"ts": float(k), "step": k, "loss": 3.0, "sps": 4.0, "dev": 2, "step_s": 0.5}
            for k in (1, 2, 3)
        ],
        evals=[(2, 3.1)],
        distances=[(2, [0.1, 0.2])],
        skipped=1,
    )
    labels = [
        html.unescape(x)
        for x in re.findall(r"<th>(.*?)</th>", "".join(_summary_html(ROW, s, FULL)))
    ]
    for chart in charts(s):
        labels += [chart.title, chart.x_label, chart.y_label, *(x.name for x in chart.series)]
    pieces = _pieces(predicted_vs_measured(0.25, s))
    assert "$ to finish (current rate)" in labels and "Throughput per device" in labels
    assert _missing(labels, pieces) == []
