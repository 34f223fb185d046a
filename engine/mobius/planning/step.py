"""A Mobius plan's simulated step, and the words for why the planner runs Mobius.

``swap_stages`` prices each stage of a ``core.plan.MobiusLayout`` from the calibration
the way ``engine.mobius.runtime`` runs it: per micro-batch forward, and backward with
the forward recomputed (the last stage, still resident, runs forward and backward
together and recomputes nothing); the record's weights, gradients and optimizer slots;
the optimizer update (on upload); the stage's input (offloaded after its forward,
reloaded for its backward) and output. ``simulate_plan`` runs them through
``planning.simulator`` on the plan's ranks, with the tier's bandwidth the partition
assumed (``plan.TIER_BPS``) and, on one node with ``hardware.topology``, its
root complexes sharing their bandwidth. ``state_ratio`` and ``why_mobius`` say how far
the training state is over what the devices hold and what Mobius predicts instead.

``resolve_mobius`` is where the planner turns to Mobius: a ``schedule: mobius`` job
always (``plan.mobius_plan`` at the user's S); under ``schedule: auto`` with
``pipeline_stages: auto`` when no P x D layout fits ``hardware.memory_gb`` (the
search's own test: for every P, the heaviest stage's state and one micro-batch over
the cap) and the spec has nothing Mobius does not run (``spec.mobius``' rules), at
the S the MIP finds best (above N).

``faster_mobius`` is auto's other arm: with the ordinary plan priced (objective
throughput, no budget: Mobius has no priced alternatives of its own), an admissible
spec gets a cheap Mobius estimate, the even split simulated at a few S
(``cheap_stages``), and only where the best is within ``MARGIN`` of the ordinary
step is the MIP plan at its S built and simulated; it replaces the ordinary plan
where its step is shorter.
"""

from __future__ import annotations

from jobctl.engine.calibration.record import Calibration
from jobctl.engine.core.plan import Plan
from jobctl.engine.core.systems import update_of
from jobctl.engine.mobius.planning.costs import MobiusConfig, even_bounds, layer_costs
from jobctl.engine.mobius.planning.partition import mobius_partition
from jobctl.engine.mobius.planning.plan import TIER_BPS, mapped_topology, micro_batch, mobius_plan
from jobctl.engine.mobius.planning.simulator import (
    MobiusSimConfig,
    MobiusSimResult,
    SwapStage,
    simulate_mobius,
)
from jobctl.engine.planner.search import PlanError
from jobctl.engine.planner.sizing import GB
from jobctl.engine.planner.stage_costs import Tables
from jobctl.spec import JobSpec
from jobctl.spec.mobius import mobius_violations


def swap_stages(cal: Calibration, stages: list[list[int]], m: int) -> list[SwapStage]:
    """Each stage's costs at micro-batch size ``m`` (see the module doc)."""
    out = []
    for j, blocks in enumerate(stages):
        bs = [cal.blocks[i] for i in blocks]
        fwd = sum(cal.forward(i, m) for i in blocks)
        bwd = sum(cal.backward(i, m) for i in blocks)
        params = sum(b.param_bytes for b in bs)
        before = cal.blocks[blocks[0] - 1].boundary_bytes * m if blocks[0] > 0 else 0.0
        out.append(
            SwapStage(
                forward_s=fwd,
                backward_s=bwd + (fwd if j < len(stages) - 1 else 0.0),
                param_bytes=params,
                optim_bytes=max(0.0, sum(b.state_bytes for b in bs) - 2 * params),
                update_s=sum(b.optimizer.median for b in bs),
                input_bytes=before,
                boundary_bytes=bs[-1].boundary_bytes * m,
            )
        )
    return out


def sim_config(spec: JobSpec, cal: Calibration, plan: Plan, prefetch: bool | None = None):
    """The simulator's machine for ``plan``: N ranks, the tier, the links, the complexes."""
    lay = plan.mobius
    if lay is None:
        raise ValueError("the plan has no Mobius layout (Plan.mobius)")
    topology = mapped_topology(spec, lay.N)
    return MobiusSimConfig(
        devices=lay.N,
        micro_batches=plan.micro_batches,
        tier_Bps=TIER_BPS[spec.hardware.device],
        link_Bps=_link_Bps(cal, plan.micro_batch_size),
        prefetch=lay.prefetch if prefetch is None else prefetch,
        placement=tuple(lay.ranks),
        root_complexes=None if topology is None else topology.root_complexes,
    )


