"""Turn the pipeline probe's samples into the runtime's own costs (``RuntimeCalibration``).

The probe (``measure.probe``) ran 1F1B over the job's model with the runtime's
executor and the trainer's per-step work: one stage alone (``solo``), a 2-stage
pipeline (``idle``) and, on groups of 4 ranks, a 4-stage one (``busy``: more
processes than cores on small hosts). Here the same runs are simulated with the rest
of the calibration (compute per block, data fetch, links, core sharing):

* ``solo`` has no messages: what its executor run takes beyond the calibrated compute
  is the executor's own cost per action, and what its step loop takes beyond the
  calibrated optimizer step is the fixed cost per step;
* with those, the extra seconds per message that make each simulated pipeline match
  its measured median are found by bisection (the simulated time grows with it).

One number per regime, fitted once; every plan then uses it for every message it
sends, by how many processes compute at once (Varuna sec. 4.3: a few primitives,
calibrated once, predict any configuration).
"""

from __future__ import annotations

import dataclasses
import statistics

from jobctl.engine.calibration.record import Calibration, RuntimeCalibration, Stat
from jobctl.engine.planner.contention import contend, demand
from jobctl.engine.planner.layout import Hosting, Layout
from jobctl.engine.planner.simulator.simulation import simulate
from jobctl.engine.planner.stage_costs import BlockTimes, stage_costs, with_message
from jobctl.engine.schedule.generators import generate

BISECTION_ROUNDS = 30
SCAN_START_S = 1e-5


def probe_hosting(cal: Calibration, P: int) -> Hosting:
    """A probe's ranks: one P-stage pipeline sharing this host's cores."""
    return Hosting(P, 1, P, "pipeline_major", True, True, cal.host.cores < P)


def _probe_model(cal: Calibration, stages, m: int, M: int, extra: float):
    """A probe's cost model (the executor's part, no allreduce or optimizer) with
    ``extra`` seconds per message, and its actions."""
    P = len(stages)
    layout = Layout(P, 1, m, M, "1f1b")
    costs = stage_costs(cal, layout, stages, probe_hosting(cal, P), BlockTimes.at(cal, m))
    sends = with_message(costs.sends, extra)
    model = costs.model(layout, [0] * P)
    model = dataclasses.replace(model, act=sends, grad=sends, ar=(), opt=())
    return model, generate("1f1b", P, M)


def simulated_run(cal: Calibration, stages, m: int, M: int, extra: float):
    """Simulated probe run with ``extra`` seconds per message: ``(costs after core
    sharing, result)``."""
    model, actions = _probe_model(cal, stages, m, M, extra)
    return contend(cal, actions, model, 1, messages=False)


def probe_time(cal: Calibration, stages, m: int, M: int, extra: float) -> float:
    return simulated_run(cal, stages, m, M, extra)[1].pipeline_time


def probe_load(cal: Calibration, stages, m: int, M: int, extra: float) -> float:
    """A probe's compute demand (processes computing at once in its plain simulation,
    as ``contend`` measures a plan's) with ``extra`` seconds per message."""
    model, actions = _probe_model(cal, stages, m, M, extra)
    return demand(simulate(actions, model), 1)


def fit_message(cal: Calibration, stages, m: int, M: int, measured: float) -> float:
    """The least extra seconds per message at which the simulated probe takes ``measured``
    (negative where the probe ran faster than the ping-pong's sends say, never below
    free sends).

    With cores shared the simulated time is not monotone in the message time (later
    messages overlap the other stages' compute less, so it is stretched less): a
    doubling scan brackets the first crossing, bisection narrows it.
    """
    run = lambda extra: probe_time(cal, stages, m, M, extra)  # noqa: E731
    if run(0.0) >= measured:
        # Messages cheaper than the ping-pong (the runtime's shared-memory channel, not
        # gloo's): down to sends that cost nothing.
        lo, hi = -min(_probe_model(cal, stages, m, M, 0.0)[0].act, default=0.0), 0.0
        if run(lo) >= measured:
            return lo
        return _bisect(run, lo, hi, measured)
    lo, hi = 0.0, SCAN_START_S
    while run(hi) < measured:
        if hi > measured:  # no message time explains it (cannot happen: sends are serial)
            return hi
        lo, hi = hi, 2 * hi
    return _bisect(run, lo, hi, measured)


def _bisect(run, lo: float, hi: float, measured: float) -> float:
    """The extra in [lo, hi] (run(lo) < measured <= run(hi)) where ``run`` crosses."""
    for _ in range(BISECTION_ROUNDS):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if run(mid) < measured else (lo, mid)
    return (lo + hi) / 2


def solo_costs(cal: Calibration, solo: dict, m: int, M: int):
    """(seconds per action, seconds per step) of the runtime from the one-stage probe.

    Per action: the executor run beyond the calibrated compute (forwards with their
    data fetch, backwards), over its 2M actions. Per step: the rest of the step loop,
    plus the optimizer step beyond its calibrated per-block cost. Neither below zero.
    """
    blocks = solo["stages"][0]
    bare = probe_time(cal, [blocks], m, M, 0.0)  # the runtime's costs are not in ``cal``
    action = max(0.0, (statistics.median(solo["run"]) - bare) / (2 * M))
    opt = sum(cal.blocks[i].optimizer.median for i in blocks)
    extra_opt = statistics.median(solo["opt"][0]) - opt
    return action, max(0.0, statistics.median(solo["rest"]) + extra_opt)


