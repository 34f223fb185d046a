"""A Mobius rank's checkpoint (engine/mobius/checkpoint): the block format a 1f1b rank
writes, and a resume that continues exactly where the run left off."""

from __future__ import annotations

import torch

from jobctl.engine.checkpoint.blocks import (
    load_blocks,
    snapshot_blocks,
    write_meta,
    write_snapshot,
)
from jobctl.engine.mobius import checkpoint as mobius_checkpoint
from jobctl.engine.mobius.runtime import MobiusRunner
from jobctl.engine.model.blocks import Stage, model_def
from jobctl.engine.runtime.optim import build_optimizer

from ..jobrun import tiny_spec
from .mobius_helpers import ADAMW, mobius_runner, one_thread  # noqa: F401 - one_thread: autouse

STAGES = ((0, 1), (2,), (3, 4), (5,))  # the embedding and the tied head apart


def _save(runner: MobiusRunner, spec, folder, step: int):
    folder.mkdir()
    write_snapshot(mobius_checkpoint.snapshot(runner, _ties(spec)), folder)
    write_meta(folder, {"step": step, "global_batch_size": spec.training.global_batch_size})
    return folder


def _ties(spec):
    return model_def(spec.model, spec.training.seed, 2).ties


def test_resume_continues_the_run_exactly(tmp_path):
    spec = tiny_spec(**{"model.layers": 4, **ADAMW})
    straight = mobius_runner(spec, tmp_path / "a", STAGES)
    losses = [straight.step(t) for t in range(4)]
    straight.close()
    first = mobius_runner(spec, tmp_path / "b", STAGES)
    assert [first.step(t) for t in range(2)] == losses[:2]
    ckpt = _save(first, spec, tmp_path / "ckpt", 2)
    first.close()
    second = mobius_runner(spec, tmp_path / "c", STAGES)
    mobius_checkpoint.load(second, _ties(spec), ckpt)
    assert [second.step(t) for t in range(2, 4)] == losses[2:]
    second.close()


def test_blocks_are_a_whole_model_checkpoint(tmp_path):
    # The same files, names and optimizer state a one-stage rank writes, loadable into
    # any other cut (here: the whole model in one Stage), weights as the runner holds.
    spec = tiny_spec(**{"model.layers": 4, **ADAMW})
    runner = mobius_runner(spec, tmp_path / "a", STAGES)
    for t in range(2):
        runner.step(t)
    snap = mobius_checkpoint.snapshot(runner, _ties(spec))
    weights = runner.weights()
    mdef = model_def(spec.model, spec.training.seed, 2)
    whole = Stage(mdef, range(mdef.num_blocks))
    opt = build_optimizer(list(whole.parameters()), spec.training)
    ckpt = _save(runner, spec, tmp_path / "ckpt", 2)
    runner.close()
    load_blocks(whole, opt, ckpt, mdef.ties)
    again = snapshot_blocks(whole, opt, list(range(mdef.num_blocks)), mdef.ties)
    assert sorted(snap) == sorted(again) == list(range(mdef.num_blocks))
    for b, part in snap.items():
        assert part["params"].keys() == again[b]["params"].keys()
        for name, state in part["optim"].items():
            assert set(state) == {"step", "exp_avg", "exp_avg_sq"}
            assert float(state["step"]) == 2.0
            torch.testing.assert_close(again[b]["optim"][name], state, rtol=0, atol=0)
    for name, p in whole.named_parameters():
        torch.testing.assert_close(p.detach(), weights[name], rtol=0, atol=0, msg=name)
