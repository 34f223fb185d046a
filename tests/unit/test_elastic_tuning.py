"""AvgPipe's (M, N) tuning (sec. 5.2): the equations on hand-computed numbers, the
pick under a memory cap, the profile's assembly, the spec's auto fields and refusals,
and the plan table's width."""

from __future__ import annotations

import dataclasses

import pytest

from jobctl.engine.averaging.planning.tuning import (
    Profile,
    StageProfile,
    bubbles,
    communication,
    computation,
    footprint,
    measured,
    predict,
    seconds_at,
    tune,
    utilisation_scale,
)
from jobctl.engine.averaging.tuning import profile_from, resolve
from jobctl.engine.views.averaging_tuning import tuning_lines
from jobctl.spec import load_spec_text
from jobctl.spec.averaging import elastic_settings
from tests.spec_texts import spec_error

SPEC = """\
name: avg
model:
  layers: 2
training:
  global_batch_size: 16
  micro_batch_size: auto
  steps: 5
hardware:
  nodes: 1
  processes_per_node: 2
parallelism:
  pipeline_stages: 2
  data_parallel: 1
  averaging: elastic
  parallel_pipelines: auto
  micro_batches: auto
"""


def _stage(T_gpu=1.0, T=0.1, phi=((1.0, 0.5),), T_upd=0.2, F_mod=100.0, F_dat=40.0):
    return StageProfile(T_gpu, T, phi, T_upd, F_mod, 30.0, F_dat, 2)


def test_eq2_computation_scales_volume_and_charges_overuse() -> None:
    phi = ((0.5, 0.4), (0.5, 0.8))
    # r = 2: 0.5 * 0 + 0.5 * (1.6 - 1) = 0.3 over 100 %; (1 + 0.3) / 2
    assert computation(1.0, phi, 2.0) == pytest.approx(0.65)
    assert computation(1.0, phi, 0.5) == pytest.approx(2.0)  # never over: T / r
    # interleaved pipelines: micro-batches of B / (D N M); (m, n) = (8, 1) -> (2, 2)
    assert utilisation_scale(8, 1, 2, 2) == 2.0


def test_stage_seconds_at_a_size_timed_else_from_the_least_squares_line() -> None:
    timed = ((2, 0.06), (8, 0.15))
    assert seconds_at(timed, 8) == 0.15  # timed: as measured
    # the line through both: b = 0.09 / 6 = 0.015 per sample, a = 0.03
    assert seconds_at(timed, 4) == pytest.approx(0.09)
    assert seconds_at(timed, 16) == pytest.approx(0.27)
    # three points off a line: mean size 13/3, mean t 0.1; deviations (-10/3, -1/3,
    # 11/3) and (-0.07, 0, 0.07): b = 0.49 / (222 / 9), t(2) = 0.1 - b 7/3 = 0.05365
    three = ((1, 0.03), (4, 0.1), (8, 0.17))
    assert seconds_at(three, 2) == pytest.approx(0.05365, abs=1e-5)
    assert seconds_at(((4, 0.1),), 2) == pytest.approx(0.05)  # one timing: per sample


def test_measured_computation_keeps_the_pipeline_overhead_per_micro_batch() -> None:
    timed = ((2, 0.06), (4, 0.09), (8, 0.15))
    # profiled K = 4 micro-batches of 2 in 0.4 s: c = 0.1, of which 0.06 the stage alone
    assert measured(0.4, 4, 1, 2, 8, timed) == pytest.approx(0.1 + 0.15 - 0.06)
    assert measured(0.4, 4, 2, 2, 4, timed) == pytest.approx(2 * (0.1 + 0.09 - 0.06))
    assert measured(0.4, 4, 4, 2, 2, timed) == pytest.approx(0.4)  # the profile itself
    # a pipeline micro-batch never costs less than the stage alone at its size
    assert measured(0.08, 4, 1, 2, 8, timed) == pytest.approx(0.15)


def test_predict_takes_computation_from_the_timed_sizes_not_eq2() -> None:
    timed = ((2, 0.06), (8, 0.15))
    s = StageProfile(0.4, 0.0, ((0.4, 0.5),), 0.0, 100.0, 30.0, 40.0, 2, timed)
    p = Profile(m=4, n=1, B=8, stages=(s,))
    row = predict(p, 1, 1, [1])  # m = 8 samples: measured, c* = 0.1 + 0.09
    assert row.T_gpu == pytest.approx(0.19)
    # eq. 2 would say the volume at twice the utilisation: (0.4 + 0.4 * 1.0) / 4
    assert computation(0.4, s.phi, 4.0) == pytest.approx(0.2)
    untimed = Profile(m=4, n=1, B=8, stages=(dataclasses.replace(s, timed=()),))
    assert predict(untimed, 1, 1, [1]).T_gpu == pytest.approx(0.2)