def machine_drift(samples: dict, reference: float | None) -> float:
    """How much slower the machine ran during the probes than while the blocks were
    timed: the solo probe's model time between its steps over the same time taken
    with the blocks (``reference``); 1 when either is missing."""
    bare = (samples.get("solo") or {}).get("bare")
    if not bare or not reference:
        return 1.0
    return statistics.median(bare) / reference


def at_machine_speed(cal: Calibration, drift: float) -> Calibration:
    """``cal`` with every compute time of the calibrating process (each block's
    forwards, backward and optimizer step, the data fetch) multiplied by ``drift``."""

    def scaled(stat):
        return stat.model_copy(update={"median": stat.median * drift, "iqr": stat.iqr * drift})

    def per_m(stats: dict) -> dict:
        return {m: scaled(x) for m, x in stats.items()}

    blocks = [
        b.model_copy(
            update={
                "forward": per_m(b.forward),
                "forward_nograd": per_m(b.forward_nograd),
                "backward": per_m(b.backward),
                "optimizer": scaled(b.optimizer),
            }
        )
        for b in cal.blocks
    ]
    return cal.model_copy(update={"blocks": blocks, "data": per_m(cal.data)})


def calibrate_runtime(
    cal: Calibration, samples: dict, m: int, M: int, reference: float | None = None
) -> Calibration:
    """``cal`` at the machine's speed during the pipeline probes, with the runtime's own
    costs fitted to them (``fit_runtime``; unchanged if no pipeline probe ran).

    The blocks are timed in one process over a fraction of a second, the faster of
    two passes; the probes run the runtime in its own processes for seconds, as
    training does. The VM's speed moves by a tenth over seconds (the same solo probe,
    run again, took 17.6 to 19.4 ms), and the probes' model ran 0.96 to 1.36 times the
    chosen pass's time across calibrations (``machine_drift``, from ``reference``: the
    whole model's seconds then, as the solo probe times it between its steps). The
    probes are the longer look, in the processes training uses, and the fastest of
    two passes is fast by selection (brought to its speed instead, 8 of 10 plans
    came out under their real runs), so every compute time is scaled by the drift
    first and the runtime's costs are fitted against the probes as measured.
    """
    drift = machine_drift(samples, reference)
    scaled = at_machine_speed(cal, drift)
    runtime = fit_runtime(scaled, samples, m, M)
    if runtime is None:
        return cal
    return scaled.model_copy(update={"runtime": runtime.model_copy(update={"drift": drift})})


def step_spread(runs: list[float], round_len: int | None = None) -> float:
    """One rank's step-to-step spread (relative standard deviation, from the
    interquartile range) within each probe round of ``round_len`` consecutive steps.

    Each step is taken relative to its round's median first: the VM's speed moves
    between rounds for every process alike (one idle probe's rounds differed by a
    fifth, a 40 % spread pooled), which does not set replicas apart; within a round
    the spread was 5 to 9 % on 2 processes and 11 to 16 % on 4."""
    n = round_len or len(runs)
    rel = []
    for i in range(0, len(runs), n):
        chunk = runs[i : i + n]
        mid = statistics.median(chunk)
        rel += [x / mid for x in chunk] if mid > 0 else []
    return Stat.of(rel).rel_std if len(rel) > 1 else 0.0


def fit_runtime(cal: Calibration, samples: dict, m: int, M: int) -> RuntimeCalibration | None:
    """The runtime's per-action, per-step and per-message costs from the probe samples
    (``probe.probe_pipeline``: each phase's stages and times; None if no
    pipeline probe ran), ``cal``'s compute taken as at the probes' speed
    (``calibrate_runtime`` sees to it).

    The per-action and per-step costs come first (the solo probe: no messages in it);
    the message time is then what explains the rest of each pipeline probe's run.
    """
    solo, idle = samples.get("solo"), samples.get("idle")
    if not solo or not solo.get("run") or not idle or not idle.get("run"):
        return None
    action, step = solo_costs(cal, solo, m, M)
    base = RuntimeCalibration(source="measured", action_s=action)
    cal = cal.model_copy(update={"runtime": base})
    probe = {"idle": _fit_phase(cal, idle, m, M)}
    if "busy" in samples and samples["busy"].get("run"):
        probe["busy"] = _fit_phase(cal, samples["busy"], m, M, probe["idle"]["message_s"])
    busy = probe.get("busy", probe["idle"])
    return base.model_copy(
        update={
            "message_s": probe["idle"]["message_s"],
            "message_busy_s": busy["message_s"],
            "step_s": step,
            "load_idle": probe["idle"]["load"],
            "load_busy": busy["load"],
            "step_cv": probe["idle"]["cv"],
            "step_cv_busy": busy["cv"],
            "probe": probe,
        }
    )


def _fit_phase(
    cal: Calibration, sample: dict, m: int, M: int, idle_message: float | None = None
) -> dict:
    """One pipeline probe phase: its measured run, the per-message time that explains
    it, the load it put on the host and its step-to-step spread.

    The load is taken as a plan's demand is (base costs: the idle probe's message time,
    ``idle_message``; None: this is the idle probe), never from the fitted busy time: a
    load that moved with its own fit made the two probes' loads land anywhere from 1.4
    to 3.1 and the slope between them unstable.
    """
    stages = sample["stages"]
    measured = statistics.median(sample["run"])
    message = fit_message(cal, stages, m, M, measured)
    load = probe_load(cal, stages, m, M, message if idle_message is None else idle_message)
    return {
        "measured_s": measured,
        "simulated_s": probe_time(cal, stages, m, M, 0.0),
        "message_s": message,
        "load": load,
        "cv": step_spread(sample["run"], sample.get("round")),
    }
