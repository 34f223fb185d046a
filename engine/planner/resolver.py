"""Resolve a JobSpec into a Plan: P, D, micro-batching, partition, placement, schedule.

``make_plan(spec, devices)`` is the public entry. It takes the costs from a calibration
(a cached measured one that matches the model and machine, else the analytic one from
the hardware spec), runs ``search.search`` (Varuna sec. 4.4: m by
F(m)/m, a P sweep, every applicable schedule simulated) and turns the fastest
candidate into a Plan whose prediction is its simulation; the runners-up become
``Plan.alternatives``, each with why it lost, and ``Plan.explanation`` keeps the
reasoning. Explicit P, D, m and schedule in the spec are honoured exactly.
"""

from __future__ import annotations

import time
from pathlib import Path

from jobctl.engine.calibration.cache import calibration_for, device_name
from jobctl.engine.calibration.record import Calibration
from jobctl.engine.calibration.startup import startup_for
from jobctl.engine.core import systems
from jobctl.engine.core.actions import Action, Op
from jobctl.engine.core.plan import Alternative, Plan, Prediction, StagePlan, idle_share
from jobctl.engine.planner import stage_aware, tp_overlap, tp_search, v_shape
from jobctl.engine.planner.cost import Measured, forecast
from jobctl.engine.planner.objective import (
    NOT_MEASURED,
    Choice,
    candidate_costs,
    choose,
    nodes_of,
)
from jobctl.engine.planner.search import GB, Candidate, PlanError, Search
from jobctl.engine.planner.simulator.simulation import SimResult
from jobctl.spec import JobSpec
from jobctl.spec.cost import run_price

__all__ = ["PlanError", "make_plan", "plan_and_simulate", "plan_priced"]

TOP_ALTERNATIVES = 8
TOP_REJECTED = 4


def make_plan(
    spec: JobSpec,
    devices: int | None = None,
    calibration: Calibration | None = None,
    home: Path | None = None,
) -> Plan:
    """The plan for ``spec`` on ``devices`` devices (default: the whole pool).

    ``calibration`` defaults to the cached measured record under ``home`` (the state
    home) that matches the spec's model and this machine, else the analytic one.
    A job whose ``parallelism.schedule`` names a step system that plans itself
    (``core.systems``: ``mobius``) is planned by that system; under ``schedule: auto``
    a job no P x D layout fits is planned by such a system where it can be (its
    ``resolve``), and so is one whose plan by it is simulated faster than the
    search's (its ``faster``).
    """
    own = systems.planned_by(spec.parallelism.schedule)
    if own is not None:
        G = devices if devices is not None else spec.hardware.devices
        return own.plan(spec, calibration or calibration_for(spec, home), G)
    par = spec.parallelism
    if par.schedule == "auto" and par.pipeline_stages == "auto":
        return _auto(spec, devices, calibration or calibration_for(spec, home), home)
    return plan_and_simulate(spec, devices, calibration, home)[0]


def _auto(spec: JobSpec, devices: int | None, calibration: Calibration, home: Path | None) -> Plan:
    """``schedule: auto``: a step system's plan where nothing else fits, else the
    search's plan, unless a system's is simulated faster (each registered system in
    ``core.systems.SYSTEMS``' order, each against the best plan so far)."""
    G = devices if devices is not None else spec.hardware.devices
    for own in systems.every():  # where nothing fits
        try:
            got = own.resolve(spec, calibration, G)
        except PlanError as no_system:  # neither fits: the search's own reason first
            try:
                plan_and_simulate(spec, devices, calibration, home)
            except PlanError as err:
                raise PlanError(f"{err}; as {own.NAME}: {no_system}") from None
            raise
        if got is not None:
            return got[0]
    plan = plan_and_simulate(spec, devices, calibration, home)[0]
    for own in systems.every():  # where it is faster
        got = own.faster(spec, calibration, G, plan)
        plan = plan if got is None else got[0]
    return plan


def plan_and_simulate(
    spec: JobSpec,
    devices: int | None = None,
    calibration: Calibration | None = None,
    home: Path | None = None,
) -> tuple[Plan, SimResult]:
    """``make_plan``, and the simulated step of the chosen plan (for timelines)."""
    return plan_priced(spec, devices, calibration, home)[:2]


