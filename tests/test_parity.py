"""Semantics preservation: every P x D layout trains exactly like one process."""

from __future__ import annotations

import pytest
import torch

from jobctl.engine.reference import reference_train

from .jobrun import final_weights, run_job, step_losses, tiny_spec

STEPS = 3


def _spec(P: int, D: int, schedule: str = "1f1b", **extra):
    return tiny_spec(**{
        "training.steps": STEPS,
        "checkpoint.interval": STEPS,
        "parallelism.pipeline_stages": P,
        "parallelism.data_parallel": D,
        "parallelism.schedule": schedule,
        **extra,
    })


@pytest.fixture(scope="module")
def reference():
    return reference_train(_spec(1, 1))


@pytest.mark.multiproc
@pytest.mark.parametrize(("P", "D"), [(2, 1), (1, 2), (2, 2)])
def test_layout_matches_single_process(tmp_path, reference, P, D):
    ref_losses, ref_weights = reference
    run, outcome = run_job(_spec(P, D), tmp_path)
    assert outcome.ok, outcome.message
    losses = step_losses(run.dir)
    assert losses == pytest.approx(ref_losses, abs=1e-5)
    assert losses[-1] < losses[0]
    weights = final_weights(run.dir, STEPS)
    assert set(weights) == set(ref_weights)
    for name, w in ref_weights.items():
        torch.testing.assert_close(weights[name], w, atol=1e-5, rtol=1e-5, msg=name)
