"""fp16's dynamic loss scale (engine/runtime/loss_scale.py) against torch.amp.GradScaler,
its agreement over ranks, and the spec's fp16 rules."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from jobctl.engine.core.process import free_port
from jobctl.engine.runtime.failure import commit_step
from jobctl.engine.runtime.loss_scale import (
    LossScaleConfig,
    LossScaler,
    agree_found_inf,
    loss_scaler,
)
from jobctl.engine.runtime.step import autocast
from jobctl.spec import load_spec_text
from jobctl.spec.serialization import dump_yaml
from tests.spec_texts import spec_error

from ..jobrun import tiny_spec

# Overflow (True) or clean (False), step by step: backoffs, a growth after 3 clean
# steps in a row, a backoff that resets the count, and a second growth.
FLAGS = [True, False, False, False, True, True, False, False, False, False, False, False]


def _torch_scales(flags: list[bool], interval: int) -> list[float]:
    """GradScaler's scale after each step of ``flags`` (an inf gradient where True)."""
    p = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([p], lr=0.1)
    scaler = torch.amp.GradScaler("cpu", growth_interval=interval)
    scales = []
    for bad in flags:
        opt.zero_grad()
        scaler.scale((p * (float("inf") if bad else 1.0)).sum()).backward()
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
    return scales


def test_scale_moves_exactly_as_grad_scaler() -> None:
    ours = LossScaler(LossScaleConfig(growth_interval=3))
    scales, skipped = [], []
    for bad in FLAGS:
        ours.update(bad)
        scales.append(ours.scale)
        skipped.append(ours.skipped)
    assert scales == _torch_scales(FLAGS, 3)
    # by hand: 2**16 halves at steps 1, 5, 6; grows after steps 4 and 12 (3 clean each)
    assert scales[:5] == [2.0**15, 2.0**15, 2.0**15, 2.0**16, 2.0**15]
    assert scales[-1] == 2.0**16 and scales[-4] == 2.0**15
    assert skipped == FLAGS  # a skipped step is one whose agreed flag was set


def test_defaults_are_grad_scalers() -> None:
    cfg, torch_scaler = LossScaleConfig(), torch.amp.GradScaler("cpu")
    assert cfg.init_scale == torch_scaler.get_scale() == 2.0**16
    assert cfg.growth_interval == torch_scaler.get_growth_interval() == 2000
    assert (cfg.growth_factor, cfg.backoff_factor) == (2.0, 0.5)


def test_unscale_is_exact_and_finds_inf_and_nan() -> None:
    torch.manual_seed(0)
    scaler = LossScaler()
    params = [torch.nn.Parameter(torch.randn(3, 4)), torch.nn.Parameter(torch.randn(5))]
    grads = [torch.randn_like(p) for p in params]
    for p, g in zip(params, grads, strict=True):
        p.grad = g * scaler.scale
    assert scaler.unscale(params) is False
    for p, g in zip(params, grads, strict=True):
        assert torch.equal(p.grad, g)  # dividing by a power of two loses no bit
    for bad in (float("inf"), float("nan")):
        params[1].grad = torch.ones(5)
        params[1].grad[2] = bad
        assert scaler.unscale(params) is True


def test_record_restores_scale_and_growth_count() -> None:
    a = LossScaler(LossScaleConfig(growth_interval=3))
    for bad in (True, False, False):
        a.update(bad)
    b = LossScaler(LossScaleConfig(growth_interval=3))
    b.restore(a.record())
    assert (b.scale, b.growth_tracker) == (2.0**15, 2)
    b.update(False)  # the third clean step grows on the resumed copy as on the first
    assert b.scale == 2.0**16


