"""Traced and sharded Hugging Face models equal the unmodified model (Merak sec. 4).

Each family is built from a tiny config, traced on the meta device and cut into
subgraphs; the subgraphs, run in sequence in one process with the model's own weights,
must give the model's loss and gradients exactly. The reference is ``transformers``'
own forward, which jobctl did not write.
"""

from __future__ import annotations

import pytest
import torch
import transformers

from jobctl.engine.model.graph import boundary
from jobctl.engine.model.graph.graph_def import GraphModel
from jobctl.engine.model.graph.source import GraphModelConfig
from jobctl.engine.model.graph.subgraph import repoint_devices

B, T = 2, 16
FAMILIES = {
    "gpt2": (
        "GPT2LMHeadModel",
        {
            "n_layer": 3,
            "n_embd": 32,
            "n_head": 4,
            "vocab_size": 97,
            "n_positions": T,
            "resid_pdrop": 0.0,
            "embd_pdrop": 0.0,
            "attn_pdrop": 0.0,
        },
    ),
    "llama": (
        "LlamaForCausalLM",
        {
            "num_hidden_layers": 3,
            "hidden_size": 32,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "intermediate_size": 64,
            "vocab_size": 97,
        },
    ),
    "bert": (
        "BertForMaskedLM",
        {
            "num_hidden_layers": 3,
            "hidden_size": 32,
            "num_attention_heads": 4,
            "intermediate_size": 64,
            "vocab_size": 97,
            "hidden_dropout_prob": 0.0,
            "attention_probs_dropout_prob": 0.0,
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
            "vocab_size": 97,
            "dropout_rate": 0.0,
            "decoder_start_token_id": 0,
            "pad_token_id": 0,
        },
    ),
    "vit": (
        "ViTForImageClassification",
        {
            "num_hidden_layers": 3,
            "hidden_size": 32,
            "num_attention_heads": 4,
            "intermediate_size": 64,
            "image_size": 16,
            "patch_size": 4,
            "num_labels": 5,
            "hidden_dropout_prob": 0.0,
            "attention_probs_dropout_prob": 0.0,
        },
    ),
}


def _batch(family: str, gen: torch.Generator) -> dict:
    if family == "vit":
        return {
            "pixel_values": torch.randn(B, 3, 16, 16, generator=gen),
            "labels": torch.randint(0, 5, (B,), generator=gen),
        }
    x = torch.randint(1, 97, (B, T), generator=gen)
    return {"input_ids": x, "labels": torch.roll(x, 1, dims=1)}


def _stitched(g: GraphModel, batch: dict):
    blocks = [g.block(i, seed=3) for i in range(len(g.shards))]
    for b in blocks:
        repoint_devices(b, torch.device("cpu"))
    carry: tuple = ()
    for b in blocks:
        carry = b.run(carry, batch)
    return blocks, carry[0]


def _reference(cls_name: str, config: dict, blocks) -> torch.nn.Module:
    cls = getattr(transformers, cls_name)
    ref = cls(cls.config_class(**config)).train()
    state = {n: p.detach().clone() for b in blocks for n, p in b.named_parameters()}
    ref.load_state_dict(state, strict=False)
    ref.tie_weights()
    return ref


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_subgraphs_equal_the_model(family):
    cls_name, config = FAMILIES[family]
    task = "image_classification" if family == "vit" else None
    cfg = GraphModelConfig(hf_class=cls_name, hf_config=config, seq_len=T, task=task)
    g = GraphModel(cfg, B)
    assert len(g.shards) >= 3
    batch = _batch(family, torch.Generator().manual_seed(0))
    blocks, loss = _stitched(g, batch)
    ref = _reference(cls_name, config, blocks)
    want = ref(**batch, use_cache=False) if family in ("gpt2", "llama", "t5") else ref(**batch)
    torch.testing.assert_close(loss, want.loss, atol=1e-6, rtol=0)
    loss.backward()
    want.loss.backward()
    grads: dict[str, torch.Tensor] = {}
    for b in blocks:  # a tied tensor's copies in different subgraphs: gradients add
        for n, p in b.named_parameters():
            grads[n] = grads.get(n, 0) + p.grad
    ref_params = dict(ref.named_parameters())
    for n, gsum in grads.items():
        torch.testing.assert_close(gsum, ref_params[n].grad, atol=1e-5, rtol=0, msg=n)


