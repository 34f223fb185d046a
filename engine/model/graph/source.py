"""Building a user's model without memory: an import factory or a Hugging Face class.

Parameters are created on the meta device while buffers stay real (they are small
and some, such as rotary frequencies, are computed at construction and could not be
recovered later), so a 10-billion-parameter model is built in seconds on a laptop and
each rank later materialises only its own stage (``subgraph``).
"""

from __future__ import annotations

import contextlib
import importlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn


class FixableError(ValueError):
    """Bad input of an unmodified model, with ``fix``: what the user should do."""

    def __init__(self, message: str, fix: str) -> None:
        super().__init__(message)
        self.fix = fix


class ModelSourceError(FixableError):
    """A model that cannot be built."""


@dataclass(frozen=True)
class GraphModelConfig:
    """What the graph path needs from the spec's ``model`` section."""

    import_: str | None = None
    args: dict[str, Any] = field(default_factory=dict)
    hf_class: str | None = None
    hf_config: dict[str, Any] | None = None
    hf_config_path: str | None = None
    pretrained: str | None = None
    task: str | None = None
    loss: str = "auto"
    mask_token_id: int | None = None  # the spec's; None: found (graph.mask_token)
    seq_len: int = 32
    subgraphs: int | None = None
    seed: int = 0


@contextlib.contextmanager
def meta_parameters():
    """Create every ``nn.Parameter`` on the meta device; buffers keep their device."""
    original = nn.Module.register_parameter

    def register(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        original(module, name, param)
        if param is not None and param.device.type != "meta":
            kind = type(module._parameters[name])
            meta = module._parameters[name].to("meta")
            module._parameters[name] = kind(meta, requires_grad=param.requires_grad)

    nn.Module.register_parameter = register
    try:
        yield
    finally:
        nn.Module.register_parameter = original


def build_model(cfg: GraphModelConfig) -> nn.Module:
    """The user's model with meta parameters, in train mode."""
    with meta_parameters():
        model = _hf_model(cfg) if cfg.hf_class else factory_model(cfg)
    if not isinstance(model, nn.Module):
        raise ModelSourceError(
            f"model.import {cfg.import_!r} returned {type(model).__name__}, not an nn.Module",
            "return the model itself (an nn.Module) from the factory",
        )
    return model.train()


def factory_model(cfg: GraphModelConfig) -> Any:
    """What the ``import`` factory returns for ``model.args``."""
    module_name, _, attr = (cfg.import_ or "").partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ModelSourceError(
            f"model.import {cfg.import_!r} cannot be imported: {exc}",
            "check the module is installed on every node and the factory name is right",
        ) from exc
    try:
        return factory(**cfg.args)
    except Exception as exc:  # noqa: BLE001 -- a user factory may raise anything
        raise ModelSourceError(
            f"model.import {cfg.import_!r} raised {type(exc).__name__}: {exc}",
            "fix the factory or model.args so that it builds the model",
        ) from exc


def hf_config(cfg: GraphModelConfig):
    """The ``transformers`` config of a Hugging Face model section."""
    conf_cls = hf_class(cfg.hf_class).config_class
    if cfg.pretrained:
        path = Path(cfg.pretrained) / "config.json"
        if not path.is_file():
            raise ModelSourceError(
                f"model.huggingface.pretrained {cfg.pretrained!r} has no config.json",
                "point it at a directory written by save_pretrained",
            )
        return conf_cls.from_pretrained(cfg.pretrained)
    if cfg.hf_config_path:
        return conf_cls(**_config_json(cfg.hf_config_path))
    return conf_cls(**(cfg.hf_config or {}))


def _config_json(path: str) -> dict[str, Any]:
    """The fields of a config.json (``model.huggingface.config_path``)."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ModelSourceError(
            f"model.huggingface.config_path {path!r} cannot be read: {exc.strerror}",
            "point it at a config.json (e.g. one written by save_pretrained)",
        ) from exc
    except ValueError as exc:
        raise ModelSourceError(
            f"model.huggingface.config_path {path!r} is not JSON: {exc}",
            "point it at a config.json (e.g. one written by save_pretrained)",
        ) from exc
    if not isinstance(data, dict):
        raise ModelSourceError(
            f"model.huggingface.config_path {path!r} is not a JSON object",
            "point it at a config.json (e.g. one written by save_pretrained)",
        )
    return data


def _hf_model(cfg: GraphModelConfig) -> nn.Module:
    cls = hf_class(cfg.hf_class)
    conf = hf_config(cfg)
    try:
        return cls(conf)
    except Exception as exc:  # noqa: BLE001 -- transformers raises many kinds
        raise ModelSourceError(
            f"model.huggingface: {cfg.hf_class}({type(conf).__name__}) failed: {exc}",
            "fix the config values for this model class",
        ) from exc


def hf_class(name: str | None) -> type:
    """A ``transformers`` model class by name (``LlamaForCausalLM``)."""
    transformers = _transformers()
    cls = getattr(transformers, name or "", None)
    if not isinstance(cls, type) or not issubclass(cls, nn.Module):
        raise ModelSourceError(
            f"model.huggingface.class {name!r} is not a transformers model class",
            "use a class name such as GPT2LMHeadModel or LlamaForCausalLM",
        )
    return cls


def _transformers():
    try:
        transformers = importlib.import_module("transformers")
    except ImportError as exc:
        raise ModelSourceError(
            "model.huggingface needs the transformers package",
            "pip install 'jobctl[hf]'",
        ) from exc
    transformers.logging.set_verbosity_error()
    return transformers


def repeated_layers(model: nn.Module) -> int:
    """Length of the model's longest ``nn.ModuleList`` (its transformer layers)."""
    lengths = [len(m) for m in model.modules() if isinstance(m, nn.ModuleList)]
    return max(lengths, default=1)


def param_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer by its full name, tied names included."""
    out = dict(model.named_parameters(remove_duplicate=False))
    out.update(model.named_buffers(remove_duplicate=False))
    return out
