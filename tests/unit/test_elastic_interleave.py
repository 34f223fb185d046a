"""AvgPipe's N parallel pipelines interleaved in one action list
(``engine/averaging/interleave.py``): every micro-batch of every pipeline runs forward
and backward exactly once, on its owner's model, and each model's gradient equals the
one of its pipeline run alone (the sequential order)."""

from __future__ import annotations

import copy
from collections import Counter

import pytest
import torch

from jobctl.engine.averaging.interleave import InterleavedExecutor, InterleavedShare
from jobctl.engine.averaging.models import PipelineShare
from jobctl.engine.calibration.cache import analytic_for
from jobctl.engine.core.actions import Op, weight_follows
from jobctl.engine.data.dataset import Sharding, make_data
from jobctl.engine.model.blocks import Stage, model_def
from jobctl.engine.planner.resolver import make_plan
from jobctl.engine.planner.search import PlanError
from jobctl.engine.planner.sizing import GB
from jobctl.engine.runtime.executor import Channels, StepExecutor
from jobctl.engine.runtime.topology import Topology
from jobctl.engine.schedule.generators import generate

from ..jobrun import tiny_spec

B, m = 16, 2


def test_owners_are_contiguous_shares_of_the_batch() -> None:
    share = InterleavedShare(B, 1, m, N=4)  # 8 micro-batches, 2 per pipeline
    assert [share.pipeline(0, j) for j in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert share.loss_scale == pytest.approx(m * 4 / B)  # mean over a share of B / 4
    two = InterleavedShare(B, 2, m, N=2)  # replica 0: micro 0-3, replica 1: micro 4-7
    assert [two.pipeline(d, j) for d in (0, 1) for j in range(4)] == [0] * 4 + [1] * 4


@pytest.mark.parametrize(("N", "D"), [(2, 1), (4, 1), (2, 2), (2, 3), (4, 2)])
def test_each_pipeline_trains_exactly_its_share_of_samples(N: int, D: int) -> None:
    batch = N * m * 3  # three micro-batches per share: uneven over D = 2
    inter = InterleavedShare(batch, D, m, N=N)
    got: dict[int, list[int]] = {i: [] for i in range(N)}
    for d in range(D):
        for j in range(inter.count(d)):
            got[inter.pipeline(d, j)].append(inter.first_sample(5, d, j))
    for i in range(N):  # the sequential run's samples of pipeline i at step 5
        alone = PipelineShare.of(Sharding(batch, D, m), i, N)
        want = [alone.first_sample(5, d, j) for d in range(D) for j in range(alone.count(d))]
        assert sorted(got[i]) == sorted(want)


@pytest.mark.parametrize("schedule", ["1f1b", "advance_forward", "gpipe", "zb_h1"])
def test_every_micro_batch_of_every_pipeline_runs_once_on_every_stage(schedule: str) -> None:
    N, P = 4, 4
    share = InterleavedShare(B, 1, m, N=N)
    per = B // N // m
    for stage in generate(schedule, P, share.micro_batches):
        done = Counter((a.op, share.pipeline(0, a.micro_batch), a.micro_batch % per) for a in stage)
        ops = {a.op for a in stage}
        want = Counter({(op, i, k): 1 for op in ops for i in range(N) for k in range(per)})
        assert done == want
        assert {Op.FORWARD, Op.BACKWARD} <= ops


def _executor(stage: Stage, shard, data) -> StepExecutor:
    topo = Topology(0, 0, 0, 1, 1, None, None, [0], None, [], None)
    chans = Channels(None, None, None, None)
    return StepExecutor(stage, topo, data, shard, chans, torch.device("cpu"))


def _grads(stage: Stage) -> dict[str, torch.Tensor]:
    return {k: p.grad.clone() for k, p in stage.named_parameters() if p.grad is not None}


@pytest.mark.parametrize(
    ("schedule", "options", "k"),
    [
        ("advance_forward", {}, 0),
        ("1f1b", {"recompute": True}, 0),
        ("zb_h1", {}, 0),  # every W right after its B: whole backwards (fused)
        ("zb_h1", {}, -1),  # the last stage's list: W(i) after B(i+1), split
        ("gpipe", {}, 0),
    ],
)
def test_each_models_gradient_equals_its_pipeline_run_alone(schedule, options, k) -> None:
    """A 4-stage schedule's first-stage list (the most interleaved order; or stage
    ``k``'s) run by one process holding the whole model: forwards of later pipelines
    run before the backwards of earlier ones."""
    torch.set_num_threads(1)
    N = 2
    spec = tiny_spec(**{"training.global_batch_size": B, "training.micro_batch_size": m})
    mdef = model_def(spec.model, spec.training.seed, m)
    data = make_data(spec)
    first = Stage(mdef, range(mdef.num_blocks))
    models = [copy.deepcopy(first) for _ in range(N)]
    share = InterleavedShare(B, 1, m, N=N)
    actions = generate(schedule, 4, share.micro_batches, **options)[k]
    ex = InterleavedExecutor(_executor(models[0], share, data), models, share)
    stats = ex.run(actions, 3)
    fused = weight_follows(actions)  # no stage before this one waits for B's output
    assert stats.order == [
        a for a in actions if a.op is not Op.WEIGHT or a.micro_batch not in fused
    ]
    assert (len(fused) == share.micro_batches) == (schedule == "zb_h1" and k == 0)
    losses = 0.0
    for i, model in enumerate(models):
        alone = copy.deepcopy(first)
        own = PipelineShare.of(Sharding(B, 1, m), i, N)
        want = _executor(alone, own, data).run(generate("1f1b", 1, own.micro_batches)[0], 3)
        got, ref = _grads(model), _grads(alone)
        assert got.keys() == ref.keys() and len(got) > 4
        for k, g in got.items():
            torch.testing.assert_close(g, ref[k], atol=1e-6, rtol=0, msg=k)
        losses += float(want.loss_sum)
    assert float(stats.loss_sum) == pytest.approx(losses, abs=1e-6) and losses > 0
    # the last stage's sum stays a float64 tensor until the commit reads it once: a
    # float() per micro-batch drains a GPU's queue before every backward
    assert isinstance(stats.loss_sum, torch.Tensor) and stats.loss_sum.dtype == torch.float64
    assert not torch.allclose(_grads(models[0])[k], _grads(models[1])[k])


def _plan(n: int, **extra):
    over = {
        "training.global_batch_size": B,
        "training.micro_batch_size": m,
        "parallelism.pipeline_stages": 2,
        "parallelism.data_parallel": 1,
        "parallelism.schedule": "advance_forward",
        "hardware.nodes": 1,
        "hardware.processes_per_node": 2,
        **extra,
    }
    if n > 1:
        over |= {"parallelism.averaging": "elastic", "parallelism.parallel_pipelines": n}
    spec = tiny_spec(**over)
    cal = analytic_for(spec)
    return make_plan(spec, calibration=cal), cal


def test_plan_memory_holds_every_parallel_model_the_reference_and_the_updates() -> None:
    sync, cal = _plan(1)
    for n in (2, 4):
        plan, _ = _plan(n)
        assert plan.micro_batches == sync.micro_batches == B // m  # one list, N x M
        for s, (one, got) in enumerate(
            zip(
                sync.prediction.memory_per_stage_gb,
                plan.prediction.memory_per_stage_gb,
                strict=True,
            )
        ):
            blocks = plan.stages[s].blocks
            state = sum(cal.blocks[b].state_bytes for b in blocks)
            weights = sum(cal.blocks[b].param_bytes for b in blocks)
            assert (got - one) * GB == pytest.approx((n - 1) * state + (n + 1) * weights)


def test_plan_refuses_parallel_models_that_do_not_fit() -> None:
    sync, _ = _plan(1)
    plan, _ = _plan(4)
    cap = (max(sync.prediction.memory_per_stage_gb) + max(plan.prediction.memory_per_stage_gb)) / 2
    assert _plan(1, **{"hardware.memory_gb": cap})[0].P == 2
    with pytest.raises(PlanError, match="N=4 parallel models.*lower parallelism.parallel_pip"):
        _plan(4, **{"hardware.memory_gb": cap})


def test_plan_predicts_an_optimizer_step_per_parallel_model() -> None:
    """The step's action list is the synchronous one (same bubble); every stage adds
    N - 1 optimizer steps of its blocks."""
    sync, cal = _plan(1)
    opt = [sum(cal.blocks[b].optimizer.median for b in st.blocks) for st in sync.stages]
    for n in (2, 4):
        plan, _ = _plan(n)
        assert plan.prediction.bubble_ratio == pytest.approx(sync.prediction.bubble_ratio)
        more = plan.prediction.step_time_s - sync.prediction.step_time_s
        assert (n - 1) * min(opt) - 1e-12 <= more <= (n - 1) * max(opt) + 1e-12
        assert more > 0


@pytest.mark.parametrize(
    ("schedule", "options"),
    [("advance_forward", {}), ("1f1b", {"recompute": True}), ("zb_h1", {}), ("gpipe", {})],
)
def test_on_done_fires_once_per_pipeline_in_order_with_its_gradient_complete(
    schedule, options
) -> None:
    """AvgPipe sec. 4.2: model i's update may run in the drain of the later pipelines:
    when ``on_done(i)`` fires, model i's gradient is final (no later action of the
    step touches it), and the pipelines finish in the order 0 .. N-1."""
    torch.set_num_threads(1)
    N = 3
    spec = tiny_spec(**{"training.global_batch_size": 24, "training.micro_batch_size": m})
    mdef = model_def(spec.model, spec.training.seed, m)
    first = Stage(mdef, range(mdef.num_blocks))
    models = [copy.deepcopy(first) for _ in range(N)]
    share = InterleavedShare(24, 1, m, N=N)
    actions = generate(schedule, 4, share.micro_batches, **options)[0]
    ex = InterleavedExecutor(_executor(models[0], share, make_data(spec)), models, share)
    seen: list[tuple[int, dict]] = []
    ex.on_done = lambda i: seen.append((i, _grads(models[i])))
    ex.run(actions, 0)
    assert [i for i, _ in seen] == list(range(N))
    for i, grads in seen:
        final = _grads(models[i])
        assert grads.keys() == final.keys() and len(final) > 4
        for k, g in grads.items():
            assert torch.equal(g, final[k]), (i, k)