def test_eq3_4_communication_hidden_behind_computation() -> None:
    assert communication(0.4, 0.3, 4) == pytest.approx(0.1 + 0.75 * 0.1)
    assert communication(0.4, 1.0, 4) == pytest.approx(0.1)  # all hidden but the first


def test_eq5_7_bubbles_wait_for_every_stage_above_and_below() -> None:
    got = bubbles([0.1, 0.2, 0.3], [1.0, 2.0, 3.0], 4)
    # up: 0, 1.1/4, 1.1/4 + 2.2/4; down: 2.2/4 + 3.3/4, 3.3/4, 0
    assert got == pytest.approx([1.375, 1.1, 0.825])


def test_eq8_memory_models_scale_with_n_data_with_micro_batch_and_peak() -> None:
    s = _stage()
    assert footprint(s, 1, 2, 0.5, 3) == pytest.approx(200 + 30 + 0.5 * 1.5 * 40)


def test_predict_is_the_slowest_stage_of_eq1() -> None:
    p = Profile(m=4, n=1, B=8, stages=(_stage(), _stage(T_gpu=2.0, phi=((2.0, 0.5),))))
    row = predict(p, 2, 1, [2, 1])  # r = 2: phi 1.0, nothing over
    gpu = [0.5, 1.0]
    com = [0.1 / 2 + 0.5 * max(0.1 - g, 0) for g in gpu]
    bub = [(0.1 + 1.0) / 2, (0.1 + 0.5) / 2]
    steps = [g + c + b + 0.2 for g, c, b in zip(gpu, com, bub, strict=True)]
    assert row.step_s == pytest.approx(max(steps))
    assert row.T_gpu == pytest.approx(1.0) and row.size == 4
    assert row.samples_per_s == pytest.approx(8 / max(steps))
    assert row.memory == pytest.approx(100 + 30 + 2 * 1 * 40)  # stage 0's peak of 2


def test_one_machine_messages_cost_per_message_a_network_per_byte() -> None:
    s = _stage(T=0.4, phi=((1.0, 1.0),))  # never over at r <= 1
    net = Profile(m=4, n=1, B=8, stages=(s, s))
    shm = Profile(m=4, n=1, B=8, stages=(s, s), per_message=True)
    # (M, N) = (2, 4): K* = 8 messages each way, twice the profile's 4; r = 4/8
    gpu = 2.0
    for p, T in ((net, 0.4), (shm, 0.8)):
        row = predict(p, 2, 4, [2, 1])
        com = T / 8 + 7 / 8 * max(T - gpu, 0.0)
        assert row.T_com == pytest.approx(com)
        assert row.T_bub == pytest.approx((T + gpu) / 8)


def test_pick_is_the_fastest_that_fits_the_cap() -> None:
    p = Profile(m=8, n=1, B=8, stages=(_stage(phi=((1.0, 0.1),)), _stage(phi=((1.0, 0.1),))))
    settings = elastic_settings(8, 4, None, None, None)
    free = tune(p, settings, 1e9, lambda K: [min(K, 2), 1])
    assert free.pick is min(free.rows, key=lambda r: r.step_s)
    assert free.reason.startswith("fastest predicted step")
    cap = free.pick.memory - 1  # the fastest no longer fits
    capped = tune(p, settings, cap, lambda K: [min(K, 2), 1])
    fits = [r for r in capped.rows if r.memory <= cap]
    assert capped.pick is min(fits, key=lambda r: r.step_s)
    assert (capped.pick.M, capped.pick.N) != (free.pick.M, free.pick.N)
    assert f"M={free.pick.M} N={free.pick.N} would be" in capped.reason
    with pytest.raises(ValueError, match="raise hardware.memory_gb"):
        tune(p, settings, 10.0, lambda K: [1, 1])


def test_settings_hold_whole_samples_under_the_fixed_values() -> None:
    assert len(elastic_settings(16, 8, None, None, None)) == 14
    assert elastic_settings(16, 8, None, None, 2) == [(8, 1), (4, 2), (2, 4), (1, 8)]
    assert elastic_settings(16, 8, 2, None, None) == [(2, 1), (2, 2), (2, 4), (2, 8)]
    assert elastic_settings(12, 1, None, 5, None) == []


