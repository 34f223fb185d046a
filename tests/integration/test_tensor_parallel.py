"""Tensor parallelism inside stages (Merak 4.1) on real gloo ranks, against one process.

One launch of 4 ranks runs every case, so the processes start once: tiny GPT-2
(``Conv1D``, fused q/k/v), Llama (GQA, RoPE), T5 and BERT at T = 2 x D = 2 (each is a
T = 2 x P = 1 pipeline; gradients all-reduced over the (D, P, T) mesh's ``dp``
groups), GPT-2 and Llama at T = 2 x P = 2 too (the carrier between the stages
holds split values: the cut after a column linear), and GPT-2 at T = 4. Each rank checks its losses,
its split gradients (its shard of one process's), and the whole weights that
``full_state`` gathers after one SGD step, which a T = 1 model loads and continues
from (resume at T = 1). GPT-2 and Llama at T = 2 x P = 1 and T = 2 x P = 2 run once
more sub-pipelined (Merak 5.3: each micro-batch as two halves, ``tp_subpipeline``).
"""

from __future__ import annotations

import json
import math
import socket
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from jobctl.engine.checkpoint.blocks import (  # noqa: E402
    load_blocks,
    snapshot_blocks,
    write_snapshot,
)
from jobctl.engine.model.blocks import Stage  # noqa: E402
from jobctl.engine.model.graph import boundary  # noqa: E402
from jobctl.engine.model.graph.graph_def import GraphModel  # noqa: E402
from jobctl.engine.model.graph.source import FixableError, GraphModelConfig  # noqa: E402
from jobctl.engine.model.graph.tp_plan import discover  # noqa: E402
from jobctl.engine.model.graph.tp_stage import (  # noqa: E402
    full_state,
    parallelize,
    shard_of,
    subpipeline,
    tp_mesh,
)

M, SEQ, LR, WORLD = 2, 8, 0.1, 4
MODELS = {
    "gpt2": (
        "GPT2LMHeadModel",
        {
            "n_layer": 2,
            "n_embd": 32,
            "n_head": 4,
            "vocab_size": 128,
            "n_positions": 32,
            "resid_pdrop": 0.0,
            "embd_pdrop": 0.0,
            "attn_pdrop": 0.0,
        },
    ),
    "llama": (
        "LlamaForCausalLM",
        {
            "num_hidden_layers": 2,
            "hidden_size": 32,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "intermediate_size": 64,
            "vocab_size": 128,
            "max_position_embeddings": 64,
        },
    ),
    "t5": (
        "T5ForConditionalGeneration",
        {
            "num_layers": 2,
            "num_decoder_layers": 2,
            "d_model": 32,
            "d_kv": 8,
            "num_heads": 4,
            "d_ff": 64,
            "vocab_size": 128,
            "dropout_rate": 0.0,
            "decoder_start_token_id": 0,
            "pad_token_id": 0,
        },
    ),
    "bert": (
        "BertForMaskedLM",
        {
            "num_hidden_layers": 2,
            "hidden_size": 32,
            "num_attention_heads": 4,
            "intermediate_size": 64,
            "vocab_size": 128,
            "max_position_embeddings": 64,
            "hidden_dropout_prob": 0.0,
            "attention_probs_dropout_prob": 0.0,
        },
    ),
}
#: GPT-2 and Llama at T x D and T x P; T5 (its position bias over all heads is
#: narrowed to each rank's) and BERT at T x D only, to keep the launch short
CASES = [(n, P, D) for n in ("gpt2", "llama") for P, D in ((1, 2), (2, 1))] + [
    ("t5", 1, 2),
    ("bert", 1, 2),
    ("gpt2", 1, 1),
]  # the last at T = 4: a head per rank
#: sub-pipelined TMP (Merak 5.3): GPT-2 and Llama at T = 2 x P = 1 and T = 2 x P = 2
SUB_CASES = [(n, P, D, True) for n in ("gpt2", "llama") for P, D in ((1, 2), (2, 1))]


def _graph(name: str, m: int = M) -> GraphModel:
    cls, config = MODELS[name]
    return GraphModel(GraphModelConfig(hf_class=cls, hf_config=config, seq_len=SEQ), m)


