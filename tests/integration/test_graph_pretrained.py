"""``model.huggingface.pretrained``: a local directory written by ``save_pretrained``
(one safetensors file, or sharded with ``model.safetensors.index.json``) is where a
P=2 run's weights come from (issue 21): step 0's loss is the transformers model's own
loss on the same first batch, and training goes on from there."""

from __future__ import annotations

import math

import pytest
import torch
import transformers

from jobctl.engine.data.dataset import make_data
from jobctl.engine.worker.reference import reference_train

from ..jobrun import run_job, step_losses
from .test_graph_models import LLAMA, hf_spec


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
