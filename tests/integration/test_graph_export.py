"""``jobctl export RUN --format hf``: a traced Hugging Face run's newest checkpoint as a
directory that ``from_pretrained`` loads, with the trained model's logits (issue 21):
GPT-2's tied embedding and LM head, and T5's four names of one shared embedding."""

from __future__ import annotations

import pytest
import torch
import transformers

from jobctl.engine.model.blocks import Stage, model_def

from ..jobrun import final_weights, run_cli, run_job
from .test_graph_models import GPT2, STEPS, T5, hf_spec


def _own_names(full: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``layers.<subgraph>.<name>`` -> ``<name>``."""
    return {n.split(".", 2)[2]: t for n, t in full.items()}


def _fresh(model: dict, state: dict[str, torch.Tensor]):
    """The test's model built by transformers from its config, holding ``state``; a
    tied name left out of ``state`` must share the tensor of one that is in it."""
    cls = getattr(transformers, model["class"])
    fresh = cls(cls.config_class(**model["config"]))
    missing, unexpected = fresh.load_state_dict(state, strict=False)
    assert unexpected == [], unexpected
    loaded = {fresh.get_parameter(n).data_ptr() for n in state}
    assert all(fresh.get_parameter(n).data_ptr() in loaded for n in missing), missing
    return fresh.eval()


def _logits(model, tokens: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        if model.config.is_encoder_decoder:
            return model(input_ids=tokens, decoder_input_ids=tokens.flip(1)).logits
        return model(input_ids=tokens).logits


@pytest.mark.multiproc
@pytest.mark.parametrize("model", [GPT2, T5], ids=["gpt2-tied", "t5-shared"])
def test_export_hf_round_trip_has_the_trained_logits(tmp_path, model):
    spec = hf_spec(model, 2, 1)
    run, outcome = run_job(spec, tmp_path)
    assert outcome.ok, outcome.message
    out = tmp_path / "exported"
    r = run_cli(tmp_path, "export", run.id, "--format", "hf", "--out", str(out), timeout=300)
    assert r.returncode == 0, r.stderr
    assert f"from step {STEPS}" in r.stdout
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()

    loaded = getattr(transformers, model["class"]).from_pretrained(out).eval()
    ties = {
        n
        for n, p in loaded.named_parameters(remove_duplicate=False)
        if p.data_ptr() == loaded.get_input_embeddings().weight.data_ptr()
    }
    assert len(ties) == (2 if model is GPT2 else 4), ties  # tied again on loading
    trained = _fresh(model, _own_names(final_weights(run.dir, STEPS)))
    mdef = model_def(spec.model, spec.training.seed, spec.training.micro_batch_size)
    start = Stage(mdef, range(mdef.num_blocks))  # the weights training started from
    initial = _fresh(model, _own_names(dict(start.named_parameters())))

    seeded = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, model["config"]["vocab_size"], (2, 16), generator=seeded)
    got, want = _logits(loaded, tokens), _logits(trained, tokens)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    moved = (got - _logits(initial, tokens)).abs().max().item()
    assert moved > 1e-2, moved
