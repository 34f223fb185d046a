"""A pretrained directory's tensors under the names the model has in memory.

transformers 5 keeps some families on disk in another layout than in memory and
converts them in ``from_pretrained``: Mixtral saves one module per expert
(``model.layers.0.block_sparse_moe.experts.3.w1.weight``) and fuses them in memory
(``model.layers.0.mlp.experts.gate_up_proj``: every expert's ``w1`` and ``w3``,
stacked, then concatenated). ``DiskLayout`` applies the class's own conversion
mapping (``get_model_conversion_mapping``, the list ``from_pretrained`` applies, in
its order: every renaming, then at most one converter, keys sorted as it sorts them
so experts stack in their order), so jobctl reads exactly what transformers would
load. Nothing is read until a stage asks for a name, and then only the disk tensors
that make it. Shapes come from the same conversion run on meta tensors built from
the safetensors headers, so ``validate`` checks a converted checkpoint without
reading its data. Export needs nothing here: ``save_pretrained`` reverts the mapping.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch


class DiskLayout:
    """Which disk tensors make each in-memory name, and how (``model``: meta)."""

    def __init__(self, model: Any, disk_names: list[str]) -> None:
        from transformers.core_model_loading import dot_natural_key

        self.model = model
        self.renamings, self.converters = _transforms(model)
        self._by_pattern = {p: c for c in self.converters for p in c.source_patterns}
        self.groups: dict[str, list[tuple[str, str | None]]] = {}
        self.made_by: dict[str, str] = {}  # in-memory name -> its group's first name
        known = model.state_dict()
        for key in sorted(disk_names, key=dot_natural_key):
            self._place(key, known)

    def _place(self, key: str, known: dict) -> None:
        from transformers.core_model_loading import rename_source_key

        prefix = getattr(self.model, "base_model_prefix", None)
        target, pattern = rename_source_key(key, self.renamings, self.converters, prefix, known)
        if target not in known and key in known:  # as from_pretrained: keep the name
            target, pattern = rename_source_key(key, [], [], prefix, known)
        self.groups.setdefault(target, []).append((key, pattern))
        if pattern is None:
            self.made_by[target] = target
            return
        first, *_ = targets = self._by_pattern[pattern].target_patterns
        for t in targets:  # a one-to-many converter names its others from the first
            self.made_by[target.replace(first, t)] = target

    @property
    def converts(self) -> bool:
        """Whether any disk name maps to a name other than itself."""
        return any(len(keys) > 1 or keys[0][0] != target for target, keys in self.groups.items())

    def disk_names(self, name: str) -> list[str]:
        """The disk tensors that make ``name``."""
        return [key for key, _ in self.groups[self.made_by[name]]]

    def tensors(self, names: list[str], load: Callable[[str], torch.Tensor]) -> dict:
        """Each of ``names`` (all in ``made_by``), built from ``load(disk name)``."""
        out: dict[str, torch.Tensor] = {}
        for first in dict.fromkeys(self.made_by[n] for n in names):
            out.update(self._convert(first, load))
        return {n: out[n] for n in names}

    def _convert(self, first: str, load: Callable[[str], torch.Tensor]) -> dict:
        keys = self.groups[first]
        pattern = keys[0][1]
        if pattern is None:
            return {first: load(keys[0][0])}
        converter = copy.deepcopy(self._by_pattern[pattern])  # it collects its inputs
        for key, source_pattern in keys:
            converter.add_tensor(first, key, source_pattern, functools.partial(load, key))
        made = converter.convert(first, model=self.model, config=self.model.config)
        return {n: v[0] if isinstance(v, list) else v for n, v in made.items()}

    def shapes(self, names: list[str], files: dict[str, Path]) -> dict[str, tuple]:
        """Each name's shape as converted, computed on meta tensors from the headers."""
        return {n: tuple(t.shape) for n, t in self.tensors(names, _header(files)).items()}


def _transforms(model: Any) -> tuple[list, list]:
    """The class's renamings and converters (none for a module that is not a
    transformers model)."""
    from transformers import PreTrainedModel
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightConverter, WeightRenaming

    if not isinstance(model, PreTrainedModel):
        return [], []
    transforms = get_model_conversion_mapping(model)
    return (
        [t for t in transforms if isinstance(t, WeightRenaming)],
        [t for t in transforms if isinstance(t, WeightConverter)],
    )


def _header(files: dict[str, Path]) -> Callable[[str], torch.Tensor]:
    """A loader of meta tensors with each disk tensor's shape and dtype."""
    from safetensors import safe_open

    def load(key: str) -> torch.Tensor:
        with safe_open(str(files[key]), framework="pt") as handle:
            part = handle.get_slice(key)
            dtype = _DTYPES.get(part.get_dtype(), torch.float32)
            return torch.empty(part.get_shape(), dtype=dtype, device="meta")

    return load


_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
