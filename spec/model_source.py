"""Where an unmodified model comes from: a local Hugging Face model (``model.huggingface``).

Everything is a local path (or an fsspec URL copied to local disk first): jobctl
never downloads from the hub. ``class`` names a ``transformers`` model class;
exactly one of ``config`` (the config's fields inline), ``config_path`` (a
config.json) or ``pretrained`` (a directory written by ``save_pretrained``: config.json
plus ``*.safetensors``, sharded index included) gives its shape.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, StringConstraints

from .base import SpecModel, Violation
from .files import read_regular

CLASS_PATTERN = r"^[A-Z][A-Za-z0-9_]*$"
#: What a traced model is trained to do; ``auto`` infers it from the class name.
Task = Literal["causal_lm", "masked_lm", "seq2seq", "image_classification"]
LOSS_PATTERN = r"^(auto|next_token|cross_entropy|[A-Za-z_][\w.]*:[A-Za-z_]\w*)$"
#: A traced model's loss: its own, a named one, or ``pkg.module:fn(logits, batch)``.
LossName = Annotated[str, StringConstraints(pattern=LOSS_PATTERN)]


class HuggingFaceSpec(SpecModel):
    """A ``transformers`` model class with its config or local pretrained weights."""

    class_: str = Field(
        ...,
        alias="class",
        description="transformers model class, e.g. GPT2LMHeadModel or LlamaForCausalLM.",
        json_schema_extra={"pattern": CLASS_PATTERN},
    )
    config: dict[str, Any] | None = Field(
        None, description="The model config's fields inline (e.g. num_hidden_layers: 4)."
    )
    config_path: str | None = Field(None, description="Path of a config.json for the class.")
    pretrained: str | None = Field(
        None,
        description="Local directory from save_pretrained (config.json + *.safetensors); "
        "training starts from its weights.",
    )

    def _violations(self) -> Iterator[Violation]:
        given = [k for k in ("config", "config_path", "pretrained") if getattr(self, k)]
        if len(given) != 1:
            yield Violation(
                "config",
                f"model.huggingface needs exactly one of config, config_path, pretrained "
                f"(got {', '.join(given) or 'none'})",
                "give the config inline, a config.json path, or a pretrained directory",
            )


def hf_vocab(hf: dict) -> int | None:
    """The config's ``vocab_size`` (inline, or in a readable config.json), or None."""
    config = hf.get("config")
    if not isinstance(config, dict):
        path = hf.get("config_path") or (
            str(Path(hf["pretrained"]) / "config.json") if hf.get("pretrained") else None
        )
        try:
            config = json.loads(read_regular(path)) if path else None
        except (OSError, ValueError):
            return None  # validate reports the missing or broken file
    vocab = config.get("vocab_size") if isinstance(config, dict) else None
    return vocab if isinstance(vocab, int) and vocab >= 2 else None


def hf_defaults(data):
    """A ``model`` section with a ``huggingface`` model: no builtin family, and the
    config's vocabulary (what the data's token ids range over) unless given."""
    hf = data.get("huggingface") if isinstance(data, dict) else None
    if hf is None:
        return data
    data = data if "family" in data else {**data, "family": None}
    vocab = hf_vocab(hf) if isinstance(hf, dict) and "vocab" not in data else None
    return data if vocab is None else {**data, "vocab": vocab}


def hf_violations(model) -> Iterator[Violation]:
    """A ``model`` section's conflicts around ``huggingface``."""
    if model.huggingface is None:
        return
    if model.import_ is not None:
        yield Violation(
            "huggingface",
            "`import` and `huggingface` are exclusive: give one model",
            "remove model.import or model.huggingface",
        )
    vocab = hf_vocab(model.huggingface.model_dump(by_alias=True))
    if vocab and vocab != model.vocab:
        yield Violation(
            "vocab",
            f"model.vocab {model.vocab} differs from the config's vocab_size {vocab}",
            "remove model.vocab (a Hugging Face model takes its config's vocab_size)",
        )
