"""Feature dicts: which linears of a model family tensor parallelism splits (Merak 4.1).

Merak maps a TMP attribute to each proxied GEMM from a feature dict per model
family; here a :class:`Features` names, by regular expressions on the model's own
module paths, the linears split by output columns (attention q/k/v, the MLP's input)
and by input rows (attention output, the MLP's output), and how many equal parts a
fused weight holds (GPT-2's ``c_attn`` is q, k and v in one ``Conv1D``). Whether a
weight is stored ``[out, in]`` (``nn.Linear``) or transposed ``[in, out]``
(``Conv1D``) is read from the traced graph (``tp_plan``), not written here. GPT-2,
Llama, BERT, T5 and ViT are shipped; :func:`register` adds a family.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from torch import nn

from jobctl.engine.model.graph.source import FixableError


@dataclass(frozen=True)
class Features:
    """One family's split linears: module-path patterns (``re.search``) and fusions.

    ``heads``/``kv_heads``/``widths`` name the config fields T must divide.
    """

    column: tuple[str, ...]
    row: tuple[str, ...]
    fused: dict[str, int] = field(default_factory=dict)  # pattern -> equal parts
    heads: tuple[str, ...] = ()
    widths: tuple[str, ...] = ()

    def role(self, module: str) -> str | None:
        """``column``, ``row`` or None for a module path."""
        if any(re.search(p, module) for p in self.column):
            return "column"
        if any(re.search(p, module) for p in self.row):
            return "row"
        return None

    def parts(self, module: str) -> int:
        """How many equal parts a fused weight holds (1: not fused)."""
        return next((n for p, n in self.fused.items() if re.search(p, module)), 1)


_HEADS = ("num_attention_heads", "num_key_value_heads", "n_head", "num_heads")
_WIDTHS = ("intermediate_size", "n_inner", "d_ff")

FEATURES: dict[str, Features] = {
    "gpt2": Features(
        column=(r"\.attn\.c_attn$", r"\.mlp\.c_fc$"),
        row=(r"\.attn\.c_proj$", r"\.mlp\.c_proj$"),
        fused={r"\.attn\.c_attn$": 3},
        heads=_HEADS,
        widths=_WIDTHS,
    ),
    "llama": Features(
        column=(r"\.self_attn\.[qkv]_proj$", r"\.mlp\.(gate|up)_proj$"),
        row=(r"\.self_attn\.o_proj$", r"\.mlp\.down_proj$"),
        heads=_HEADS,
        widths=_WIDTHS,
    ),
    "bert": Features(
        column=(r"\.attention\.self\.(query|key|value)$", r"\.intermediate\.dense$"),
        row=(r"\.attention\.output\.dense$", r"\.layer\.\d+\.output\.dense$"),
        heads=_HEADS,
        widths=_WIDTHS,
    ),
    "t5": Features(
        column=(r"\.(SelfAttention|EncDecAttention)\.[qkv]$", r"\.DenseReluDense\.wi(_\d)?$"),
        row=(r"\.(SelfAttention|EncDecAttention)\.o$", r"\.DenseReluDense\.wo$"),
        heads=_HEADS,
        widths=_WIDTHS,
    ),
    "vit": Features(  # transformers 5 names (q_proj, mlp.fc1) and the 4.x ones
        column=(
            r"\.attention\.attention\.(query|key|value)$",
            r"\.intermediate\.dense$",
            r"\.attention\.[qkv]_proj$",
            r"\.mlp\.fc1$",
        ),
        row=(
            r"\.attention\.output\.dense$",
            r"\.layer\.\d+\.output\.dense$",
            r"\.attention\.o_proj$",
            r"\.mlp\.fc2$",
        ),
        heads=_HEADS,
        widths=_WIDTHS,
    ),
}


def register(family: str, features: Features) -> None:
    """Add (or replace) a family's feature dict; ``family`` is the config's
    ``model_type`` (or, for a model without a config, its class name)."""
    FEATURES[family] = features


def family_of(model: nn.Module) -> str:
    """The feature dict's key for ``model``: its config's ``model_type``, else its class."""
    config = getattr(model, "config", None)
    return getattr(config, "model_type", None) or type(model).__name__


def features_for(model: nn.Module) -> Features:
    """The family's feature dict, or a clear refusal naming how to add one."""
    family = family_of(model)
    found = FEATURES.get(family)
    if found is None:
        raise FixableError(
            f"parallelism.tensor_parallel: no feature dict for model family {family!r} "
            f"(shipped: {', '.join(sorted(FEATURES))}), so its linears to split are unknown",
            "set parallelism.tensor_parallel: 1, or add one with "
            "jobctl.engine.model.graph.tp_features.register("
            f"{family!r}, Features(column=..., row=...))",
        )
    return found


def divisor_problems(model: nn.Module, T: int, features: Features) -> tuple[list[str], str]:
    """The config fields (heads, MLP widths, hidden size) that ``T`` does not divide,
    and the T that divide them all (``1, 2, 4``)."""
    config = getattr(model, "config", None)
    names = (*features.heads, *features.widths, "hidden_size", "n_embd", "d_model")
    values = {n: getattr(config, n, None) for n in dict.fromkeys(names)}
    values = {n: v for n, v in values.items() if isinstance(v, int) and v > 0}
    found = [f"{n} = {v}" for n, v in values.items() if v % T]
    common = math.gcd(*values.values()) if values else 1
    fits = ", ".join(str(t) for t in range(1, min(common, 64) + 1) if common % t == 0)
    return found, fits
