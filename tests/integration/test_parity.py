"""Semantics preservation: every P x D layout and schedule trains exactly like one process."""

from __future__ import annotations

import json

import pytest
import torch

from jobctl.engine.worker.reference import reference_train

from ..jobrun import events, final_weights, run_job, step_losses, tiny_spec

STEPS = 3
SGD = {"training.optimizer": "sgd", "training.lr": 0.3, "training.momentum": 0.9}


def _spec(P: int, D: int, schedule: str = "1f1b", **extra):
    return tiny_spec(
        **{
            "training.steps": STEPS,
            "checkpoint.interval": STEPS,
            "parallelism.pipeline_stages": P,
            "parallelism.data_parallel": D,
            "parallelism.schedule": schedule,
            **extra,
        }
    )


def _run_and_compare(tmp_path, spec, atol: float, falls: bool = True):
    """Run ``spec`` and check its losses and final weights equal one process's (and,
    with ``falls``, that its loss went down)."""
    ref_losses, ref_weights = reference_train(spec)
    run, outcome = run_job(spec, tmp_path)
    assert outcome.ok, outcome.message
    losses = step_losses(run.dir)
    assert losses == pytest.approx(ref_losses, abs=1e-5)
    assert losses[-1] < losses[0] or not falls
    weights = final_weights(run.dir, spec.training.steps)
    assert set(weights) == set(ref_weights)
    for name, w in ref_weights.items():
        torch.testing.assert_close(weights[name], w, atol=atol, rtol=0, msg=name)
    return run


@pytest.mark.multiproc
@pytest.mark.parametrize(("P", "D"), [(2, 1), (1, 2), (2, 2)])
def test_layout_matches_single_process(tmp_path, P, D):
    _run_and_compare(tmp_path, _spec(P, D, **SGD), atol=1e-5)


@pytest.mark.multiproc
def test_any_d_matches_single_process(tmp_path):
    # 16 samples in micro-batches of 2 over D=3 replicas on 3 processes: replicas run
    # 3, 3 and 2 micro-batches (Sharding.count), each weighted by its samples.
    spec = _spec(1, 3, **SGD, **{"hardware.nodes": 1, "hardware.processes_per_node": 3})
    assert spec.training.global_batch_size % 3
    run = _run_and_compare(tmp_path, spec, atol=1e-5)
    assert (run.plan.D, run.plan.micro_batches) == (3, 3)


@pytest.mark.multiproc
def test_adamw_layout_matches_single_process(tmp_path):
    # Losses agree to 1e-5. Weights get a looser bound: Adam divides by sqrt(v), so a
    # gradient that is zero in exact arithmetic (the attention key bias: softmax ignores
    # a shift of all keys) becomes +-lr of rounding noise whose sign depends on the
    # order of summation, which necessarily differs across replicas.
    _run_and_compare(tmp_path, _spec(2, 2), atol=5e-4)


@pytest.mark.multiproc
@pytest.mark.parametrize(
    ("schedule", "extra"),
    [
        ("gpipe", {"parallelism.recompute": "all"}),
        ("varuna", {}),
        ("shifted_critical_path", {}),
    ],
)
def test_schedules_with_recompute_match_single_process(tmp_path, schedule, extra):
    spec = _spec(3, 1, schedule, **SGD, **extra)
    run = _run_and_compare(tmp_path, spec, atol=1e-5)
    plan = run.plan
    assert plan.schedule == schedule
    assert any(st.recompute for st in plan.stages)


@pytest.mark.multiproc
def test_recompute_restores_rng_bit_identically(tmp_path):
    # With dropout, a recomputed forward must draw the same masks as the original one.
    losses = {}
    for dropout, recompute in ((0.2, "none"), (0.2, "all"), (0.0, "none")):
        overrides = {"model.dropout": dropout, "parallelism.recompute": recompute}
        spec = _spec(2, 1, "gpipe", **overrides)
        run, outcome = run_job(spec, tmp_path / f"{dropout}-{recompute}")
        assert outcome.ok, outcome.message
        losses[dropout, recompute] = step_losses(run.dir)
    assert losses[0.2, "all"] == losses[0.2, "none"]  # bit-identical, not approximately
    # ... and dropout really drew masks: without it the same run trains differently
    # (were dropout a no-op, the two runs above would agree trivially).
    assert all(a != b for a, b in zip(losses[0.2, "none"], losses[0.0, "none"], strict=True))


