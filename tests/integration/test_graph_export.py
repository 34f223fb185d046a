"""``jobctl export RUN --format hf``: a traced Hugging Face run's newest checkpoint as a
directory that ``from_pretrained`` loads, with the trained model's logits (issue 21)."""

from __future__ import annotations

import pytest
import torch

from jobctl.engine.model.blocks import Stage, model_def

from ..jobrun import final_weights, run_cli, run_job
from .test_graph_models import GPT2, STEPS, hf_spec

transformers = pytest.importorskip("transformers")


def _own_names(full: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``layers.<subgraph>.<name>`` -> ``<name>``."""
    return {n.split(".", 2)[2]: t for n, t in full.items()}


def _fresh_gpt2(state: dict[str, torch.Tensor]):
    """A GPT-2 built by transformers from the test's config, holding ``state``."""
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**GPT2["config"]))
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert unexpected == [] and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    assert model.lm_head.weight is model.transformer.wte.weight  # tied: loaded with wte
    return model.eval()


def _logits(model, tokens: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=tokens).logits


@pytest.mark.multiproc
def test_export_hf_round_trip_has_the_trained_logits(tmp_path):
    spec = hf_spec(GPT2, 2, 1)
    run, outcome = run_job(spec, tmp_path)
    assert outcome.ok, outcome.message
    out = tmp_path / "exported"
    r = run_cli(tmp_path, "export", run.id, "--format", "hf", "--out", str(out), timeout=300)
    assert r.returncode == 0, r.stderr
    assert f"from step {STEPS}" in r.stdout
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()

    loaded = transformers.GPT2LMHeadModel.from_pretrained(out).eval()
    assert loaded.lm_head.weight.data_ptr() == loaded.transformer.wte.weight.data_ptr()
    trained = _fresh_gpt2(_own_names(final_weights(run.dir, STEPS)))
    mdef = model_def(spec.model, spec.training.seed, spec.training.micro_batch_size)
    initial = _fresh_gpt2(_own_names(dict(Stage(mdef, range(mdef.num_blocks)).named_parameters())))

    seeded = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, GPT2["config"]["vocab_size"], (2, 16), generator=seeded)
    got, want = _logits(loaded, tokens), _logits(trained, tokens)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    moved = (got - _logits(initial, tokens)).abs().max().item()
    assert moved > 1e-2, moved
