"""Varuna's Table 7 from the analytic source (the specs: ``tests/papers.py``).

The device model alone prices the kernels and what jobctl's runtime adds around them,
from specs that state the paper's hardware; nothing is fitted to the table. The same
model against real H100 runs recorded before its gradient path was priced (``H100_RUNS``,
recorded in benchmarks/results/2026-11-26-gpu_accuracy-h100-sxm-80gb.json).
"""

from __future__ import annotations

import statistics
from pathlib import Path

from jobctl.engine.calibration.cache import analytic_for
from jobctl.engine.planner.resolver import make_plan
from jobctl.spec import load_spec

from .. import papers as pt

QUICKSTART = Path(__file__).resolve().parents[2] / "jobs" / "quickstart.yaml"
# gpu_accuracy's one-GPU runs on one H100 80GB, 2026-11-26 (its 4 x 2048 GPT, sequence
# 1024, bf16, P = D = 1): (m, global batch, recompute, ms per step in the first round).
H100_RUNS = [(1, 8, False, 64.0), (2, 16, False, 79.2), (4, 16, False, 65.9)]
H100_RUNS += [(8, 32, False, 111.4), (4, 16, True, 79.7)]
H100 = {
    "model.hidden": 2048,
    "model.layers": 4,
    "model.heads": 16,
    "model.seq_len": 1024,
    "model.vocab": 8192,
    "training.precision": "bf16",
    "training.steps": 12,
    "checkpoint.interval": 100000,
    "hardware.device": "cuda",
    "hardware.nodes": 1,
    "hardware.processes_per_node": 1,
    "hardware.memory_gb": 72.0,
    "hardware.accelerator": "h100-sxm-80gb",
    "parallelism.pipeline_stages": 1,
    "parallelism.data_parallel": 1,
    "parallelism.schedule": "1f1b",
}


def h100_errors() -> list[float]:
    """Analytic step / recorded step - 1 of each H100 run."""
    errors = []
    for m, B, recompute, real_ms in H100_RUNS:
        over = {**H100, "training.micro_batch_size": m, "training.global_batch_size": B}
        if recompute:
            over["parallelism.recompute"] = "all"
        spec = load_spec(QUICKSTART, overrides=over)
        step = make_plan(spec, calibration=analytic_for(spec)).prediction.step_time_s
        errors.append(1e3 * step / real_ms - 1)
    return errors


def test_table7_from_the_device_model_alone(tmp_path):
    """The target rows at m = 1, nothing fitted. 12.0 % / 20.6 % since the V100's
    cuBLAS share is taken of the card Markidis et al. measured (was 18.8 / 26.5);
    10.8 % / 17.7 % since gradients are priced fp32, as the runtime sums them, every
    row fast; 5.2 % / 12.1 % since autocast's gradient path is priced (analytic_device),
    rows on both sides: the P = 36 ones slow, the P = 18 ones fast."""
    device = [pt.predict(tmp_path, row)[1].step_time / row[4] - 1 for row in pt.TABLE7]
    assert statistics.median(abs(e) for e in device) <= 0.053
    assert max(abs(e) for e in device) <= 0.122  # the target is 0.10: see the benchmark
    assert min(device) < -0.03 and max(device) > 0.10


def test_the_planners_own_m_runs_faster_than_the_m_1_rows(tmp_path):
    """At its own micro-batch size the planner predicts every row faster than Varuna's
    m = 1 measurement (a larger m sustains more of the device), each with its m."""
    for row in pt.TABLE7:
        plan = pt.predict(tmp_path, row, "auto")[0]
        assert plan.micro_batch_size > 1 and plan.prediction.step_time_s < row[4]


def test_device_model_sits_between_two_public_v100_measurements(tmp_path):
    """Slower than Megatron-LM v1.0's published 1.2B iteration on a 450 W DGX-2H V100,
    faster than Varuna's 250 W PCIe V100s on the P = 18 rows: the share of the peak a
    step sustains follows the card's power budget, which the device facts leave out."""
    assert 1.0 < pt.megatron_step() / pt.MEGATRON_V1[-1] < 1.35
    row = pt.TABLE7[5]  # 8.3B 18x6: the P = 18 rows are the ones priced fast
    assert pt.predict(tmp_path, row)[1].step_time < row[4]


def test_h100_runs_recorded_before_the_change_are_predicted_closer():
    """The analytic plan against gpu_accuracy's one-GPU runs on one H100 80GB (2026-11-26,
    ``H100_RUNS``), never fitted: median |error| 17 % before the autocast gradient path was
    priced (-39, -22, -17, -10, -10 %), 9 % after; never slower than the run, whose eager
    per-action host cost the device model does not price."""
    errors = h100_errors()
    assert len(errors) == 5
    assert statistics.median(abs(e) for e in errors) <= 0.10
    assert all(e <= 0.02 for e in errors)
    assert errors[0] == min(errors)  # m = 1: the most actions per sample
