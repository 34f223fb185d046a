"""The search's speed-ups give the exhaustive search's answers.

``step_floor`` (the bound the search prunes with) never exceeds a simulated step, over
every auto schedule, many shapes and random costs (fixed and jittered sends, a send
limit, opportunistic Varuna); a pipeline simulated once and recosted for another
allreduce is the simulation under that allreduce; and over a grid of specs and pool
sizes the pruned search builds exactly the plan of the exhaustive one, pruning in
some of them.
"""

from __future__ import annotations

import dataclasses
import random

import pytest

from jobctl.engine.planner.layout import Hosting, Layout
from jobctl.engine.planner.resolver import build_plan
from jobctl.engine.planner.search import (
    AUTO_SCHEDULES,
    OPTIONAL_RECOMPUTE,
    SPLIT_BACKWARD,
    _recompute_counts,
    search,
)
from jobctl.engine.planner.simulator.simulation import CostModel, simulate
from jobctl.engine.planner.stage_costs import recompute_counts, step_floor
from jobctl.engine.schedule.generators import generate
from jobctl.spec import load_spec_text

from .test_planner import analytic
from .test_planner_answers import GPT


def _costs(rng: random.Random, P: int, **options) -> CostModel:
    f = [rng.uniform(0.2, 1.5) for _ in range(P)]
    return CostModel(
        f=f,
        b=[x * rng.uniform(1.5, 2.5) for x in f],
        r=[x * rng.uniform(0.8, 1.2) for x in f],
        act=[rng.uniform(0, 2) for _ in range(P - 1)],
        grad=[rng.uniform(0, 2) for _ in range(P - 1)],
        ar=[rng.uniform(0, 20) for _ in range(P)],
        opt=[rng.uniform(0, 3) for _ in range(P)],
        jitter=rng.choice([0.0, 0.0, 0.5]),
        max_inflight_sends=rng.choice([None, 1]),
        **options,
    )


def test_step_floor_never_exceeds_the_simulation():
    rng, tight = random.Random(5), 0
    for _ in range(400):
        P, name = rng.randint(1, 9), rng.choice(AUTO_SCHEDULES)
        M = rng.randint(1, 4 * P + 3)
        rec = name in OPTIONAL_RECOMPUTE and rng.random() < 0.5
        layout = Layout(P, 1, 1, M, name, rec)
        stages = generate(name, P, M, **({"recompute": True} if rec else {}))
        counts = _recompute_counts(layout)
        assert counts == recompute_counts(stages), (name, P, M, rec)
        costs = _costs(rng, P, opportunistic=name == "varuna")
        floor = step_floor(costs, counts, M, split=name in SPLIT_BACKWARD)
        step = simulate(stages, costs, seed=rng.randrange(99)).step_time
        assert floor <= step * (1 + 1e-12), (name, P, M, rec, floor, step)
        tight += floor > 0.9 * step
    assert tight > 100  # a floor, not just a small number


def test_a_recosted_pipeline_is_the_simulation_with_that_allreduce():
    rng = random.Random(2)
    for name in ("varuna", "1f1b", "zb_h1"):
        P, M = 5, 13
        stages = generate(name, P, M)
        costs = _costs(rng, P, opportunistic=name == "varuna")
        other = dataclasses.replace(costs, ar=[rng.uniform(0, 9) for _ in range(P)], opt=[1.0] * P)
        got, want = simulate(stages, costs).recosted(other), simulate(stages, other)
        assert got.step_time == want.step_time and got.stage_end == want.stage_end
        assert got.events == want.events


# (layers, hidden, batch, memory GB, G): small to mid models on pools where many P and D fit
GRID = [
    (24, 1024, 256, 24, 64),
    (24, 2048, 512, 24, 128),
    (24, 2048, 500, 40, 96),
    (32, 1024, 384, 16, 256),
    (12, 768, 96, 8, 48),
]


@pytest.mark.parametrize("layers,hidden,batch,memory,G", GRID)
def test_pruned_search_plans_as_the_exhaustive_one(layers, hidden, batch, memory, G):
    spec = load_spec_text(GPT.format(layers=layers, hidden=hidden, batch=batch, memory=memory))
    cal = analytic(spec)
    full = search(spec, G, cal, "analytic", exhaustive=True)
    fast = search(spec, G, cal, "analytic")
    assert not full.pruned
    assert build_plan(spec, cal, fast, G) == build_plan(spec, cal, full, G)
    # Every layout the exhaustive search simulated was simulated or pruned here.
    label = lambda c: c.layout.label()  # noqa: E731
    assert {*map(label, full.ranked)} <= {*map(label, fast.ranked), *map(label, fast.pruned)}
    assert {*map(label, fast.ranked)} <= {*map(label, full.ranked)}


def test_the_grid_prunes():
    """The grid above prunes (else its equality shows nothing): its last two specs."""
    pruned = 0
    for layers, hidden, batch, memory, G in GRID[-2:]:
        spec = load_spec_text(GPT.format(layers=layers, hidden=hidden, batch=batch, memory=memory))
        pruned += len(search(spec, G, analytic(spec), "analytic").pruned)
    assert pruned > 0


def test_hosting_nodes_is_the_placed_ranks_node_count():
    for P, D, per_node in [(1, 1, 4), (3, 5, 4), (7, 3, 2), (4, 8, 8), (5, 1, 1)]:
        for placement in ("stage_major", "pipeline_major"):
            for one_host in (False, True):
                hosting = Hosting(P, D, per_node, placement, one_host, False)
                assert hosting.nodes == max(r.node for r in hosting.ranks) + 1
