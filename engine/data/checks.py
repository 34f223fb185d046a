"""What can be known about a job's data before anything starts, checked at ``validate``.

``data_violations(spec)`` opens the files the spec names (token files by a few byte
ranges, datasets by their first documents, tokenizers by their vocabulary) and reports
each problem as a :class:`~jobctl.spec.base.Violation` on the field to fix: a path that
does not exist or cannot be read, fewer tokens than one global batch of sequences, ids
or a tokenizer vocabulary larger than ``model.vocab``, a ``.npy`` dtype too narrow for
the vocabulary, a dataset without the text column, a missing optional package.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

from jobctl.spec import JobSpec
from jobctl.spec.base import Violation
from jobctl.spec.data import UINT16_VOCAB
from jobctl.spec.files import NotARegularFile, special

if TYPE_CHECKING:
    from jobctl.engine.data.tokens import TokenFile

# engine.data.tokens (numpy, fsspec) is imported by the checks that read files, so that
# `validate` of a synthetic-data spec starts without it.


def data_violations(spec: JobSpec) -> list[Violation]:
    """Every data problem of ``spec`` that the files reveal (none for 'synthetic')."""
    d = spec.data
    if d.source == "synthetic":
        return []
    if d.source == "text":
        return list(_text(spec))
    if d.source == "tokens":
        found = list(_tokens(spec, d.path or "", "data.path", _fraction(spec)))
        if isinstance(d.eval, str):
            found += _tokens(spec, d.eval, "data.eval", None, need=1)
        return found
    return list(_hf(spec))


def _fraction(spec: JobSpec) -> float | None:
    return spec.data.eval if isinstance(spec.data.eval, float) else None


def _need(spec: JobSpec) -> int:
    """Sequences one global batch reads."""
    return spec.training.global_batch_size


def _missing(path: str, field: str, folder_ok: bool = False) -> Violation | None:
    """Why the local ``path`` cannot be read as ``field``'s file: missing, or a FIFO,
    device or socket (#46 item 6: reading a FIFO blocks until a writer comes, so a
    token file that was one hung `validate`); a folder only where ``folder_ok``."""
    from jobctl.engine.data.tokens import is_url

    if is_url(path):
        return None
    if not os.path.exists(path):
        return Violation(
            field, f"{path}: no such file or folder", f"fix {field} or create the file"
        )
    if (what := special(path, folder_ok)) is None:
        return None
    return Violation(field, f"{path} is {what}, not a regular file", NotARegularFile.fix)


def _text(spec: JobSpec) -> Iterator[Violation]:
    path, seq_len = spec.data.path or "", spec.model.seq_len
    if (missing := _missing(path, "data.path")) is not None:
        yield missing
        return
    size = os.path.getsize(path)
    if size < seq_len + 2:
        yield Violation(
            "data.path",
            f"{path} has {size} bytes; source 'text' needs at least seq_len + 2 = {seq_len + 2}",
            "point data.path at a longer file or lower model.seq_len",
        )
    if spec.model.vocab < 256:
        yield Violation(
            "model.vocab",
            f"source 'text' reads bytes (ids 0-255), but model.vocab is {spec.model.vocab}",
            "set model.vocab: 256 or more",
        )


def _open(path: str, field: str, dtype: str, vocab: int) -> TokenFile | Violation:
    if (missing := _missing(path, field)) is not None:
        return missing
    from jobctl.engine.data.tokens import TokenError, TokenFile

    try:
        return TokenFile(path, dtype, vocab)
    except TokenError as err:  # the file is not what the spec says it is
        if looks_like_text(path):
            return _as_text(path, field, f"{err}")
        return Violation(err.field or field, f"{path}: {err}", err.fix)
    except Exception as err:  # noqa: BLE001 - any reader error: permissions, S3 credentials
        reason = f"{type(err).__name__}: {err}".strip()
        return Violation(field, f"cannot read {path}: {reason}", f"check {field} and its access")


def _as_text(path: str, field: str, detail: str) -> Violation:
    """A text file given as token ids (``detail``: what reading it as ids found)."""
    return Violation(
        field,
        f"{path} looks like text, not token ids ({detail})",
        "train on its bytes with data.source: text (model.vocab: 256), or tokenize it "
        f"first: jobctl data prepare {path} --vocab-size 8000 --out train.bin",
    )


def _tokens(
    spec: JobSpec, path: str, field: str, fraction: float | None, need: int | None = None
) -> Iterator[Violation]:
    from jobctl.engine.data.tokens import sequences_in

    vocab, seq_len = spec.model.vocab, spec.model.seq_len
    tf = _open(path, field, spec.data.dtype, vocab)
    if isinstance(tf, Violation):
        yield tf
        return
    have = sequences_in(len(tf), seq_len)
    if fraction:
        have -= max(1, round(have * fraction))
    need = _need(spec) if need is None else need
    if have < need:
        yield Violation(
            field,
            f"{path} holds {len(tf)} tokens = {max(have, 0)} sequences of seq_len {seq_len} "
            f"{'after the eval split' if fraction else ''}; one global batch needs {need}",
            f"use a file of at least {need * seq_len + 1} tokens"
            + (" (after the eval split)" if fraction else "")
            + " or lower training.global_batch_size / model.seq_len",
        )
    yield from _ids_fit(tf, path, field, vocab)


def _ids_fit(tf: TokenFile, path: str, field: str, vocab: int) -> Iterator[Violation]:
    if tf.dtype.itemsize < 4 and vocab > UINT16_VOCAB:
        yield Violation(
            field,
            f"{path} stores {tf.dtype} ids, too narrow for model.vocab {vocab}",
            "write the token file as uint32 (jobctl data prepare picks the type)",
        )
        return
    from jobctl.engine.data.tokens import sample_spans

    parts = tf.read_raw(sample_spans(len(tf)))
    top = max((int(part.max()) for part in parts if part.size), default=0)
    if top >= vocab and looks_like_text(path):
        detail = f"its bytes read as {tf.dtype} ids reach {top}, outside model.vocab {vocab}"
        yield _as_text(path, field, detail)
    elif top >= vocab:
        yield Violation(
            field,
            f"{path} has token id {top}, outside model.vocab {vocab} (ids 0-{vocab - 1}); "
            f"is it the right file, and data.dtype {tf.dtype} the type it was written with?",
            f"raise model.vocab to at least {top + 1}, or fix data.path / data.dtype",
        )


TEXT_PROBE = 4096  # bytes read from a token file's start to tell text from ids


def looks_like_text(path: str) -> bool:
    """Whether a local token file's first bytes are UTF-8 text (a .txt given as
    ``source: tokens``): ids as uint16/uint32 bytes hold zero bytes and control codes."""
    if path.endswith(".npy") or not os.path.isfile(path):
        return False
    with open(path, "rb") as f:
        head = f.read(TEXT_PROBE).decode("utf-8", errors="replace")
    if not head:
        return False
    printable = sum(c.isprintable() or c in "\n\r\t" for c in head)
    return head.count("\ufffd") <= 2 and printable >= 0.97 * len(head)


def _hf(spec: JobSpec) -> Iterator[Violation]:
    from jobctl.engine.data.hf import MissingExtra

    d = spec.data
    for path, field in ((d.path or "", "data.path"), (d.tokenizer or "", "data.tokenizer")):
        if (missing := _missing(path, field, folder_ok=True)) is not None:
            yield missing
            return
    try:
        yield from _hf_contents(spec)
    except MissingExtra as err:
        yield Violation("data.source", str(err), "install the extra, or use source: tokens")


def _hf_contents(spec: JobSpec) -> Iterator[Violation]:
    from jobctl.engine.data.hf import Tokenizer, open_dataset, texts_of

    d, vocab = spec.data, spec.model.vocab
    try:
        tok = Tokenizer(d.tokenizer or "")
    except Exception as err:  # noqa: BLE001 - a folder no tokenizer library reads
        yield Violation(
            "data.tokenizer",
            f"cannot load a tokenizer: {err}",
            "give a folder with tokenizer.json (or one transformers.AutoTokenizer reads)",
        )
        return
    if tok.vocab > vocab:
        yield Violation(
            "data.tokenizer",
            f"the tokenizer has {tok.vocab} tokens, more than model.vocab {vocab}",
            f"set model.vocab: {tok.vocab} (or more)",
        )
    try:
        ds = open_dataset(d.path or "")
    except Exception as err:  # noqa: BLE001 - any datasets error: format, damage
        yield Violation("data.path", f"cannot read the dataset: {err}", "check data.path")
        return
    if d.text_column not in ds.column_names:
        yield Violation(
            "data.text_column",
            f"the dataset has no column {d.text_column!r} (has {', '.join(ds.column_names)})",
            "set data.text_column to one of those",
        )
        return
    yield from _hf_enough(spec, tok, texts_of(ds, d.text_column))


def _hf_enough(spec: JobSpec, tok, batches) -> Iterator[Violation]:
    """Tokenize documents until one global batch is covered (the whole set at worst)."""
    from jobctl.engine.data.tokens import sequences_in

    seq_len, fraction = spec.model.seq_len, _fraction(spec)
    want = (_need(spec) + (1 if fraction else 0)) * seq_len + 1
    have = 0
    for texts in batches:
        have += len(tok.stream(texts))
        if have >= want / (1 - (fraction or 0)):
            return
    held = max(1, round(sequences_in(have, seq_len) * fraction)) if fraction else 0
    got = sequences_in(have, seq_len) - held
    if got < _need(spec):
        yield Violation(
            "data.path",
            f"the dataset tokenizes to {have} tokens = {max(got, 0)} training sequences of "
            f"seq_len {seq_len}; one global batch needs {_need(spec)}",
            "use a larger dataset or lower training.global_batch_size / model.seq_len",
        )
