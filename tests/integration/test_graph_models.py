"""Unmodified Hugging Face models (Merak sec. 4): traced, sharded, trained like one process."""

from __future__ import annotations

import pytest
import torch

from jobctl.engine.worker.reference import reference_train

from ..jobrun import final_weights, run_job, step_losses, tiny_spec
from ..unit.test_hf_families import FAMILIES
from .test_parity import _run_and_compare

STEPS = 3
SGD = {"training.optimizer": "sgd", "training.lr": 0.3, "training.momentum": 0.9}
NO_DROPOUT = {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
GPT2 = {
    "class": "GPT2LMHeadModel",
    "config": {
        "n_layer": 3,
        "n_embd": 32,
        "n_head": 4,
        "vocab_size": 256,
        "n_positions": 32,
        **NO_DROPOUT,
    },
}
LLAMA = {
    "class": "LlamaForCausalLM",
    "config": {
        "num_hidden_layers": 3,
        "hidden_size": 32,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 64,
        "vocab_size": 256,
        "max_position_embeddings": 64,
    },
}
BERT = {
    "class": "BertForMaskedLM",
    "config": {
        "num_hidden_layers": 3,
        "hidden_size": 32,
        "num_attention_heads": 4,
        "intermediate_size": 64,
        "vocab_size": 256,
        "max_position_embeddings": 64,
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
    },
}
T5 = {
    "class": "T5ForConditionalGeneration",
    "config": {
        "num_layers": 2,
        "num_decoder_layers": 2,
        "d_model": 32,
        "d_kv": 8,
        "num_heads": 4,
        "d_ff": 64,
        "vocab_size": 256,
        "dropout_rate": 0.0,
        "decoder_start_token_id": 0,
        "pad_token_id": 0,
    },
}

# #54: a tensor lifted out of forward (Falcon), a table built at construction (GPT-J),
# mixture of experts whose carrier holds the token permutation (Mixtral).
FALCON = {"class": "FalconForCausalLM", "config": FAMILIES["falcon"][1]}
GPTJ = {"class": "GPTJForCausalLM", "config": FAMILIES["gptj"][1]}
MIXTRAL = {"class": "MixtralForCausalLM", "config": FAMILIES["mixtral"][1]}


def hf_spec(model: dict, P: int, D: int, **extra):
    """The quickstart job with a Hugging Face model instead of the builtin GPT."""
    return tiny_spec(
        **{
            "model.family": None,
            "model.huggingface": model,
            "training.steps": STEPS,
            "checkpoint.interval": STEPS,
            "parallelism.pipeline_stages": P,
            "parallelism.data_parallel": D,
            "hardware.processes_per_node": P * D,
            **SGD,
            **extra,
        }
    )


def run_and_compare(tmp_path, spec, atol: float = 1e-5, falls: bool = True):
    """``test_parity``'s check: losses and final weights equal one process's (with
    ``falls``, 3 steps lower the loss; masked-LM's fresh masks each step on random
    tokens leave its loss flat within noise, so there only equality counts)."""
    return _run_and_compare(tmp_path, spec, atol, falls)


@pytest.mark.multiproc
def test_tied_gpt2_two_stages_equals_one_process(tmp_path, monkeypatch):
    # The cut carries the hidden state and the attention mask (bool) in one message,
    # here through gloo (JOBCTL_P2P=gloo); every other run here uses shared memory.
    monkeypatch.setenv("JOBCTL_P2P", "gloo")  # inherited by the spawned ranks
    run = run_and_compare(tmp_path, hf_spec(GPT2, 2, 1))
    assert run.plan.P == 2


@pytest.mark.multiproc
@pytest.mark.parametrize(
    ("model", "P", "D"),
    [
        (BERT, 3, 1),
        (T5, 2, 2),
        (LLAMA, 2, 2),
        (GPT2, 3, 1),
        (FALCON, 2, 2),
        (GPTJ, 2, 2),
    ],
    ids=["bert-3x1", "t5-2x2", "llama-2x2", "gpt2-3x1", "falcon-2x2", "gptj-2x2"],
)
def test_families_equal_one_process(tmp_path, model, P, D):
    run = run_and_compare(tmp_path, hf_spec(model, P, D), falls=model is not BERT)
    assert (run.plan.P, run.plan.D) == (P, D)


@pytest.mark.multiproc
def test_tied_gpt2_resumes_into_another_layout(tmp_path):
    # Two steps as 2 stages, then steps 3-4 as 3 stages from its checkpoint (a morph's
    # path): the subgraphs' checkpoints are layout-independent, as the builtin's are.
    first = hf_spec(GPT2, 2, 1, **{"training.steps": 2, "checkpoint.interval": 1})
    run, outcome = run_job(first, tmp_path / "first")
    assert outcome.ok, outcome.message
    ckpt = run.dir / "checkpoints" / "step-00000002"
    second = hf_spec(GPT2, 3, 1, **{"training.steps": 4, "checkpoint.interval": 2})
    ref_losses, ref_weights = reference_train(second)
    assert step_losses(run.dir) == pytest.approx(ref_losses[:2], abs=1e-5)
    run, outcome = run_job(second, tmp_path / "second", resume_dir=ckpt)
    assert outcome.ok, outcome.message
    assert step_losses(run.dir) == pytest.approx(ref_losses[2:], abs=1e-5)
    weights = final_weights(run.dir, 4)
    for name, w in ref_weights.items():
        torch.testing.assert_close(weights[name], w, atol=1e-5, rtol=0, msg=name)


@pytest.mark.multiproc
def test_named_loss_trains_the_logits_like_one_process(tmp_path):
    # model.loss: next_token -- the model is traced without labels, the last stage takes
    # its logits and computes the builtin GPT's loss against the next tokens.
    run = run_and_compare(tmp_path, hf_spec(LLAMA, 2, 1, **{"model.loss": "next_token"}))
    assert run.plan.P == 2


VIT = {
    "class": "ViTForImageClassification",
    "config": {
        "num_hidden_layers": 3,
        "hidden_size": 32,
        "num_attention_heads": 4,
        "intermediate_size": 64,
        "image_size": 16,
        "patch_size": 4,
        "num_labels": 4,
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
    },
}


@pytest.mark.multiproc
def test_vit_on_synthetic_images_equals_one_process(tmp_path):
    # Seeded images whose label is their brightest band: the model's own loss, 2 stages
    # (3 steps of fresh images move its loss within noise: equality is what counts).
    run = run_and_compare(tmp_path, hf_spec(VIT, 2, 1), falls=False)
    assert run.plan.P == 2


@pytest.mark.multiproc
def test_llama_under_zb_v_equals_one_process(tmp_path):
    # ZB-V on a traced model: 2 ranks host 4 stages in V shape; stages 1 and 2 share a
    # rank and hand their carrier (hidden states, position embeddings, mask) over in
    # memory, its layout taken from the stage that fills it.
    run = run_and_compare(tmp_path, hf_spec(LLAMA, 2, 1, **{"parallelism.schedule": "zb_v"}))
    assert (run.plan.schedule, len(run.plan.stages), run.plan.placement) == (
        "zb_v",
        4,
        [[0, 3], [1, 2]],
    )


@pytest.mark.multiproc
def test_mixture_of_experts_equals_one_process_of_the_same_micro_batches(tmp_path):
    """Mixtral at P = 2 x D = 2: the carrier holds each layer's token permutation (the
    start-up probe runs every stage on what the one before computed, not zeros) and
    the router's auxiliary loss. That loss is a statistic of one forward call's tokens
    (transformers computes it per call), so it is per micro-batch, as a one-process
    gradient-accumulation loop of the same micro-batches computes it: the reference
    here runs the plan's micro-batches, not the whole batch at once."""
    spec = hf_spec(MIXTRAL, 2, 2)
    m = spec.training.micro_batch_size
    ref_losses, ref_weights = reference_train(spec, micro_batch=m)
    run, outcome = run_job(spec, tmp_path)
    assert outcome.ok, outcome.message
    assert (run.plan.P, run.plan.D, run.plan.micro_batch_size) == (2, 2, m)
    assert step_losses(run.dir) == pytest.approx(ref_losses, abs=1e-5)
    weights = final_weights(run.dir, STEPS)
    for name, w in ref_weights.items():
        torch.testing.assert_close(weights[name], w, atol=1e-5, rtol=0, msg=name)
