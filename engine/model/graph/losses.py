"""A traced model's loss when it is not the model's own (``model.loss``).

``auto`` trains the loss the model computes from ``labels`` (Hugging Face models).
Otherwise the model is traced without labels, its first output is taken as logits,
and: ``next_token`` is the mean cross entropy against the next tokens (what the
builtin GPT trains); ``cross_entropy`` is the mean cross entropy against the task's
labels (positions labelled -100 ignored: masked-LM's unmasked tokens); and
``pkg.module:fn`` is called as ``fn(logits, batch)`` with the batch's keyword
arguments and its ``labels``.
"""

from __future__ import annotations

import importlib

import torch
import torch.nn.functional as F  # noqa: N812

LABELS = "__labels__"  # the batch key holding labels the model is not given


def split_labels(batch: dict, loss: str) -> dict:
    """The model's arguments: without ``labels`` unless the model computes the loss."""
    if loss == "auto" or "labels" not in batch:
        return batch
    out = dict(batch)
    out[LABELS] = out.pop("labels")
    return out


def compute(loss: str, logits: torch.Tensor, y: torch.Tensor, batch: dict) -> torch.Tensor:
    """The micro-batch's mean loss under ``loss`` (not ``auto``)."""
    if loss == "next_token":
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1))
    labels = batch.get(LABELS)
    if loss == "cross_entropy":
        return F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1), ignore_index=-100
        )
    module_name, _, attr = loss.partition(":")
    fn = getattr(importlib.import_module(module_name), attr)
    return fn(logits, {**{k: v for k, v in batch.items() if k != LABELS}, "labels": labels})