def plan_priced(
    spec: JobSpec,
    devices: int | None = None,
    calibration: Calibration | None = None,
    home: Path | None = None,
) -> tuple[Plan, SimResult, Choice]:
    """``plan_and_simulate``, and the layout ``planner.objective`` chose among every
    layout priced to finish the job (``objective.choose``; ``BudgetError``: none fits)."""
    G = devices if devices is not None else spec.hardware.devices
    if G < 1:
        raise PlanError("no devices available: the pool is empty")
    own = systems.planned_by(spec.parallelism.schedule)
    if own is not None:  # e.g. mobius: its own step, simulated by its own room
        raise PlanError(own.EXPLAIN)
    cal = calibration or calibration_for(spec, home)
    whole_cal = cal  # before the T search prices one rank of a group

    def chooser(spec_T: JobSpec, cal_T: Calibration, G_T: int) -> Choice:
        return choose(spec_T, cal_T, G_T, describe(cal, spec), measured(home, spec_T))

    tc = tp_search.best(spec, G, cal, tp_groups, chooser)  # T x P x D (tp_costs)
    spec, G, cal, choice = tc.spec, tc.G, tc.cal, tc.choice
    found, aware = stage_aware.apply(spec, cal, choice.found)
    # ZB-V: the chosen layout's V variant (a T group as one device, its two stages split)
    found = v_shape.consider(spec, cal, found)
    found = v_shape.stage_aware(spec, cal, found)  # Merak 5.2 on its devices
    plan = build_plan(spec, cal, found, G, home, aware)
    plan = with_tensor_parallel(plan, tc.T).model_copy(update={"t_search": tc.lines})
    plan = tp_overlap.resolve(spec, whole_cal, plan)  # Merak 5.3 at the chosen T
    return plan, found.ranked[0].sim, choice


def _per_rank(pred: Prediction | None, T: int) -> Prediction | None:
    """A group's prediction per device: its T devices' share of the rates (its dollars
    are already T devices', ``tp_groups``' price)."""
    if pred is None or pred.samples_per_s_per_device is None:
        return pred
    return pred.model_copy(update={"samples_per_s_per_device": pred.samples_per_s_per_device / T})


def tp_groups(spec: JobSpec, G: int) -> tuple[JobSpec, int]:
    """The spec and pool the search sees with T > 1: a tensor-parallel group of T
    consecutive ranks is one device to it, at T devices' price (its costs
    priced by ``tp_costs`` as one rank of it pays), so every dollar figure and the budget
    count all T x P x D."""
    T = spec.parallelism.tensor_parallel
    if T == 1:
        return spec, G
    if G < T:
        raise PlanError(f"parallelism.tensor_parallel {T} needs {T} devices, {G} are left")
    per_node = spec.hardware.processes_per_node // T
    hw = spec.hardware
    spot = None if hw.spot_price_per_hour is None else hw.spot_price_per_hour * T
    hardware = hw.model_copy(
        update={
            "processes_per_node": per_node,
            "price_per_hour": hw.price_per_hour * T,
            "spot_price_per_hour": spot,
        }
    )
    return spec.model_copy(update={"hardware": hardware}), G // T


def with_tensor_parallel(plan: Plan, T: int) -> Plan:
    """``plan`` (one rank per T group) with T consecutive ranks per group: group g's
    ranks are g T .. g T + T - 1, so the group stays on group g's node."""
    if T == 1:
        return plan
    ranks = [
        r.model_copy(
            update={"rank": r.rank * T + t, "local_rank": r.local_rank * T + t, "tp_rank": t}
        )
        for r in plan.ranks
        for t in range(T)
    ]
    stages = [st.model_copy(update={"ranks": [r * T for r in st.ranks]}) for st in plan.stages]
    return plan.model_copy(
        update={
            "T": T,
            "ranks": ranks,
            "stages": stages,
            "prediction": _per_rank(plan.prediction, T),
            "processes_per_node": plan.processes_per_node * T,
            "explanation": [
                *plan.explanation,
                f"T = {T}: each stage split over {T} "
                "consecutive ranks (a group priced as one of its ranks)",
            ],
        }
    )


