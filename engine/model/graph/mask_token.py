"""The token a masked-LM task masks with: the model's own, or none (refused).

A pretrained masked LM learned one id as ``[MASK]``; masking with any other trains a
different task, silently (#54: ``BertConfig`` has no ``mask_token_id``, so a real BERT
was masked with its last id, 30521, not 103). In order: ``model.mask_token_id``; the
config's ``mask_token_id``; the mask token of the tokenizer saved beside a pretrained
model (``save_pretrained`` of model and tokenizer into one folder, transformers'
convention), read from its JSON files; for a model trained from scratch, which learns
whatever id masks, the last id. A pretrained model with none of these has no mask id:
``validate`` refuses it and names the id the data's tokenizer would give.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

MASK_NAMES = ("[MASK]", "<mask>")  # BERT's and RoBERTa's, where a tokenizer names none


def tokenizer_mask_id(folder: str | None) -> int | None:
    """The mask token's id of the tokenizer saved in ``folder`` (None: no tokenizer, or
    it has no mask token): ``tokenizer_config.json``'s ``mask_token`` (else a token named
    [MASK] or <mask>) looked up in its added tokens, or ``tokenizer.json``'s."""
    if not folder or not Path(folder).is_dir():
        return None
    config = json_object(Path(folder) / "tokenizer_config.json")
    named = config.get("mask_token")
    if isinstance(named, dict):  # an AddedToken written out
        named = named.get("content")
    wanted = (named,) if isinstance(named, str) else MASK_NAMES
    ids = _added_tokens(config, json_object(Path(folder) / "tokenizer.json"))
    return next((ids[w] for w in wanted if w in ids), None)


def _added_tokens(config: dict, tokenizer: dict) -> dict[str, int]:
    """Content -> id of the special tokens either file lists (and the vocabulary's)."""
    ids: dict[str, int] = {}
    for k, v in (config.get("added_tokens_decoder") or {}).items():
        if isinstance(v, dict) and isinstance(v.get("content"), str) and str(k).isdigit():
            ids[v["content"]] = int(k)
    for t in tokenizer.get("added_tokens") or []:
        if isinstance(t, dict) and isinstance(t.get("id"), int):
            ids.setdefault(str(t.get("content")), t["id"])
    vocab = (tokenizer.get("model") or {}).get("vocab")
    if isinstance(vocab, dict):
        for name in MASK_NAMES:
            if isinstance(vocab.get(name), int):
                ids.setdefault(name, vocab[name])
    return ids


def json_object(path: Path) -> dict:
    """The JSON object in ``path`` ({}: none, unreadable, or not an object)."""
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def mask_id(explicit: int | None, config: dict[str, Any], pretrained: str | None) -> int | None:
    """The mask id of a model (``config``: its config's fields), by the order above;
    None for a pretrained model whose mask token nothing names."""
    if explicit is not None:
        return int(explicit)
    if config.get("mask_token_id") is not None:
        return int(config["mask_token_id"])
    if pretrained:
        return tokenizer_mask_id(pretrained)
    return int(config.get("vocab_size", 1)) - 1
