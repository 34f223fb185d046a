"""Tensor parallelism (Merak 4.1) before anything starts: ``parallelism.tensor_parallel``
refused at ``jobctl validate`` (exit 2, at its line, with a fix) where it cannot work,
and the column/row plan found on tiny GPT-2 and Llama graphs."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from jobctl.engine.cli.app import app
from jobctl.engine.model.graph.source import FixableError, GraphModelConfig
from jobctl.engine.model.graph.tp_features import FEATURES, Features, register
from jobctl.engine.model.graph.tp_plan import Split, discover
from jobctl.engine.model.graph.tp_stage import shard_of, whole_of

from ..jobrun import quickstart_with

runner = CliRunner()
GPT2 = {"n_layer": 1, "n_embd": 32, "n_head": 4, "vocab_size": 64, "n_positions": 16}
LLAMA = {
    "num_hidden_layers": 1,
    "hidden_size": 32,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 64,
    "vocab_size": 64,
}
LAYOUT = "  pipeline_stages: 2\n  data_parallel: 2"


def _spec(tmp_path, T, layout: str = "  pipeline_stages: 1\n  data_parallel: 2", model=None):
    edits = [(LAYOUT, f"{layout}\n  tensor_parallel: {T}")]
    if model is not None:
        edits.append(("  family: gpt", model))
    return quickstart_with(tmp_path / "job.yaml", *edits)


def _gpt2_yaml(heads: int = 4, width: int = 32) -> str:
    return (
        "  huggingface:\n    class: GPT2LMHeadModel\n    config: {n_layer: 1, "
        f"n_embd: {width}, n_head: {heads}, vocab_size: 256, n_positions: 32}}"
    )


def _fails(path, *words: str) -> str:
    r = runner.invoke(app, ["validate", str(path)])
    assert r.exit_code == 2, r.output
    line = next(i for i, t in enumerate(path.read_text().splitlines(), 1) if "tensor_parallel" in t)
    assert f"{path}:{line}:" in r.output and "fix:" in r.output, r.output
    assert "Traceback" not in r.output
    for word in words:
        assert word in r.output, r.output
    return r.output


def test_auto_validates_and_a_bad_T_is_refused(tmp_path):
    r = runner.invoke(app, ["validate", str(_spec(tmp_path, "auto", model=_gpt2_yaml()))])
    assert r.exit_code == 0, r.output  # the planner resolves it (tp_search)
    _fails(_spec(tmp_path, "two"), "integer 1..64 or 'auto'", "auto (the planner")


def test_builtin_family_splits_its_heads_and_the_pool_is_checked(tmp_path):
    # the builtin GPT runs T = 2 over its 4 heads (model.gpt_tp); T must divide them
    assert runner.invoke(app, ["validate", str(_spec(tmp_path, 2))]).exit_code == 0
    one_head = quickstart_with(
        tmp_path / "one.yaml",
        (LAYOUT, "  pipeline_stages: 1\n  data_parallel: 2\n  tensor_parallel: 2"),
        ("  heads: 4", "  heads: 1"),
    )
    _fails(one_head, "splits each block's 1 heads", "divisor of model.heads (1)")
    # a T group must sit in one node (2 processes per node), and T P D fit the pool (4)
    _fails(_spec(tmp_path, 4, model=_gpt2_yaml()), "inside one node", "T x P x D = 4 x 1 x 2")


def test_T_must_divide_heads_and_widths(tmp_path):
    out = _fails(_spec(tmp_path, 2, model=_gpt2_yaml(heads=3, width=24)), "n_head = 3")
    assert "one of 1, 3" in out


def test_valid_T_validates_and_the_plan_places_T_consecutive_ranks(tmp_path):
    path = _spec(tmp_path, 2, model=_gpt2_yaml())
    priced = path.read_text().replace("  device: cpu", "  device: cpu\n  price_per_hour: 1.5")
    path.write_text(priced)
    r = runner.invoke(app, ["validate", str(path)])
    assert r.exit_code == 0, r.output
    from jobctl.engine.planner.resolver import make_plan
    from jobctl.spec import load_spec

    plan = make_plan(load_spec(path))  # 2 nodes x 2 processes: one T group per node
    assert (plan.T, plan.P, plan.D, plan.world_size) == (2, 1, 2, 4)
    assert [plan.coords(r) for r in range(4)] == [(0, 0, 0), (0, 0, 1), (1, 0, 0), (1, 0, 1)]
    assert [r.node for r in plan.ranks] == [0, 0, 1, 1]
    assert [r.local_rank for r in plan.ranks] == [0, 1, 0, 1]
    assert plan.tp_ranks(3) == [2, 3] and plan.rank_at(1, 0, 1) == 3
    pred = plan.prediction  # rates per device over all 4 ranks, not the 2 groups
    assert pred.samples_per_s_per_device == pytest.approx(pred.samples_per_s / 4)
    assert pred.hourly_usd == pytest.approx(4 * 1.5)  # all T x P x D devices are paid
    assert pred.cost_per_1k_samples == pytest.approx(6.0 / 3600 / pred.samples_per_s * 1000)
    out = runner.invoke(app, ["plan", str(path)]).output
    assert "T=2 x P=1 x D=2 on 4 device(s)" in out, out


@pytest.mark.parametrize(
    "field, edit, words",
    [
        (
            "averaging",
            (
                "  schedule: 1f1b",
                "  schedule: 1f1b\n  averaging: elastic\n  parallel_pipelines: auto",
            ),
            "(M, N) tuner profiles an unsplit stage",
        ),
        (
            "packing",
            ("hardware:", "rebalancing:\n  enabled: true\n  pack: true\nhardware:"),
            "packing re-places whole T groups",
        ),
    ],
)
def test_features_without_T_ranks_are_refused(tmp_path, field, edit, words):
    path = _spec(tmp_path, 2, model=_gpt2_yaml())
    path.write_text(path.read_text().replace(*edit))
    r = runner.invoke(app, ["validate", str(path)])
    assert r.exit_code == 2 and words in r.output and "tensor_parallel: 1" in r.output, r.output
    assert "Traceback" not in r.output


@pytest.mark.parametrize("section", ["elasticity", "pruning"])
def test_elasticity_and_pruning_validate_with_T(tmp_path, section):
    # A lost node's survivors fall back to the newest checkpoint and the morph keeps T
    # (tests/integration/test_chaos_tensor_parallel.py runs it); pruning selects on the
    # T group's whole weights (tests/integration/test_pruning_multiproc.py).
    path = _spec(tmp_path, 2, model=_gpt2_yaml())
    on = f"{section}:\n  enabled: true\n" + (
        "  end_step: 6\n  frequency: 2\n" * (section == "pruning")
    )
    on += "hardware:"
    path.write_text(path.read_text().replace("hardware:", on))
    r = runner.invoke(app, ["validate", str(path)])
    assert r.exit_code == 0, r.output


def _graph(cls: str, config: dict):
    from jobctl.engine.model.graph.graph_def import GraphModel

    return GraphModel(GraphModelConfig(hf_class=cls, hf_config=config, seq_len=8), 2)


def test_gpt2_conv1d_and_fused_qkv_are_found():
    plan = discover(_graph("GPT2LMHeadModel", GPT2), 2)
    h = "transformer.h.0."
    assert plan.params == {  # Conv1D stores [in, out]: columns are its dim 1
        h + "attn.c_attn.weight": Split(1, 3),
        h + "attn.c_attn.bias": Split(0, 3),
        h + "attn.c_proj.weight": Split(0),
        h + "mlp.c_fc.weight": Split(1),
        h + "mlp.c_fc.bias": Split(0),
        h + "mlp.c_proj.weight": Split(0),
    }
    args = {a[1] if not isinstance(a[1], list) else tuple(a[1]) for a in plan.args.values()}
    assert 16 in args  # the fused split: 32 / T columns each of q, k and v
    assert (2, 8, 48) in args  # the q/k/v view: 96 / T
    assert (-1, 16) in args and (2, 8, 64) in args  # into c_proj; the MLP: 128 / T


def test_llama_gqa_heads_are_divided():
    plan = discover(_graph("LlamaForCausalLM", LLAMA), 2)
    a = "model.layers.0."
    assert plan.params[a + "self_attn.k_proj.weight"] == Split(0)  # nn.Linear: [out, in]
    assert plan.params[a + "self_attn.o_proj.weight"] == Split(1)
    assert plan.params[a + "mlp.down_proj.weight"] == Split(1)
    expands = [tuple(v[1]) for v in plan.args.values() if len(v[1]) == 5]
    assert expands == [(2, 1, 2, 8, 8)] * 2  # repeat_kv over 2 / T kv heads, for k and v
    assert len(plan.row) == 2 and len(plan.column) == 5


def test_a_split_reaching_an_unnamed_linear_is_refused():
    register(
        "gpt2_half",
        Features(
            column=(r"\.attn\.c_attn$",), row=(r"\.mlp\.c_proj$",), fused={r"\.attn\.c_attn$": 3}
        ),
    )
    graph = _graph("GPT2LMHeadModel", GPT2)
    graph.model.config.model_type = "gpt2_half"
    try:
        with pytest.raises(FixableError, match="contracts the split dimension"):
            discover(graph, 2)
    finally:
        del FEATURES["gpt2_half"]


def test_shards_of_fused_parts_put_back_whole():
    whole = torch.arange(4 * 12.0).reshape(4, 12)  # 3 fused parts of 4 columns
    split = Split(1, 3)
    shards = [shard_of(whole, split, t, 2) for t in range(2)]
    assert shards[0][0].tolist() == [0, 1, 4, 5, 8, 9]  # q, k and v's first halves
    assert torch.equal(whole_of(torch.cat(shards, 1), split, 2), whole)
