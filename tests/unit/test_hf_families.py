"""#54: Falcon (a tensor lifted out of forward), GPT-J (a sin/cos table built at
construction beside meta parameters) and Mixtral (mixture of experts: routing that
branches on the device type, with the router's auxiliary loss) trace, and their
traced subgraphs, run one after another through the carrier that crosses a pipeline
cut, compute what transformers computes eagerly with the same weights: the loss and
every parameter's gradient (checked against transformers itself, not jobctl's own
reference)."""

from __future__ import annotations

import pytest
import torch

from jobctl.engine.model.graph import boundary
from jobctl.engine.model.graph.graph_def import GraphModel
from jobctl.engine.model.graph.source import GraphModelConfig

FAMILIES = {
    "falcon": (
        "FalconForCausalLM",
        {
            "num_hidden_layers": 2,
            "hidden_size": 32,
            "num_attention_heads": 4,
            "vocab_size": 256,
            "multi_query": True,
            "parallel_attn": True,
            "new_decoder_architecture": False,
            "alibi": False,
            "hidden_dropout": 0.0,
            "attention_dropout": 0.0,
        },
    ),
    "gptj": (
        "GPTJForCausalLM",
        {
            "n_layer": 2,
            "n_embd": 32,
            "n_head": 4,
            "vocab_size": 256,
            "rotary_dim": 4,
            "n_positions": 64,
            "bos_token_id": 0,
            "eos_token_id": 0,
            "resid_pdrop": 0.0,
            "embd_pdrop": 0.0,
            "attn_pdrop": 0.0,
        },
    ),
    "mixtral": (
        "MixtralForCausalLM",
        {
            "num_hidden_layers": 2,
            "hidden_size": 32,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "intermediate_size": 64,
            "vocab_size": 256,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "output_router_logits": True,  # the loss adds the router's auxiliary loss
            "router_aux_loss_coef": 0.5,
        },
    ),
}


def _traced(cls: str, config: dict, batch: dict) -> tuple[torch.Tensor, dict, list]:
    """The loss of the traced model's subgraphs run in order, each carry packed and
    unpacked as a pipeline cut sends it; and the weights jobctl initialised."""
    g = GraphModel(GraphModelConfig(hf_class=cls, hf_config=config, seq_len=16), 2)
    subs = [g.block(i, seed=0) for i in range(len(g.shards))]
    carry: tuple = ()
    for sub in subs:
        out = sub.run(carry, batch)
        cut = boundary.describe(list(out))
        carry = tuple(boundary.unpack(cut, boundary.pack(cut, list(out))))
    state = {n: p for sub in subs for n, p in sub.named_parameters()}
    return carry[0], state, subs


def _summed_grads(subs) -> dict[str, torch.Tensor]:
    """Each name's gradient summed over the subgraphs holding it (a tied embedding and
    head: the pipeline all-reduces them over the tie's stages)."""
    out: dict[str, torch.Tensor] = {}
    for sub in subs:
        for n, p in sub.named_parameters():
            out[n] = out[n] + p.grad if n in out else p.grad.clone()
    return out


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_traced_family_equals_transformers_eager(family):
    import transformers

    torch.manual_seed(0)
    cls, config = FAMILIES[family]
    x = torch.randint(0, 256, (2, 16))
    batch = {"input_ids": x, "labels": x}
    loss, state, subs = _traced(cls, config, batch)
    loss.backward()
    model_cls = getattr(transformers, cls)
    eager = model_cls(model_cls.config_class(**config)).train()
    eager.load_state_dict({n: p.detach() for n, p in state.items()}, strict=False)
    assert set(dict(eager.named_parameters())) <= set(state)  # tied aliases: one name
    want = eager(**batch, use_cache=False).loss
    want.backward()
    assert torch.allclose(loss, want, atol=1e-6), (loss.item(), want.item())
    eager_params = dict(eager.named_parameters())
    for name, grad in _summed_grads(subs).items():
        assert torch.allclose(grad, eager_params[name].grad, atol=1e-6), name
