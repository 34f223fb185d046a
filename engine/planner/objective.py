"""The planner's objective (``planner.objective``) and budget, as a selection over the
layouts the search simulated.

``search`` ranks the layouts of one pool size by step time. Here every ranked candidate
is priced to finish the whole job (``cost.forecast``), and one is chosen:

* throughput: the fastest within ``budget`` (the search's own order);
* cost: the cheapest within the budget (and ``planner.deadline`` when given);
* deadline: the cheapest that finishes before ``planner.deadline``, within the budget.

The search stops at layouts that cannot beat the fastest, and a smaller pool is often
cheaper (less waiting per device-hour), so when an objective or a budget asks about
money the search also runs on halves of the pool (G/2, G/4, ... 1 device) and the
candidates of all runs are the choice. Nothing fits: ``BudgetError``, naming the
cheapest plan that would (from a search with P and D left to the planner).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from jobctl.engine.calibration.record import Calibration
from jobctl.engine.planner.cost import (
    CostConfig,
    Forecast,
    Measured,
    cost_config,
    forecast,
    forecasts,
    rank_checkpoint_bytes,
    stage_state_bytes,
)
from jobctl.engine.planner.search import Candidate, PlanError, Search, rank_key, search
from jobctl.spec import JobSpec

NOT_MEASURED = Measured()


class BudgetError(PlanError):
    """No layout meets the budget or the deadline; the message names what would."""


@dataclass
class Option:
    """One simulated layout, priced to finish the job under the pricing the run pays."""

    cand: Candidate
    forecast: Forecast
    why_not: str = ""  # over the budget, or late; "" when it fits


@dataclass
class Choice:
    """The chosen layout among every priced option, and the search it is first in."""

    found: Search
    chosen: Option
    options: list[Option] = field(default_factory=list)
    line: str = ""  # the selection, for the plan's explanation
    pricings: list[Forecast] = field(default_factory=list)  # the chosen under every pricing


def candidate_costs(
    spec: JobSpec, cal: Calibration, cand: Candidate, measured: Measured
) -> CostConfig:
    """The ``CostConfig`` of ``cand``: its largest stage's state, and what one of its
    ranks copies into a checkpoint (to match this machine's measured checkpoints)."""
    ranks = rank_checkpoint_bytes(cal, cand.stages, cand.layout.D)
    return cost_config(spec, stage_state_bytes(cal, cand.stages), measured, ranks)


def nodes_of(cand: Candidate) -> int:
    return cand.hosting.nodes


def price(spec: JobSpec, cal: Calibration, cand: Candidate, measured: Measured) -> Option:
    """``cand`` priced to finish ``spec`` (and whether the budget and deadline allow it)."""
    cfg = candidate_costs(spec, cal, cand, measured)
    fc = forecast(cand.step, cand.layout.devices, nodes_of(cand), cfg, cfg.pricing())
    return Option(cand, fc, why_not(spec, fc))


def why_not(spec: JobSpec, fc: Forecast) -> str:
    """Why a forecast breaks the budget or misses the deadline; "" when it does neither."""
    b, deadline = spec.budget, spec.planner.deadline
    if not fc.finishes:
        return "never finishes: preemptions undo progress faster than it is made"
    if b.max_total_usd is not None and fc.usd > b.max_total_usd:
        return f"${fc.usd:.4g} to finish > budget.max_total_usd ${b.max_total_usd:g}"
    if b.max_hourly_usd is not None and fc.hourly_usd > b.max_hourly_usd:
        return f"${fc.hourly_usd:.4g}/h > budget.max_hourly_usd ${b.max_hourly_usd:g}"
    if deadline is not None and fc.wall_s > deadline:
        return f"{span(fc.wall_s)} > planner.deadline {span(deadline)}"
    return ""


def pool_sizes(G: int) -> list[int]:
    """G, G/2, G/4, ..., 1: the pool sizes searched when money matters."""
    sizes = [G]
    while sizes[-1] > 1:
        sizes.append(sizes[-1] // 2)
    return sizes


def searches(
    spec: JobSpec, cal: Calibration, G: int, source: str, wide: bool = False
) -> tuple[Search, list]:
    """The search on G devices, and the ranked candidates of every searched pool size
    (only G's unless money matters or ``wide``)."""
    found = search(spec, G, cal, source)
    if not wide and spec.planner.objective == "throughput" and not spec.budget.capped:
        return found, list(found.ranked)
    seen = {c.layout.label(): c for c in found.ranked}
    for g in pool_sizes(G)[1:]:
        try:
            more = search(spec, g, cal, source)
        except PlanError:  # an explicit P x D above g, or nothing fits g devices
            break
        for c in more.ranked:
            seen.setdefault(c.layout.label(), c)
    return found, sorted(seen.values(), key=rank_key)


def plan_options(
    spec: JobSpec, cal: Calibration, G: int, measured: Measured = NOT_MEASURED
) -> list[Option]:
    """Every layout of every searched pool size, priced to finish the job."""
    ranked = searches(spec, cal, G, cal.source, wide=True)[1]
    return [price(spec, cal, c, measured) for c in ranked]


def choose(
    spec: JobSpec, cal: Calibration, G: int, source: str, measured: Measured = NOT_MEASURED
) -> Choice:
    """The layout ``planner.objective`` picks within the budget (module doc)."""
    found, ranked = searches(spec, cal, G, source)
    options = [price(spec, cal, c, measured) for c in ranked]
    fits = [o for o in options if not o.why_not]
    objective = spec.planner.objective
    if not fits:
        raise BudgetError(refusal(spec, cal, G, source, measured, options))
    if objective == "throughput":
        chosen = fits[0]  # the search's order: step time, then fewer devices
    else:
        chosen = min(fits, key=lambda o: (round(o.forecast.usd, 9), o.forecast.wall_s))
    rest = [o.cand for o in options if o is not chosen]
    line = (
        f"objective {objective}: {chosen.cand.layout.label()} on {chosen.forecast.devices} "
        f"device(s), {span(chosen.forecast.wall_s)}, ${chosen.forecast.usd:.4g} to "
        f"finish ({len(fits)} of {len(options)} priced layouts fit)"
    )
    plain = objective == "throughput" and not spec.budget.capped  # the search's own pick
    explain = found.explanation if plain else [*found.explanation, line]
    picked = Search([chosen.cand, *rest], found.rejected, explain)
    return Choice(picked, chosen, options, line, side_by_side(spec, cal, chosen.cand, measured))


def side_by_side(
    spec: JobSpec, cal: Calibration, cand: Candidate, measured: Measured
) -> list[Forecast]:
    """``cand`` finishing the job under every pricing the spec gives (on-demand, spot)."""
    cfg = candidate_costs(spec, cal, cand, measured)
    return forecasts(cand.step, cand.layout.devices, nodes_of(cand), cfg)


def refusal(
    spec: JobSpec,
    cal: Calibration,
    G: int,
    source: str,
    measured: Measured,
    options: list[Option],
) -> str:
    """Why nothing fits, and the cheapest plan that would: with P and D left to the planner
    when the spec pins them."""
    best = options[0]
    text = f"{best.cand.layout.label()} on {best.forecast.devices} device(s): {best.why_not}"
    fit = cheapest_fit(spec, cal, G, source, measured)
    if fit is None:
        cheapest = min(options, key=lambda o: o.forecast.usd)
        return f"{text}; no plan fits: the cheapest, {describe(cheapest)}, " + cheapest.why_not
    lay = fit.cand.layout
    return (
        f"{text}; the cheapest plan that fits: {describe(fit)} (set "
        f"parallelism.pipeline_stages: {lay.P} and data_parallel: {lay.D})"
    )


def cheapest_fit(
    spec: JobSpec, cal: Calibration, G: int, source: str, measured: Measured
) -> Option | None:
    """The cheapest option within the budget and deadline with P and D left to the search."""
    par = spec.parallelism.model_copy(update={"pipeline_stages": "auto", "data_parallel": "auto"})
    free = spec.model_copy(update={"parallelism": par})
    fits = []
    for g in pool_sizes(G):
        try:
            ranked = search(free, g, cal, source).ranked
        except PlanError:
            continue
        fits += [o for o in (price(spec, cal, c, measured) for c in ranked) if not o.why_not]
    return min(fits, key=lambda o: o.forecast.usd) if fits else None


def describe(o: Option) -> str:
    """One line: the layout, its devices, wall time and dollars to finish."""
    fc = o.forecast
    return f"{o.cand.layout.label()} on {fc.devices} device(s), {span(fc.wall_s)}, ${fc.usd:.4g}"


def span(seconds: float) -> str:
    """Seconds as s, min or h (3 significant digits)."""
    if seconds < 120:
        return f"{seconds:.3g} s"
    return f"{seconds / 60:.3g} min" if seconds < 7200 else f"{seconds / 3600:.3g} h"


def frontier(options: list[Option]) -> list[Option]:
    """The time-vs-dollars frontier: each option no other is both faster and cheaper than."""
    out: list[Option] = []
    for o in sorted(options, key=lambda o: (o.forecast.wall_s, o.forecast.usd)):
        if o.forecast.finishes and (not out or o.forecast.usd < out[-1].forecast.usd):
            out.append(o)
    return out
