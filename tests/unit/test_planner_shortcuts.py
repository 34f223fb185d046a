"""The planner's shortcuts equal the generic computations they replace.

Closed-form activation peaks (gpipe, 1f1b, zb_h1, with and without recompute, and
shifted critical path) equal
``peak_activations`` of the generated lists over many shapes; ``peak_activations``
equals a plain reference count on every generator and on random (even invalid) lists;
the cached schedules are the generators' own; the any-D pass that prices only the
winner's schedule finds the candidates the unfiltered one kept.
"""

from __future__ import annotations

import random

import pytest

from jobctl.engine.core.actions import Action, Op
from jobctl.engine.planner.layout import Layout
from jobctl.engine.planner.search import candidates_for
from jobctl.engine.planner.stage_costs import (
    CLOSED_FORM_PEAKS,
    Tables,
    activation_peaks,
    generated,
    generated_peaks,
)
from jobctl.engine.schedule.checks import ActivationPeak, peak_activations
from jobctl.engine.schedule.generators import generate

from .test_planner import analytic, auto_spec

SCHEDULES = ("gpipe", "1f1b", "varuna", "shifted_critical_path", "zb_h1", "advance_forward")
RECOMPUTE_OPTION = ("gpipe", "1f1b", "zb_h1")


def reference_peaks(actions: list[Action]) -> ActivationPeak:
    """Count held micro-batches action by action (the definition, nothing clever)."""
    rec = {a.micro_batch for a in actions if a.op is Op.RECOMPUTE}
    split = {a.micro_batch for a in actions if a.op is Op.WEIGHT}
    full = stashed = top_full = top_stashed = 0
    for a in actions:
        if a.op is Op.FORWARD and a.micro_batch in rec:
            stashed += 1
        elif a.op is Op.FORWARD:
            full += 1
        elif a.op is Op.RECOMPUTE:
            stashed, full = stashed - 1, full + 1
        elif a.op is Op.WEIGHT or a.micro_batch not in split:
            full -= 1
        top_full, top_stashed = max(top_full, full), max(top_stashed, stashed)
    return ActivationPeak(top_full, top_stashed)


@pytest.mark.parametrize("schedule", CLOSED_FORM_PEAKS)
@pytest.mark.parametrize("recompute", [False, True])
def test_closed_form_peaks_equal_the_generated_schedules(schedule, recompute):
    for P in range(1, 13):
        for M in range(1, 3 * P + 4):
            layout = Layout(P, 1, 1, M, schedule, recompute)
            if schedule == "shifted_critical_path" and recompute:
                continue  # it always recomputes (all stages but the last)
            opts = {"recompute": recompute} if schedule in RECOMPUTE_OPTION else {}
            actions = generate(schedule, P, M, **opts)
            got = activation_peaks(layout, None)
            assert got == [reference_peaks(a) for a in actions], (schedule, P, M)
    if schedule == "zb_h1":  # ZB-H1 without recompute holds 1F1B's first-stage peak
        assert activation_peaks(Layout(8, 1, 1, 20, schedule, False), None)[5].full == 8


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_peak_activations_counts_as_the_reference(schedule):
    for P in range(1, 9):
        for M in range(1, 2 * P + 6):
            for rec in (False, True) if schedule in RECOMPUTE_OPTION else (False,):
                opts = {"recompute": True} if rec else {}
                for stage in generate(schedule, P, M, **opts):
                    assert peak_activations(stage) == reference_peaks(stage), (P, M, rec)


def test_peak_activations_on_random_lists():
    rng = random.Random(7)
    for _ in range(2000):
        stage = [Action(rng.choice(list(Op)), rng.randrange(6)) for _ in range(rng.randrange(30))]
        assert peak_activations(stage) == reference_peaks(stage), stage


def test_cached_schedules_are_the_generators_own():
    for name in SCHEDULES:
        for P, M in [(1, 1), (3, 7), (6, 25)]:
            opts = (("recompute", True),) if name in RECOMPUTE_OPTION else ()
            fresh = generate(name, P, M, **dict(opts))
            assert generated(name, P, M, opts) == fresh
            assert generated(name, P, M, opts) is generated(name, P, M, opts)
            assert generated_peaks(name, P, M, opts) == [reference_peaks(a) for a in fresh]


def test_any_d_pass_prices_only_the_winners_schedule_and_finds_the_same():
    spec = auto_spec(
        **{
            "training.global_batch_size": 24,
            "training.micro_batch_size": 1,
            "parallelism.recompute": "auto",
        }
    )
    tables = Tables(analytic(spec))
    key = lambda c: (c.layout, c.bound, c.stages)  # noqa: E731
    for P in (1, 2, 3):
        for only in [("varuna", False), ("gpipe", True), ("zb_h1", False), ("1f1b", False)]:
            every = candidates_for(spec, tables, P, 12, 1, beat=1e9)
            kept = [c for c in every if (c.layout.schedule, c.layout.recompute) == only]
            got = candidates_for(spec, tables, P, 12, 1, beat=1e9, only=only)
            assert [key(c) for c in got] == [key(c) for c in kept]
            assert got or (P == 1 and only[0] != "1f1b")  # one stage runs 1f1b only