def simulate_plan(
    spec: JobSpec, cal: Calibration, plan: Plan, prefetch: bool | None = None
) -> MobiusSimResult:
    """One simulated step of the Mobius ``plan`` (prefetch: the plan's unless given)."""
    stages = swap_stages(cal, plan.mobius.stages if plan.mobius else [], plan.micro_batch_size)
    return simulate_mobius(stages, sim_config(spec, cal, plan, prefetch))


def state_ratio(spec: JobSpec, cal: Calibration, devices: int) -> float:
    """The whole training state (weights, gradients, optimizer slots) over what
    ``devices`` devices hold at ``hardware.memory_gb`` each: above 1, no layout that
    keeps the state on the devices fits, however it is cut."""
    state = sum(b.state_bytes for b in cal.blocks)
    return state / (devices * spec.hardware.memory_gb * GB)


def why_mobius(
    spec: JobSpec, cal: Calibration, plan: Plan, step_s: float, reason: str, base_s: float = 0.0
) -> str:
    """One line: why this run swaps, and what it is predicted to take (``base_s``: the
    ordinary plan's step, where Mobius is "faster")."""
    lay = plan.mobius
    assert lay is not None
    ratio = state_ratio(spec, cal, lay.N)
    if reason == "faster":
        return (
            f"mobius: faster than P x D's {base_s:.3g} s: S={lay.S}/N={lay.N}, "
            f"sim {step_s:.3g} s/step"
        )
    head = {"forced": "schedule mobius", "memory": "no P x D fits"}[reason]
    return (
        f"mobius: {head} (state {ratio:.1f}x N x memory_gb): "
        f"S={lay.S}/N={lay.N}, sim {step_s:.3g} s/step"
    )


def as_mobius(spec: JobSpec, S: int) -> JobSpec:
    """``spec`` with ``schedule: mobius`` at S stages (what auto resolves to)."""
    par = spec.parallelism.model_copy(update={"schedule": "mobius", "pipeline_stages": S})
    return spec.model_copy(update={"parallelism": par})


def nothing_fits(spec: JobSpec, cal: Calibration, G: int) -> bool:
    """No P x D layout on G devices fits ``hardware.memory_gb``: for every P, the
    heaviest stage's state and one micro-batch are over it (the search's P sweep)."""
    tables = Tables(update_of(spec).calibration(spec, cal))
    m = spec.training.micro_batch_size if isinstance(spec.training.micro_batch_size, int) else 1
    cap = spec.hardware.memory_gb * GB
    return all(tables.min_memory(P, m) > cap for P in range(1, min(cal.num_blocks, G) + 1))


def auto_reason(spec: JobSpec, cal: Calibration, G: int) -> str | None:
    """Why the planner runs ``spec`` as Mobius ("forced", "memory"), or None."""
    par = spec.parallelism
    if par.schedule == "mobius":
        return "forced"
    if par.schedule != "auto" or par.pipeline_stages != "auto":
        return None
    S = max(G, spec.hardware.devices) + 1  # any S above the pool, for the rules
    if list(mobius_violations(as_mobius(spec, S))) or not nothing_fits(spec, cal, G):
        return None
    return "memory"


def best_stages(spec: JobSpec, cal: Calibration, G: int) -> int:
    """S for auto: the MIP's best stage count over every S (at least N + 1)."""
    m = micro_batch(spec, G)
    M = spec.training.global_batch_size // m
    cfg = MobiusConfig(
        devices=G,
        memory_bytes=spec.hardware.memory_gb * GB,
        tier_Bps=TIER_BPS[spec.hardware.device],
        micro_batches=M,
    )
    try:
        part = mobius_partition(layer_costs(cal, m, M), cfg)
    except ValueError as err:
        raise PlanError(
            f"{err}, and no P x D layout does either: raise hardware.memory_gb or use "
            "a smaller model"
        ) from None
    return min(max(len(part.stages), G + 1), cal.num_blocks)


