"""AvgPipe's (M, N) tuner for real: 2 profile processes (P = 2) train the profiled
setting for twenty batches with the runtime's parts; the measured memory is the
models' exact bytes, every computing action is on the utilisation curve, and the
resolved spec plans as written."""

from __future__ import annotations

import pytest

from jobctl.engine.averaging.planning.tuning import measured
from jobctl.engine.averaging.profile_rank import BATCHES
from jobctl.engine.averaging.tuning import resolve, settings
from jobctl.engine.planner.resolver import make_plan
from jobctl.engine.views.averaging_tuning import tuning_lines
from jobctl.spec import load_spec_text

SPEC = """\
name: avgtune
model:
  layers: 2
  hidden: 32
  seq_len: 16
training:
  global_batch_size: 8
  micro_batch_size: auto
  steps: 2
  optimizer: sgd
  lr: 0.1
  momentum: 0.9
hardware:
  nodes: 1
  processes_per_node: 2
parallelism:
  pipeline_stages: 2
  data_parallel: 1
  schedule: advance_forward
  averaging: elastic
  parallel_pipelines: auto
  micro_batches: auto
"""


@pytest.mark.multiproc
def test_profile_measures_the_models_and_the_pick_plans(tmp_path) -> None:
    spec = load_spec_text(SPEC)
    tuned, tuning = resolve(spec, tmp_path)
    p = tuning.profile
    assert (p.m, p.n, p.B) == (8, 1, 8)  # smallest N, largest M: micro-batches of 1
    for s in p.stages:
        # SGD with momentum: weights, the local update's copy, gradients, momentum
        assert s.F_mod == 4 * s.F_ref > 0
        assert len(s.phi) == BATCHES * 2 * 8  # every F and B of every batch
        assert all(0 < phi <= 1 for _, phi in s.phi) and s.T_gpu > 0 and s.T_upd > 0
        # the stage alone at every candidate's micro-batch size, B / (N M)
        assert [z for z, _ in s.timed] == [1, 2, 4, 8] and all(t > 0 for _, t in s.timed)
    for row in tuning.rows:  # computation from those timings (the slowest stage's)
        gpu = [measured(s.T_gpu, 8, row.M * row.N, 1, row.size, s.timed) for s in p.stages]
        assert row.T_gpu in gpu
    assert len(tuning.rows) == len(settings(spec)) == 10
    pick = tuning.pick
    assert tuned.parallelism.parallel_pipelines == pick.N
    assert tuned.training.micro_batch_size == pick.size == 8 // (pick.M * pick.N)
    plan = make_plan(tuned)
    assert plan.micro_batches == pick.M * pick.N
    assert max(map(len, tuning_lines(tuning))) <= 80
    again, cached = resolve(spec, tmp_path)  # the profile is reused from the cache
    assert cached.profile == p
