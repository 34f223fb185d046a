"""``jobctl data prepare``: a text corpus tokenized into a token file, resumably.

The corpus (a text file, a jsonl / parquet / arrow file or folder, or a
``save_to_disk`` folder) is read in chunks of documents; a pool of processes (one per
core) tokenizes the chunks, and the parent appends their ids, in corpus order, to
``OUT.partial`` as ``uint16`` (``uint32`` when the tokenizer's vocabulary needs it),
each document followed by the end-of-text id. After every chunk ``OUT.progress.json``
records the chunks and bytes done, so an interrupted run continues where it stopped
(the partial file is cut back to the last recorded chunk). The finished file is
renamed to ``OUT``: raw ids for ``.bin``, with a NumPy header for ``.npy``.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from jobctl.engine.data.hf import Tokenizer, open_dataset, texts_of
from jobctl.spec.data import UINT16_VOCAB

CHUNK_DOCS = 1000


@dataclass(frozen=True)
class Job:
    """What to tokenize, with what, into which file."""

    source: str
    tokenizer: str
    out: str
    column: str = "text"
    workers: int = 0  # 0: one per core

    @property
    def partial(self) -> Path:
        return Path(self.out + ".partial")

    @property
    def progress(self) -> Path:
        return Path(self.out + ".progress.json")


def documents(source: str, column: str) -> tuple[int, Iterator[list[str]]]:
    """(number of chunks, the chunks of documents) of ``source``."""
    if Path(source).suffix in (".txt", ".md", ".text"):
        docs = [d for d in Path(source).read_text(errors="replace").split("\n\n") if d.strip()]
        chunks = [docs[i : i + CHUNK_DOCS] for i in range(0, len(docs), CHUNK_DOCS)]
        return len(chunks), iter(chunks)
    ds = open_dataset(source)
    if column not in ds.column_names:
        raise ValueError(f"{source}: no column {column!r} (has {', '.join(ds.column_names)})")
    return -(-len(ds) // CHUNK_DOCS), texts_of(ds, column)


_TOKENIZER: Tokenizer | None = None


def _start_worker(folder: str) -> None:
    global _TOKENIZER  # one tokenizer per worker process, loaded once
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # the pool is the parallelism
    _TOKENIZER = Tokenizer(folder)


def _tokenize(texts: list[str]) -> np.ndarray:
    assert _TOKENIZER is not None
    return _TOKENIZER.stream(texts)


def _resume_point(job: Job) -> int:
    """Chunks already written; the partial file is cut back to them."""
    if not job.partial.exists() or not job.progress.exists():
        job.partial.write_bytes(b"")
        return 0
    done = json.loads(job.progress.read_text())
    with open(job.partial, "r+b") as f:
        f.truncate(done["bytes"])
    return int(done["chunks"])


def prepare(job: Job, on_chunk: Callable[[int, int, int], None] | None = None) -> int:
    """Tokenize ``job.source`` into ``job.out``; returns the tokens written.
    ``on_chunk(done, total, tokens)`` follows progress (chunks, of chunks, tokens)."""
    tok = Tokenizer(job.tokenizer)
    dtype = np.uint16 if tok.vocab <= UINT16_VOCAB else np.uint32
    total, chunks = documents(job.source, job.column)
    skip = _resume_point(job)
    if on_chunk is not None:
        on_chunk(skip, total, 0)
    todo = (c for k, c in enumerate(chunks) if k >= skip)
    workers = job.workers or os.cpu_count() or 1
    # forkserver: workers fork from a clean server process, so they inherit no thread
    # of the caller's (a plain fork deadlocked under pytest, whose process had run
    # tokenizers' thread pool and a moto server thread before); the server preloads
    # this module, so a worker starts without re-importing it.
    methods = mp.get_all_start_methods()
    ctx = mp.get_context("forkserver" if "forkserver" in methods else "spawn")
    if "forkserver" in methods:
        ctx.set_forkserver_preload([__name__])
    pool = ctx.Pool(workers, _start_worker, (job.tokenizer,))
    with pool, open(job.partial, "ab") as out:
        for k, ids in enumerate(pool.imap(_tokenize, todo), start=skip + 1):
            out.write(ids.astype(dtype).tobytes())
            out.flush()
            job.progress.write_text(json.dumps({"chunks": k, "bytes": out.tell()}))
            if on_chunk is not None:
                on_chunk(k, total, len(ids))
    return _finish(job, dtype)


def _finish(job: Job, dtype) -> int:
    count = job.partial.stat().st_size // np.dtype(dtype).itemsize
    if job.out.endswith(".npy"):
        ids = np.memmap(job.partial, dtype, "r", shape=(count,))
        np.save(job.out, ids)
        del ids
        job.partial.unlink()
    else:
        job.partial.replace(job.out)
    job.progress.unlink()
    return count


def single_process(job: Job) -> int:
    """The plain loop ``prepare`` is measured against: one process, one document at a
    time (``benchmarks/io/data_throughput.py``)."""
    tok = Tokenizer(job.tokenizer)
    dtype = np.uint16 if tok.vocab <= UINT16_VOCAB else np.uint32
    n = 0
    with open(job.out, "wb") as out:
        for texts in documents(job.source, job.column)[1]:
            for text in texts:
                ids = tok.stream([text]).astype(dtype)
                out.write(ids.tobytes())
                n += len(ids)
    return n
