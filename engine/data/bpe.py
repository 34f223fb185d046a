"""``jobctl data prepare --vocab-size N``: a tokenizer trained on the user's own corpus.

A newcomer with a folder of text has no tokenizer offline, and ``data prepare`` needs
one. This trains GPT-2's kind of tokenizer with Hugging Face ``tokenizers``: byte-level
BPE (every byte is in the initial alphabet, so any text encodes and decodes back
exactly, with no unknown token) with ``<|endoftext|>`` as the end-of-document id that
``prepare`` appends, on the same documents ``prepare`` then tokenizes. The folder gets
``tokenizer.json`` (what ``data prepare --tokenizer`` and ``transformers``'
``PreTrainedTokenizerFast(tokenizer_file=...)`` read) and ``jobctl-tokenizer.json``,
the arguments it was trained with, so that running the same command again (an
interrupted ``prepare`` continues) reuses it instead of training another.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from jobctl.engine.data.hf import require

EOS = "<|endoftext|>"
BYTES = 256  # byte-level BPE starts from every byte
MAX_VOCAB = 1_000_000
TRAINED_WITH = "jobctl-tokenizer.json"


def check_vocab_size(vocab_size: int) -> None:
    """A byte-level BPE holds every byte and the end-of-text token at least."""
    if not BYTES + 1 <= vocab_size <= MAX_VOCAB:
        raise ValueError(
            f"--vocab-size {vocab_size}: a byte-level BPE needs {BYTES + 1} to {MAX_VOCAB:,} "
            "tokens (every byte and <|endoftext|>); 8000-50000 is usual for a few MB-GB of text"
        )


def train(docs: Iterator[list[str]], vocab_size: int, folder: Path, trained_with: dict) -> int:
    """Train on ``docs`` (chunks of documents) into ``folder``; the vocabulary size got
    (smaller than asked when the corpus has fewer merges to learn)."""
    tk = require("tokenizers")
    tok = tk.Tokenizer(tk.models.BPE())
    tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,  # the command shows its own
    )
    tok.train_from_iterator((doc for chunk in docs for doc in chunk), trainer)
    folder.mkdir(parents=True, exist_ok=True)
    partial = folder / "tokenizer.json.partial"
    tok.save(str(partial))
    partial.replace(folder / "tokenizer.json")  # never a half-written tokenizer
    (folder / TRAINED_WITH).write_text(json.dumps({**trained_with, "vocab_size": vocab_size}))
    return tok.get_vocab_size()


def reusable(folder: Path, trained_with: dict, vocab_size: int) -> bool:
    """Whether ``folder`` holds a tokenizer this command trained with these arguments
    (True: use it); a folder with another tokenizer in it is refused, never overwritten."""
    if not (folder / "tokenizer.json").exists():
        return False
    record = folder / TRAINED_WITH
    try:
        same = json.loads(record.read_text()) == {**trained_with, "vocab_size": vocab_size}
    except (OSError, ValueError):
        same = False
    if not same:
        raise ValueError(
            f"{folder} already holds a tokenizer not trained by this command with these "
            "arguments: drop --vocab-size to tokenize with it, or give another --tokenizer"
        )
    return True
