"""#54: a pretrained directory is read as ``from_pretrained`` reads it, through the
class's conversion mapping: transformers 5 saves Mixtral's and Qwen2-MoE's experts
one module each (``block_sparse_moe.experts.3.w1.weight``) and fuses them in memory
(``mlp.experts.gate_up_proj``). Every parameter jobctl reads equals the one
transformers itself loads, for families with a mapping and without one (BERT's,
GPT-2's and T5's tied and prefixed names), and ``validate``'s header-only shape
check sees through the conversion."""

from __future__ import annotations

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from jobctl.engine.model.graph.source import ModelSourceError, meta_parameters
from jobctl.engine.model.graph.weights import check_pretrained, read_pretrained

from .test_hf_families import FAMILIES

QWEN2_MOE = {
    "num_hidden_layers": 2,
    "hidden_size": 32,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 64,
    "moe_intermediate_size": 16,
    "shared_expert_intermediate_size": 32,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "vocab_size": 256,
}
SMALL = {"vocab_size": 256, "num_hidden_layers": 2, "hidden_size": 32}
MODELS = {
    "mixtral": ("MixtralForCausalLM", FAMILIES["mixtral"][1]),
    "qwen2_moe": ("Qwen2MoeForCausalLM", QWEN2_MOE),
    "llama": ("LlamaForCausalLM", {**SMALL, "num_attention_heads": 4, "intermediate_size": 64}),
    "bert": ("BertForMaskedLM", {**SMALL, "num_attention_heads": 4, "intermediate_size": 64}),
    "gpt2": ("GPT2LMHeadModel", {"vocab_size": 256, "n_layer": 2, "n_embd": 32, "n_head": 4}),
    "t5": (
        "T5ForConditionalGeneration",
        {"vocab_size": 256, "d_model": 32, "d_ff": 64, "num_layers": 2, "num_heads": 4},
    ),
}


def _saved(tmp_path, name: str):
    cls_name, config = MODELS[name]
    cls = getattr(transformers, cls_name)
    torch.manual_seed(0)
    cls(cls.config_class(**config)).save_pretrained(tmp_path / name)
    return cls, cls.config_class(**config), tmp_path / name


def _meta(cls, config):
    with meta_parameters():
        return cls(config)


def _ties(model) -> dict[str, list[str]]:
    from jobctl.engine.model.graph.checks import tied_names

    return tied_names(model)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_parameter_equals_what_from_pretrained_loads(tmp_path, name):
    cls, config, directory = _saved(tmp_path, name)
    meta = _meta(cls, config)
    shapes = {n: tuple(p.shape) for n, p in meta.named_parameters()}
    check_pretrained(str(directory), meta, shapes, _ties(meta))
    got = read_pretrained(str(directory), {n: _ties(meta)[n] for n in shapes}, shapes, meta)
    loaded = cls.from_pretrained(directory).state_dict()
    assert sorted(got) == sorted(shapes)
    for n, t in got.items():
        assert torch.equal(t, loaded[n]), n


@pytest.mark.parametrize("name", ["mixtral", "qwen2_moe"])
def test_experts_are_fused_from_their_saved_modules(tmp_path, name):
    _, _, directory = _saved(tmp_path, name)
    disk = load_file(directory / "model.safetensors")
    assert any(".experts.3." in k for k in disk)  # one module per expert on disk
    assert not any(k.endswith("experts.gate_up_proj") for k in disk)


def test_a_converted_tensor_of_another_shape_names_its_disk_tensors(tmp_path):
    cls, config, directory = _saved(tmp_path, "mixtral")
    disk = load_file(directory / "model.safetensors")
    gone = [k for k in disk if ".layers.1.block_sparse_moe.experts.3." in k]
    save_file({k: v for k, v in disk.items() if k not in gone}, directory / "model.safetensors")
    meta = _meta(cls, config)
    shapes = {n: tuple(p.shape) for n, p in meta.named_parameters()}
    with pytest.raises(ModelSourceError) as e:
        check_pretrained(str(directory), meta, shapes, _ties(meta))
    text = str(e.value)
    assert "model.layers.1.mlp.experts" in text and "(3, " in text, text
    assert "block_sparse_moe.experts.0." in text and "more)" in text, text
    assert "config.json" in e.value.fix


def test_a_tensor_no_disk_name_makes_is_refused(tmp_path):
    cls, config, directory = _saved(tmp_path, "mixtral")
    disk = load_file(directory / "model.safetensors")
    gate = "model.layers.0.block_sparse_moe.gate.weight"
    save_file({k: v for k, v in disk.items() if k != gate}, directory / "model.safetensors")
    meta = _meta(cls, config)
    shapes = {n: tuple(p.shape) for n, p in meta.named_parameters()}
    with pytest.raises(ModelSourceError, match="no tensor 'model.layers.0.mlp.gate.weight'"):
        check_pretrained(str(directory), meta, shapes, _ties(meta))
