"""Mobius in the planner: a plan's simulated step (mobius.planning.step), ``auto``
turning to Mobius when no P x D layout fits memory, and the swaps drawn
(views.mobius_gantt, ``jobctl plan``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from jobctl.engine.calibration.cache import calibration_for
from jobctl.engine.cli.app import app
from jobctl.engine.mobius.planning.plan import mobius_plan
from jobctl.engine.mobius.planning.simulator import MobiusSimConfig, SwapStage, simulate_mobius
from jobctl.engine.mobius.planning.step import (
    MARGIN,
    as_mobius,
    even_estimate,
    faster_mobius,
    nothing_fits,
    resolve_mobius,
    simulate_plan,
    swap_stages,
)
from jobctl.engine.planner.resolver import make_plan, plan_and_simulate
from jobctl.engine.views.mobius_gantt import draw_mobius_gantt, gantt_lines

from ..jobrun import QUICKSTART, tiny_spec


def _auto(memory_gb: float, **extra):
    """8 blocks (6 GPT layers at hidden 256) on 2 processes, everything auto."""
    return tiny_spec(
        **{
            "model.layers": 6,
            "model.hidden": 256,
            "hardware.nodes": 1,
            "hardware.processes_per_node": 2,
            "hardware.memory_gb": memory_gb,
            "parallelism.pipeline_stages": "auto",
            "parallelism.data_parallel": "auto",
            "parallelism.schedule": "auto",
            **extra,
        }
    )


def test_auto_turns_to_mobius_only_when_nothing_fits():
    big = _auto(0.03)  # the state is 1.2x what the 2 devices hold
    cal = calibration_for(big, None)
    assert nothing_fits(big, cal, 2)
    plan = make_plan(big, calibration=cal)
    assert plan.schedule == "mobius" and plan.mobius is not None
    assert plan.mobius.S > plan.mobius.N == 2
    assert sorted(b for s in plan.mobius.stages for b in s) == list(range(cal.num_blocks))
    assert plan.explanation[0].startswith("mobius: no P x D fits (state 1.2x N x memory_gb)")
    small = _auto(2.0)
    assert not nothing_fits(small, cal, 2)
    assert resolve_mobius(small, cal, 2) is None
    assert make_plan(small, calibration=cal).schedule != "mobius"
    # what Mobius does not run (stage-aware ratios) keeps auto off it
    assert resolve_mobius(_auto(0.03, **{"parallelism.recompute": "stage_aware"}), cal, 2) is None
    # fp16 runs under Mobius with its loss scale (was refused: auto kept off it)
    fp16 = resolve_mobius(_auto(0.03, **{"training.precision": "fp16"}), cal, 2)
    assert fp16 is not None and fp16[0].schedule == "mobius"


def test_a_plans_step_is_simulated_from_its_calibration():
    spec = _auto(0.03)
    cal = calibration_for(spec, None)
    plan, sim, why = resolve_mobius(spec, cal, 2)
    stages = swap_stages(cal, plan.mobius.stages, plan.micro_batch_size)
    m, last = plan.micro_batch_size, plan.mobius.stages[-1]
    first = plan.mobius.stages[0]
    assert stages[0].backward_s == pytest.approx(
        sum(cal.backward(i, m) + cal.forward(i, m) for i in first)  # recomputed
    )
    assert stages[-1].backward_s == pytest.approx(sum(cal.backward(i, m) for i in last))
    assert stages[0].input_bytes == 0 and stages[1].input_bytes > 0
    said = float(why.split("sim ")[-1].split(" s/step")[0])
    assert sim.step_time == pytest.approx(said, rel=1e-2)
    computes = [e for e in sim.events if e.kind in ("F", "B", "FB")]
    assert len(computes) == plan.micro_batches * (2 * plan.mobius.S - 1)
    for e in computes:  # each stage on the rank the plan maps it to
        assert e.rank == plan.mobius.ranks[e.stage]
    off = simulate_plan(spec, cal, plan, prefetch=False)
    assert off.step_time > sim.step_time
    assert sum(off.busy) == pytest.approx(sum(sim.busy))


def test_the_text_gantt_shows_each_swap_in_80_columns(tmp_path):
    G = 1e9  # 2 stages on 1 rank: up 0-1, F 1-3 (prefetch 1-2), FB 3-7, B 7-9; step 10 s
    cfg = MobiusSimConfig(devices=1, micro_batches=1, tier_Bps=G, update_on_upload=False)
    sim = simulate_mobius([SwapStage(2.0, 2.0, G)] * 2, cfg)
    lines = gantt_lines(sim)
    assert all(len(line) <= 80 for line in lines)
    compute, swaps = lines[0][8:], lines[1][8:]  # 72 cells of 10/72 s, each its main kind
    assert compute == "." * 7 + "F" * 15 + "X" * 28 + "B" * 15 + "." * 7
    assert swaps.startswith("U" * 7 + "P" * 8 + " ")  # up 0-1, stage 1 prefetched 1-2
    assert swaps.endswith("D" * 7)  # stage 0's gradients down 9-10
    assert lines[2].rstrip().endswith("10 s")
    # three stages: stage 1's input goes down after its forward and back for its backward
    three = simulate_mobius([SwapStage(2.0, 2.0, G, input_bytes=0.5 * G)] * 3, cfg)
    assert {"U", "P", "o", "r", "D"} <= set(gantt_lines(three)[1][8:])
    png = draw_mobius_gantt(sim, tmp_path / "step.png")
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_jobctl_plan_says_why_and_draws_the_swaps(tmp_path):
    text = QUICKSTART.read_text()
    for old, new in [
        ("layers: 4 ", "layers: 6 "),
        ("hidden: 64 ", "hidden: 256"),
        ("nodes: 2\n", "nodes: 1\n"),
        ("memory_gb: 2 ", "memory_gb: 0.03"),
        ("pipeline_stages: 2", "pipeline_stages: auto"),
        ("data_parallel: 2", "data_parallel: auto"),
        ("schedule: 1f1b", "schedule: auto"),
    ]:
        assert old in text
        text = text.replace(old, new)
    spec_file = tmp_path / "big.yaml"
    spec_file.write_text(text)
    png = tmp_path / "step.png"
    home = Path("/nonexistent-home")  # nothing measured: analytic costs
    r = CliRunner().invoke(app, ["plan", str(spec_file), "--gantt", str(png), "--home", str(home)])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    why = next(line for line in lines if line.startswith("mobius: no P x D fits"))
    assert "state 1.2x N x memory_gb" in why and "/N=2, sim " in why and len(why) <= 80
    lanes = [line for line in lines if line[:1] == "r" and " cmp " in line]
    assert len(lanes) == 2 and all(len(line) == 80 for line in lanes)
    assert "schedule mobius" in r.output and png.read_bytes()[:4] == b"\x89PNG"


def _one_v100(memory_gb: float, **extra):
    """6 GPT layers (hidden 256, 128 tokens) on one V100, 8 samples a step, all auto:
    at 0.1 GB only m = 1 fits resident (launch-bound micro-batches), while Mobius
    swaps stages over PCIe and runs all 8 samples as one micro-batch."""
    return _auto(
        memory_gb,
        **{
            "hardware.processes_per_node": 1,
            "hardware.device": "cuda",
            "hardware.accelerator": "v100-pcie-16gb",
            "model.seq_len": 128,
            "training.global_batch_size": 8,
            "training.micro_batch_size": "auto",
            **extra,
        },
    )


def test_auto_turns_to_mobius_where_it_is_faster():
    spec = _one_v100(0.1)
    cal = calibration_for(spec, None)
    assert not nothing_fits(spec, cal, 1)  # P = 1 fits: only the faster arm applies
    base = plan_and_simulate(spec, 1, cal)[0]
    assert base.schedule != "mobius" and base.micro_batch_size == 1
    est, S = even_estimate(spec, cal, 1)
    assert est < base.prediction.step_time_s / 2  # even split: 0.023 s vs 0.063 s
    plan = make_plan(spec, 1, cal)
    assert plan.schedule == "mobius" and plan.mobius.N == 1 and plan.mobius.S == S > 1
    sim = simulate_plan(as_mobius(spec, plan.mobius.S), cal, plan).step_time
    assert sim < base.prediction.step_time_s
    why = plan.explanation[0]
    assert why.startswith(f"mobius: faster than P x D's {base.prediction.step_time_s:.3g} s")
    assert len(why) <= 80


def test_auto_keeps_the_search_plan_where_mobius_loses():
    far = _one_v100(0.15)  # m = 4 fits resident: 0.020 s, Mobius's even split 0.023 s
    cal = calibration_for(far, None)
    base = plan_and_simulate(far, 1, cal)[0]
    assert even_estimate(far, cal, 1)[0] > base.prediction.step_time_s * (1 + MARGIN)
    assert faster_mobius(far, cal, 1, base) is None and make_plan(far, 1, cal) == base
    near = tiny_spec(
        **{  # test_planner_answers' quickstart-auto-4, on 4 devices
            "parallelism.pipeline_stages": "auto",
            "parallelism.data_parallel": "auto",
            "parallelism.schedule": "auto",
            "training.micro_batch_size": "auto",
        }
    )
    cal = calibration_for(near, None)
    base = plan_and_simulate(near, 4, cal)[0]
    est, S = even_estimate(near, cal, 4)
    assert base.prediction.step_time_s < est < base.prediction.step_time_s * (1 + MARGIN)
    assert mobius_plan(as_mobius(near, S), cal, 4).mobius.S == S  # the MIP it prices
    assert faster_mobius(near, cal, 4, base) is None  # ... loses to the search's plan
    assert make_plan(near, 4, cal) == base
    # not admissible (fixed stages): no estimate at all, however fast Mobius would be
    fixed = _one_v100(0.1, **{"parallelism.pipeline_stages": 1})
    assert faster_mobius(fixed, cal, 1, plan_and_simulate(fixed, 1, cal)[0]) is None


@pytest.mark.parametrize("S", [2, 3, 4, 8])
def test_the_mip_prices_what_the_simulator_plays(S):
    """The MIP's step (planning.costs with the runtime's update on upload, store back,
    input reloads, gradients down and recompute) is within 10 % of the simulated step
    of its own plan (the paper's terms alone: 0.63-0.82 of it here)."""
    spec = as_mobius(_one_v100(0.1), S)
    cal = calibration_for(spec, None)
    plan = make_plan(spec, 1, cal)
    ratio = plan.mobius.step_time_s / simulate_plan(spec, cal, plan).step_time
    assert 0.97 < ratio < 1.1


def test_jobctl_plan_says_mobius_is_faster(tmp_path):
    """``_one_v100(0.1)`` as a file: the search's plan priced, then Mobius's, and why."""
    text = QUICKSTART.read_text()
    edits = [
        ("layers: 4 ", "layers: 6 "),
        ("hidden: 64 ", "hidden: 256 "),
        ("seq_len: 32", "seq_len: 128"),
        ("global_batch_size: 16", "global_batch_size: 8"),
        ("micro_batch_size: 2 ", "micro_batch_size: auto "),
        ("nodes: 2", "nodes: 1"),
        ("processes_per_node: 2", "processes_per_node: 1"),
        ("device: cpu", "device: cuda\n  accelerator: v100-pcie-16gb"),
        # the V100 is a cluster's, not this machine's: a local cuda run is refused here
        ("backend: local", "backend: slurm"),
        ("memory_gb: 2 ", "memory_gb: 0.1 "),
        ("pipeline_stages: 2", "pipeline_stages: auto"),
        ("data_parallel: 2", "data_parallel: auto"),
        ("schedule: 1f1b", "schedule: auto"),
    ]
    for old, new in edits:
        assert old in text
        text = text.replace(old, new)
    spec_file = tmp_path / "fast.yaml"
    spec_file.write_text(text)
    r = CliRunner().invoke(app, ["plan", str(spec_file), "--home", "/nonexistent-home"])
    assert r.exit_code == 0, r.output
    why = next(line for line in r.output.splitlines() if line.startswith("mobius: faster"))
    assert why.startswith("mobius: faster than P x D's 0.0633 s: S=2/N=1, sim ") and len(why) <= 80
    assert "schedule mobius" in r.output
