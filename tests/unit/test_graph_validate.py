"""Bad unmodified-model sources fail at ``jobctl validate`` (exit 2), located at the
``model`` field to fix with a fix, before anything starts (issue 21): a class that is
not a transformers class, a missing config_path, a pretrained directory without
config.json or safetensors or saved from another config, and a factory that cannot be
imported, raises, or returns neither an nn.Module nor a list of them."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from jobctl.engine.cli.app import app

from ..jobrun import quickstart_with

runner = CliRunner()
GPT2 = {"n_layer": 2, "n_embd": 16, "n_head": 2, "vocab_size": 256, "n_positions": 32}
HERE = "tests.unit.test_graph_validate"


def tiny_module(width: int = 8) -> torch.nn.Module:
    """A factory that works: an ordinary module."""
    return torch.nn.Linear(width, width)


def raising_factory(width: int = 8) -> torch.nn.Module:
    raise RuntimeError(f"width {width} is not supported")


def dict_factory() -> dict:
    return {"weight": torch.zeros(2)}


def list_of_ints_factory() -> list:
    return [1, 2]


def _spec(tmp_path, model_yaml: str):
    """jobs/quickstart.yaml with ``model_yaml`` (indented lines) in place of the family."""
    return quickstart_with(tmp_path / "job.yaml", ("  family: gpt", model_yaml))


def _hf_yaml(cls: str = "GPT2LMHeadModel", **source: str) -> str:
    key, value = next(iter(source.items()))
    return f"  huggingface:\n    class: {cls}\n    {key}: {value}"


def _validate_fails(path, key: str, *words: str) -> str:
    """Run ``jobctl validate``; it must exit 2 at the line of ``key`` with a fix."""
    r = runner.invoke(app, ["validate", str(path)])
    assert r.exit_code == 2, r.output
    line = next(i for i, t in enumerate(path.read_text().splitlines(), 1) if key in t)
    assert f"{path}:{line}:" in r.output, r.output
    assert "fix:" in r.output
    assert "Traceback" not in r.output
    for word in words:
        assert word in r.output, r.output
    return r.output


@pytest.fixture(scope="module")
def saved_gpt2(tmp_path_factory):
    """A tiny GPT-2 directory written by save_pretrained."""
    import transformers

    path = tmp_path_factory.mktemp("gpt2")
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**GPT2))
    model.save_pretrained(path)
    return path


def _copy_dir(src, dst, skip: str = "", config: dict | None = None):
    dst.mkdir()
    for f in src.iterdir():
        if not f.name.endswith(skip) or not skip:
            (dst / f.name).write_bytes(f.read_bytes())
    if config is not None:
        data = json.loads((dst / "config.json").read_text())
        (dst / "config.json").write_text(json.dumps({**data, **config}))
    return dst


def test_good_sources_validate(tmp_path, saved_gpt2):
    for model in (
        _hf_yaml(config=json.dumps(GPT2)),
        _hf_yaml(pretrained=str(saved_gpt2)),
        f'  import: "{HERE}:tiny_module"\n  import_args: {{width: 4}}',
    ):
        r = runner.invoke(app, ["validate", str(_spec(tmp_path, model))])
        assert r.exit_code == 0, (model, r.output)


def test_class_that_is_not_a_transformers_class(tmp_path):
    path = _spec(tmp_path, _hf_yaml("GPT2LMHeadModle", config=json.dumps(GPT2)))
    _validate_fails(path, "class:", "model.huggingface.class", "GPT2LMHeadModle")


def test_config_path_missing(tmp_path):
    missing = tmp_path / "nowhere" / "config.json"
    path = _spec(tmp_path, _hf_yaml(config_path=str(missing)))
    _validate_fails(path, "config_path:", "model.huggingface.config_path", "cannot be read")


def test_pretrained_without_config_json(tmp_path, saved_gpt2):
    bad = _copy_dir(saved_gpt2, tmp_path / "bad", skip="config.json")
    path = _spec(tmp_path, _hf_yaml(pretrained=str(bad)))
    _validate_fails(path, "pretrained:", "model.huggingface.pretrained", "no config.json")


def test_pretrained_without_safetensors(tmp_path, saved_gpt2):
    bad = _copy_dir(saved_gpt2, tmp_path / "bad", skip=".safetensors")
    path = _spec(tmp_path, _hf_yaml(pretrained=str(bad)))
    _validate_fails(path, "pretrained:", "has no *.safetensors")


def test_pretrained_saved_from_another_config(tmp_path, saved_gpt2):
    bad = _copy_dir(saved_gpt2, tmp_path / "bad", config={"n_embd": 32})
    path = _spec(tmp_path, _hf_yaml(pretrained=str(bad)))
    _validate_fails(path, "pretrained:", "has shape (256, 16)", "makes (256, 32)")


def test_factory_that_cannot_be_imported(tmp_path):
    path = _spec(tmp_path, '  import: "tests.no_such_module:build"')
    _validate_fails(path, "import:", "model.import", "cannot be imported", "no_such_module")


def test_factory_that_raises(tmp_path):
    path = _spec(tmp_path, f'  import: "{HERE}:raising_factory"\n  import_args: {{width: 3}}')
    _validate_fails(path, "import:", "raised RuntimeError", "width 3 is not supported")


@pytest.mark.parametrize(
    ("factory", "kind"), [("dict_factory", "returned dict"), ("list_of_ints_factory", "of int")]
)
def test_factory_returning_no_module(tmp_path, factory, kind):
    path = _spec(tmp_path, f'  import: "{HERE}:{factory}"')
    _validate_fails(path, "import:", kind, "not an nn.Module")


def test_relative_pretrained_resolves_against_the_spec_folder(tmp_path, saved_gpt2):
    _copy_dir(saved_gpt2, tmp_path / "weights")
    path = _spec(tmp_path, _hf_yaml(pretrained="weights"))
    r = runner.invoke(app, ["validate", str(path)])  # from the repository, not tmp_path
    assert r.exit_code == 0, r.output
    from jobctl.spec import load_spec

    assert load_spec(path).model.huggingface.pretrained == str(tmp_path / "weights")


def test_image_model_needs_the_synthetic_image_source(tmp_path):
    config = json.dumps(
        {
            "num_hidden_layers": 1,
            "hidden_size": 16,
            "num_attention_heads": 2,
            "intermediate_size": 32,
            "image_size": 8,
            "patch_size": 4,
        }
    )
    model = f"  huggingface:\n    class: ViTForImageClassification\n    config: {config}"
    path = _spec(tmp_path, model)
    path.write_text(path.read_text().replace("source: synthetic", "source: text\n  path: x.txt"))
    (tmp_path / "x.txt").write_text("hello " * 2000)
    _validate_fails(path, "source: text", "trains on images", "data.source")
