"""Where an unmodified model comes from: a local Hugging Face model (``model.huggingface``).

Everything is a local path (or an fsspec URL copied to local disk first): jobctl
never downloads from the hub. ``class`` names a ``transformers`` model class;
exactly one of ``config`` (the config's fields inline), ``config_path`` (a
config.json) or ``pretrained`` (a directory written by ``save_pretrained``: config.json
plus ``*.safetensors``, sharded index included) gives its shape.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal

from pydantic import Field

from .base import SpecModel, Violation

CLASS_PATTERN = r"^[A-Z][A-Za-z0-9_]*$"
#: What a traced model is trained to do; ``auto`` infers it from the class name.
Task = Literal["causal_lm", "masked_lm", "seq2seq"]


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
