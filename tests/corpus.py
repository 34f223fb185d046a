"""Small text corpora, a BPE tokenizer trained on them and a parquet file of them, made
by the tests themselves (no hub downloads)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

WORDS = "the quick brown fox jumps over a lazy dog while seven cats sleep in warm sun"


def corpus(n: int, seed: int = 0) -> list[str]:
    """``n`` documents of 5-29 words drawn from ``WORDS``."""
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS.split(), size=rng.integers(5, 30))) for _ in range(n)]


def train_tokenizer(folder: Path, vocab: int = 120) -> Path:
    """A BPE tokenizer trained on ``corpus(500)``, saved as ``folder/tokenizer.json``."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["[UNK]", "<|endoftext|>"])
    tok.train_from_iterator(corpus(500), trainer)
    tok.save(str(folder / "tokenizer.json"))
    return folder


def write_parquet(path: Path, n: int = 400, seed: int = 1) -> Path:
    """``corpus(n, seed)`` as the ``text`` column of a parquet file (with an ``id``)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": corpus(n, seed), "id": list(range(n))}), path)
    return path
