"""What ``jobctl report`` draws, read and computed from a run (engine/views/report.py
renders it).

Step points (samples/s, the devices that trained each step, loss) and event markers
(morph, preemption, checkpoint and upload events, Varuna Fig. 10) from the run's
``metrics.jsonl`` and its state-DB events; and the simulated step of the run's own plan
(its ``plan.json``; re-planned, and said so, only when that is missing or no longer
matches the model).
"""

from __future__ import annotations

import logging
import math
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from jobctl.engine.calibration.record import Calibration
from jobctl.engine.core import event_schema
from jobctl.engine.core.events import Kind, read_metrics
from jobctl.engine.core.plan import Plan
from jobctl.engine.planner.simulator.simulation import SimResult, simulate
from jobctl.engine.supervise.figures import distance_series
from jobctl.spec import JobSpec, load_spec

# State-DB event kinds drawn as markers, by the marker family they belong to.
DB_MARKERS = {
    "preemption": "preemption",
    "heartbeat_timeout": "preemption",
    "resume": "resume",  # a morph where the devices before and after differ (_family)
    "recovery": "recovery",  # its label says the steps lost and what it resumed from
    "emergency": "recovery",  # the survivors' handover, or why there was none
    "adopt": "adopt",
    "straggler": "straggler",
    "stop": "stop",
    "stopped": "stop",
}
# Metrics records drawn as markers, by marker family.
RECORD_MARKERS = {
    Kind.CHECKPOINT: "checkpoint",
    Kind.UPLOADED: "upload",
    Kind.SIGTERM: "preemption",
}


@dataclass
class Marker:
    """An event at ``x`` (seconds after the first step) of a marker family ``kind``."""

    x: float
    kind: str
    label: str


@dataclass
class RunSeries:
    """What the page plots, read from the run's archive and its DB events."""

    t0: float = 0.0
    steps: list[dict] = field(default_factory=list)  # ts, step, loss, sps, devices
    markers: list[Marker] = field(default_factory=list)
    evals: list[tuple[int, float]] = field(default_factory=list)  # (step, eval loss)
    # (from, to) seconds with no training between two steps: a stop, a preemption
    gaps: list[tuple[float, float]] = field(default_factory=list)
    # AvgPipe: (step, each parallel model's distance from the reference)
    distances: list[tuple[int, list[float]]] = field(default_factory=list)
    skipped: int = 0  # records of metrics.jsonl the page could not place (see readable)


log = logging.getLogger(__name__)


def readable(recs: list[dict]) -> tuple[list[dict], int]:
    """(the records the page can place, how many it skipped). A worker on a shared disk
    appends to ``metrics.jsonl`` directly, past the channel's checks and its ``ts``
    stamping: a record its kind's schema refuses, or without a finite ``ts`` (the page
    places everything in time), is skipped and counted, as the monitor does, never fatal."""
    ok = [r for r in recs if event_schema.problem(r) is None and event_schema.timed(r)]
    return ok, len(recs) - len(ok)


