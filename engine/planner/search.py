"""The planner's search (Varuna sec. 4.4): micro-batch size, P sweep, simulation, ranking.

1. m: the lowest micro-batch size at which the per-sample time F(m)/m stops improving
   (by less than ``sizing.STOP_GAIN`` to the next size) and the model still fits
   memory; an explicit ``training.micro_batch_size`` is kept.
2. P from the smallest that fits memory to min(blocks, G) (an explicit P only), with
   D = floor(G / P) (an explicit D kept); then, against the best of those and with its
   schedule, every smaller D whose compute alone could still win (``compute_floor``;
   the schedules' order hardly moves with D, their simulations cost). Any D trains:
   replicas take N // D or one more of the N = B / m micro-batches (``micro_batches``).
3. Per (P, D, m): blocks balanced over stages by the schedule's own per-stage cost
   (exact min-max partition; under Varuna the last stage does not recompute), ranks
   placed, and every applicable schedule simulated with a CostModel from the
   calibration, best bound first: one whose bound cannot beat the best simulated step
   is skipped, and one no plan could show (``shortlist``) is not simulated.
4. Ranked by throughput (the global batch is fixed, so by step time), then devices.

The spec's update strategy (``core.systems.update_of``: AvgPipe's elastic averaging,
or the plain synchronous update) prices its part of every layout: the step's
calibration and each stage's memory beside one model's.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from jobctl.engine.calibration.record import Calibration
from jobctl.engine.core.actions import Action
from jobctl.engine.core.systems import update_of
from jobctl.engine.planner.contention import contend, demand, replica_skew
from jobctl.engine.planner.layout import Hosting, Layout
from jobctl.engine.planner.replicas import (
    compute_floor,
    data_parallel_layouts,
    fill_variant,
    micro_batches,
)
from jobctl.engine.planner.shortlist import Shortlist, sweep_lines
from jobctl.engine.planner.simulator.simulation import SimResult
from jobctl.engine.planner.simulator.steady import steady_simulate
from jobctl.engine.planner.sizing import GB, choose_m, fit_hint, gb_text
from jobctl.engine.planner.stage_costs import (
    CLOSED_FORM_PEAKS,
    StageCosts,
    Tables,
    activation_peaks,
    generated,
    generated_peaks,
    recompute_counts,
    stage_costs,
    stage_memory,
    step_floor,
)
from jobctl.engine.planner.tp_overlap import tables_for
from jobctl.spec import JobSpec, ParallelismSpec, TrainingSpec

AUTO_SCHEDULES = ("gpipe", "1f1b", "varuna", "shifted_critical_path", "zb_h1")
RECOMPUTING = ("varuna", "shifted_critical_path")
OPTIONAL_RECOMPUTE = ("gpipe", "1f1b", "zb_h1")  # recompute by parallelism.recompute
SPLIT_BACKWARD = ("zb_h1",)  # zero bubble: backward split into B and W
# Every CostModel field the pipeline depends on (all but the allreduce and optimizer).
PIPELINE_COSTS = ("f", "b", "r", "w", "act", "grad", "jitter", "max_inflight_sends")
PIPELINE_COSTS += ("opportunistic",)


class PlanError(ValueError):
    """The spec asks for a layout that cannot exist; the message says what would fit."""


@dataclass
class Candidate:
    """One layout the planner considered, and what became of it."""

    layout: Layout
    stages: list[list[int]]
    hosting: Hosting
    costs: StageCosts
    note: str = ""  # how D or m were adjusted for divisibility
    bound: float = 0.0
    floor: float | None = None  # step_floor, where the search prunes with it
    memory: list[float] = field(default_factory=list)
    actions: list[list[Action]] = field(default_factory=list)
    sim: SimResult | None = None
    why_not: str = ""

    @property
    def step(self) -> float | None:
        return self.sim.step_time if self.sim else None


@dataclass
class Search:
    """Everything the search saw: the ranked candidates and its reasoning."""

    ranked: list[Candidate]  # simulated, fastest first
    rejected: list[Candidate]  # did not fit, or could not beat the winner
    explanation: list[str]
    pruned: list[Candidate] = field(default_factory=list)  # could not be shown (shortlist)


def schedule_options(par: ParallelismSpec, P: int) -> list[tuple[str, bool | None]]:
    """(schedule, recompute) pairs to try; recompute None: decide by memory."""
    if par.schedule != "auto":  # zb_v: its V variant is made of zb_h1's (v_shape)
        names: tuple[str, ...] = ("zb_h1" if par.schedule == "zb_v" else par.schedule,)
    else:  # one stage has no pipeline: every schedule is its F B F B ... there
        names = AUTO_SCHEDULES if P > 1 else ("1f1b",)
    flag = {"none": False, "all": True, "auto": None, "stage_aware": True}[par.recompute]
    return [(n, flag if n in OPTIONAL_RECOMPUTE else False) for n in names]


def generator_options(par: ParallelismSpec, layout: Layout) -> dict:
    """Options for ``schedule.generators.generate`` (recompute, advance_num)."""
    opts: dict = {}
    if layout.schedule in OPTIONAL_RECOMPUTE and layout.recompute:
        opts["recompute"] = True
    if layout.schedule == "advance_forward" and par.advance_num is not None:
        opts["advance_num"] = par.advance_num
    return opts


def hosting(spec: JobSpec, P: int, D: int, cores: int) -> Hosting:
    """Placement of P x D ranks; CPU ranks of the local backend share ``cores``."""
    hw = spec.hardware
    share = hw.one_machine and hw.device == "cpu"
    placement = spec.parallelism.placement
    return Hosting(
        P, D, hw.processes_per_node, placement, hw.one_machine, share, share and cores < P * D
    )


def candidates_for(
    spec: JobSpec,
    tables: Tables,
    P: int,
    G: int,
    m: int,
    beat: float | None = None,
    only: tuple[str, bool] | None = None,
) -> list[Candidate]:
    """(D, m, schedule) candidates for P stages, with bounds, not yet simulated.

    ``beat`` None: the largest D (floor(G / P), or the explicit one). A step time: every
    smaller D whose compute alone could beat it (``compute_floor``), so the search
    reaches every D without pricing those that cannot win. ``only``: just this
    (schedule, recompute), the others are not priced.
    """
    out = []
    for D, mm, note in _variants(spec, tables, P, G, m, beat):
        M = micro_batches(spec.training.global_batch_size, D, mm)
        host = hosting(spec, P, D, tables.cal.host.cores)
        priced: dict[tuple[str, bool], tuple[list[list[int]], StageCosts]] = {}
        for name, recompute in schedule_options(spec.parallelism, P):
            for rec in (False, True) if recompute is None else (recompute,):
                if only is not None and (name, rec) != only:
                    continue
                layout = Layout(P, D, mm, M, name, rec)
                mode, split = recompute_mode(layout), name in SPLIT_BACKWARD
                if (mode, split) not in priced:  # the partition balances its own costs
                    own = tables_for(tables, split)  # ZB-H1 runs plain TMP (tp_overlap)
                    stages, times = own.stages(P, mm, mode), own.times(mm)
                    costs = stage_costs(own.cal, layout, stages, host, times, bound_only=True)
                    priced[mode, split] = stages, costs
                stages, costs = priced[mode, split]
                cand = Candidate(layout, stages, host, costs, note)
                recs = _recompute_counts(layout)
                cand.bound = costs.bound(layout, recs, split=split)
                out.append(cand)
    return out


def _variants(
    spec: JobSpec, tables: Tables, P: int, G: int, m: int, beat: float | None
) -> list[tuple[int, int, str]]:
    """(D, m, note) to price for P stages (``candidates_for``'s ``beat``)."""
    variants = data_parallel_layouts(spec, P, G, m)
    if beat is None:
        variants = variants[:1]
    else:
        variants = [v for v in variants[1:] if compute_floor(spec, tables, P, v[0], v[1]) < beat]
    for D, mm, _ in list(variants):
        smaller = fill_variant(spec.training, P, D, mm)
        if smaller is not None:
            variants.append((D, smaller, f"m={smaller} so that M >= P={P}"))
    return variants


def recompute_mode(layout: Layout) -> str:
    """Which stages recompute: 'last_free' (Varuna, SCP: all but the last), 'all'
    (gpipe / 1f1b with recompute), 'none'."""
    if layout.schedule in RECOMPUTING:
        return "last_free"
    return "all" if layout.recompute else "none"


def _recompute_counts(layout: Layout) -> list[int]:
    """Recomputes per stage, without generating the schedule (a bound needs no more)."""
    P, M = layout.P, layout.M
    if layout.schedule in RECOMPUTING:
        return [M] * (P - 1) + [0]
    if layout.recompute:
        return [M] * (P - 1) + [M - 1 if layout.schedule == "gpipe" else M]
    return [0] * P


def _schedule(par: ParallelismSpec, lay: Layout) -> list[list[Action]]:
    return generated(lay.schedule, lay.P, lay.M, _options_key(par, lay))


def _options_key(par: ParallelismSpec, lay: Layout) -> tuple:
    return tuple(sorted(generator_options(par, lay).items()))


def evaluate(spec: JobSpec, tables: Tables, cand: Candidate, cap: float, seed: int = 0) -> None:
    """Generate the schedule, check memory, simulate; fills ``memory``/``sim``/``why_not``."""
    if fits_memory(spec, tables, cand, cap):
        simulate_candidate(spec, tables, cand, seed)


def fits_memory(spec: JobSpec, tables: Tables, cand: Candidate, cap: float) -> bool:
    """Fill ``memory`` (and ``why_not`` when a stage does not fit ``cap``)."""
    lay = cand.layout
    # GPipe's, 1F1B's and ZB-H1's memory has a closed form: generate them only if they fit.
    if lay.schedule in CLOSED_FORM_PEAKS:
        peaks = activation_peaks(lay, None)
    else:
        peaks = generated_peaks(lay.schedule, lay.P, lay.M, _options_key(spec.parallelism, lay))
    # One model's bytes, then what the spec's update strategy adds (AvgPipe: its N
    # parallel models and the reference), asked of core.systems so that the search
    # imports no module of the strategy's room.
    update = update_of(spec)
    one = stage_memory(tables.cal, cand.stages, peaks, lay.m)
    cand.memory = update.memory(spec, tables.cal, cand.stages, one)
    worst = max(range(lay.P), key=lambda s: cand.memory[s])
    if cand.memory[worst] <= cap:
        return True
    cand.why_not = (
        f"does not fit memory: stage {worst} needs {gb_text(cand.memory[worst])} GB "
        f"> {spec.hardware.memory_gb} GB{update.refusal_note(spec)}"
    )
    return False


def priced(tables: Tables, cand: Candidate) -> StageCosts:
    """The candidate's stage costs with sends (bounds need none; most never simulate)."""
    if cand.costs.bound_only:
        lay = cand.layout
        own = tables_for(tables, lay.schedule in SPLIT_BACKWARD)  # ZB-H1: plain TMP
        cand.costs = stage_costs(own.cal, lay, cand.stages, cand.hosting, own.times(lay.m))
    return cand.costs


def simulate_candidate(spec: JobSpec, tables: Tables, cand: Candidate, seed: int = 0) -> None:
    """Simulate a candidate that fits memory; fills ``actions`` and ``sim``."""
    lay, cal = cand.layout, tables.cal
    actions = cand.actions = _schedule(spec.parallelism, lay)
    costs = priced(tables, cand).model(lay, recompute_counts(actions))
    if cand.hosting.share_cores:
        # Messages cost more with load only where ranks outnumber cores (``contend``).
        _, cand.sim = contend(cal, actions, costs, lay.D, seed, cand.hosting.oversubscribed)
        return
    # The pipeline is the same for every D with this M and these costs: only the
    # allreduce and optimizer after it differ (``SimResult.recosted``).
    key = (_options_key(spec.parallelism, lay), lay.schedule, lay.M, seed)
    key += tuple(getattr(costs, name) for name in PIPELINE_COSTS)
    sim = tables.pipelines.get(key)
    if sim is None:
        # Large M: a few small simulations extrapolated from the periodic steady state
        # (``simulator.steady``), equal to simulating ``actions`` where costs are fixed.
        def make(M: int) -> list[list[Action]]:
            return actions if M == lay.M else _schedule(spec.parallelism, replace(lay, M=M))

        sim = tables.pipelines[key] = steady_simulate(make, lay.M, costs, seed)
    sim = sim.recosted(costs)
    _, cand.sim = replica_skew(cal, actions, costs, sim, lay.D, demand(sim, lay.D), seed)


def search(
    spec: JobSpec, G: int, cal: Calibration, source: str, exhaustive: bool = False
) -> Search:
    """Sweep, simulate and rank every candidate layout for G devices (``exhaustive``:
    also those no plan could show, see ``shortlist``)."""
    cap = spec.hardware.memory_gb * GB
    n, par = cal.num_blocks, spec.parallelism
    explicit_P = par.pipeline_stages if isinstance(par.pipeline_stages, int) else None
    if explicit_P is not None and explicit_P > n:
        raise PlanError(f"parallelism.pipeline_stages={explicit_P}: the model has only {n} blocks")
    explain, tables = [f"costs: {source}"], Tables(update_of(spec).calibration(spec, cal))
    m, lines = choose_m(spec, tables, explicit_P or min(n, G), cap)
    explain += lines
    while True:
        Ps = _pipeline_depths(spec, tables, G, m, cap, explain)
        cands = [c for P in Ps for c in candidates_for(spec, tables, P, G, m)]
        for c in cands:
            check_explicit(spec.training, c.layout, G)
        short = None if exhaustive or not _prunable(spec) else Shortlist()
        ranked, rejected = _run(spec, tables, cands, cap, None, short)
        if ranked and not isinstance(par.data_parallel, int):  # then every smaller D
            win = ranked[0].layout
            only = (win.schedule, win.recompute)
            beat = ranked[0].step
            more = [c for P in Ps for c in candidates_for(spec, tables, P, G, m, beat, only)]
            more_ranked, more_rejected = _run(spec, tables, more, cap, beat, short)
            ranked, rejected = sorted(ranked + more_ranked, key=rank_key), rejected + more_rejected
        smaller = [x for x in cal.micro_batch_sizes if x < m]
        if ranked or isinstance(spec.training.micro_batch_size, int) or not smaller:
            break
        explain.append(f"m={m}: no schedule fits memory; trying m={smaller[-1]}")
        m = smaller[-1]
    if not ranked:
        worst = min(rejected, key=lambda c: max(c.memory or [float("inf")]))
        raise PlanError(
            f"no layout fits: {worst.layout.label()} {worst.why_not}; "
            + fit_hint(spec.hardware, tables, G)
        )
    explain += sweep_lines(Ps, ranked, rejected)
    return Search(ranked, rejected, explain, short.pruned if short else [])


def _prunable(spec: JobSpec) -> bool:
    """Is the search's order the plan's? (Money chooses among every layout simulated.)"""
    return spec.planner.objective == "throughput" and not spec.budget.capped


def _pipeline_depths(spec: JobSpec, tables: Tables, G: int, m: int, cap: float, explain: list[str]):
    """The P values to sweep: explicit P, else the smallest that fits to min(blocks, G)."""
    par, n = spec.parallelism, tables.cal.num_blocks
    if isinstance(par.pipeline_stages, int):
        explain.append(f"P={par.pipeline_stages}: explicit parallelism.pipeline_stages")
        return [par.pipeline_stages]
    top = min(n, G)
    low = next((P for P in range(1, top + 1) if tables.min_memory(P, m) <= cap), None)
    if low is None:
        raise PlanError(fit_hint(spec.hardware, tables, G))
    explain.append(
        f"P sweep: from {low} (smallest P whose stages fit {spec.hardware.memory_gb} GB "
        f"at m={m}) to {top} = min(blocks {n}, G {G})"
    )
    return range(low, top + 1)


def check_explicit(training: TrainingSpec, layout: Layout, G: int) -> None:
    """The errors an explicit P, D or m can cause, with what would fit."""
    B, P, D = training.global_batch_size, layout.P, layout.D
    if P * D > G:
        raise PlanError(
            f"P x D = {P} x {D} = {P * D} devices, but only {G} are available: "
            "lower parallelism.pipeline_stages or data_parallel, or add nodes"
        )
    if B % layout.m:
        raise PlanError(
            f"training.micro_batch_size={layout.m} does not divide the global batch "
            f"{B}: pick a divisor of {B}"
        )


def _run(
    spec: JobSpec,
    tables: Tables,
    cands: list[Candidate],
    cap: float,
    best: float | None = None,
    short: Shortlist | None = None,
):
    """Evaluate candidates best bound first, skipping those that cannot win (``best``:
    a step already simulated elsewhere) and, with a ``short``list, those no plan could
    show (into ``short.pruned``)."""
    ranked, rejected = [], []
    for c in sorted(cands, key=lambda c: c.bound):
        if best is not None and c.bound >= best:
            c.why_not = f"cannot win: even without bubbles a step takes >= {c.bound:.4g} s"
            rejected.append(c)
        elif _pruned(tables, c, short):
            short.pruned.append(c)
        elif not fits_memory(spec, tables, c, cap):
            rejected.append(c)
            if short is not None:
                short.rejected(c)
        elif _pruned(tables, c, short):  # now that its memory cannot list it
            short.pruned.append(c)
        else:
            simulate_candidate(spec, tables, c)
            ranked.append(c)
            best = c.step if best is None else min(best, c.step)
            if short is not None:
                short.ranked(c)
    ranked.sort(key=rank_key)
    return ranked, rejected


def _pruned(tables: Tables, cand: Candidate, short: Shortlist | None) -> bool:
    """Is the candidate's ``step_floor`` above the step any plan could show it at?"""
    cut = None if short is None or cand.hosting.share_cores else short.cutoff(cand)
    if cut is None:  # (contention stretches costs after pricing: no floor there)
        return False
    lay = cand.layout
    if cand.floor is None:
        costs = priced(tables, cand).model(lay, None)
        split = lay.schedule in SPLIT_BACKWARD
        cand.floor = step_floor(costs, _recompute_counts(lay), lay.M, split=split)
    if cand.floor <= cut:
        return False
    cand.why_not = f"cannot be shown: a step takes >= {cand.floor:.4g} s"
    return True


def rank_key(c: Candidate) -> tuple[float, int, float]:
    """Throughput first (the global batch is fixed: step time), then fewer devices,
    then less memory."""
    return (round(c.step, 12), c.layout.devices, max(c.memory))
