"""#54: a masked LM masks with the token it learned as its mask, or is refused. A
``BertConfig`` has no ``mask_token_id``, so a pretrained BERT was masked with its last
id (30521, not [MASK] = 103): a different task, trained silently. The id now comes from
``model.mask_token_id``, the config, or the tokenizer saved beside the pretrained
weights (read from its JSON files); a pretrained masked LM with none is refused at
``validate``, naming the data tokenizer's mask id where there is one."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from jobctl.engine.cli.app import app
from jobctl.engine.model.blocks import model_def
from jobctl.engine.model.graph.batch import model_inputs
from jobctl.engine.model.graph.mask_token import tokenizer_mask_id
from jobctl.spec import load_spec

from .test_graph_validate import _validate_fails, quickstart_with

runner = CliRunner()
BERT = {
    "num_hidden_layers": 2,
    "hidden_size": 16,
    "num_attention_heads": 2,
    "intermediate_size": 32,
    "vocab_size": 256,
    "max_position_embeddings": 64,
    "hidden_dropout_prob": 0.0,
    "attention_probs_dropout_prob": 0.0,
}
WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(251)]


def _tokenizer(folder, mask: str = "[MASK]", words=WORDS) -> None:
    """A word-level fast tokenizer whose mask token is ``mask``, saved to ``folder``."""
    import tokenizers
    import transformers

    vocab = {w: i for i, w in enumerate(words)}
    model = tokenizers.models.WordLevel(vocab, unk_token="[UNK]")
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizers.Tokenizer(model), unk_token="[UNK]", mask_token=mask
    )
    fast.save_pretrained(folder)


@pytest.fixture(scope="module")
def saved_bert(tmp_path_factory):
    """A tiny BertForMaskedLM written by save_pretrained (no tokenizer beside it)."""
    import transformers

    path = tmp_path_factory.mktemp("bert")
    transformers.BertForMaskedLM(transformers.BertConfig(**BERT)).save_pretrained(path)
    return path


def _copy(src, dst):
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def _job(tmp_path, pretrained, extra: str = ""):
    model = f"  huggingface:\n    class: BertForMaskedLM\n    pretrained: {pretrained}{extra}"
    return quickstart_with(tmp_path / "job.yaml", ("  family: gpt", model))


def _masked_with(job) -> set[int]:
    """The ids a training batch of ``job``'s model puts where it masks."""
    spec = load_spec(job)
    graph = model_def(spec.model, spec.training.seed).graph
    x = torch.randint(5, 256, (2, 32))
    batch = model_inputs(graph.task, x, x, 0, 0, graph.mask_id, graph.config)
    return set(batch["input_ids"][batch["labels"] != -100].tolist())


def test_a_pretrained_bert_without_a_mask_token_is_refused(tmp_path, saved_bert):
    _validate_fails(_job(tmp_path, saved_bert), "pretrained:", "model.mask_token_id")


def test_the_refusal_names_the_data_tokenizers_mask_id(tmp_path, saved_bert):
    _tokenizer(tmp_path / "tok")
    lines = [
        json.dumps({"text": " ".join(f"w{i % 59}" for i in range(k, k + 200))}) for k in range(40)
    ]
    (tmp_path / "d.jsonl").write_text("\n".join(lines) + "\n")
    job = _job(tmp_path, saved_bert)
    data = f"data:\n  source: hf\n  path: {tmp_path / 'd.jsonl'}\n  tokenizer: {tmp_path / 'tok'}\n"
    job.write_text(job.read_text().replace("data:\n  source: synthetic\n", data))
    assert "source: hf" in job.read_text()
    out = _validate_fails(job, "pretrained:", "model.mask_token_id")
    assert "data.tokenizer's mask token is 4" in out


def test_the_tokenizer_saved_beside_the_weights_gives_the_mask(tmp_path, saved_bert):
    folder = _copy(saved_bert, tmp_path / "bert")
    _tokenizer(folder)
    assert tokenizer_mask_id(str(folder)) == 4
    job = _job(tmp_path, folder)
    r = runner.invoke(app, ["validate", str(job)])
    assert r.exit_code == 0, r.output
    assert _masked_with(job) == {4}  # was {255}: the last id


def test_a_roberta_style_mask_in_tokenizer_json_only(tmp_path):
    words = ["<s>", "<pad>", "</s>", "<unk>"] + [f"w{i}" for i in range(251)] + ["<mask>"]
    _tokenizer(tmp_path, mask="<mask>", words=words)
    (tmp_path / "tokenizer_config.json").unlink()
    assert tokenizer_mask_id(str(tmp_path)) == 255


def test_the_spec_and_the_config_name_it_first(tmp_path, saved_bert):
    job = _job(tmp_path, saved_bert, "\n  mask_token_id: 7")
    assert runner.invoke(app, ["validate", str(job)]).exit_code == 0
    assert _masked_with(job) == {7}
    folder = _copy(saved_bert, tmp_path / "bert")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "mask_token_id": 9}))
    assert _masked_with(_job(tmp_path, folder)) == {9}
    bad = _job(tmp_path, saved_bert, "\n  mask_token_id: 256")
    _validate_fails(bad, "mask_token_id:", "outside model.vocab 256")


def test_a_model_trained_from_scratch_masks_with_its_last_id(tmp_path):
    model = f"  huggingface:\n    class: BertForMaskedLM\n    config: {json.dumps(BERT)}"
    job = quickstart_with(tmp_path / "job.yaml", ("  family: gpt", model))
    assert _masked_with(job) == {255}


def test_a_pretrained_causal_lm_needs_no_mask_token(tmp_path):
    """Only a masked LM asks for a mask id: a pretrained causal LM with no tokenizer
    beside it builds its batches (the first version asked every task, and failed)."""
    import transformers

    gpt2 = {"n_layer": 2, "n_embd": 16, "n_head": 2, "vocab_size": 256, "n_positions": 32}
    transformers.GPT2LMHeadModel(transformers.GPT2Config(**gpt2)).save_pretrained(tmp_path / "g")
    model = f"  huggingface:\n    class: GPT2LMHeadModel\n    pretrained: {tmp_path / 'g'}"
    spec = load_spec(quickstart_with(tmp_path / "job.yaml", ("  family: gpt", model)))
    graph = model_def(spec.model, spec.training.seed).graph
    assert graph.mask_id is None
    x = torch.randint(0, 256, (2, 32))
    assert graph.runner([0]).batch(x, x, 0)["labels"] is x
