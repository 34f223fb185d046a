"""AvgPipe's elastic averaging, distributed: 2 worker processes (P = 2) training N = 2
parallel models train exactly like the plain-torch reference of the rule
(``tests/unit/elastic_reference.py``): the step losses, the reference model and every
parallel model in the final checkpoint, to 1e-5 in fp32."""

from __future__ import annotations

import pytest
import torch

from jobctl.engine.data.dataset import make_data
from jobctl.engine.model.blocks import Stage, model_def
from jobctl.engine.supervise.figures import avg_distance, tail_records
from jobctl.engine.supervise.report_data import collect

from ..jobrun import events, final_weights, run_job, step_losses, tiny_spec
from ..unit.elastic_reference import elastic_train

N, STEPS = 2, 4


def _spec(**extra):
    return tiny_spec(
        **{
            "training.steps": STEPS,
            "checkpoint.interval": STEPS,
            "training.optimizer": "sgd",
            "training.lr": 0.3,
            "training.momentum": 0.9,
            "hardware.nodes": 1,
            "hardware.processes_per_node": 2,
            "parallelism.pipeline_stages": 2,
            "parallelism.data_parallel": 1,
            "parallelism.schedule": "advance_forward",
            "parallelism.averaging": "elastic",
            "parallelism.parallel_pipelines": N,
            **extra,
        }
    )


