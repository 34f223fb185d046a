"""``jobctl report``: one self-contained HTML page per run.

Throughput (samples/s, and samples/s per device) over wall-clock time with morph,
preemption, checkpoint and upload events marked (Varuna Fig. 10), the loss curve,
the simulated pipeline timeline of the run's own plan (its ``plan.json``; re-planned,
and said so, only when that is missing: engine/views/gantt.py, embedded as a base64 PNG),
and the run's events. Charts are inline SVG (engine/views/svg.py); the same charts
and the timeline are also written as PNG files beside the page (engine/views/png.py),
which lists them. The page loads nothing from anywhere.
"""

from __future__ import annotations

import base64
import time
from collections import defaultdict
from dataclasses import dataclass, field
from html import escape
from pathlib import Path

from jobctl.engine.core.events import read_metrics
from jobctl.engine.core.plan import Plan
from jobctl.engine.planner.simulator.simulation import SimResult, simulate
from jobctl.engine.views.png import draw_png, slug
from jobctl.engine.views.svg import Chart, Marker, Series, render

# State-DB event kinds drawn as markers, by the marker family they belong to.
DB_MARKERS = {
    "preemption": "preemption",
    "heartbeat_timeout": "preemption",
    "resume": "morph",
    "recovery": "recovery",
    "adopt": "adopt",
    "straggler": "straggler",
    "stop": "stop",
    "stopped": "stop",
}


@dataclass
class RunSeries:
    """What the page plots, read from the run's archive and its DB events."""

    t0: float = 0.0
    steps: list[dict] = field(default_factory=list)  # ts, step, loss, sps, devices
    markers: list[Marker] = field(default_factory=list)


def collect(run_dir: Path, db_events: list[dict], devices_now: int | None) -> RunSeries:
    """Step points (each with the devices that trained it) and event markers."""
    recs, _ = read_metrics(Path(run_dir) / "metrics.jsonl", 0)
    beats: dict[int, list[tuple[float, int]]] = defaultdict(list)
    for r in recs:
        if r["kind"] == "heartbeat":
            beats[r["step"]].append((r["ts"], r["rank"]))
    out = RunSeries()
    for r in recs:
        if r["kind"] != "step":
            continue
        # The ranks that trained this step: heartbeats of the same step from the same
        # attempt (an earlier attempt that trained the same step did so long before).
        near = max(1.0, 2 * r.get("step_time_s", 0.0))
        ranks = {k for ts, k in beats.get(r["step"], []) if abs(ts - r["ts"]) <= near}
        devices = len(ranks) or devices_now or 1
        sps = r.get("samples_per_s", 0.0)
        out.steps.append(
            {"ts": r["ts"], "step": r["step"], "loss": r.get("loss"), "sps": sps, "dev": devices}
        )
    out.t0 = min([s["ts"] for s in out.steps] + [r["ts"] for r in recs[:1]], default=time.time())
    for r in recs:
        kind = {"checkpoint": "checkpoint", "uploaded": "upload", "sigterm": "preemption"}.get(
            r["kind"]
        )
        if kind == "preemption" and any(
            m.kind == "preemption" and abs(m.x - (r["ts"] - out.t0)) < 1 for m in out.markers
        ):
            continue  # every rank of a node reports the same notice
        if kind:
            what = f"{r['kind']} step {r.get('step', '')}".strip()
            out.markers.append(Marker(r["ts"] - out.t0, kind, what))
    for e in db_events:
        kind = DB_MARKERS.get(e["kind"])
        if kind:
            out.markers.append(Marker(e["ts"] - out.t0, kind, f"{e['kind']}: {e['message']}"))
    return out


def charts(s: RunSeries) -> list[Chart]:
    xs = [p["ts"] - s.t0 for p in s.steps]
    sps = [p["sps"] for p in s.steps]
    per_dev = [p["sps"] / p["dev"] for p in s.steps]
    loss = [p["loss"] if p["loss"] is not None else float("nan") for p in s.steps]
    return [
        Chart(
            "Throughput",
            "wall-clock time since the first step (s)",
            "samples/s",
            [Series("samples/s", xs, sps, "#4C78A8", "throughput")],
            s.markers,
        ),
        Chart(
            "Throughput per device",
            "wall-clock time since the first step (s)",
            "samples/s/device",
            [Series("samples/s/device", xs, per_dev, "#F58518", "per-device")],
            s.markers,
        ),
        Chart(
            "Loss",
            "step",
            "loss",
            [Series("loss", [float(p["step"]) for p in s.steps], loss, "#E45756", "loss")],
        ),
    ]


@dataclass
class Timeline:
    """The simulated step drawn on the page, and where its plan came from."""

    png: Path
    caption: str
    note: str  # the run's plan.json, or why the page re-planned instead


