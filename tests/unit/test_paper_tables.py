"""Varuna's Table 7 from the analytic source (``benchmarks.paper_tables``).

The device model alone prices the kernels and what jobctl's runtime adds around them,
from specs that state the paper's hardware; nothing is fitted to the table. The same
model against real H100 runs recorded before its gradient path was priced:
``h100_check``.
"""

from __future__ import annotations

import statistics

import pytest

from benchmarks import paper_tables as pt
from benchmarks.h100_check import h100_check


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
    errors = pt.own_m(tmp_path)
    assert len(errors) == len(pt.TABLE7)
    for row in pt.TABLE7:
        plan = pt.predict(tmp_path, row, "auto")[0]
        assert plan.micro_batch_size > 1 and plan.prediction.step_time_s < row[4]


def test_least_squares_solves_two_unknowns_exactly():
    # y = 3 a + 5 b on three rows: the normal equations give (3, 5) back.
    a, b = [2731.0, 4096.0, 8192.0], [4 / 3, 1.0, 0.0]
    y = [3 * p + 5 * q for p, q in zip(a, b, strict=True)]
    assert pt._least_squares(a, b, y) == pytest.approx((3.0, 5.0))


def test_allreduce_check_recovers_a_slower_ring(monkeypatch):
    """Rows built from c = 50 ms per micro-batch, a bubble + optimizer of 1 s and an
    allreduce X twice the model's (Varuna's estimates: X 4 s): the check finds c, both
    X and the ratio 2, and skips the (model, P) measured at one D only."""
    table = [
        ("8.3B", 36, 3, 0, 0.0),
        ("8.3B", 36, 2, 0, 0.0),
        ("8.3B", 36, 1, 0, 0.0),
        ("2.5B", 9, 7, 0, 0.0),
    ]
    tails, rows = [], []
    for name, P, D, _, _ in table:
        M, k = -(-8192 // D), 2 * (D - 1) / D
        tails.append((M, D, k * 1.5, 1.0))  # the model's X: 1.5 s
        # Varuna's estimate: X 4 s; the measurement: X 3 s.
        rows.append((name, P, D, M * 0.05 + 1.0 + k * 4.0, M * 0.05 + 1.0 + k * 3.0))
    monkeypatch.setattr(pt, "TABLE7", rows)
    [(name, P, c, x_real, model, x_sim)] = pt.allreduce_check(tails)
    assert (name, P) == ("8.3B", 36)
    assert c == pytest.approx(0.05) and x_real == pytest.approx(3.0) and model == pytest.approx(1.5)
    assert x_sim == pytest.approx(4.0)


def test_device_model_sits_between_two_public_v100_measurements(tmp_path):
    """Slower than Megatron-LM v1.0's published 1.2B iteration on a 450 W DGX-2H V100,
    faster than Varuna's 250 W PCIe V100s on the P = 18 rows: the share of the peak a
    step sustains follows the card's power budget, which the device facts leave out."""
    assert 1.0 < pt.megatron_check() < 1.35
    row = pt.TABLE7[5]  # 8.3B 18x6: the P = 18 rows are the ones priced fast
    assert pt.predict(tmp_path, row)[1].step_time < row[4]


def test_h100_runs_recorded_before_the_change_are_predicted_closer():
    """The analytic plan against gpu_accuracy's one-GPU runs on one H100 80GB (NOTES.md,
    2026-11-26), never fitted: median |error| 17 % before the autocast gradient path was
    priced (-39, -22, -17, -10, -10 %), 9 % after; never slower than the run, whose eager
    per-action host cost the device model does not price."""
    errors = h100_check()
    assert len(errors) == 5
    assert statistics.median(abs(e) for e in errors) <= 0.10
    assert all(e <= 0.02 for e in errors)
    assert errors[0] == min(errors)  # m = 1: the most actions per sample
