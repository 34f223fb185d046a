"""The planner's search over T (Merak sec. 4.1): T x P x D with memory per device.

For each admissible T the search of P, D, m and schedule runs on G / T devices, a T
group seen as one device (``resolver.tp_groups``) priced as one rank of it pays
(``tp_costs.calibration``: compute and state split, Megatron's all-reduces, split
activations), so its memory check is per device. The fastest plan wins (under
``planner.objective`` cost or deadline: the cheapest), ties to the smaller T. An
explicit ``parallelism.tensor_parallel`` fixes T. Under ``auto``, T runs over the
divisors of ``hardware.processes_per_node`` (a group stays inside one node) that
divide the model's heads and widths (``tp_features.divisor_problems``), up to G;
(the builtin GPT: of its heads); T = 1 only where the model is a user's hand-cut
blocks, its family has no feature dict, or
a feature that does not run with T > 1 (``spec.tensor_parallel.NOT_WITH_T``) is on:
each says why in the plan.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from jobctl.engine.calibration.record import Calibration
from jobctl.engine.planner import tp_costs, tp_overlap
from jobctl.engine.planner.objective import Choice
from jobctl.engine.planner.search import PlanError
from jobctl.spec import JobSpec
from jobctl.spec.tensor_parallel import NOT_WITH_T

#: (spec, calibration, devices) -> the objective's choice among that search's layouts
Chooser = Callable[[JobSpec, Calibration, int], Choice]


@dataclass
class TChoice:
    """The T chosen, with the spec, pool and calibration its search saw."""

    T: int
    spec: JobSpec
    G: int
    cal: Calibration
    choice: Choice
    lines: list[str] = field(default_factory=list)  # the T search, for the explanation


def with_T(spec: JobSpec, T: int) -> JobSpec:
    """``spec`` with ``parallelism.tensor_parallel`` set to ``T``."""
    par = spec.parallelism.model_copy(update={"tensor_parallel": T})
    return spec.model_copy(update={"parallelism": par})


def options(spec: JobSpec, G: int) -> tuple[list[int], str]:
    """The T to search, and why auto searches only T = 1 ("" where it searches more)."""
    T = spec.parallelism.tensor_parallel
    if T != "auto":
        return [T], ""
    off = [field for field, on, _ in NOT_WITH_T if on(spec)]
    if off:
        return [1], f"{', '.join(off)} does not run with tensor_parallel > 1"
    per_node = spec.hardware.processes_per_node
    if spec.model.family is not None:  # the builtin GPT: its heads split (model.gpt_tp)
        heads = spec.model.heads
        Ts = [t for t in range(1, min(per_node, G) + 1) if per_node % t == 0 and heads % t == 0]
        why = f"no T > 1 divides hardware.processes_per_node ({per_node}) and model.heads"
        return Ts, "" if len(Ts) > 1 else why
    if spec.model.huggingface is None and spec.model.import_ is None:
        return [1], "model.import returns hand-cut blocks: no traced linears to split"
    from jobctl.engine.model.graph.checks import graph_config
    from jobctl.engine.model.graph.source import FixableError, build_model
    from jobctl.engine.model.graph.tp_features import divisor_problems, features_for

    model = build_model(graph_config(spec.model))
    try:
        features = features_for(model)
    except FixableError as e:
        return [1], str(e).removeprefix("parallelism.tensor_parallel: ")
    Ts = [t for t in range(1, min(per_node, G) + 1) if per_node % t == 0]
    Ts = [t for t in Ts if not divisor_problems(model, t, features)[0]]
    if Ts == [1]:
        return Ts, (
            f"no T > 1 divides both hardware.processes_per_node ({per_node}, a "
            "group stays in one node) and the model's heads and widths"
        )
    return Ts, ""


def rank_calibration(spec: JobSpec, cal: Calibration, T: int) -> Calibration:
    """``cal`` as one rank of a T group pays it (``tp_costs``), from the traced graph."""
    if T == 1:
        return cal
    from jobctl.engine.model.blocks import model_def
    from jobctl.engine.model.graph.tp_plan import discover

    hw, m = spec.hardware, spec.model
    if m.family is not None:  # the builtin GPT's own plan (model.gpt_tp)
        facts = tp_costs.gpt_facts(m.layers, m.hidden, m.heads, m.seq_len)
    else:
        graph = model_def(m, spec.training.seed).graph
        if graph is None:  # validate refuses this; make_plan may be called without it
            raise PlanError(
                f"parallelism.tensor_parallel {T} splits a traced model's linears or the "
                "builtin GPT's; a model.import of hand-cut blocks has none: set it to 1"
            )
        facts = tp_costs.facts(graph, discover(graph, T))
    tp = tp_costs.TPCosts(T, facts, hw.one_machine and hw.device == "cpu")
    return overlapped(spec, cal, tp, tp_costs.calibration(cal, tp))


def overlapped(spec: JobSpec, cal: Calibration, tp: tp_costs.TPCosts, ranked: Calibration):
    """``ranked`` (one rank's costs) with sub-pipelined TMP's saving (Merak 5.3,
    ``tp_overlap``) taken off each split block's forward and backward at even m, where
    ``parallelism.tp_subpipeline`` is true, or auto and the block gains (the resolver
    decides auto for the chosen plan over whole stages; per block the fill and drain
    count once more). The model's last block runs as plain TMP (its mean loss). The
    result keeps ``ranked`` as its ``plain``: ZB-H1 candidates (``schedule: auto``)
    are priced from it, as they run (``tp_overlap.SubPipelined``)."""
    want = spec.parallelism.tp_subpipeline
    # the builtin GPT's blocks run plain TMP (tp_overlap.resolve says so in the plan)
    if want is False or spec.parallelism.schedule == "zb_h1" or spec.model.family is not None:
        return ranked
    hw = spec.hardware
    hidden = tp_overlap.hidden_share(hw.device, cal.host.cores, tp_overlap.machine_ranks(hw))
    blocks = list(ranked.blocks)
    for i, fact in enumerate(tp.blocks[:-1]):
        saved = {
            m: _saving(cal, i, fact, tp.T, m, hidden) for m in cal.micro_batch_sizes if m % 2 == 0
        }
        if want == "auto":
            saved = {m: s for m, s in saved.items() if s[0] + s[1] > 0}
        if saved:
            blocks[i] = _less(blocks[i], saved)
    return tp_overlap.SubPipelined(**{**dict(ranked), "blocks": blocks, "plain": ranked})


def _saving(cal: Calibration, i: int, fact, T: int, m: int, hidden: float):
    """(forward, backward) seconds block i saves by sub-pipelining at m (0 without g)."""
    K = len(fact.reduce_bytes) / 2
    if K == 0:
        return 0.0, 0.0
    o = tp_costs.overhead(cal.blocks[i].forward)
    T_m = tp_costs.split_time(cal.forward(i, m), o, fact.phi, T) / K
    T_a, T_o = tp_costs.comm_time(cal, fact, T, m) / K, o / K
    exclusive = K * (1.0 - hidden) * T_a
    fwd = (T_m + T_a) * K - tp_overlap.forward(T_m + T_o, hidden * T_a, K) - exclusive
    bwd = (2 * T_m + T_a) * K - tp_overlap.backward(T_m + T_o, hidden * T_a, K) - exclusive
    return fwd, bwd


def _less(block, saved: dict):
    """``block`` with ``saved[m]`` = (forward, backward) seconds taken off its times."""

    def minus(table, k):
        return {
            m: s.model_copy(update={"median": s.median - saved[m][k]}) if m in saved else s
            for m, s in table.items()
        }

    # forward_nograd stays whole: a no-grad forward (eval, the first forward of a
    # recomputed micro-batch) runs plain TMP (``SubPipeline.run``)
    return block.model_copy(
        update={"forward": minus(block.forward, 0), "backward": minus(block.backward, 1)}
    )


def _score(spec: JobSpec, choice: Choice) -> float:
    """What the objective minimises across T: step time, or dollars to finish."""
    if spec.planner.objective == "throughput":  # (the budget filtered each T's choice)
        return choice.chosen.cand.step
    return choice.chosen.forecast.usd


def best(spec: JobSpec, G: int, cal: Calibration, groups, choose: Chooser) -> TChoice:
    """Search every admissible T (``groups(spec, G)``: the spec and pool a T group sees
    as one device) and keep the best; PlanError when no T fits."""
    Ts, why = options(spec, G)
    lines = [f"T = 1 only: {why}"] if why else []
    found: list[TChoice] = []
    errors: list[str] = []
    failures: list[PlanError] = []
    for T in Ts:
        spec_T, G_T = groups(with_T(spec, T), G)
        cal_T = rank_calibration(spec, cal, T)
        try:
            found.append(TChoice(T, spec_T, G_T, cal_T, choose(spec_T, cal_T, G_T)))
        except PlanError as e:
            errors.append(f"T = {T}: {e}")
            failures.append(e)
    if not found:
        # one T: its own error as it was (a BudgetError stays one); several: every T's
        # reason, under the kind they share (BudgetError only when each was over budget)
        if len(failures) == 1:
            raise failures[0]
        kind = type(failures[0]) if len({type(e) for e in failures}) == 1 else PlanError
        raise kind("; ".join(errors))
    win = min(found, key=lambda c: (_score(spec, c.choice), c.T))
    if len(Ts) > 1:
        lines += _lines(spec, win, found, errors)
    if win.T > 1:
        lines.append(f"T = {win.T} all-reduces priced by {tp_costs.link_source(cal, win.T)}")
    win.lines = lines
    return win


def _lines(spec: JobSpec, win: TChoice, found: list[TChoice], errors: list[str]) -> list[str]:
    """One line per T searched: its best layout and how it compares."""
    out = [f"T search over {', '.join(str(c.T) for c in found)}:"]
    top = _score(spec, win.choice)
    unit = "s/step" if spec.planner.objective == "throughput" else "USD"
    for c in found:
        s = _score(spec, c.choice)
        lay = c.choice.chosen.cand.layout.label()
        tail = "chosen" if c is win else f"{100 * (s / top - 1):.1f} % worse"
        out.append(f"  T = {c.T}: {lay}: {s:.4g} {unit} ({tail})")
    return out + [f"  {e}" for e in errors]
