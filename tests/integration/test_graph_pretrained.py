"""``model.huggingface.pretrained``: a local directory written by ``save_pretrained``
(one safetensors file, or sharded with ``model.safetensors.index.json``) is where a
P=2 run's weights come from (issue 21): step 0's loss is the transformers model's own
loss on the same first batch, and training goes on from there. A family that
transformers saves in another layout than it holds in memory (Mixtral's experts, #54)
is read through the class's conversion mapping and exported back through it."""

from __future__ import annotations

import math

import pytest
import torch
import transformers
from safetensors import safe_open

from jobctl.engine.data.dataset import make_data
from jobctl.engine.worker.reference import reference_train

from ..jobrun import final_weights, run_cli, run_job, step_losses
from .test_graph_export import _fresh, _logits, _own_names
from .test_graph_models import LLAMA, MIXTRAL, STEPS, hf_spec


def save_llama(path, shard_size: str | None):
    """A tiny Llama whose weights no fresh init would make (every parameter x4, so its
    loss on random tokens is far from ln(vocab)), saved by save_pretrained."""
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA["config"]))
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(4.0)
    extra = {"max_shard_size": shard_size} if shard_size else {}
    model.save_pretrained(path, **extra)
    return path


@pytest.mark.multiproc
@pytest.mark.parametrize("shard_size", ["20KB"], ids=["sharded"])  # one file: the S3 test
def test_pretrained_llama_trains_from_its_weights(tmp_path, shard_size):
    directory = save_llama(tmp_path / "llama", shard_size)
    sharded = (directory / "model.safetensors.index.json").is_file()
    assert sharded == (shard_size is not None)
    assert len(list(directory.glob("*.safetensors"))) > (1 if sharded else 0)
    spec = hf_spec({"class": "LlamaForCausalLM", "pretrained": str(directory)}, 2, 1)

    run, outcome = run_job(spec, tmp_path)
    assert outcome.ok, outcome.message
    assert run.plan.P == 2
    losses = step_losses(run.dir)

    # The transformers model's own loss on the first global batch (causal LM: the
    # labels are the inputs, shifted by the model); micro-batches hold equal token
    # counts, so the mean of their means is this mean.
    tokens, _ = make_data(spec).batch(0, spec.training.global_batch_size)
    hf_model = transformers.LlamaForCausalLM.from_pretrained(directory).eval()
    with torch.no_grad():
        own = float(hf_model(input_ids=tokens, labels=tokens).loss)
    assert abs(own - math.log(LLAMA["config"]["vocab_size"])) > 0.5  # not a fresh init
    assert losses[0] == pytest.approx(own, abs=1e-5)
    assert losses[-1] < losses[0]
    ref_losses, _ = reference_train(spec)
    assert losses == pytest.approx(ref_losses, abs=1e-5)


@pytest.mark.multiproc
@pytest.mark.s3
def test_pretrained_from_an_s3_url(tmp_path, s3_url):
    # The same sharded directory uploaded to a real S3 server (moto): every process
    # copies it once into its state home and reads only its own tensors.
    import s3fs

    directory = save_llama(tmp_path / "llama", None)  # one model.safetensors
    url = f"{s3_url}/llama"
    s3fs.S3FileSystem(skip_instance_cache=True).put(str(directory), url, recursive=True)
    spec = hf_spec({"class": "LlamaForCausalLM", "pretrained": url}, 2, 1)
    run, outcome = run_job(spec, tmp_path)
    assert outcome.ok, outcome.message
    tokens, _ = make_data(spec).batch(0, spec.training.global_batch_size)
    hf_model = transformers.LlamaForCausalLM.from_pretrained(directory).eval()
    with torch.no_grad():
        own = float(hf_model(input_ids=tokens, labels=tokens).loss)
    assert step_losses(run.dir)[0] == pytest.approx(own, abs=1e-5)


def _own_loss(model, tokens: torch.Tensor, m: int) -> float:
    """transformers' own loss, one forward per micro-batch of ``m`` (the router's
    auxiliary loss is a statistic of one call's tokens), averaged."""
    with torch.no_grad():
        losses = [float(model(input_ids=t, labels=t).loss) for t in tokens.split(m)]
    return sum(losses) / len(losses)


@pytest.mark.multiproc
def test_pretrained_mixtral_trains_from_its_saved_experts_and_exports_them(tmp_path):
    # save_pretrained writes one module per expert (block_sparse_moe.experts.3.w1);
    # the model holds them fused (mlp.experts.gate_up_proj). P = 2 x D = 2.
    torch.manual_seed(0)
    model = transformers.MixtralForCausalLM(transformers.MixtralConfig(**MIXTRAL["config"]))
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(2.0)
    model.save_pretrained(tmp_path / "mixtral")
    spec = hf_spec({"class": MIXTRAL["class"], "pretrained": str(tmp_path / "mixtral")}, 2, 2)
    m = spec.training.micro_batch_size
    run, outcome = run_job(spec, tmp_path)
    assert outcome.ok, outcome.message
    assert (run.plan.P, run.plan.D, run.plan.micro_batch_size) == (2, 2, m)
    losses = step_losses(run.dir)
    tokens, _ = make_data(spec).batch(0, spec.training.global_batch_size)
    hf_model = transformers.MixtralForCausalLM.from_pretrained(tmp_path / "mixtral").eval()
    assert losses[0] == pytest.approx(_own_loss(hf_model, tokens, m), abs=1e-5)
    ref_losses, _ = reference_train(spec, micro_batch=m)
    assert losses == pytest.approx(ref_losses, abs=1e-5)

    out = tmp_path / "exported"
    r = run_cli(tmp_path, "export", run.id, "--format", "hf", "--out", str(out), timeout=300)
    assert r.returncode == 0, r.stderr
    with safe_open(str(out / "model.safetensors"), framework="pt") as handle:
        written = set(handle.keys())
    assert "model.layers.1.block_sparse_moe.experts.3.w1.weight" in written  # as saved
    loaded = transformers.MixtralForCausalLM.from_pretrained(out).eval()
    trained = _fresh(MIXTRAL, _own_names(final_weights(run.dir, STEPS)))
    probe = torch.randint(0, MIXTRAL["config"]["vocab_size"], (2, 16))
    torch.testing.assert_close(_logits(loaded, probe), _logits(trained, probe), atol=1e-6, rtol=0)
    assert (_logits(loaded, probe) - _logits(hf_model, probe)).abs().max() > 1e-2