def simulate_plan(spec, plan: Plan, cal) -> SimResult:
    """The simulator's step of ``plan`` as it is (its stages, ranks and action lists),
    costed from ``cal`` the way the planner costs a candidate."""
    from jobctl.engine.planner.contention import contend
    from jobctl.engine.planner.search import hosting
    from jobctl.engine.planner.stage_costs import BlockTimes, recompute_counts, stage_costs
    from jobctl.engine.rebalance.replan import layout_of

    lay = layout_of(plan)
    host = hosting(spec, plan.P, plan.D, cal.host.cores)
    stages = [st.blocks for st in plan.stages]
    actions = [st.action_list() for st in plan.stages]
    costs = stage_costs(cal, lay, stages, host, BlockTimes.at(cal, lay.m))
    model = costs.model(lay, recompute_counts(actions))
    return contend(cal, actions, model, plan.D)[1] if host.share_cores else simulate(actions, model)


def run_plan(spec, run_dir: Path, devices: int | None, home: Path | None):
    """(plan, simulated step, note): the run's own ``plan.json`` (what its workers ran,
    rewritten by a rebalance), or a fresh plan for ``devices`` when that is missing or
    no longer matches the model."""
    from jobctl.engine.calibration.cache import calibration_for
    from jobctl.engine.planner.resolver import plan_and_simulate

    cal = calibration_for(spec, home)
    path = Path(run_dir) / "plan.json"
    if path.exists():
        plan = Plan.model_validate_json(path.read_text())
        if plan.block_names == cal.names:
            return plan, simulate_plan(spec, plan, cal), f"the run's plan ({path})"
        why = f"{path} names blocks {plan.block_names}, the model now has {cal.names}"
    else:
        why = f"the run has no {path.name}"
    plan, sim = plan_and_simulate(spec, devices, calibration=cal)
    target = f"{devices} device(s)" if devices else "the spec's pool"
    return plan, sim, f"re-planned for {target}: {why}"


def draw_timeline(spec, run_dir: Path, devices: int | None, home, path: Path) -> Timeline:
    """Simulate the run's plan and draw its step as a Gantt chart PNG at ``path``."""
    from jobctl.engine.views.gantt import draw_gantt

    plan, sim, note = run_plan(spec, run_dir, devices, home)
    caption = f"{spec.name}: {plan.summary()}, simulated {sim.step_time:.4g} s/step"
    return Timeline(draw_gantt(sim, path, caption), caption, note)


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
) -> str:
    """The page: summary, charts, timeline, the PNG files beside it, events."""
    summary = [
        ("run", row["id"]),
        ("phase", row["phase"]),
        ("steps", f"{row.get('step') or 0} / {row.get('total_steps')}"),
        ("loss", row.get("loss")),
        ("plan", row.get("plan")),
        ("devices", row.get("devices")),
        ("step points", len(s.steps)),
        ("event markers", len(s.markers)),
    ]
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>jobctl report: {escape(row['id'])}</title>",
        f"<style>{CSS}</style></head><body>",
        f"<h1>jobctl report: {escape(row['id'])}</h1>",
        "<table>",
        *(f"<tr><th>{escape(k)}</th><td>{escape(str(v))}</td></tr>" for k, v in summary),
        "</table>",
    ]
    for chart in charts(s):
        parts.append(f"<h2>{escape(chart.title)}</h2>")
        parts.append(render(chart))
    parts += _timeline_html(timeline)
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


def _timeline_html(t: Timeline | None) -> list[str]:
    """The Gantt PNG embedded as a data: URL (the page stays one file), and its source."""
    out = ["<h2>Simulated pipeline timeline</h2>"]
    if t is None:
        return [*out, "<p>no simulated timeline (the plan could not be simulated)</p>"]
    data = base64.b64encode(t.png.read_bytes()).decode()
    return [
        *out,
        f'<p class="plan-source">plan: {escape(t.note)}</p>',
        f'<figure><img alt="{escape(t.caption)}" src="data:image/png;base64,{data}">'
        f"<figcaption>{escape(t.caption)}</figcaption></figure>",
    ]


def _files_html(pngs: list[Path]) -> list[str]:
    """The PNGs written beside the page (relative links: the page needs none of them)."""
    if not pngs:
        return []
    items = [
        f'<li><a href="{escape(p.name)}">{escape(p.name)}</a> ({p.stat().st_size:,} bytes)</li>'
        for p in pngs
    ]
    return ['<h2>Pictures</h2><ul class="pngs">', *items, "</ul>"]


def write_report(db, row: dict, out: Path | None = None, home: Path | None = None) -> Path:
    """Write the report of the run in ``row`` and its PNGs beside it (``<name>-*.png``);
    returns the page's path."""
    from jobctl.spec import SpecError, load_spec

    run_dir = Path(row["run_dir"])
    path = Path(out) if out else run_dir / "report.html"
    stem = path.with_suffix("")
    db_events = db.events(row["id"])
    s = collect(run_dir, db_events, row.get("devices"))
    pngs = write_pngs(s, stem)
    timeline = None
    try:
        spec = load_spec(run_dir / "spec.yaml")
        timeline_png = stem.with_name(f"{stem.name}-timeline.png")
        timeline = draw_timeline(spec, run_dir, row.get("devices"), home, timeline_png)
        pngs.append(timeline.png)
    except (ValueError, OSError, SpecError) as e:  # a plan that no longer fits, no spec
        db_events = [*db_events, {"ts": time.time(), "kind": "report", "message": str(e)}]
    path.write_text(render_html(row, s, db_events, timeline, pngs))
    return path