def test_profile_counts_each_message_once_and_phi_against_the_peak_rate() -> None:
    rank = {
        "actions": [[("F", 0.02), ("B", 0.04)], [("F", 0.02), ("B", 0.04)]],
        "sent": [[0.01, 0.0], [0.01, 0.0]],
        "update": [0.1, 0.3],
        "v_F": 0.005,
        "v_B": 0.01,
        "F_mod": 10,
        "F_ref": 5,
        "dat_per_sample": 3.0,
        "peak": 2,
        "size": 2,
        "timed": [[1, 0.004], [2, 0.006]],
    }
    last = {**rank, "sent": [[0.0, 0.03], [0.0, 0.05]], "timed": []}
    p = profile_from({"m": 4, "n": 1, "B": 8, "ranks": [rank, last], "per_message": True})
    first = p.stages[0]
    sent = [s.T for s in p.stages]  # its own sends and its neighbour's to it
    assert sent == pytest.approx([0.01 + 0.04, 0.04 + 0.01])
    assert first.T_gpu == pytest.approx(0.06) and first.T_upd == pytest.approx(0.2)
    # pytest >= 9.2's approx refuses nested sequences: compare the (size, phi) pairs flat
    flat = [x for pair in first.phi[:2] for x in pair]
    assert flat == pytest.approx([0.01, 0.5, 0.02, 0.5])  # 2 * 0.005 / 0.02
    assert first.F_dat == 3.0 * 2 * 2
    assert first.timed == ((1, 0.004), (2, 0.006))  # the stage alone at each size
    assert p.stages[1].timed == ()  # none timed: eq. 2


def test_spec_accepts_auto_and_a_fixed_m_resolves_without_profiling() -> None:
    spec = load_spec_text(SPEC)
    assert spec.parallelism.parallel_pipelines == "auto"
    fixed = load_spec_text(
        SPEC.replace("parallel_pipelines: auto", "parallel_pipelines: 2").replace(
            "micro_batches: auto", "micro_batches: 4"
        )
    )
    out, tuning = resolve(fixed)
    assert tuning is None and out.training.micro_batch_size == 2  # 16 / (1 * 2 * 4)
    assert out.parallelism.parallel_pipelines == 2 and out.parallelism.micro_batches is None


def _error(text: str) -> str:
    return spec_error(text, "jobs/avg.yaml")


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (
            ("micro_batch_size: auto", "micro_batch_size: 2"),
            "jobs/avg.yaml:16:3: parallelism.micro_batches: micro_batches (auto) and "
            "training.micro_batch_size (2) both set",
        ),
        (
            ("  averaging: elastic\n  parallel_pipelines: auto\n", ""),
            "jobs/avg.yaml:14:3: parallelism.micro_batches: micro_batches (AvgPipe's M) is "
            "only used by averaging 'elastic'",
        ),
        (
            ("parallel_pipelines: auto", "parallel_pipelines: 3"),
            "jobs/avg.yaml:15:3: parallelism.parallel_pipelines: global_batch_size 16 over 1 "
            "replicas does not split into N equal shares of M whole micro-batches (N=3)",
        ),
        (
            ("data_parallel: 1", "data_parallel: 3"),
            "jobs/avg.yaml:15:3: parallelism.parallel_pipelines: global_batch_size 16 does "
            "not split over 3 data-parallel replicas",
        ),
        (
            ("micro_batches: auto", "micro_batches: 32"),
            "jobs/avg.yaml:16:3: parallelism.micro_batches: global_batch_size 16 over 1 "
            "replicas does not split into N equal shares of M whole micro-batches (M=32)",
        ),
    ],
)
def test_impossible_combinations_are_refused_at_the_field(edit, expected) -> None:
    assert expected in _error(SPEC.replace(*edit))


def test_plan_table_fits_80_columns_and_marks_the_pick() -> None:
    p = Profile(m=16, n=1, B=16, stages=(_stage(phi=((1.0, 0.05),)),) * 2)
    t = tune(p, elastic_settings(16, 8, None, None, None), 2**30, lambda K: [2, 1])
    lines = tuning_lines(t)
    assert max(map(len, lines)) <= 80
    marked = [x for x in lines if x.endswith("<-")]
    assert len(marked) == 1 and marked[0].split()[:2] == [str(t.pick.M), str(t.pick.N)]
    assert sum(1 for x in lines if x[:4].strip().isdigit()) == 14
    assert "eq. 2's utilisation curve" in " ".join(lines)  # no sizes timed
    timed = dataclasses.replace(p.stages[0], timed=((1, 0.01), (16, 0.1)))
    t = tune(
        dataclasses.replace(p, stages=(timed,) * 2), [(16, 1), (1, 1)], 2**30, lambda K: [2, 1]
    )
    lines = tuning_lines(t)
    assert "the stage alone timed at that m" in " ".join(lines)
    assert max(map(len, lines)) <= 80
