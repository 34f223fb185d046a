"""``jobctl report``: one self-contained HTML page per run.

Throughput (samples/s, and samples/s per device) over wall-clock time with morph,
preemption, checkpoint and upload events marked (Varuna Fig. 10), the loss curve,
the simulated pipeline timeline of the run's own plan (its ``plan.json``; re-planned,
and said so, only when that is missing: engine/views/gantt.py, embedded as a base64 PNG),
and the run's events. Charts are inline SVG (engine/views/svg.py); the same charts
and the timeline are also written as PNG files beside the page (engine/views/png.py),
which lists them. The page loads nothing from anywhere. What it shows is read and
simulated by engine/supervise/report_data.py.
"""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass
from html import escape
from pathlib import Path

from jobctl.engine.supervise.figures import RunFigures
from jobctl.engine.supervise.report_data import RunSeries, SimulatedStep
from jobctl.engine.views.gantt import draw_gantt
from jobctl.engine.views.png import draw_png, slug
from jobctl.engine.views.svg import Chart, Series, render
from jobctl.engine.views.tables import _num, dollars, hms


def charts(s: RunSeries) -> list[Chart]:
    """Throughput, throughput per device (both with the event markers and the gaps in
    training, where their lines break) and loss."""
    xs, sps, per_dev = _broken(s, [p["sps"] for p in s.steps], [p["dev"] for p in s.steps])
    loss = [p["loss"] if p["loss"] is not None else float("nan") for p in s.steps]
    return [
        Chart(
            "Throughput",
            "wall-clock time since the first step (s)",
            "samples/s",
            [Series("samples/s", xs, sps, "#4C78A8", "throughput")],
            s.markers,
            s.gaps,
        ),
        Chart(
            "Throughput per device",
            "wall-clock time since the first step (s)",
            "samples/s/device",
            [Series("samples/s/device", xs, per_dev, "#F58518", "per-device")],
            s.markers,
            s.gaps,
        ),
        Chart(
            "Loss",
            "step",
            "loss",
            [Series("loss", [float(p["step"]) for p in s.steps], loss, "#E45756", "loss")]
            + _eval_series(s),
        ),
    ] + _distance_charts(s)


def _broken(s: RunSeries, sps: list[float], dev: list[int]) -> tuple[list, list, list]:
    """(x, samples/s, samples/s/device) with a NaN point inside each gap, so no line
    bridges a stretch with no training as if it had gone on (#47)."""
    nan = float("nan")
    xs: list[float] = []
    ys: list[float] = []
    per: list[float] = []
    starts = {b for _, b in s.gaps}
    for p, y, d in zip(s.steps, sps, dev, strict=True):
        x = p["ts"] - s.t0
        for out, v in ((xs, x), (ys, y), (per, y / d)):
            if x in starts:
                out.append(nan)
            out.append(v)
    return xs, ys, per


#: One colour per AvgPipe parallel model (cycled past ten).
MODEL_COLOURS = (
    "#4C78A8",
    "#F58518",
    "#54A24B",
    "#E45756",
    "#72B7B2",
    "#B279A2",
    "#FF9DA6",
    "#9D755D",
    "#BAB0AC",
    "#EECA3B",
)


def _distance_charts(s: RunSeries) -> list[Chart]:
    """AvgPipe: each parallel model's distance from the reference, by step."""
    if not s.distances:
        return []
    n = len(s.distances[-1][1])  # a resume with another N: the newest N's steps
    points = [(float(k), d) for k, d in s.distances if len(d) == n]
    steps = [k for k, _ in points]
    lines = [
        Series(
            f"model {i}",
            steps,
            [d[i] for _, d in points],
            MODEL_COLOURS[i % len(MODEL_COLOURS)],
            f"dist-{i}",
        )
        for i in range(n)
    ]
    return [Chart("Distance to reference", "step", "L2 distance", lines)]


def _eval_series(s: RunSeries) -> list[Series]:
    """The validation loss (``training.eval_every``) beside the training loss."""
    if not s.evals:
        return []
    steps, losses = [float(k) for k, _ in s.evals], [v for _, v in s.evals]
    return [Series("eval loss", steps, losses, "#54A24B", "eval-loss")]


@dataclass
class Timeline:
    """The simulated step drawn on the page, and where its plan came from."""

    png: Path
    caption: str
    note: str  # the run's plan.json, or why the page re-planned instead
    step_s: float = 0.0  # the simulated step time


def draw_timeline(step: SimulatedStep, path: Path) -> Timeline:
    """Draw the simulated step as a Gantt chart PNG at ``path``."""
    caption = f"{step.name}: {step.plan.summary()}, simulated {step.sim.step_time:.4g} s/step"
    return Timeline(draw_gantt(step.sim, path, caption), caption, step.note, step.sim.step_time)


def write_pngs(s: RunSeries, stem: Path) -> list[Path]:
    """One PNG per chart, ``<stem>-<chart>.png``."""
    return [draw_png(c, stem.with_name(f"{stem.name}-{slug(c)}.png")) for c in charts(s)]


