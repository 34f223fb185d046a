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
#
# At S = 2**22 step 1 trains, step 2's fp16 gradients overflow, step 3's overflow at
# 2**21 too and step 4 trains at 2**20 (an fp32 run would never overflow at these
# scales): one run checks the parity, the skips and the scale's moves. Whether a
# gradient overflows near the threshold depends on the micro-batch size (a weight's
# fp16 gradient sums its micro-batch's tokens), so the reference runs the plan's m.
FP16 = {
    **SGD,
    "training.precision": "fp16",
    "training.steps": 4,
    "checkpoint.interval": 2,
    "training.loss_scale.init_scale": 2.0**22,
}


def _skipped(run_dir) -> list[int]:
    return [r["step"] for r in events(run_dir) if r["kind"] == "step" and r.get("skipped")]


def _scale_at(run_dir, step: int) -> dict:
    meta = run_dir / "checkpoints" / f"step-{step:08d}" / "meta.json"
    return json.loads(meta.read_text())["loss_scale"]


def _assert_fp16_parity(run_dir, ref_losses, ref_weights, first: int = 1):
    assert step_losses(run_dir) == pytest.approx(ref_losses[first - 1 :], rel=1e-4)
    weights = final_weights(run_dir, 4)
    for name, w in ref_weights.items():
        torch.testing.assert_close(weights[name], w, atol=5e-4, rtol=0, msg=name)


@pytest.mark.multiproc
def test_fp16_matches_grad_scaler_skips_on_every_rank_and_resumes_its_scale(tmp_path):
    # A 2-stage fp16 run against the one-process torch.amp.GradScaler loop; its step-2
    # checkpoint resumes as a 1 x 2 elastic run, whose step commit carries the flag.
    # With a fresh 2**22 the resumed run would end at another scale (or skip step 4).
    skipped: list[int] = []
    spec = _spec(2, 1, **FP16)
    m = spec.training.micro_batch_size
    ref_losses, ref_weights = reference_train(spec, micro_batch=m, skipped=skipped)
    assert [s + 1 for s in skipped] == [2, 3]
    first, outcome = run_job(spec, tmp_path / "first")
    assert outcome.ok, outcome.message
    _assert_fp16_parity(first.dir, ref_losses, ref_weights)
    assert _skipped(first.dir) == [2, 3]
    for rank in (0, 1):  # each rank's own log says which updates it skipped
        log = (first.dir / "logs" / f"rank-{rank}.log").read_text().splitlines()
        said = [int(line.split()[1]) for line in log if line.endswith("fp16 overflow)")]
        assert said == [2, 3], rank
    assert _scale_at(first.dir, 2) == {"scale": 2.0**21, "growth_tracker": 0}
    assert _scale_at(first.dir, 4) == {"scale": 2.0**20, "growth_tracker": 1}
    other = _spec(1, 2, **FP16, **{"elasticity.enabled": True})
    ckpt = first.dir / "checkpoints" / "step-00000002"
    second, outcome = run_job(other, tmp_path / "second", resume_dir=ckpt)
    assert outcome.ok, outcome.message
    assert _skipped(second.dir) == [3]
    _assert_fp16_parity(second.dir, ref_losses, ref_weights, first=3)
    assert _scale_at(second.dir, 4) == {"scale": 2.0**20, "growth_tracker": 1}