# fp16 rounds activations to 11 significant bits (unit roundoff 2**-11 = 4.9e-4), and
# each layout sums micro-batches and replicas in its own order, so fp16 runs are not
# bit-equal across layouts. A step's loss is a mean over 512 tokens, which averages
# that rounding down: seen 1e-6 relative against the one-process GradScaler loop,
# checked at 1e-4. SGD moves a weight by lr x its gradient, so a weight differs by
# about lr x one fp16 rounding of the gradient: seen 3e-5, checked at 5e-4. A rank
# that stepped on a skipped step would move by lr x inf instead.
FP16 = {**SGD, "training.precision": "fp16", "training.steps": 4, "checkpoint.interval": 2}
#: a scale so large that fp16 gradients overflow at it, then at 2**23 and 2**22: the
#: first three steps are skipped (an fp32 run would never overflow at 2**24)
OVERFLOW = {**FP16, "training.loss_scale.init_scale": 2.0**24}


def _fp16_reference(spec):
    skipped: list[int] = []
    losses, weights = reference_train(spec, skipped=skipped)
    return losses, weights, [s + 1 for s in skipped]  # as the step records count


def _skipped(run_dir) -> list[int]:
    return [r["step"] for r in events(run_dir) if r["kind"] == "step" and r.get("skipped")]


def _assert_fp16_parity(run_dir, ref_losses, ref_weights, first: int = 1):
    assert step_losses(run_dir) == pytest.approx(ref_losses[first - 1 :], rel=1e-4)
    weights = final_weights(run_dir, 4)
    for name, w in ref_weights.items():
        torch.testing.assert_close(weights[name], w, atol=5e-4, rtol=0, msg=name)


@pytest.mark.multiproc
def test_fp16_pipeline_matches_grad_scaler_reference(tmp_path):
    spec = _spec(2, 1, **FP16)
    ref_losses, ref_weights, ref_skipped = _fp16_reference(spec)
    run, outcome = run_job(spec, tmp_path)
    assert outcome.ok, outcome.message
    _assert_fp16_parity(run.dir, ref_losses, ref_weights)
    assert _skipped(run.dir) == ref_skipped == []


@pytest.mark.multiproc
def test_fp16_overflow_skips_on_every_rank_and_resumes_with_its_scale(tmp_path):
    # 2 stages find the overflow and agree on it; the step-2 checkpoint's scale (2**22
    # after two backoffs) comes back in a 1 x 2 elastic run, whose commit carries the
    # flag: with 2**24 again it would skip steps 3 and 4, the reference skips 3 only.
    ref_losses, ref_weights, ref_skipped = _fp16_reference(_spec(2, 1, **OVERFLOW))
    assert ref_skipped == [1, 2, 3]
    first, outcome = run_job(_spec(2, 1, **OVERFLOW), tmp_path / "first")
    assert outcome.ok, outcome.message
    assert _skipped(first.dir) == ref_skipped
    for rank in (0, 1):  # each rank's own log says which updates it skipped
        log = (first.dir / "logs" / f"rank-{rank}.log").read_text().splitlines()
        said = [int(line.split()[1]) for line in log if line.endswith("fp16 overflow)")]
        assert said == ref_skipped, rank
    _assert_fp16_parity(first.dir, ref_losses, ref_weights)
    ckpt = first.dir / "checkpoints" / "step-00000002"
    scale = json.loads((ckpt / "meta.json").read_text())["loss_scale"]
    assert scale == {"scale": 2.0**22, "growth_tracker": 0}
    other = _spec(1, 2, **OVERFLOW, **{"elasticity.enabled": True})
    second, outcome = run_job(other, tmp_path / "second", resume_dir=ckpt)
    assert outcome.ok, outcome.message
    assert _skipped(second.dir) == [3]
    _assert_fp16_parity(second.dir, ref_losses, ref_weights, first=3)
