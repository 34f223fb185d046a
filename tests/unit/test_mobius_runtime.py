"""The Mobius runtime (engine/mobius) on a CPU device: equal to one process, the
bytes it moves between the device and its file tier, and its refusals."""

from __future__ import annotations

import os

import pytest
import torch

from jobctl.engine.mobius.planned import planned_config
from jobctl.engine.mobius.planning.cross_mapping import Topology
from jobctl.engine.mobius.planning.partition import MobiusPartition
from jobctl.engine.mobius.runtime import SwapConfig
from jobctl.engine.worker.reference import reference_train

from ..jobrun import tiny_spec
from .mobius_helpers import ADAMW, mobius_runner, one_thread  # noqa: F401 - one_thread: autouse

SGD = {"training.optimizer": "sgd", "training.lr": 0.3, "training.momentum": 0.9}


@pytest.mark.parametrize("prefetch", [True, False])
@pytest.mark.parametrize("opt", [SGD, ADAMW], ids=["sgd", "adamw"])
def test_swapped_stages_train_like_one_process(tmp_path, opt, prefetch):
    spec = tiny_spec(**{"model.layers": 4, "training.steps": 3, **opt})
    ref_losses, ref_weights = reference_train(spec, micro_batch=2)
    runner = mobius_runner(spec, tmp_path, prefetch=prefetch)  # 6 stages of one block each
    losses = [runner.step(t) for t in range(3)]
    runner.flush()
    weights = runner.weights()
    runner.close()
    assert losses == pytest.approx(ref_losses, abs=1e-5)
    # The tied head holds the embedding's weights (one update from summed gradients).
    torch.testing.assert_close(weights["layers.5.weight"], weights["layers.0.wte.weight"])
    for name, w in ref_weights.items():
        # Adam turns the attention key bias' gradient, zero in exact arithmetic, into
        # +-lr of rounding noise (tests/integration/test_parity.py says why).
        atol = 5e-4 if opt is ADAMW and name.endswith("qkv.bias") else 1e-5
        torch.testing.assert_close(weights[name], w, atol=atol, rtol=0, msg=name)


def test_bytes_moved_per_step(tmp_path):
    spec = tiny_spec(**{"model.layers": 2, **ADAMW})
    runner = mobius_runner(spec, tmp_path)  # 4 stages: 1 and 2 offload their inputs
    runner.step(0)
    runner.traffic.reset()
    runner.step(1)  # a step with the previous step's update on each upload
    moved = runner.traffic.moved
    n = [lay.n * 4 for lay in runner.layouts.values()]
    P, M = sum(n), runner.shard.micro_batches
    act = 2 * 32 * 64 * 4  # m x seq_len x hidden, fp32
    assert moved[("params", "up")] == 2 * P - n[-1]  # the last stage stays up
    assert moved[("grads", "down")] == P
    assert moved[("grads", "up")] == P and moved[("params", "down")] == P  # the update
    assert moved[("optim", "up")] == moved[("optim", "down")] == 2 * P  # Adam's slots
    assert moved[("acts", "down")] == moved[("acts", "up")] == 2 * M * act
    tie = 256 * 64 * 4
    assert moved[("ties", "up")] == moved[("ties", "down")] == 2 * tie
    runner.close()


def test_gradients_accumulate_in_the_reserved_buffer(tmp_path):
    spec = tiny_spec(**{"model.layers": 2, **SGD})
    runner = mobius_runner(spec, tmp_path)
    seen = {}

    def hook(p):
        seen[p] = (p.grad.data_ptr(), runner.reserved.of(1).data_ptr())

    p = next(runner.mods[1].parameters())
    p.register_post_accumulate_grad_hook(hook)
    runner.step(0)
    grad_ptr, buf = seen[p]
    lay = runner.layouts[1]
    assert buf <= grad_ptr < buf + lay.nbytes  # in the record, not a fresh tensor
    runner.close()


def test_a_budget_two_records_overflow_is_refused(tmp_path):
    spec = tiny_spec(**{"model.layers": 2, **ADAMW})
    with pytest.raises(ValueError, match="more stages"):
        mobius_runner(spec, tmp_path, stages=((0, 1), (2, 3)), budget_bytes=2**20)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_pinned_tier_on_cuda_trains_like_one_process(tmp_path):
    spec = tiny_spec(**{"model.layers": 4, "training.steps": 3, **SGD})
    ref_losses, ref_weights = reference_train(spec, micro_batch=2)
    runner = mobius_runner(spec, tmp_path, device=torch.device("cuda"))
    assert type(runner.tier).__name__ == "PinnedTier"
    losses = [runner.step(t) for t in range(3)]
    runner.flush()
    weights = runner.weights()
    runner.close()
    assert losses == pytest.approx(ref_losses, abs=1e-4)  # GPU kernels round otherwise
    for name, w in ref_weights.items():
        torch.testing.assert_close(weights[name].cpu(), w, atol=1e-4, rtol=0, msg=name)


def test_placement_gives_every_stage_a_rank_and_every_rank_a_stage(tmp_path):
    stages = ((0,), (1,), (2,), (3,))
    assert SwapConfig(tmp_path, stages, 2, world=2).ranks() == (0, 1, 0, 1)
    assert SwapConfig(tmp_path, stages, 2, world=2, placement=(0, 1, 1, 0)).ranks() == (0, 1, 1, 0)
    for bad in ((0, 0, 0, 0), (0, 1, 2, 0), (0, 1, 0)):
        with pytest.raises(ValueError, match="every rank at least one stage"):
            SwapConfig(tmp_path, stages, 2, world=2, placement=bad).ranks()


def test_a_failed_write_to_the_tier_is_raised(tmp_path):
    spec = tiny_spec(**{"model.layers": 2, **SGD})
    runner = mobius_runner(spec, tmp_path)
    os.close(runner.tier.fds[1])  # stage 1's record can no longer be written
    runner.tier.fds[1] = os.open(tmp_path / "rank-0" / "stage-0001.bin", os.O_RDONLY)
    with pytest.raises(OSError):
        runner.step(0)


def test_planned_config_takes_the_mip_stages_and_the_cross_mapping(tmp_path):
    cuts = [0, 2, 3, 5, 6, 8, 9, 10, 12]
    part = MobiusPartition(
        stages=tuple(range(a, b) for a, b in zip(cuts, cuts[1:], strict=False)),
        devices=(0, 1, 2, 3, 0, 1, 2, 3),
        step_time_s=1.0,
        group=1,
        solve_s=0.1,
        optimal=True,
    )
    cfg = planned_config(part, tmp_path, 2, rank=1)
    assert cfg.stages[:3] == ((0, 1), (2,), (3, 4)) and cfg.world == 4
    assert cfg.ranks() == (0, 1, 2, 3, 0, 1, 2, 3)
    # Figure 4: P1 P2 under one root complex, P3 P4 under the other (devices 0-3).
    fig4 = Topology(root_complexes=[[0, 1], [2, 3]])
    assert planned_config(part, tmp_path, 2, topology=fig4).ranks() == (0, 2, 1, 3, 0, 2, 1, 3)
    with pytest.raises(ValueError, match="topology lists 2 devices"):
        planned_config(part, tmp_path, 2, topology=Topology(root_complexes=[[0, 1]]))