def _reference(spec, skipped=None, prune=None, prunable=lambda name: True):
    """The rule in one process on the whole model: model i's share of batch t is
    samples [tB + iB/N, tB + (i+1)B/N), in micro-batches of m, mean loss; under fp16
    the forward autocast to float16 and one GradScaler at the spec's rule."""
    B, m = spec.training.global_batch_size, spec.training.micro_batch_size
    mdef = model_def(spec.model, spec.training.seed, m)
    data = make_data(spec)
    fp16 = spec.training.precision == "fp16"

    def loss_of(model, t, i):
        total = 0.0
        for first in range(t * B + i * B // N, t * B + (i + 1) * B // N, m):
            x, y = data.batch(first, m)
            batch = model.batch(x, y, first)
            with torch.autocast("cpu", dtype=torch.float16, enabled=fp16):
                total = total + model.loss(model(x, batch), y, batch) * (m * N / B)
        return total

    def make_opt(params):
        t = spec.training
        return torch.optim.SGD(params, lr=t.lr, momentum=t.momentum)

    model = Stage(mdef, range(mdef.num_blocks))
    ls = spec.training.loss_scale
    scaler = None
    if fp16:
        scaler = torch.amp.GradScaler(
            "cpu", init_scale=ls.init_scale, backoff_factor=ls.backoff_factor
        )
    steps = spec.training.steps
    return elastic_train(
        model, make_opt, loss_of, N, 1 / N, steps, scaler, skipped, prune, prunable
    )


def _parallel_weights(ckpt) -> list[dict[str, torch.Tensor]]:
    out: list[dict] = [{} for _ in range(N)]
    for f in sorted(ckpt.glob("block-*.pt")):
        for i, part in enumerate(torch.load(f, weights_only=True)["parallel"]):
            out[i].update(part["params"])
    return out


def _pruned_reference(spec, globs: list[str]):
    """The plain-torch rule with the spec's pruning schedule on the weights ``globs``
    select."""
    import fnmatch

    from jobctl.engine.pruning.schedule import target_at

    return _reference(
        spec,
        prune=lambda t: target_at(spec.pruning, t),
        prunable=lambda name: any(fnmatch.fnmatchcase(name, g) for g in globs),
    )


def _follows_the_rule(run, steps: int, losses, reference, models) -> dict:
    """The run's losses, its checkpoint's reference (the run's model) and each
    parallel model equal the plain-torch rule's to 1e-5; the final weights."""
    assert step_losses(run.dir) == pytest.approx(losses, abs=1e-5)
    got, want = final_weights(run.dir, steps), dict(reference.named_parameters())
    assert set(got) == set(want)
    for name, w in got.items():
        torch.testing.assert_close(w, want[name].detach(), atol=1e-5, rtol=0, msg=name)
    ckpt = run.dir / "checkpoints" / f"step-{steps:08d}"
    for model, saved in zip(models, _parallel_weights(ckpt), strict=True):
        assert saved.keys() == got.keys()
        for name, w in dict(model.named_parameters()).items():
            torch.testing.assert_close(saved[name], w.detach(), atol=1e-5, rtol=0, msg=name)
    return got


@pytest.mark.multiproc
def test_elastic_averaging_matches_the_reference_rule(tmp_path):
    torch.set_num_threads(1)
    spec = _spec()
    losses, reference, models = _reference(spec)
    run, outcome = run_job(spec, tmp_path)
    assert outcome.ok, outcome.message
    assert step_losses(run.dir) == pytest.approx(losses, abs=1e-5)
    assert losses[-1] < losses[0]
    got = final_weights(run.dir, STEPS)  # the checkpoint's model is the reference
    want = dict(reference.named_parameters())
    assert set(got) == set(want)
    for name, w in got.items():
        torch.testing.assert_close(w, want[name].detach(), atol=1e-5, rtol=0, msg=name)
    ckpt = run.dir / "checkpoints" / f"step-{STEPS:08d}"
    for model, saved in zip(models, _parallel_weights(ckpt), strict=True):
        mine = dict(model.named_parameters())
        assert saved.keys() == got.keys()
        for name, w in saved.items():
            torch.testing.assert_close(w, mine[name].detach(), atol=1e-5, rtol=0, msg=name)
    step, dists = avg_distance(tail_records(run.dir))  # both stages' heartbeats, summed
    assert step == STEPS and len(dists) == N and min(dists) > 0
    assert collect(run.dir, [], 2).distances[-1] == (step, dists)  # the report's chart
    first = sorted(got)[0]  # the parallel models are not the reference
    assert not torch.allclose(_parallel_weights(ckpt)[0][first], got[first])


@pytest.mark.multiproc
def test_elastic_averaging_in_fp16_skips_each_overflowed_model_as_grad_scaler_does(tmp_path):
    # One loss scale for the N models, as one GradScaler serves N optimizers: at
    # S = 2**22 the first steps' fp16 gradients overflow and S backs off; a model that
    # overflowed skips its step (zero local update, still diluted). Tolerances as
    # test_parity's fp16 (fp16 rounds each layout's sums in its own order).
    torch.set_num_threads(1)
    spec = _spec(**{"training.precision": "fp16", "training.loss_scale.init_scale": 2.0**22})
    skipped: list[tuple[int, int]] = []
    losses, reference, _ = _reference(spec, skipped)
    assert skipped, "the scale must overflow somewhere for this test to mean anything"
    assert len(skipped) < N * STEPS, "and train somewhere too"
    run, outcome = run_job(spec, tmp_path)
    assert outcome.ok, outcome.message
    assert step_losses(run.dir) == pytest.approx(losses, rel=1e-4)
    recs = [r for r in events(run.dir) if r["kind"] == "step"]
    assert [r["step"] for r in recs if r.get("skipped")] == sorted({t + 1 for t, _ in skipped})
    got = final_weights(run.dir, STEPS)
    for name, w in dict(reference.named_parameters()).items():
        torch.testing.assert_close(got[name], w.detach(), atol=5e-4, rtol=0, msg=name)


@pytest.mark.multiproc
def test_elastic_averaging_with_pruning_matches_the_reference_rule(tmp_path):
    # The selection reads the reference once it has applied every earlier batch; the
    # masks hold on both parallel models and the reference (pruned weights and
    # optimizer state zeroed, gradients masked before each model's own step).

    from jobctl.engine.checkpoint.blocks import load_masks

    torch.set_num_threads(1)
    pruning = {"pruning.enabled": True, "pruning.start_step": 1, "pruning.end_step": 3}
    pruning |= {"pruning.frequency": 1, "pruning.initial_sparsity": 0.3}
    spec = _spec(**pruning, **{"pruning.final_sparsity": 0.8, "checkpoint.interval": 2})
    globs = spec.pruning.prunable
    losses, reference, models = _pruned_reference(spec, globs)
    run, outcome = run_job(spec, tmp_path)
    assert outcome.ok, outcome.message
    got = _follows_the_rule(run, STEPS, losses, reference, models)
    ckpt = run.dir / "checkpoints" / f"step-{STEPS:08d}"
    masks = load_masks(ckpt, list(got), [])
    assert masks and all(int((got[n] == 0).sum()) == int((~m).sum()) for n, m in masks.items())
    pruned = sum(int((~m).sum()) for m in masks.values())
    assert pruned / sum(m.numel() for m in masks.values()) == pytest.approx(0.8, abs=1e-3)
    resumed, outcome = run_job(
        spec, tmp_path / "resumed", resume_dir=run.dir / "checkpoints" / "step-00000002"
    )
    assert outcome.ok, outcome.message
    assert step_losses(resumed.dir) == pytest.approx(losses[2:], abs=1e-5)


@pytest.mark.multiproc
def test_elastic_averaging_at_T2_matches_the_reference_rule(tmp_path):
    # AvgPipe's N = 2 models and the reference each split over a T = 2 group (T = 2 x
    # P = 2 on 4 ranks, the builtin GPT's Megatron plan): the rule on shards is the rule
    # on whole tensors, so losses, the checkpoint's whole reference and parallel
    # models equal the plain-torch rule; each model's distance from the reference
    # counts the split weights over the T group once, as the T = 1 run's does.
    torch.set_num_threads(1)
    spec = _spec(**{"parallelism.tensor_parallel": 2, "hardware.processes_per_node": 4})
    losses, reference, models = _reference(spec)
    run, outcome = run_job(spec, tmp_path / "t2")
    assert outcome.ok, outcome.message
    assert (run.plan.T, run.plan.P) == (2, 2)
    _follows_the_rule(run, STEPS, losses, reference, models)
    plain, outcome = run_job(_spec(), tmp_path / "t1")
    assert outcome.ok, outcome.message
    at_t2, at_t1 = avg_distance(tail_records(run.dir)), avg_distance(tail_records(plain.dir))
    assert at_t2[0] == at_t1[0] == STEPS
    assert at_t2[1] == pytest.approx(at_t1[1], rel=1e-4)


@pytest.mark.multiproc
@pytest.mark.parametrize("pack", [False, True])
def test_elastic_averaging_rebalances_its_models_and_reference_with_the_stage(tmp_path, pack):
    # Pruning only stage 0's blocks leaves it light; the partition balancer moves a
    # block to it, and with it that block of both parallel models and of the
    # reference (with their optimizer state and masks): still the plain-torch rule.
    # Packed onto one device, rank 1 hands all its blocks of every copy over and leaves.

    torch.set_num_threads(1)
    globs = [f"layers.{b}.{m}.weight" for b in (1, 2) for m in ("attn.*", "mlp.*")]
    pruning = {"pruning.enabled": True, "pruning.prunable": globs, "pruning.start_step": 1}
    pruning |= {"pruning.end_step": 3, "pruning.frequency": 1, "pruning.final_sparsity": 0.95}
    rebalance = {"rebalancing.enabled": True, "rebalancing.tolerance": 0.0}
    rebalance |= {"rebalancing.balancer": "partition", "rebalancing.by": "params"}
    rebalance |= {"rebalancing.pack": pack, "rebalancing.target_devices": 1 if pack else None}
    spec = _spec(**pruning, **rebalance, **{"training.steps": 6})
    losses, reference, models = _pruned_reference(spec, globs)
    run, outcome = run_job(spec, tmp_path)
    assert outcome.ok, outcome.message
    moved = [r for r in events(run.dir) if r["kind"] == ("packed" if pack else "rebalanced")]
    assert moved and moved[0]["stages_after"] != moved[0]["stages_before"], moved
    assert len(moved[0]["stages_after"]) == (1 if pack else 2)
    _follows_the_rule(run, 6, losses, reference, models)


@pytest.mark.multiproc
def test_elastic_averaging_under_zb_v_matches_the_reference_rule(tmp_path):
    # ZB-V on 2 ranks (4 stages in V shape): each rank's two stages interleave the N = 2
    # pipelines' micro-batches on their owner's copies, and model i's update runs once
    # both of the rank's stages finished pipeline i (inside the list, D = 1); the
    # eval pass reads the reference's two stages.
    from jobctl.engine.data.dataset import make_eval_data

    from ..jobrun import plain_eval
    from .test_data_sources import write_tokens

    torch.set_num_threads(1)
    tokens = write_tokens(tmp_path / "tokens.bin")
    data = {"data.source": "tokens", "data.path": str(tokens), "data.eval": 0.1}
    spec = _spec(**{"parallelism.schedule": "zb_v", "training.eval_every": STEPS}, **data)
    losses, reference, models = _reference(spec)
    run, outcome = run_job(spec, tmp_path / "home")
    assert outcome.ok, outcome.message
    assert run.plan.placement == [[0, 3], [1, 2]]
    got = _follows_the_rule(run, STEPS, losses, reference, models)
    (ev,) = [r for r in events(run.dir) if r["kind"] == "eval"]
    m = run.plan.micro_batch_size
    assert ev["eval_loss"] == pytest.approx(
        plain_eval(spec, got, make_eval_data(spec), m), abs=1e-5
    )
