"""Turn the pipeline probe's samples into the runtime's own costs (``RuntimeCalibration``).

The probe (``calibration_probe``) ran a 2-stage 1F1B pipeline of the job's model with
the runtime's executor, alone and, on hosts with few cores, two pipelines at once.
Here the same probe is simulated with the rest of the calibration (compute per block,
data fetch, links, core sharing), and the extra seconds per message that make the
simulated run match the measured median are found by bisection (the simulated time
grows with it). One number per regime, fitted once from one probe layout; every plan
then uses it for every message it sends, by how many processes compute at once
(Varuna sec. 4.3: a few primitives, calibrated once, predict any configuration).
Before that, the executor's own compute times in the probe give what each of its
forward and backward actions costs beyond the calibrated block times.
"""

from __future__ import annotations

import dataclasses
import statistics

from .calibration import Calibration, RuntimeCalibration
from .planner_costs import BlockTimes, Hosting, Layout, contend, demand, stage_costs
from .schedules import generate
from .simulator import simulate

BISECTION_ROUNDS = 30
SCAN_START_S = 1e-5


def probe_hosting(cal: Calibration, pipelines: int) -> Hosting:
    """The probe's ranks: ``pipelines`` 2-stage pipelines sharing this host's cores."""
    ranks = 2 * pipelines
    return Hosting(2, pipelines, ranks, "pipeline_major", True, True, cal.host.cores < ranks)


def _probe_model(cal: Calibration, stages, m: int, M: int, pipelines: int, extra: float):
    """The probe's cost model (the executor's part, no allreduce or optimizer) with
    ``extra`` seconds per message, and its actions."""
    layout = Layout(2, pipelines, m, M, "1f1b")
    hosting = probe_hosting(cal, pipelines)
    costs = stage_costs(cal, layout, stages, hosting, BlockTimes.at(cal, m))
    sends = [x + extra for x in costs.sends]
    model = costs.model(layout, [0, 0])
    model = dataclasses.replace(model, act=sends, grad=sends, ar=(), opt=())
    return model, generate("1f1b", 2, M)


def simulated_run(cal: Calibration, stages, m: int, M: int, pipelines: int, extra: float):
    """Simulated probe run with ``extra`` seconds per message: ``(costs after core
    sharing, result)``."""
    model, actions = _probe_model(cal, stages, m, M, pipelines, extra)
    return contend(cal, actions, model, pipelines, messages=False)


def probe_time(cal: Calibration, stages, m: int, M: int, pipelines: int, extra: float) -> float:
    return simulated_run(cal, stages, m, M, pipelines, extra)[1].pipeline_time


def probe_load(cal: Calibration, stages, m: int, M: int, pipelines: int, extra: float) -> float:
    """The probe's compute demand (processes computing at once in its plain simulation,
    as ``contend`` measures a plan's) with ``extra`` seconds per message."""
    model, actions = _probe_model(cal, stages, m, M, pipelines, extra)
    return demand(simulate(actions, model), pipelines)


def fit_message(cal: Calibration, stages, m: int, M: int, pipelines: int, measured: float):
    """The least extra seconds per message at which the simulated probe takes ``measured``.

    With cores shared the simulated time is not monotone in the message time (later
    messages overlap the pipelines' compute less, so it is stretched less): a doubling
    scan brackets the first crossing, bisection narrows it.
    """
    run = lambda extra: probe_time(cal, stages, m, M, pipelines, extra)  # noqa: E731
    if run(0.0) >= measured:
        return 0.0
    lo, hi = 0.0, SCAN_START_S
    while run(hi) < measured:
        if hi > measured:  # no message time explains it (cannot happen: sends are serial)
            return hi
        lo, hi = hi, 2 * hi
    for _ in range(BISECTION_ROUNDS):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if run(mid) < measured else (lo, mid)
    return (lo + hi) / 2


def action_cost(cal: Calibration, samples: dict, stages, m: int, M: int) -> float:
    """Seconds per forward or backward action of the executor beyond the calibrated
    compute, from the probe's own compute timings (idle phase: one pipeline; core
    sharing simulated on the calibrated side). Never below zero."""
    stretched, _ = simulated_run(cal, stages, m, M, 1, 0.0)
    fetch = BlockTimes.at(cal, m).data
    simulated = sum(M * (f - fetch + b) for f, b in zip(stretched.f, stretched.b, strict=True))
    real = sum(statistics.median(xs) for xs in samples["compute"])
    return max(0.0, (real - simulated) / (2 * M * len(stages)))


def fit_runtime(
    cal: Calibration, samples: dict, stages: list[list[int]], m: int, M: int
) -> RuntimeCalibration | None:
    """The runtime's per-action, per-message and per-step costs from the probe samples
    (None if the probe did not run).

    The per-action cost comes first (the executor's own compute times, no messages in
    them); the message time is then what explains the rest of each probe's run.
    """
    idle = samples.get("idle")
    if not idle or not idle.get("run"):
        return None
    action = action_cost(cal, idle, stages, m, M) if idle.get("compute") else 0.0
    base = RuntimeCalibration(source="measured", action_s=action)
    cal = cal.model_copy(update={"runtime": base})
    probe, fitted, loads = {}, {}, {}
    for phase, pipelines in (("idle", 1), ("busy", 2)):
        if phase not in samples:
            continue
        measured = statistics.median(samples[phase]["run"])
        fitted[phase] = fit_message(cal, stages, m, M, pipelines, measured)
        # As a plan's demand is taken (base costs: idle message time), never from the
        # fitted busy time: a load that moved with its own fit made the two probes'
        # loads land anywhere from 1.4 to 3.1 and the slope between them unstable.
        loads[phase] = probe_load(cal, stages, m, M, pipelines, fitted["idle"])
        probe[phase] = {
            "measured_s": measured,
            "simulated_s": probe_time(cal, stages, m, M, pipelines, 0.0),
            "message_s": fitted[phase],
            "load": loads[phase],
        }
    return base.model_copy(
        update={
            "message_s": fitted["idle"],
            "message_busy_s": fitted.get("busy", fitted["idle"]),
            "step_s": statistics.median(idle["rest"]),
            "load_idle": loads["idle"],
            "load_busy": loads.get("busy", loads["idle"]),
            "probe": probe,
        }
    )
