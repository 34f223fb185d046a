"""A run's trained weights in its model's own format: a Hugging Face model directory.

A layout-independent checkpoint of a traced model stores each parameter as
``layers.<subgraph>.<the model's own name>``, a tied group once under its first name
(``blocks``). ``export_hf`` reads the run's newest complete checkpoint (local, or
downloaded from ``checkpoint.remote``), strips the subgraph prefix, gives every name
of a tie group the tensor, puts the result into the model built from the run's spec
(meta parameters, so the weights are held once) and writes ``save_pretrained``
(safetensors and config.json), which ``from_pretrained`` loads. The builtin family
and hand-cut blocks have no such model and are refused with ``ExportError``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from jobctl.engine.checkpoint.blocks import load_full_state
from jobctl.engine.checkpoint.resume import find_resume_point, local_root
from jobctl.engine.model.graph.source import FixableError


class ExportError(FixableError):
    """A run that cannot be exported; ``fix`` says what to do."""


@dataclass(frozen=True)
class Exported:
    """What ``export_hf`` wrote: the checkpoint's step, the folder, the tensor count."""

    step: int
    out: Path
    tensors: int


def export_hf(spec: Any, run_dir: Path, out: Path) -> Exported:
    """Write the newest checkpoint of the run in ``run_dir`` to ``out`` as a Hugging
    Face model directory."""
    model = _model(_hf_config(spec))  # refuses a model without the format first
    point = find_resume_point(spec.checkpoint, local_root(spec.checkpoint, Path(run_dir)))
    if point is None:
        raise ExportError(
            f"run {Path(run_dir).name} has no complete checkpoint",
            "export after the run has written one (checkpoint.interval, or `jobctl "
            "stop`, which checkpoints)",
        )
    load_state(model, model_state(load_full_state(point.path)))
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    return Exported(point.step, out, len(model.state_dict()))


def _hf_config(spec: Any):
    from jobctl.engine.model.graph.checks import graph_config

    cfg = graph_config(spec.model)
    if cfg is None:
        raise ExportError(
            "the builtin model family has no Hugging Face format",
            "export runs of model.huggingface or of a model.import factory that "
            "returns a transformers model",
        )
    return cfg


def _model(cfg: Any) -> torch.nn.Module:
    """The run's model with meta parameters (refusing hand-cut blocks)."""
    from jobctl.engine.model.graph.source import ModelSourceError, build_model

    try:
        model = build_model(cfg)
    except ModelSourceError as e:
        raise ExportError(str(e), e.fix) from None
    if not hasattr(model, "save_pretrained"):
        raise ExportError(
            f"model.import {cfg.import_!r} builds a {type(model).__name__}, not a "
            "transformers model, so it has no Hugging Face format",
            "use model.huggingface, or a factory that returns a transformers model",
        )
    return model


def model_state(full: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Checkpoint names (``layers.<subgraph>.<name>``) -> the model's own names."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in full.items():
        _, block, own = name.split(".", 2)
        if own in out and not torch.equal(out[own], tensor):
            raise ExportError(
                f"checkpoint holds two different values of {own!r} (subgraph {block})",
                "this checkpoint was not written by a traced model; export its run",
            )
        out[own] = tensor
    return out


def load_state(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Put ``state`` into ``model`` (meta parameters): every tied name gets its group's
    tensor; buffers keep the values the model was built with."""
    from jobctl.engine.model.graph.checks import tied_names

    full = dict(state)
    for name, others in tied_names(model).items():
        found = next((state[n] for n in [name, *others] if n in state), None)
        if found is not None:
            full[name] = found
    params = dict(model.named_parameters(remove_duplicate=False))
    missing = sorted(set(params) - set(full))
    unknown = sorted(set(full) - set(model.state_dict()))
    unknown += [n for n in params if n in full and full[n].shape != params[n].shape]
    if missing or unknown:
        raise ExportError(
            f"checkpoint does not match the run's model: missing {missing[:3]}, "
            f"unknown or of another shape {unknown[:3]}",
            "export with the spec the run was trained with (its run folder's spec.yaml)",
        )
    model.load_state_dict({n: full[n] for n in params}, strict=False, assign=True)
    if hasattr(model, "tie_weights"):
        model.tie_weights()  # assign gave each tied name its own Parameter: one again