def describe(cal: Calibration, spec: JobSpec | None = None) -> str:
    """Where the plan's costs come from, in one line."""
    if cal.source == "analytic":
        return (
            "analytic (from the hardware spec; no measured calibration matches this model "
            "and machine: `jobctl calibrate job.yaml` measures one)"
        )
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(cal.created))
    fp = cal.fingerprint
    text = f"measured calibration {fp.key} ({when}, {fp.device}, torch {fp.torch})"
    source = spec.data.source if spec else None
    if source and cal.data_source and cal.data_source != source:
        text += (
            f"; its data fetch times are for data.source {cal.data_source!r}, this job "
            f"reads {source!r} (`jobctl calibrate` measures them)"
        )
    return text


def machine_key(spec: JobSpec) -> str:
    """Whose start-up a plan uses: this machine's device, through the spec's backend."""
    return f"{spec.hardware.backend}:{device_name(spec.hardware.device)}"


def build_plan(
    spec: JobSpec,
    cal: Calibration,
    found: Search,
    G: int,
    home: Path | None = None,
    aware: stage_aware.StageAware | None = None,
) -> Plan:
    """The winning candidate as a Plan, with its prediction and the alternatives."""
    win = found.ranked[0]
    lay = win.layout
    ranks = win.hosting.ranks
    by_stage: list[list[int]] = [[] for _ in range(lay.P)]
    for r in sorted(ranks, key=lambda r: r.replica):
        by_stage[r.stage].append(r.rank)
    if isinstance(win, v_shape.VCandidate):  # two stages per rank (by_stage: by device)
        stage_plans, v_fields = v_shape.v_stage_plans(win, by_stage)
    else:
        stage_plans, v_fields = _stage_plans(win, by_stage, aware), {}
    return Plan(
        P=lay.P,
        D=lay.D,
        micro_batch_size=lay.m,
        micro_batches=lay.M,
        global_batch_size=spec.training.global_batch_size,
        schedule=lay.schedule,
        nodes=max(r.node for r in ranks) + 1,
        processes_per_node=min(spec.hardware.processes_per_node, lay.devices),
        device=spec.hardware.device,
        block_names=cal.names,
        stages=stage_plans,
        ranks=ranks,
        prediction=predict(spec, cal, win, measured(home, spec)),
        alternatives=alternatives(spec, found, G),
        explanation=[*found.explanation, f"winner: {lay.label()} ({win.step:.4g} s/step)"],
        **v_fields,
    )


def _stage_plans(
    win: Candidate, by_stage: list[list[int]], aware: stage_aware.StageAware | None
) -> list[StagePlan]:
    """Each stage's blocks, ranks, recomputation and action list."""
    return [
        StagePlan(
            index=s,
            blocks=blocks,
            ranks=by_stage[s],
            recompute=any(a.op is Op.RECOMPUTE for a in win.actions[s]),
            keep_blocks=aware.keep[s] if aware else None,
            alpha=aware.alphas[s] if aware else None,
            actions=action_text(win.actions[s]),
        )
        for s, blocks in enumerate(win.stages)
    ]


def action_text(actions: list[Action]) -> str:
    """A stage's list in ``core.actions``' compact form (``F0 F1 R0 B0 ...``), as
    ``str(action)`` writes each one but without its enum lookups: a plan of Varuna's
    8.3B at P = 36 and M = 8192 holds 0.9 M actions (0.59 s by ``str``, 0.26 s here)."""
    return " ".join([f"{a.op._value_}{a.micro_batch}" for a in actions])


def _throughput(spec: JobSpec, cand: Candidate) -> tuple[float, float, float]:
    """Samples/s, samples/s per device, USD per 1,000 samples."""
    samples = spec.training.global_batch_size / cand.step
    devices = cand.layout.devices
    price = run_price(spec.hardware) * devices  # the spot price on spot, when given
    return samples, samples / devices, price / 3600.0 / samples * 1000.0


def measured(home: Path | None, spec: JobSpec) -> Measured:
    """This machine's measured start-up, recovery and checkpoint snapshot rate,
    through the spec's backend."""
    key = machine_key(spec)
    return Measured(
        startup_for(home, key),
        startup_for(home, key, "recovery"),
        startup_for(home, key, "snapshot"),
        startup_for(home, key, "checkpoint"),
        startup_for(home, key, "checkpoint_bytes"),
    )


