"""``jobctl export`` refuses what has no Hugging Face format, with exit 2 and a fix:
the builtin family, hand-cut blocks, a run without a checkpoint (issue 21); and the
checkpoint's names become the model's own (tests/integration/test_graph_export.py
round-trips a trained run)."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from jobctl.engine.checkpoint.export import ExportError, model_state
from jobctl.engine.cli.app import app
from jobctl.engine.state.db import StateDB
from jobctl.spec import dump_yaml

from ..jobrun import tiny_spec

runner = CliRunner()
GPT2 = {
    "class": "GPT2LMHeadModel",
    "config": {"n_layer": 2, "n_embd": 16, "n_head": 2, "vocab_size": 256, "n_positions": 32},
}


def hand_cut_blocks() -> list[torch.nn.Module]:
    """The hand-cut form: a list of blocks."""
    return [torch.nn.Embedding(256, 8), torch.nn.Linear(8, 256)]


def _export(tmp_path, spec) -> str:
    """Record a run of ``spec`` with no checkpoint and export it; must exit 2."""
    run_dir = tmp_path / "runs" / "r-1"
    run_dir.mkdir(parents=True)
    (run_dir / "spec.yaml").write_text(dump_yaml(spec))
    StateDB(tmp_path).create_run("r-1", spec.name, run_dir, total_steps=3)
    out = tmp_path / "out"
    r = runner.invoke(app, ["export", "r-1", "--out", str(out), "--home", str(tmp_path)])
    assert r.exit_code == 2, r.output
    assert "fix:" in r.output and "Traceback" not in r.output
    assert not out.exists()
    return r.output


def test_builtin_family_is_refused(tmp_path):
    assert "builtin model family has no Hugging Face format" in _export(tmp_path, tiny_spec())


def test_hand_cut_blocks_are_refused(tmp_path):
    spec = tiny_spec(
        **{"model.family": None, "model.import": "tests.unit.test_export:hand_cut_blocks"}
    )
    assert "returned list, not an nn.Module" in _export(tmp_path, spec)


def test_run_without_checkpoint_is_refused(tmp_path):
    spec = tiny_spec(**{"model.family": None, "model.huggingface": GPT2})
    assert "run r-1 has no complete checkpoint" in _export(tmp_path, spec)


def test_unknown_run_and_format_exit_2(tmp_path):
    r = runner.invoke(app, ["export", "nope", "--out", str(tmp_path), "--home", str(tmp_path)])
    assert r.exit_code == 2 and "no run 'nope'" in r.output
    r = runner.invoke(app, ["export", "nope", "--out", str(tmp_path), "--format", "onnx"])
    assert r.exit_code == 2


def test_checkpoint_names_become_the_models_own():
    wte = torch.ones(4, 2)
    full = {"layers.0.transformer.wte.weight": wte, "layers.3.transformer.ln_f.bias": wte[0]}
    own = model_state(full)
    assert sorted(own) == ["transformer.ln_f.bias", "transformer.wte.weight"]
    assert own["transformer.wte.weight"] is wte
    with pytest.raises(ExportError, match="two different values of 'a.w'"):
        model_state({"layers.0.a.w": wte, "layers.2.a.w": wte * 2})
