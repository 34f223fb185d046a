"""``jobctl data prepare --vocab-size N`` (#47 "your own data"): a byte-level BPE
trained offline on the user's own corpus, then the corpus tokenized with it; the same
command again reuses the tokenizer (an interrupted prepare continues), another
tokenizer in the folder is never overwritten, and each refusal is one line with a fix."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
import tokenizers

from jobctl.engine.data import bpe

from ..corpus import corpus
from ..jobrun import JOBCTL
from .test_data_sources import validate, write_job

DOCS = corpus(600, seed=3)


def _prepare(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*JOBCTL, "data", "prepare", *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    folder = tmp_path_factory.mktemp("own-text")
    (folder / "notes.txt").write_text("\n\n".join(DOCS) + "\n\nnaïve café — 数据 ✓\n")
    return folder, _prepare(folder, "notes.txt", "--vocab-size", "300", "--out", "train.bin")


def test_a_tokenizer_is_trained_on_the_corpus_and_the_corpus_tokenized(prepared):
    folder, done = prepared
    assert done.returncode == 0, done.stderr
    assert "byte-level BPE of 300 tokens" in done.stdout and "model.vocab: 300" in done.stdout
    tok = tokenizers.Tokenizer.from_file(str(folder / "train-tokenizer" / "tokenizer.json"))
    assert tok.get_vocab_size() == 300
    ids = np.fromfile(folder / "train.bin", dtype=np.uint16)
    assert f"wrote train.bin: {len(ids)} tokens" in done.stdout
    assert ids.max() < 300
    eos = tok.token_to_id("<|endoftext|>")
    docs = np.split(ids, np.flatnonzero(ids == eos) + 1)[:-1]
    assert len(docs) == len(DOCS) + 1  # every document ends with the end-of-text id
    # byte-level: every document decodes back to exactly its text, non-ASCII included
    assert tok.decode(docs[0][:-1].tolist()) == DOCS[0]
    assert tok.decode(docs[-1][:-1].tolist()) == "naïve café — 数据 ✓\n"
    assert len(ids) < sum(len(d.encode()) for d in DOCS)  # merges were learned


def test_the_result_validates_as_a_token_file(prepared):
    folder, _ = prepared
    job = write_job(folder, "{source: tokens, path: train.bin}", vocab=300)
    assert validate(job).returncode == 0


def test_the_same_command_again_reuses_the_tokenizer(prepared):
    folder, _ = prepared
    before = (folder / "train.bin").read_bytes()
    again = _prepare(folder, "notes.txt", "--vocab-size", "300", "--out", "train.bin")
    assert again.returncode == 0, again.stderr
    assert "trained earlier" in again.stdout
    assert (folder / "train.bin").read_bytes() == before


def test_another_tokenizer_in_the_folder_is_refused_not_overwritten(prepared):
    folder, _ = prepared
    saved = (folder / "train-tokenizer" / "tokenizer.json").read_bytes()
    other = _prepare(folder, "notes.txt", "--vocab-size", "400", "--out", "train.bin")
    assert other.returncode == 2 and "Traceback" not in other.stderr
    assert "already holds a tokenizer" in other.stderr and "--tokenizer" in other.stderr
    assert (folder / "train-tokenizer" / "tokenizer.json").read_bytes() == saved


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ((), "give --tokenizer DIR"),
        (("--vocab-size", "100"), "needs 257 to 1,000,000 tokens"),
        (("--vocab-size", "2000000"), "needs 257 to 1,000,000 tokens"),
    ],
)
def test_no_tokenizer_or_a_bad_size_is_one_line_with_a_fix(tmp_path, args, says):
    (tmp_path / "a.txt").write_text("some text\n\nmore text\n")
    done = _prepare(tmp_path, "a.txt", "--out", "x.bin", *args)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert says in done.stderr and not (tmp_path / "x.bin").exists()


def test_check_vocab_size_bounds():
    bpe.check_vocab_size(257)
    bpe.check_vocab_size(1_000_000)
    for bad in (256, 1_000_001):
        with pytest.raises(ValueError, match="byte-level BPE needs"):
            bpe.check_vocab_size(bad)