def collect(run_dir: Path, db_events: list[dict], devices_now: int | None) -> RunSeries:
    """Step points (each with the devices that trained it) and event markers."""
    recs, skipped = readable(read_metrics(Path(run_dir) / "metrics.jsonl", 0)[0])
    if skipped:
        log.warning("%s: skipped %d unreadable record(s) of metrics.jsonl", run_dir, skipped)
    beats: dict[int, list[tuple[float, int]]] = defaultdict(list)
    for r in recs:
        if r["kind"] == Kind.HEARTBEAT:
            beats[r["step"]].append((r["ts"], r["rank"]))
    out = RunSeries(skipped=skipped)
    for r in recs:
        if r["kind"] != Kind.STEP:
            continue
        # The ranks that trained this step: heartbeats of the same step from the same
        # attempt (an earlier attempt that trained the same step did so long before).
        step_s = r.get("step_time_s")  # optional: of the workers' records only
        step_s = step_s if type(step_s) in (int, float) and math.isfinite(step_s) else None
        near = max(1.0, 2 * (step_s or 0.0))
        ranks = {k for ts, k in beats.get(r["step"], []) if abs(ts - r["ts"]) <= near}
        devices = len(ranks) or devices_now or 1
        sps = r.get("samples_per_s", 0.0)
        out.steps.append(
            {"ts": r["ts"], "step": r["step"], "loss": r.get("loss"), "sps": sps, "dev": devices}
            | {"step_s": step_s}
        )
    # x = 0 at the first step, as the axis says (records before it get x < 0)
    first = [s["ts"] for s in out.steps] or [r["ts"] for r in recs[:1]]
    out.t0 = min(first, default=time.time())
    out.gaps = gaps(out)
    out.evals = [(r["step"], r["eval_loss"]) for r in recs if r["kind"] == Kind.EVAL]
    out.distances = distance_series(recs)
    _mark(out, recs, db_events)
    return out


GAP_MIN_S = 10.0  # a pause shorter than this between steps is not drawn as a gap
GAP_STEPS = 5  # ... nor one shorter than this many typical step-to-step intervals
STOP_SIGTERM_S = 60.0  # a SIGTERM this soon after a user's stop is that stop's


def gaps(s: RunSeries) -> list[tuple[float, float]]:
    """Where no step ended for much longer than usual: (from, to), seconds after t0."""
    ts = sorted(p["ts"] for p in s.steps)
    dts = sorted(b - a for a, b in zip(ts, ts[1:], strict=False))
    if not dts:
        return []
    least = max(GAP_MIN_S, GAP_STEPS * dts[len(dts) // 2])
    return [(a - s.t0, b - s.t0) for a, b in zip(ts, ts[1:], strict=False) if b - a > least]


def _mark(out: RunSeries, recs: list[dict], db_events: list[dict]) -> None:
    """Markers of the metrics records, then of the state-DB events."""
    stops = [e["ts"] for e in db_events if e["kind"] == "stop"]
    for r in recs:
        kind = RECORD_MARKERS.get(r["kind"])
        if kind == "preemption" and any(0 <= r["ts"] - t <= STOP_SIGTERM_S for t in stops):
            continue  # the notice a user's `jobctl stop` (or Ctrl-C) sent: not a preemption
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
            label = f"{e['kind']}: {e['message']}"
            out.markers.append(Marker(e["ts"] - out.t0, _family(out, e, kind), label))


def _family(out: RunSeries, e: dict, kind: str) -> str:
    """A resume is drawn as a morph only where the devices training before and after
    it differ (a stop and resume on the same devices is no morph)."""
    if kind != "resume":
        return kind
    before = [p["dev"] for p in out.steps if p["ts"] < e["ts"]]
    after = [p["dev"] for p in out.steps if p["ts"] >= e["ts"]]
    return "morph" if before and after and before[-1] != after[0] else "resume"


def simulate_plan(spec: JobSpec, plan: Plan, cal: Calibration) -> SimResult:
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


def run_plan(
    spec: JobSpec, run_dir: Path, devices: int | None, home: Path | None
) -> tuple[Plan, SimResult, str]:
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


@dataclass(frozen=True)
class SimulatedStep:
    """The step the report's timeline draws: the job's name, the plan, its simulated
    step, and where the plan came from (the run's plan.json, or why it re-planned)."""

    name: str
    plan: Plan
    sim: SimResult
    note: str


def simulate_run(run_dir: Path, devices: int | None, home: Path | None) -> SimulatedStep:
    """The simulated step of the run in ``run_dir`` (its ``spec.yaml`` and plan).

    Raises SpecError or OSError without a readable spec, ValueError when the plan no
    longer fits."""
    spec = load_spec(Path(run_dir) / "spec.yaml")
    plan, sim, note = run_plan(spec, run_dir, devices, home)
    return SimulatedStep(spec.name, plan, sim, note)