def _batches() -> list[dict]:
    g = torch.Generator().manual_seed(7)
    ids = [torch.randint(0, 128, (M, SEQ), generator=g) for _ in range(2)]
    return [{"input_ids": x, "labels": x} for x in ids]


def _run(blocks, ids, carry, batch) -> tuple:
    for i in ids:
        carry = blocks[i].run(carry, batch)
    return carry


def _reference(graph) -> tuple[list, list, dict]:
    """One process: losses, the gradients and the weights after one SGD step."""
    blocks = [graph.block(i, seed=0) for i in range(len(graph.shards))]
    every = range(len(blocks))
    losses = []
    for batch in _batches():
        loss = _run(blocks, every, (), batch)[0] / 2
        loss.backward()
        losses.append(2 * loss.item())
    grads = {  # by block: a tied weight has one name in two blocks
        (i, n): p.grad.clone() for i, b in enumerate(blocks) for n, p in b.named_parameters()
    }
    _sgd(blocks)
    return losses, blocks, grads


def _sgd(blocks) -> None:
    with torch.no_grad():
        for b in blocks:
            for p in b.parameters():
                p -= LR * p.grad
                p.grad = None


def _stage_blocks(graph, plan, mesh, P: int, p: int, half=None) -> tuple[list, list[int]]:
    """Stage p's blocks split over T; with ``half`` (the m/2 trace and its plan) each
    split block but the model's last also sub-pipelined."""
    n = len(graph.shards)
    ids = list(range(n))[p * n // P : (p + 1) * n // P]
    blocks = {}
    for i in ids:
        blocks[i] = graph.block(i, seed=0)
        parallelize(blocks[i], plan, mesh["tp"])
        if half is not None:
            subpipeline(blocks[i], i, graph, half, plan, mesh["tp"])
    return blocks, ids


def _pipeline(blocks, ids, batch, mesh, P: int) -> float | None:
    """One micro-batch forward and backward over P stages (P <= 2); the loss on the last."""
    d, p, t = mesh.get_coordinate()
    peer = int(mesh.mesh[d, 1 - p, t]) if P == 2 else None
    if p == 0:
        carry = _run(blocks, ids, (), batch)
        if P == 1:
            (carry[0] / 2).backward()
            return carry[0].item()
        layout = boundary.describe(list(carry))
        out = boundary.pack(layout, list(carry))
        dist.send_object_list([boundary.encode(layout)], dst=peer)
        dist.send(out.detach(), dst=peer)
        grad = torch.empty_like(out)
        dist.recv(grad, src=peer)
        out.backward(grad)
        return None
    box = [None]
    dist.recv_object_list(box, src=peer)
    layout = boundary.decode(box[0])
    carrier = torch.empty(sum(layout.sizes()), dtype=layout.dtype)
    dist.recv(carrier, src=peer)
    carrier.requires_grad_(True)
    loss = _run(blocks, ids, tuple(boundary.unpack(layout, carrier)), batch)[0]
    (loss / 2).backward()
    dist.send(carrier.grad, dst=peer)
    return loss.item()


def _case(name: str, P: int, D: int, sub: bool = False) -> dict:
    """One tensor-parallel layout's errors against one process (this rank's view)."""
    graph = _graph(name)
    ref_losses, ref_blocks, ref_grads = _reference(graph)
    mesh = tp_mesh(P, D, WORLD // (P * D))
    plan = discover(graph, mesh["tp"].size())
    d, p, t = mesh.get_coordinate()
    half = _graph(name, M // 2) if sub else None
    half = (half, discover(half, plan.T)) if sub else None
    blocks, ids = _stage_blocks(graph, plan, mesh, P, p, half)
    batches = _batches()
    losses = [_pipeline(blocks, ids, b, mesh, P) for b in batches[d::D]]
    halved = sum(b.subpipeline.runs for b in blocks.values() if b.subpipeline is not None)
    for b in blocks.values():  # each loss is already / 2 micro-batches: the replicas sum
        for q in b.parameters():
            dist.all_reduce(q.grad, group=mesh["dp"].get_group())
    grad_err = max(
        (q.grad - _local(n, ref_grads[i, n], plan, t)).abs().max().item()
        for i, b in blocks.items()
        for n, q in b.named_parameters()
    )
    _sgd(blocks.values())
    return {
        "losses": losses,
        "ref_losses": ref_losses[d::D],
        "grad_err": grad_err,
        "halved": halved,
        "split": sum(n in plan.params for b in blocks.values() for n, _ in b.named_parameters()),
        **_resume(graph, blocks, plan, mesh, ref_blocks),
    }


def _local(name, whole, plan, t):
    split = plan.params.get(name)
    return whole if split is None else shard_of(whole, split, t, plan.T)


def _resume(graph, blocks, plan, mesh, ref_blocks) -> dict:
    """Whole weights gathered from T = 2 equal one process's; at P = 1 a T = 1 model
    loads them (fresh blocks, another seed) and its next loss is one process's."""
    weight_err, loaded = 0.0, {}
    for i, b in blocks.items():
        state = full_state(b, plan, mesh["tp"])
        ref = ref_blocks[i].state_dict()
        weight_err = max(weight_err, *((state[n] - ref[n]).abs().max().item() for n in ref))
        loaded[i] = graph.block(i, seed=1)
        loaded[i].load_state_dict(state)
    if len(loaded) < len(ref_blocks):
        return {"weight_err": weight_err, "resumed_err": 0.0}
    batch = _batches()[0]
    with torch.no_grad():
        got = _run(loaded, sorted(loaded), (), batch)[0]
        want = _run(ref_blocks, range(len(ref_blocks)), (), batch)[0]
    return {"weight_err": weight_err, "resumed_err": abs(got - want).item()}


def _worker(rank: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=WORLD,
        timeout=timedelta(seconds=120),
    )
    results = {f"{n}-{P}x{D}": _case(n, P, D) for n, P, D in CASES}
    results |= {f"{n}-{P}x{D}-sub": _case(n, P, D, sub) for n, P, D, sub in SUB_CASES}
    Path(out, f"{rank}.json").write_text(json.dumps(results))
    Path(out, f"state-{rank}.json").write_text(json.dumps(_run_state(rank, out)))
    dist.barrier()
    dist.destroy_process_group()


def _run_state(rank: int, out: str) -> dict:
    """What a run's rank trains under at T = 2 x D = 2 (the plan's, ``build_state``):
    its topology, and its stage's parameter shapes against the whole model's."""
    from jobctl.engine.model.blocks import model_def
    from jobctl.engine.planner.resolver import make_plan
    from jobctl.engine.runtime.trainer import build_state

    spec = _tp_spec(2, 1, 2, **{"parallelism.data_parallel": 2})
    plan = make_plan(spec)
    mdef = model_def(spec.model, spec.training.seed, plan.micro_batch_size)
    state = build_state(mdef, spec.training, plan, rank, torch.device("cpu"))
    whole = {
        n: list(p.shape) for n, p in Stage(mdef, plan.stage_of(rank).blocks).named_parameters()
    }
    topo = state.topo
    return {
        **_reshard_errors(state, mdef, plan.stage_of(rank).blocks, Path(out, f"whole-{rank}")),
        "topo": [topo.t, topo.replica, topo.dp_ranks, topo.tp_ranks, topo.is_reporter],
        "halved": sorted(
            n
            for n, p in state.named.items()
            if list(p.shape) != whole[n] and p.numel() * 2 == math.prod(whole[n])
        ),
        "changed": sum(list(p.shape) != whole[n] for n, p in state.named.items()),
        "splits": len(state.tp.plan.params),
    }


def _reshard_errors(state, mdef, blocks, folder: Path) -> dict:
    """A T = 1 stage with other weights and SGD momentum, saved as a checkpoint's block
    files, loaded at T = 2 (``load_blocks`` keeping this rank's shard: a resume from
    T = 1); the snapshot the T group then gathers is the T = 1 stage again."""
    whole = Stage(mdef, blocks)
    opt = torch.optim.SGD(whole.parameters(), lr=LR, momentum=0.9)
    g = torch.Generator().manual_seed(3)
    for q in whole.parameters():
        q.grad = torch.randn(q.shape, generator=g)
    opt.step()  # moved weights and a momentum buffer per parameter
    folder.mkdir()
    write_snapshot(snapshot_blocks(whole, opt, blocks, mdef.ties), folder)
    load_blocks(state.stage, state.opt, folder, mdef.ties, local=state.tp.local)
    named, moment = dict(whole.named_parameters()), lambda o, q: o.state[q]["momentum_buffer"]
    load_err = max(
        max(
            (q - state.tp.local(n, named[n])).abs().max().item(),
            (moment(state.opt, q) - state.tp.local(n, moment(opt, named[n]))).abs().max().item(),
        )
        for n, q in state.named.items()
    )
    snap = snapshot_blocks(state.stage, state.opt, blocks, mdef.ties, whole=state.tp.whole)
    save_err = max(
        max(
            (p[n] - named[n]).abs().max().item(),
            (snap[b]["optim"][n]["momentum_buffer"] - moment(opt, named[n])).abs().max().item(),
        )
        for b in blocks
        for p in [snap[b]["params"]]
        for n in p
    )
    return {"load_err": load_err, "save_err": save_err}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.multiproc
def test_tensor_parallel_equals_one_process(tmp_path):
    mp.spawn(_worker, args=(_free_port(), str(tmp_path)), nprocs=WORLD, join=True)
    ranks = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(WORLD)]
    for case in ranks[0]:
        for rank, results in enumerate(ranks):
            r = results[case]
            assert r["split"] > 0, (case, rank)  # this rank holds split linears
            # sub-pipelined: every rank ran a micro-batch as two halves (P = 2's last
            # stage ends with the model's last subgraph: plain there, the rest halved)
            assert (r["halved"] > 0) == case.endswith("-sub"), (case, rank, r)
            assert r["grad_err"] < 1e-5, (case, rank, r)
            assert r["weight_err"] < 1e-5, (case, rank, r)
            assert r["resumed_err"] < 1e-5, (case, rank, r)
            for got, want in zip(r["losses"], r["ref_losses"], strict=True):
                assert got is None or abs(got - want) < 1e-5, (case, rank, r)
        last = [r[case]["losses"] for r in ranks if r[case]["losses"][0] is not None]
        assert len(last) == WORLD // (2 if "-2x1" in case else 1)
    states = [json.loads((tmp_path / f"state-{r}.json").read_text()) for r in range(WORLD)]
    assert [s["topo"] for s in states] == [  # t, d, the dp group of (p, t), the T group
        [0, 0, [0, 2], [0, 1], True],
        [1, 0, [1, 3], [0, 1], False],
        [0, 1, [0, 2], [2, 3], False],
        [1, 1, [1, 3], [2, 3], False],
    ]  # reporter: d = 0, t = 0
    for s in states:  # 3 layers x (fused q/k/v w+b, attn proj, fc w+b, mlp proj)
        assert s["splits"] == 18 and s["changed"] == 18 and len(s["halved"]) == 18, s
        assert s["load_err"] == 0.0 and s["save_err"] == 0.0, s


def test_family_without_a_feature_dict_is_refused():
    class Plain(torch.nn.Module):
        def forward(self, x):
            return x

    from jobctl.engine.model.graph.tp_features import features_for

    with pytest.raises(FixableError, match="no feature dict for model family 'Plain'") as e:
        features_for(Plain())
    assert "tp_features.register" in e.value.fix


def _tp_spec(T: int, P: int, steps: int, **extra):
    from .test_graph_models import GPT2, hf_spec

    return hf_spec(
        GPT2,
        P,
        1,
        **{
            "parallelism.tensor_parallel": T,
            "hardware.processes_per_node": T * P,
            "training.steps": steps,
            "checkpoint.interval": 2,
            **extra,
        },
    )


@pytest.mark.multiproc
def test_apply_at_T2_equals_one_process_and_resumes_at_T1_and_T4(tmp_path):
    """A launched run (plan, workers, p2p, checkpoint writer) at T = 2 x P = 2 (4
    ranks, sub-pipelined): steps 1-2 equal one process; its checkpoint resumes at T = 1
    and, again, at T = 4 x P = 1 (4 ranks, one head each; steps 3-4, SGD momentum
    included). A T = 1 checkpoint loaded at T = 2 is checked by ``_run_state`` in the
    4-rank launch above (a fourth launch here would cost 20 s)."""
    from jobctl.engine.worker.reference import reference_train

    from ..jobrun import final_weights, step_losses

    ref_losses, ref_weights = reference_train(_tp_spec(1, 1, 4))
    run, _ = _launch(2, 2, 2, tmp_path, None)
    assert step_losses(run.dir) == pytest.approx(ref_losses[:2], abs=1e-5)
    ckpt = run.dir / "checkpoints" / "step-00000002"
    for T in (1, 4):  # the same T = 2 checkpoint: fewer and more ranks per stage
        run, _ = _launch(T, 1, 4, tmp_path, ckpt)
        assert step_losses(run.dir) == pytest.approx(ref_losses[2:], abs=1e-5), T
        weights = final_weights(run.dir, 4)
        for name, w in ref_weights.items():
            torch.testing.assert_close(weights[name], w, atol=1e-5, rtol=0, msg=(T, name))


def _launch(T: int, P: int, steps: int, home: Path, ckpt: Path | None):
    """A run at T x P to ``steps`` (sub-pipelined where T > 1), from ``ckpt`` if given."""
    from ..jobrun import run_job

    sub = {"parallelism.tp_subpipeline": True} if T > 1 else {}  # Merak 5.3 too
    run, outcome = run_job(_tp_spec(T, P, steps, **sub), home, resume_dir=ckpt)
    assert outcome.ok, outcome.message
    assert run.plan.T == T and run.plan.world_size == T * P
    assert run.plan.tp_subpipeline == (T > 1)
    return run, outcome


@pytest.mark.multiproc
def test_builtin_gpt_at_T2_x_P2_equals_one_process(tmp_path):
    """The quickstart's own GPT, split by its blocks' Megatron plan (``model.gpt_tp``:
    q/k/v and MLP column parallel, their output linears row parallel, 2 of 4 heads a
    rank) on 4 ranks: losses and the gathered final weights (the checkpoint's whole
    tensors, under the unsplit names) equal one process's."""
    from .test_parity import SGD, _run_and_compare, _spec

    extra = {"parallelism.tensor_parallel": 2, "hardware.nodes": 1}
    spec = _spec(2, 1, **SGD, **extra, **{"hardware.processes_per_node": 4})
    run = _run_and_compare(tmp_path, spec, atol=1e-5)
    assert (run.plan.T, run.plan.P, run.plan.world_size) == (2, 2, 4)
    assert run.plan.tp_subpipeline is False


@pytest.mark.multiproc
def test_zb_v_at_T2_equals_one_process(tmp_path):
    """ZB-V with each of a rank's two stages split over its T group (T = 2 x P = 2 on
    4 ranks: 4 stages in V shape, rank t of a device talking to rank t of the next):
    the builtin GPT's Megatron split, and a traced Llama's sub-pipelined (Merak 5.3),
    each equal to one process."""
    from .test_graph_models import LLAMA, hf_spec, run_and_compare
    from .test_parity import SGD, _run_and_compare, _spec

    four = {"parallelism.tensor_parallel": 2, "hardware.nodes": 1, "hardware.processes_per_node": 4}
    gpt = _spec(2, 1, "zb_v", **SGD, **four)
    run = _run_and_compare(tmp_path / "gpt", gpt, atol=1e-5)
    assert (run.plan.T, run.plan.P, run.plan.placement) == (2, 2, [[0, 3], [1, 2]])
    sub = {"parallelism.schedule": "zb_v", "parallelism.tp_subpipeline": True, **four}
    run = run_and_compare(tmp_path / "llama", hf_spec(LLAMA, 2, 1, **sub))
    assert run.plan.tp_subpipeline and run.plan.placement == [[0, 3], [1, 2]]