def predict(
    spec: JobSpec, cal: Calibration, cand: Candidate, seen: Measured = NOT_MEASURED
) -> Prediction:
    """The simulated step of a candidate as a Prediction (``seen``: this machine's
    measured start-up and recovery)."""
    samples, per_device, cost = _throughput(spec, cand)
    cfg = candidate_costs(spec, cal, cand, seen)
    fc = forecast(cand.step, cand.layout.devices, nodes_of(cand), cfg, cfg.pricing())
    return Prediction(
        finish_s=fc.wall_s if fc.finishes else None,
        finish_usd=fc.usd if fc.finishes else None,
        hourly_usd=fc.hourly_usd,
        step_time_s=cand.step,
        samples_per_s=samples,
        memory_per_stage_gb=[x / GB for x in cand.memory],
        bubble_ratio=cand.sim.bubble_ratio,
        cost_per_1k_samples=cost,
        source="calibration" if cal.source == "measured" else "analytic",
        samples_per_s_per_device=per_device,
        calibration=cal.fingerprint.key if cal.source == "measured" else None,
        startup_s=seen.startup_s,
    )


def alternatives(spec: JobSpec, found: Search, G: int) -> list[Alternative]:
    """The best runners-up with why each lost, then a few that could not run."""
    win = found.ranked[0]
    out = []
    for c in found.ranked[1 : 1 + TOP_ALTERNATIVES]:
        samples, per_device, cost = _throughput(spec, c)
        out.append(
            _alternative(
                c,
                why_slower(c, win, G),
                step_time_s=c.step,
                samples_per_s=samples,
                samples_per_s_per_device=per_device,
                memory_per_stage_gb=[x / GB for x in c.memory],
                bubble_ratio=c.sim.bubble_ratio,
                cost_per_1k_samples=cost,
            )
        )
    fit_first = sorted(found.rejected, key=lambda c: (not c.memory, c.bound))
    for c in fit_first[:TOP_REJECTED]:
        mem = [x / GB for x in c.memory]
        out.append(_alternative(c, c.why_not, memory_per_stage_gb=mem))
    return out


def _alternative(c: Candidate, why: str, **values) -> Alternative:
    lay = c.layout
    base = {"step_time_s": None, "samples_per_s": None}
    return Alternative(
        P=lay.P,
        D=lay.D,
        micro_batch_size=lay.m,
        micro_batches=lay.M,
        schedule=lay.schedule,
        recompute=lay.recompute or lay.schedule in ("varuna", "shifted_critical_path"),
        why_not=why,
        **{**base, **values},
    )


def why_slower(c: Candidate, win: Candidate, G: int) -> str:
    """Why a simulated candidate lost to the winner, in the terms that differ."""
    if c.step < win.step and c.layout.devices != win.layout.devices:  # chosen for money
        return (
            f"{100 * (1 - c.step / win.step):.1f} % faster on {c.layout.devices} devices, "
            "but over the budget or dearer (planner.objective)"
        )
    if c.step < win.step and win.layout.schedule == "zb_v":  # asked for by the spec
        return f"{100 * (1 - c.step / win.step):.1f} % faster, but the spec asks for zb_v"
    if c.step <= win.step:
        if c.layout.devices != win.layout.devices:
            return f"as fast, but on {c.layout.devices} devices, not {win.layout.devices}"
        mem, wmem = max(c.memory) / GB, max(win.memory) / GB
        if mem > wmem:
            return f"as fast, but needs more memory ({mem:.3g} GB vs {wmem:.3g} GB per device)"
        return "ties with the winner (same step time, devices and memory)"
    parts = [f"{100 * (c.step / win.step - 1):.1f} % slower"]
    if c.sim.bubble_ratio > win.sim.bubble_ratio + 0.02:  # shown as shares of the step
        idle, widle = idle_share(c.sim.bubble_ratio), idle_share(win.sim.bubble_ratio)
        parts.append(f"idle {100 * idle:.0f} % vs {100 * widle:.0f} %")
    tail = c.sim.step_time - c.sim.pipeline_time
    wtail = win.sim.step_time - win.sim.pipeline_time
    if tail > 1.2 * wtail and tail - wtail > 0.02 * win.step:
        parts.append(f"allreduce+optimizer {tail:.3g} s vs {wtail:.3g} s")
    if c.layout.devices < G and c.layout.devices < win.layout.devices:
        parts.append(f"uses {c.layout.devices} of {G} devices")
    if c.note:
        parts.append(c.note)
    return "; ".join(parts)
