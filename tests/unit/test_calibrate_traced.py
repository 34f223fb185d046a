"""Calibrating a traced model (#28): each subgraph timed on a real batch in the hand-cut
record format (``measure.graph_compute``), tensor parallelism's all-reduce measured
among T local gloo processes (``measure.tp_allreduce``) and priced by ``tp_costs``
over the link model; records from before ``tp_allreduce`` still load."""

from __future__ import annotations

import json

import pytest
import torch

from jobctl.engine.calibration import cache
from jobctl.engine.calibration.analytic import analytic_calibration
from jobctl.engine.calibration.measure.comm import _allreduce
from jobctl.engine.calibration.measure.graph_compute import measure_graph_blocks
from jobctl.engine.calibration.measure.tp_allreduce import measure_tp_allreduce, run_group
from jobctl.engine.model.blocks import model_def
from jobctl.engine.planner import tp_costs
from jobctl.engine.planner.resolver import make_plan
from jobctl.spec import load_spec

from ..jobrun import quickstart_with

GPT2 = (
    "  huggingface:\n    class: GPT2LMHeadModel\n    config: {n_layer: 2, n_embd: 32, "
    "n_head: 4, vocab_size: 256, n_positions: 16}"
)
MS = [1, 2]
HIDDEN, SEQ = 32, 16
PARAMS = 34176  # wte 8192 + wpe 256 + 2 layers x 12704 + ln_f 64 (GPT-2's own count)


def _spec(tmp_path, T: int = 2):
    path = quickstart_with(
        tmp_path / "job.yaml",
        (
            "  pipeline_stages: 2\n  data_parallel: 2",
            f"  pipeline_stages: 2\n  data_parallel: 1\n  tensor_parallel: {T}",
        ),
        ("  family: gpt", GPT2),
        ("  seq_len: 32", f"  seq_len: {SEQ}"),
    )
    return load_spec(path)


def _measured(spec, blocks, tp=None):
    """The spec's record with the measured subgraphs (links from the spec)."""
    cal = analytic_calibration(spec, cache.fingerprint(spec))
    update = {"source": "measured", "blocks": blocks, "micro_batch_sizes": MS}
    return cal.model_copy(update={**update, "tp_allreduce": tp})


@pytest.fixture(scope="module")
def blocks(tmp_path_factory):
    torch.set_num_threads(1)
    spec = _spec(tmp_path_factory.mktemp("traced"))
    return measure_graph_blocks(spec, MS, torch.device("cpu"), repeats=3, warmup=1)


def test_every_subgraph_is_measured_with_positive_times(tmp_path, blocks):
    spec = _spec(tmp_path)
    graph = model_def(spec.model, spec.training.seed).graph
    assert [b.name for b in blocks] == graph.names and len(blocks) == 5
    for b in blocks:
        for table in (b.forward, b.forward_nograd, b.backward):
            assert sorted(table) == MS and all(s.median > 0 and s.n == 3 for s in table.values())
        assert b.optimizer.median > 0 and b.state_bytes >= 2 * b.param_bytes
    # The tied embedding and LM head are counted on both blocks, and flagged as tied.
    assert sum(b.params for b in blocks) == PARAMS + 256 * HIDDEN
    assert blocks[0].tied_bytes == blocks[-1].tied_bytes == 256 * HIDDEN * 4
    assert blocks[0].boundary_bytes == SEQ * HIDDEN * 4  # the embedding's float carrier
    assert all(b.act_bytes > 0 for b in blocks[1:])


def test_the_plan_prices_from_the_measured_traced_record(tmp_path, blocks):
    spec = _spec(tmp_path)
    assert make_plan(spec, home=tmp_path).prediction.source == "analytic"
    cache.save(_measured(spec, blocks), tmp_path)
    plan = make_plan(spec, home=tmp_path)
    assert plan.prediction.source == "calibration"
    assert plan.explanation[0].startswith("costs: measured calibration")
    text = " ".join(plan.t_search)
    assert "analytic intra-node link model" in text  # no T all-reduce measured: says so


def test_the_T_allreduce_is_measured_and_grows_with_size():
    """The fastest of each size's runs: a median of 5 on 2 shared cores once had the 4 KB
    one (a process woken late) above the 4 MB one."""
    small, big = 4096, 16 << 20
    rows = run_group([(2, [small, big])], cuda=False, repeats=5)
    assert [(r[0], r[2]) for r in rows] == [(2, small), (2, big)]
    fastest = {r[2]: min(r[3]) for r in rows}
    assert all(x > 0 for x in fastest.values()) and fastest[big] > fastest[small]
    ring = _allreduce(rows)
    assert {p.bytes for p in ring.points} == {small, big}
    assert all(p.time.median > 0 for p in ring.points)


def test_calibration_measures_the_sizes_the_stages_reduce(tmp_path):
    spec = _spec(tmp_path)
    ring = measure_tp_allreduce(spec, MS)
    # Each row linear's output is s x h fp32 per sample: at m = 1 and 2.
    assert ring is not None and ring.source == "measured"
    assert sorted((p.ring, p.bytes) for p in ring.points) == [(2, SEQ * HIDDEN * 4 * m) for m in MS]
    assert all(p.time.median > 0 for p in ring.points)


def test_tp_costs_uses_the_measured_allreduce_over_the_link_model(tmp_path, blocks):
    spec = _spec(tmp_path)
    rows = [[2, 1, 2048, [3e-3] * 3], [2, 1, 4096, [5e-3] * 3]]
    cal = _measured(spec, blocks, _allreduce(rows))
    assert tp_costs.reduce_time(cal, 2, 2048) == pytest.approx(3e-3)
    assert tp_costs.reduce_time(cal, 2, 3072) == pytest.approx(4e-3)
    bare = _measured(spec, blocks)
    assert tp_costs.reduce_time(bare, 2, 2048) == bare.allreduce(True).time(2, 2048)
    assert tp_costs.reduce_time(bare, 2, 2048) < 1e-3  # the spec's link: far faster
    assert "measured tensor-parallel all-reduces at T = 2" in tp_costs.link_source(cal, 2)
    fact = tp_costs.TPBlock(phi=0.5, psi=0.5, reduce_bytes=(2048.0, 2048.0))
    assert tp_costs.comm_time(cal, fact, 2, 2) == pytest.approx(2 * 5e-3)
    cache.save(cal, tmp_path)
    text = " ".join(make_plan(spec, home=tmp_path).t_search)
    assert "measured tensor-parallel all-reduces at T = 2" in text


def test_a_record_without_the_T_allreduce_loads_and_falls_back(tmp_path, blocks):
    spec = _spec(tmp_path)
    path = cache.save(_measured(spec, blocks), tmp_path)
    raw = json.loads(path.read_text())
    del raw["tp_allreduce"]  # as written before the field existed
    path.write_text(json.dumps(raw))
    cal = cache.load(path)
    assert cal.tp_allreduce is None and cal.num_blocks == 5
    assert tp_costs.reduce_time(cal, 2, 2048) == cal.allreduce(True).time(2, 2048)
    assert "analytic intra-node link model" in tp_costs.link_source(cal, 2)