CSS = """
body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1000px}
h1{font-size:20px} h2{font-size:16px;margin-top:28px}
table{border-collapse:collapse;font-size:13px} td,th{padding:3px 10px;border-bottom:1px solid #ddd;
text-align:left;vertical-align:top}
svg.chart{display:block;margin:8px 0} .plot{fill:#fafafa;stroke:#ccc}
.grid{stroke:#e6e6e6} .yt{font-size:11px;text-anchor:end;fill:#555}
.xt{font-size:11px;text-anchor:middle;fill:#555} .xl{font-size:12px;text-anchor:middle;fill:#333}
.ct{font-size:14px;font-weight:600} .lg{font-size:11px;fill:#333}
.marker{stroke-width:1.2;stroke-dasharray:4 3;opacity:.8} img{max-width:100%}
"""


def render_html(
    row: dict,
    s: RunSeries,
    db_events: list[dict],
    timeline: Timeline | None,
    pngs: list[Path] | None = None,
    figures: RunFigures | None = None,
) -> str:
    """The page: summary (with the money ``figures``), charts, timeline, the PNG files
    beside it, events."""
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>jobctl report: {escape(row['id'])}</title>",
        f"<style>{CSS}</style></head><body>",
        f"<h1>jobctl report: {escape(row['id'])}</h1>",
        *_summary_html(row, s, figures),
    ]
    for chart in charts(s):
        parts.append(f"<h2>{escape(chart.title)}</h2>")
        parts.append(render(chart))
    parts += _timeline_html(timeline, s)
    parts += _files_html(pngs or [])
    parts.append("<h2>Events</h2><table><tr><th>time</th><th>kind</th><th>message</th></tr>")
    for e in db_events:
        when = time.strftime("%H:%M:%S", time.localtime(e["ts"]))
        parts.append(
            f"<tr><td>{when}</td><td>{escape(e['kind'])}</td>"
            f"<td>{escape(e['message'] or '')}</td></tr>"
        )
    parts.append("</table></body></html>")
    return "\n".join(parts) + "\n"


def _summary_html(row: dict, s: RunSeries, f: RunFigures | None = None) -> list[str]:
    """The run's fields, its dollars (so far, per step now, to finish at the current
    rate, with the ETA) and how much the page plots, as a table."""
    summary = [
        ("run", row["id"]),
        ("phase", row["phase"]),
        ("steps", f"{row.get('step') or 0} / {row.get('total_steps')}"),
        ("loss", _num(row.get("loss"), "{:.4f}")),  # shown rounded; data files keep all
        ("plan", row.get("plan")),
        ("devices", row.get("devices")),
        ("step points", len(s.steps)),
        ("event markers", len(s.markers)),
    ]
    if s.skipped:  # a shared-disk writer's record without a time, or missing a field
        summary.append(("records skipped", f"{s.skipped} unreadable in metrics.jsonl"))
    if f is not None:  # dollars only for a run with a price (else all $0.0000)
        money = [
            ("$ so far", dollars(f.cost_usd)),
            ("$ per step (now)", "-" if f.usd_per_step is None else f"${f.usd_per_step:.3g}"),
            ("$ to finish (current rate)", dollars(f.usd_to_finish)),
        ]
        summary[6:6] = [*(money if f.cost_usd is not None else []), ("ETA", hms(f.eta_s))]
    return [
        "<table>",
        *(f"<tr><th>{escape(k)}</th><td>{escape(str(v))}</td></tr>" for k, v in summary),
        "</table>",
    ]


def _timeline_html(t: Timeline | None, s: RunSeries) -> list[str]:
    """The Gantt PNG embedded as a data: URL (the page stays one file), its source, and
    the simulated step beside the measured one (the PNG carries the caption itself)."""
    out = ["<h2>Simulated pipeline timeline</h2>"]
    if t is None:
        return [*out, "<p>no simulated timeline (the plan could not be simulated)</p>"]
    data = base64.b64encode(t.png.read_bytes()).decode()
    return [
        *out,
        f'<p class="plan-source">plan: {escape(t.note)}</p>',
        f'<figure><img alt="{escape(t.caption)}" src="data:image/png;base64,{data}">'
        f'<figcaption class="predicted">{escape(predicted_vs_measured(t.step_s, s))}'
        "</figcaption></figure>",
    ]


def predicted_vs_measured(simulated_s: float, s: RunSeries) -> str:
    """The simulated step time beside the median of the measured ones."""
    times = sorted(p["step_s"] for p in s.steps if p.get("step_s"))
    said = f"simulated {simulated_s:.4g} s/step"
    if not times:
        return f"{said}; no step time measured yet"
    median = times[len(times) // 2]
    ratio = f", {median / simulated_s:.2f}x the simulation" if simulated_s > 0 else ""
    return f"{said}; measured {median:.4g} s/step (median of {len(times)} steps){ratio}"


def _files_html(pngs: list[Path]) -> list[str]:
    """The PNGs written beside the page (relative links: the page needs none of them)."""
    if not pngs:
        return []
    items = [
        f'<li><a href="{escape(p.name)}">{escape(p.name)}</a> ({p.stat().st_size:,} bytes)</li>'
        for p in pngs
    ]
    return ['<h2>Pictures</h2><ul class="pngs">', *items, "</ul>"]