def resolve_mobius(
    spec: JobSpec, cal: Calibration, G: int
) -> tuple[Plan, MobiusSimResult, str] | None:
    """The Mobius plan of ``spec`` on G devices, its simulated step and the line that
    says why (None: the planner's search plans it; see the module doc)."""
    reason = auto_reason(spec, cal, G)
    if reason is None:
        return None
    if reason == "forced":
        plan = mobius_plan(spec, cal, G)
    else:
        spec, plan = _auto_plan(spec, cal, G)
    sim = simulate_plan(spec, cal, plan)
    why = why_mobius(spec, cal, plan, sim.step_time, reason)
    plan = plan.model_copy(update={"explanation": [why, *plan.explanation]})
    return plan, sim, why


def _auto_plan(spec: JobSpec, cal: Calibration, G: int) -> tuple[JobSpec, Plan]:
    """Auto's Mobius plan: at the MIP's best S, else (its records too big for the
    runtime's two reserved buffers) at one block per stage, the smallest records."""
    tries = dict.fromkeys([best_stages(spec, cal, G), cal.num_blocks])
    for S in tries:
        try:
            return as_mobius(spec, S), mobius_plan(as_mobius(spec, S), cal, G)
        except PlanError as err:
            last = err
    raise last


#: Auto's cheap Mobius estimate builds the MIP plan only within this share of the
#: ordinary plan's step: the MIP moves a few blocks between stages of the even split,
#: a few per cent of the step (benchmarks/planner/mobius_partition.py).
MARGIN = 0.05


def cheap_stages(G: int, L: int) -> list[int]:
    """The S values the even-split estimate tries: N + 1, 2N and L (within N < S <= L)."""
    return sorted({S for S in (G + 1, 2 * G, L) if G < S <= L})


def even_estimate(spec: JobSpec, cal: Calibration, G: int) -> tuple[float, int]:
    """The least simulated step of the even split of the blocks over ``cheap_stages``,
    and its S (inf, 0: the model has at most G blocks)."""
    m = micro_batch(spec, G)
    cfg = MobiusSimConfig(
        devices=G,
        micro_batches=spec.training.global_batch_size // m,
        tier_Bps=TIER_BPS[spec.hardware.device],
        link_Bps=_link_Bps(cal, m),
    )
    best = (float("inf"), 0)
    for S in cheap_stages(G, cal.num_blocks):
        bounds = even_bounds(cal.num_blocks, S)
        stages = [list(range(a, b)) for a, b in zip(bounds, bounds[1:], strict=False)]
        best = min(best, (simulate_mobius(swap_stages(cal, stages, m), cfg).step_time, S))
    return best


def _link_Bps(cal: Calibration, m: int) -> float:  # noqa: N802
    """The activation link between ranks at micro-batch size m (``sim_config``'s)."""
    probe = max(b.boundary_bytes for b in cal.blocks) * m
    return probe / max(cal.link(same_node=True).time(probe), 1e-12)


def faster_mobius(
    spec: JobSpec, cal: Calibration, G: int, base: Plan
) -> tuple[Plan, MobiusSimResult, str] | None:
    """The Mobius plan of an auto ``spec`` where its simulated step beats ``base``'s
    (the ordinary plan's), with the line that says why; None otherwise."""
    par, pred = spec.parallelism, base.prediction
    if par.schedule != "auto" or par.pipeline_stages != "auto" or pred is None:
        return None
    if spec.planner.objective != "throughput" or spec.budget.capped:
        return None
    hw = spec.hardware
    if hw.one_machine and hw.device == "cpu":
        # CPU ranks sharing one host's cores: the search prices that sharing, this
        # simulator does not, so the comparison would favour Mobius unfairly (seen: a
        # 4-rank plan on 2 cores "beaten" by S = 6 on the same 4 ranks)
        return None
    if G < 1 or cal.num_blocks <= G or list(mobius_violations(as_mobius(spec, G + 1))):
        return None
    step, S = even_estimate(spec, cal, G)
    if step > pred.step_time_s * (1 + MARGIN):
        return None
    try:  # the MIP at the estimate's S only: one solve
        spec = as_mobius(spec, S)
        plan = mobius_plan(spec, cal, G)
    except PlanError:
        return None
    sim = simulate_plan(spec, cal, plan)
    if sim.step_time >= pred.step_time_s:
        return None
    why = why_mobius(spec, cal, plan, sim.step_time, "faster", pred.step_time_s)
    return plan.model_copy(update={"explanation": [why, *plan.explanation]}), sim, why