def test_tied_gpt2_embedding_is_one_tie_between_first_and_last_subgraph():
    cls_name, config = FAMILIES["gpt2"]
    g = GraphModel(GraphModelConfig(hf_class=cls_name, hf_config=config, seq_len=T), B)
    assert [m for t in g.ties for m in t.members] == [
        (0, "transformer.wte.weight"),
        (len(g.shards) - 1, "transformer.wte.weight"),
    ]
    # Both copies start from the same values whichever stage builds them.
    first, last = g.block(0, seed=1), g.block(len(g.shards) - 1, seed=1)
    torch.testing.assert_close(
        first.get_parameter("transformer.wte.weight"), last.get_parameter("transformer.wte.weight")
    )


def test_common_nodes_are_carried_not_cut():
    # Llama's rotary tables and mask are computed once and passed along every cut.
    cls_name, config = FAMILIES["llama"]
    g = GraphModel(GraphModelConfig(hf_class=cls_name, hf_config=config, seq_len=T), B)
    middle = g.shards[1:-1]
    assert all(len(s.carry_in) >= 2 for s in middle)
    assert g.names[1].startswith("model.layers.")


def test_blocks_do_not_depend_on_which_stage_builds_them():
    cls_name, config = FAMILIES["llama"]
    cfg = GraphModelConfig(hf_class=cls_name, hf_config=config, seq_len=T)
    a, b = GraphModel(cfg, B), GraphModel(cfg, B)
    built_a = {i: a.block(i, 5) for i in range(len(a.shards))}
    built_b = {i: b.block(i, 5) for i in reversed(range(len(b.shards)))}  # other order
    for i, block in built_a.items():
        pairs = zip(block.named_parameters(), built_b[i].named_parameters(), strict=True)
        for (n, p), (m, q) in pairs:
            assert n == m
            torch.testing.assert_close(p, q)


def test_boundary_round_trips_mixed_dtypes_bit_exactly():
    h = torch.randn(2, 3, 4, requires_grad=True)
    mask = torch.rand(2, 1, 3, 3) > 0.5
    pos = torch.arange(6, dtype=torch.int64).view(2, 3) * 1_000_000_007
    half = torch.randn(5, dtype=torch.bfloat16)
    b = boundary.describe([h, mask, pos, half])
    assert b == boundary.decode(boundary.encode(b))
    carrier = boundary.pack(b, [h, mask, pos, half])
    assert carrier.dtype == torch.float32 and carrier.numel() == b.numel()
    out = boundary.unpack(b, carrier)
    assert torch.equal(out[1], mask) and torch.equal(out[2], pos) and torch.equal(out[3], half)
    out[0].sum().backward()  # the gradient reaches the hidden state, only it
    assert torch.equal(h.grad, torch.ones_like(h))


def test_eval_mode_turns_the_traced_dropout_off():
    config = {**FAMILIES["gpt2"][1], "resid_pdrop": 0.5}
    g = GraphModel(GraphModelConfig(hf_class="GPT2LMHeadModel", hf_config=config, seq_len=T), B)
    blocks = [g.block(i, seed=3) for i in range(len(g.shards))]
    x = torch.randint(1, 97, (B, T), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": x, "labels": x}

    def loss() -> float:
        carry: tuple = ()
        with torch.no_grad():
            for b in blocks:
                carry = b.run(carry, batch)
        return float(carry[0])

    train = {loss() for _ in range(3)}
    assert len(train) == 3  # dropout draws differ in train mode
    for b in blocks:
        b.eval()
    ref = _reference("GPT2LMHeadModel", config, blocks).eval()
    with torch.no_grad():
        want = float(ref(**batch, use_cache=False).loss)
    assert loss() == pytest.approx(want, abs=1e-6) and loss() == loss()


def test_untraceable_model_names_the_module_and_line():
    from jobctl.engine.model.graph.trace import TraceError

    cfg = GraphModelConfig(import_="tests.unit.graph_models.untraceable:build", seq_len=8)
    with pytest.raises(TraceError) as info:
        GraphModel(cfg, 2)
    text = str(info.value)
    assert "in module blocks.0 (Gate)" in text and "untraceable.py:" in text
    assert "if h.sum() > 0" in text and "list of blocks" in info.value.fix
