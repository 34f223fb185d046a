"""Hugging Face datasets and tokenizers, imported only when a job or command uses them.

``data.source: hf`` reads a dataset saved with ``datasets.save_to_disk`` (a folder), or
local parquet, jsonl/json or arrow files, and tokenizes its text column with a tokenizer
folder: ``tokenizer.json`` through ``tokenizers``, anything else through
``transformers.AutoTokenizer.from_pretrained``. Documents are joined with the end-of-text
id (when the tokenizer has one) into one stream of ids that ``packed`` cuts into
sequences, as a token file would be.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

EXTRA = "pip install 'jobctl[hf]'"
FORMATS = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".arrow": "arrow"}
EOS_NAMES = ("<|endoftext|>", "</s>", "<eos>", "[SEP]", "<|end_of_text|>")
BATCH = 1000
SAVED_MARKERS = ("state.json", "dataset_info.json", "dataset_dict.json")


class MissingExtra(ImportError):
    """An optional dependency is not installed; the message names the extra."""


def require(module: str) -> Any:
    """Import ``module`` or fail with the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise MissingExtra(
            f"data.source 'hf' and `jobctl data prepare` need the {module!r} package: {EXTRA}"
        ) from err


def open_dataset(path: str) -> Any:
    """The dataset at ``path``: a ``save_to_disk`` folder or parquet/jsonl/arrow files."""
    datasets = require("datasets")
    datasets.disable_progress_bars()  # jobctl draws its own
    p = Path(path)
    if p.is_dir() and any((p / name).exists() for name in SAVED_MARKERS):
        ds = datasets.load_from_disk(str(p))
        return ds["train"] if isinstance(ds, datasets.DatasetDict) else ds
    files = sorted(str(f) for f in p.iterdir() if f.suffix in FORMATS) if p.is_dir() else [path]
    if not files:
        raise ValueError(f"{path}: no .parquet, .jsonl, .json or .arrow files in it")
    kind = FORMATS.get(Path(files[0]).suffix)
    if kind is None:
        raise ValueError(f"{path}: unknown dataset format (use {', '.join(FORMATS)})")
    return datasets.load_dataset(kind, data_files=files, split="train")


class Tokenizer:
    """``encode(texts) -> lists of ids``, the vocabulary size and the end-of-text id."""

    def __init__(self, folder: str):
        self.folder = folder
        if (Path(folder) / "tokenizer.json").exists():
            tokenizers = require("tokenizers")
            tok = tokenizers.Tokenizer.from_file(str(Path(folder) / "tokenizer.json"))
            self.vocab = tok.get_vocab_size()
            self.eos = _first_id(tok.token_to_id)
            self._encode: Callable = lambda texts: [e.ids for e in tok.encode_batch(texts)]
        else:
            auto = require("transformers").AutoTokenizer.from_pretrained(folder)
            self.vocab = len(auto)
            self.eos = auto.eos_token_id
            self._encode = lambda texts: auto(texts, add_special_tokens=False)["input_ids"]

    def encode(self, texts: list[str]) -> list[list[int]]:
        return self._encode(texts)

    def stream(self, texts: list[str]) -> np.ndarray:
        """The ids of ``texts``, each document followed by the end-of-text id if any."""
        tail = [] if self.eos is None else [self.eos]
        ids = [i for doc in self.encode(texts) for i in (*doc, *tail)]
        return np.asarray(ids, dtype=np.uint32)


def _first_id(lookup: Callable[[str], int | None]) -> int | None:
    return next((i for i in map(lookup, EOS_NAMES) if i is not None), None)


def texts_of(ds: Any, column: str) -> Iterator[list[str]]:
    """The ``column`` of ``ds`` in batches of documents."""
    for start in range(0, len(ds), BATCH):
        yield ds[start : start + BATCH][column]


def tokenize_dataset(path: str, tokenizer: str, column: str) -> np.ndarray:
    """The whole dataset at ``path`` as one stream of token ids."""
    ds, tok = open_dataset(path), Tokenizer(tokenizer)
    if column not in ds.column_names:
        raise ValueError(f"{path}: no column {column!r} (has {', '.join(ds.column_names)})")
    parts = [tok.stream(batch) for batch in texts_of(ds, column)]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint32)
