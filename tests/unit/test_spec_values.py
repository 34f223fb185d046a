"""Spec values that raised tracebacks are located errors with a fix (#46 item 3).

Before, a Hugging Face config value of the wrong type (``num_key_value_heads: café``,
``[2]``, ``max_position_embeddings: true``) raised huggingface_hub's
``StrictDataclassFieldValidationError`` through ``checks._check_shapes`` (exit 1, a
traceback), and ``training.steps`` with 5,000 digits raised Python's int-conversion
limit inside the YAML loader. Now each is an issue at the key's file:line, exit 2.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from jobctl.engine.cli.app import app
from jobctl.spec import SpecError, load_spec_text

from ..spec_texts import MINIMAL

HF_LLAMA = Path(__file__).resolve().parents[2] / "jobs" / "hf-llama.yaml"
runner = CliRunner()


def _validate(path: Path):
    result = runner.invoke(app, ["validate", str(path)])
    assert isinstance(result.exception, SystemExit), repr(result.exception)  # no traceback
    assert result.exit_code == 2, result.output
    return result.output


def _line_of(text: str, key: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if f"{key}:" in line)


@pytest.mark.parametrize(
    ("key", "value", "kind"),
    [
        ("num_key_value_heads", "café", "str"),
        ("num_key_value_heads", "[2]", "list"),
        ("max_position_embeddings", "true", "bool"),
    ],
)
def test_a_wrongly_typed_hf_config_value_is_located_with_a_fix(tmp_path, key, value, kind):
    text = HF_LLAMA.read_text()
    lines = [
        f"{line.split(':')[0]}: {value}" if line.strip().startswith(f"{key}:") else line
        for line in text.splitlines()
    ]
    path = tmp_path / "job.yaml"
    path.write_text("\n".join(lines) + "\n")
    out = " ".join(_validate(path).split())
    line = _line_of(path.read_text(), key)
    assert f"{path}:{line}:" in out and f"model.huggingface.config.{key}:" in out, out
    assert f"fix: set {key} to a value of type int (it is a {kind})" in out
    assert "StrictDataclass" not in out


def test_a_count_of_5000_digits_is_located_not_a_traceback(tmp_path):
    text = MINIMAL.replace("steps: 10", "steps: " + "9" * 5000)
    with pytest.raises(SpecError) as caught:
        load_spec_text(text, "job.yaml")
    (issue,) = caught.value.errors  # one issue: not also "a valid integer, got None"
    assert (issue.line, issue.path) == (_line_of(text, "steps"), "training.steps")
    assert "too long" in issue.message and issue.fix and "digits" in issue.fix
    path = tmp_path / "job.yaml"
    path.write_text(text)
    assert f"{path}:{issue.line}:" in _validate(path)


def test_a_wrong_value_inside_a_config_path_json_names_its_own_line(tmp_path):
    """#46 item 3, the rest: a wrong value inside ``config_path``'s JSON was reported
    at the spec's config_path line only; the message now names the key's own
    file:line:column in the JSON."""
    import json

    config = {
        "num_hidden_layers": 4,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": "café",
        "intermediate_size": 128,
        "vocab_size": 256,
        "max_position_embeddings": 64,
    }
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(config, indent=2) + "\n")
    text = HF_LLAMA.read_text()
    start = text.index("    config:")
    end = text.index("  seq_len:")
    path = tmp_path / "job.yaml"
    path.write_text(text[:start] + f"    config_path: {cfg}\n" + text[end:])
    out = " ".join(_validate(path).split())
    json_line = _line_of(cfg.read_text(), '"num_key_value_heads"')
    assert f"(at {cfg}:{json_line}:3)" in out, out
    assert f"{path}:{_line_of(path.read_text(), 'config_path')}:" in out
    assert "fix: set num_key_value_heads to a value of type int (it is a str)" in out
