"""Sub-pipelined TMP (Merak 5.3) in one process: a one-rank gloo group, so each
all-reduce is real (asynchronous work handles) but sums one value, and the halves'
interpreter, its merge and its hand-run backward are checked against the plain split
model on tiny GPT-2 (the multi-rank parity is ``tests/integration/test_tensor_parallel``)."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from jobctl.engine.model.graph import tp_stage  # noqa: E402
from jobctl.engine.model.graph.graph_def import GraphModel  # noqa: E402
from jobctl.engine.model.graph.source import GraphModelConfig  # noqa: E402
from jobctl.engine.model.graph.tp_plan import discover  # noqa: E402
from jobctl.engine.model.graph.tp_subpipeline import COPY, REDUCE, segments  # noqa: E402

M, SEQ = 4, 8
GPT2 = {
    "n_layer": 2,
    "n_embd": 32,
    "n_head": 4,
    "vocab_size": 64,
    "n_positions": 16,
    "resid_pdrop": 0.0,
    "embd_pdrop": 0.0,
    "attn_pdrop": 0.0,
}


@pytest.fixture(scope="module")
def mesh():
    if dist.is_initialized():
        pytest.skip("a process group is already up in this process")
    dist.init_process_group(
        "gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=60)
    )
    yield tp_stage.tp_mesh(1, 1, 1)["tp"]
    dist.destroy_process_group()


def _graph(m: int) -> GraphModel:
    cfg = GraphModelConfig(hf_class="GPT2LMHeadModel", hf_config=GPT2, seq_len=SEQ)
    return GraphModel(cfg, m)


def _blocks(graph, mesh, half=None):
    plan = discover(graph, 1)
    blocks, why = [], []
    for i in range(len(graph.shards)):
        b = graph.block(i, seed=0)
        tp_stage.parallelize(b, plan, mesh)
        if half is not None:
            why.append(tp_stage.subpipeline(b, i, graph, half, plan, mesh))
        blocks.append(b)
    return blocks, why


def _step(blocks, batch):
    carry: tuple = ()
    for b in blocks:
        carry = b.run(carry, batch)
    carry[0].backward()
    return carry[0].item(), {
        (i, n): p.grad for i, b in enumerate(blocks) for n, p in b.named_parameters()
    }


def _batch(m: int) -> dict:
    x = torch.randint(0, 64, (m, SEQ), generator=torch.Generator().manual_seed(1))
    return {"input_ids": x, "labels": x}


def test_halves_equal_the_plain_split_model(mesh):
    graph, half = _graph(M), _graph(M // 2)
    plain, _ = _blocks(graph, mesh)
    sub, why = _blocks(graph, mesh, (half, discover(half, 1)))
    # the embedding has no split linear; the last subgraph's loss is a batch mean
    assert why[0] == "no tensor-parallel linear" and "mean over the batch" in why[-1]
    assert all(w is None for w in why[1:-1]) and len(why) > 2
    want, grads = _step(plain, _batch(M))
    got, sub_grads = _step(sub, _batch(M))
    assert got == pytest.approx(want, abs=1e-6)
    for k, g in grads.items():
        torch.testing.assert_close(sub_grads[k], g, atol=1e-6, rtol=0, msg=str(k))
    assert [b.subpipeline.runs for b in sub[1:-1]] == [1] * (len(sub) - 2)
    carry: tuple = ()
    with torch.no_grad():  # an eval pass runs plain TMP: nothing to overlap backward
        for b in sub:
            carry = b.run(carry, _batch(M))
    assert carry[0].item() == pytest.approx(want, abs=1e-6)
    assert [b.subpipeline.runs for b in sub[1:-1]] == [1] * (len(sub) - 2)


def test_segments_cut_at_f_and_g(mesh):
    graph, half = _graph(M), _graph(M // 2)
    sub, _ = _blocks(graph, mesh, (half, discover(half, 1)))
    for b in sub[1:-1]:
        twin = b.subpipeline.half
        segs = segments(twin.graph)
        marks = [
            n.target
            for n in twin.graph.nodes
            if n.op == "call_module" and n.target in (COPY, REDUCE)
        ]
        assert [s.before.target for s in segs[1:]] == marks and marks
        assert marks.count(COPY) == marks.count(REDUCE)  # one f per g in a GPT-2 layer
        # forward phases end after each g; backward phases at each f
        fwd, bwd = b.subpipeline._phases(REDUCE), b.subpipeline._phases(COPY)
        assert len(fwd) == 1 + marks.count(REDUCE) and len(bwd) == 1 + marks.count(COPY)
        assert all(p[0].before.target == REDUCE for p in fwd[1:])
        assert all(p[0].before.target == COPY for p in bwd[1:])


def test_batch_split_only_where_dim_0_halves():
    halved = tp_stage.halved
    assert halved((4, 8, 32), (2, 8, 32)) is True
    assert halved((32, 32), (16, 32)) is True  # m x seq flattened: 4 x 8 -> 2 x 8
    assert halved((1, 1, 8, 8), (1, 1, 8, 8)) is False  # a causal mask: shared
    assert halved((8, 4, 32), (8, 2, 32)) is None  # sequence-first: batch in dim 1
    assert halved((4, 8), (3, 8)) is None and halved((4, 8), (2, 4)) is None
    assert halved((4, 8), (2, 8, 1)) is None and halved(None, (2, 8)) is None


def test_sequence_first_value_runs_plain_with_its_reason(mesh):
    graph, half = _graph(M), _graph(M // 2)
    half_plan = discover(half, 1)  # before the edit below: its plan reads the shapes
    hs = half.shards[1]
    node = next(n for n in half.gm.graph.nodes if n.name == hs.carry_in[0])
    whole = next(n for n in graph.gm.graph.nodes if n.name == graph.shards[1].carry_in[0])
    s = tuple(whole.meta["val"].shape)  # (m, seq, d): seen sequence-first at m/2
    node.meta["val"] = torch.empty((s[0], s[1] // 2, *s[2:]), device="meta")
    b = graph.block(1, seed=0)
    plan = discover(graph, 1)
    tp_stage.parallelize(b, plan, mesh)
    why = tp_stage.subpipeline(b, 1, graph, (half, half_plan), plan, mesh)
    assert why is not None and "not its first dimension halved" in why
    assert not hasattr(b, "subpipeline") or b.subpipeline is None


def test_odd_micro_batch_falls_back_with_a_reason(mesh):
    shards = tp_stage.StageShards(_graph(3), 1, mesh.get_group(), [0], subpipeline=True, m=3)
    assert shards.half is None and shards.reasons == ["micro-batch 3 does not halve: plain TMP"]
    assert shards.outcome() == (
        "sub-pipelined TMP: blocks none; plain TMP: micro-batch 3 does not halve: plain TMP"
    )


def test_stage_outcome_names_every_block(mesh):
    """The line build_state prints: the sub-pipelined blocks, each plain one's reason
    (a recomputed block included); none at all where the plan did not ask."""
    from jobctl.engine.model.blocks import ModelDef, Stage

    graph = _graph(M)
    n = len(graph.shards)
    mdef = ModelDef(n, lambda i: graph.block(i, 0), graph=graph)
    stage = Stage(mdef, range(n), keep=n - 2)  # the last two recomputed in backward
    shards = tp_stage.StageShards(graph, 1, mesh.get_group(), [0], subpipeline=True, m=M)
    shards.apply(stage)
    assert shards.subpipelined == list(range(1, n - 2))
    line = shards.outcome()
    assert line.startswith(f"sub-pipelined TMP: blocks {', '.join(map(str, range(1, n - 2)))};")
    assert "block 0: no tensor-parallel linear" in line
    assert f"block {n - 2}: recomputed in backward: plain TMP" in line
    assert f"block {n - 1}: recomputed in backward: plain TMP" in line
    from jobctl.engine.core.event_schema import problem

    event = {"kind": "tp_subpipeline", "ts": 0.0, "rank": 0, "stage": 0, **shards.record()}
    assert problem(event) is None and event["subpipelined"] == shards.subpipelined
    assert len(event["plain"]) == 3  # blocks 0, n - 2, n - 1
    off = tp_stage.StageShards(graph, 1, mesh.get_group(), [0], subpipeline=False, m=M)
    assert off.outcome() is None


class _Logged:
    """An all-reduce's work handle that logs when it is waited for."""

    def __init__(self, work, i: int, log: list) -> None:
        self.work, self.i, self.log = work, i, log

    def wait(self) -> None:
        self.log.append(("wait", self.i))
        self.work.wait()


def test_each_all_reduce_overlaps_the_other_half(mesh, monkeypatch):
    """Forward and backward: after an all-reduce starts, the other half runs (and
    starts its own) before this one's sum is waited for: never start i, wait i."""
    from jobctl.engine.model.graph import tp_subpipeline

    graph, half = _graph(M), _graph(M // 2)
    sub, _ = _blocks(graph, mesh, (half, discover(half, 1)))
    log: list = []
    real = dist.all_reduce

    def logged(t, group=None, async_op=False):
        log.append(("start", len(log)))
        return _Logged(real(t, group=group, async_op=True), log[-1][1], log)

    monkeypatch.setattr(tp_subpipeline.dist, "all_reduce", logged)
    _step(sub, _batch(M))
    starts = [e for e in log if e[0] == "start"]
    assert len(starts) >= 8 and [e for e in log if e[0] == "wait"]
    for k, event in enumerate(log[:-1]):
        if event[0] == "start":
            assert log[k + 1] != ("wait", event[1]), log