def test_only_fp16_gets_a_scaler_and_autocast_computes_in_half() -> None:
    lin = torch.nn.Linear(4, 4)
    dtypes = {}
    for precision in ("fp32", "bf16", "fp16"):
        with autocast(precision, torch.device("cpu")):
            dtypes[precision] = lin(torch.randn(2, 4)).dtype
    assert dtypes == {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    fp16 = tiny_spec(**{"training.precision": "fp16", "training.loss_scale.init_scale": 8.0})
    assert loss_scaler(tiny_spec().training) is None
    assert loss_scaler(fp16.training).scale == 8.0


def _rank(rank: int, port: int, out) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    scaler = LossScaler()
    p = torch.nn.Parameter(torch.ones(3))
    p.grad = torch.full((3,), scaler.scale)
    if rank == 1:  # only this rank's gradient overflowed
        p.grad[0] = float("inf")
    found = scaler.unscale([p])
    loss, committed = commit_step(2.5, rank == 1, None, found)
    agreed = agree_found_inf(found)
    scaler.update(agreed)
    out.put((rank, found, committed, agreed, loss, scaler.scale))
    dist.destroy_process_group()


@pytest.mark.multiproc
def test_one_ranks_overflow_skips_every_rank() -> None:
    ctx = mp.get_context("spawn")
    out, port = ctx.Queue(), free_port()
    procs = [ctx.Process(target=_rank, args=(r, port, out)) for r in range(2)]
    for proc in procs:
        proc.start()
    got = sorted(out.get(timeout=60) for _ in procs)
    for proc in procs:
        proc.join(timeout=30)
    # the commit's sum carries the flag and the loss; both ranks back off alike
    assert got == [(0, False, True, True, 2.5, 2.0**15), (1, True, True, True, 2.5, 2.0**15)]


SPEC = """name: half
model: {family: gpt, layers: 4, hidden: 64, heads: 4, seq_len: 32, vocab: 256}
training:
  global_batch_size: 16
  steps: 4
  precision: fp16
hardware: {nodes: 1, processes_per_node: 2}
parallelism:
  pipeline_stages: 2
  data_parallel: 1
"""


def _error(text: str) -> str:
    return spec_error(text, "jobs/half.yaml")


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (
            ("precision: fp16", "precision: bf16\n  loss_scale: {init_scale: 1024}"),
            "jobs/half.yaml:7:3: training.loss_scale: loss_scale is only used by precision "
            "fp16, but precision is 'bf16'\n  fix: remove training.loss_scale",
        ),
    ],
)
def test_fp16_refusals_name_field_line_and_fix(edit, expected) -> None:
    assert load_spec_text(SPEC).training.precision == "fp16"  # the plain case is valid
    # a run's saved spec writes every field (the default rule too) and must load
    assert load_spec_text(dump_yaml(load_spec_text(SPEC.replace("fp16", "fp32"))))
    assert expected in _error(SPEC.replace(*edit))


@pytest.mark.parametrize(
    "edit",
    [
        ("  data_parallel: 1\n", "  data_parallel: 1\n  schedule: mobius\n"),
        (
            "  data_parallel: 1\n",
            "  data_parallel: 1\n  averaging: elastic\n  parallel_pipelines: 2\n",
        ),
    ],
    ids=["mobius", "averaging"],
)
def test_fp16_runs_under_mobius_and_averaging(edit) -> None:
    # both carry the loss scale now (were refused: "no fp16 loss scaling")
    text = SPEC.replace(*edit)
    if "mobius" in text:
        text = text.replace("  pipeline_stages: 2\n", "  pipeline_stages: 4\n")
    else:
        text = text.replace("  steps: 4\n", "  steps: 4\n  micro_batch_size: 2\n")
    assert load_spec_text(text, "jobs/half.yaml").training.precision == "fp16"


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_memory_model_counts_what_an_fp16_step_keeps(optimizer) -> None:
    # fp16 computes in half, but the weights, their gradients and the optimizer's
    # slots stay fp32: the planner's state bytes must be the tensors a real fp16 step
    # (autocast, scaled backward, unscale, update) leaves on a stage, byte for byte.
    from jobctl.engine.calibration.cache import analytic_for
    from jobctl.engine.model.blocks import Stage, model_def
    from jobctl.engine.runtime.optim import build_optimizer

    torch.set_num_threads(1)
    over = {"training.optimizer": optimizer, "training.momentum": 0.9 * (optimizer == "sgd")}
    spec = tiny_spec(**over, **{"training.precision": "fp16"})
    cal = analytic_for(spec)
    stage = Stage(model_def(spec.model, 0, 2), [1, 2])  # two transformer layers
    opt = build_optimizer(list(stage.parameters()), spec.training)
    scaler = loss_scaler(spec.training)
    with autocast("fp16", torch.device("cpu")):
        out = stage(torch.randn(2, spec.model.seq_len, spec.model.hidden))
    scaler.scaled(out.float().square().mean()).backward()
    assert scaler.unscale(list(stage.parameters())) is False
    opt.step()
    kept = sum(p.nbytes + p.grad.nbytes for p in stage.parameters())
    kept += sum(v.nbytes for s in opt.state.values() for v in s.values() if v.dim())
    assert kept == sum(cal.blocks[b].state_bytes for b in (1, 2))
    assert all(p.grad.dtype == torch.float32 for p in stage.parameters())
