"""Flat token files: ``.bin`` (raw uint16 or uint32 ids) and ``.npy``, read by range.

A local file is memory-mapped; any other fsspec URL (``s3://``, ``gs://``, ...) is read
by byte ranges (``cat_ranges``, concurrent on async filesystems such as s3fs), never
downloaded whole. Both answer ``read(start, stop)`` in token ids, so the packing above
them does not care where the file lives.

A ``.bin`` file says nothing of its id type, so ``dtype: auto`` takes only what the
file proves (``prove_dtype``): a vocabulary above 65,536 ids needs uint32; a length
that is not a whole number of uint32 ids, or uint32 ids outside the vocabulary, mean
uint16; otherwise both readings fit and the file is refused with both (#54: a uint32
file read as uint16 trained on ids interleaved with zeros, silently). A length that is
not a whole number of ids is refused, and with ``vocab`` every read checks its ids, so
an id outside the vocabulary anywhere stops training with its place in the file.
"""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass

import numpy as np

DTYPES = {"uint16": np.uint16, "uint32": np.uint32}
NPY_HEADER_BYTES = 4096  # a .npy header is padded to 64 bytes; 4 KiB holds any sane one


def sequences_in(tokens: int, seq_len: int) -> int:
    """How many ``seq_len`` sequences (with their one-token shifted target) ``tokens`` hold."""
    return max(0, (tokens - 1) // seq_len)


def is_url(path: str) -> bool:
    """Is ``path`` an fsspec URL (``s3://b/k``) rather than a local path?"""
    return "://" in path and not path.startswith("file://")


def local_path(path: str) -> str:
    return path[len("file://") :] if path.startswith("file://") else path


@dataclass(frozen=True)
class Layout:
    """Where the ids start in the file, their type and how many there are."""

    offset: int
    dtype: np.dtype
    count: int


def npy_layout(head: bytes, size: int) -> Layout:
    """The layout of a 1-D little-endian unsigned-int ``.npy`` file from its first bytes."""
    if not head.startswith(b"\x93NUMPY"):
        raise ValueError("not a .npy file (no \\x93NUMPY magic)")
    major = head[6]
    width = 2 if major == 1 else 4
    length = int.from_bytes(head[8 : 8 + width], "little")
    offset = 8 + width + length
    header = ast.literal_eval(head[8 + width : offset].decode("latin1"))
    dtype = np.dtype(header["descr"])
    if header.get("fortran_order") or len(header["shape"]) != 1:
        raise ValueError(f"expected a 1-D array of token ids, got shape {header['shape']}")
    if dtype.kind != "u" or dtype.byteorder == ">":
        raise ValueError(f"expected uint16 or uint32 token ids, got dtype {dtype}")
    count = int(header["shape"][0])
    if offset + count * dtype.itemsize > size:
        raise ValueError(f"truncated: header says {count} ids, file has {size} bytes")
    return Layout(offset, dtype, count)


def bin_layout(size: int, dtype: str) -> Layout:
    """A raw ``.bin`` file is nothing but ids of ``dtype`` (``TokenError``: its length is
    not a whole number of them)."""
    dt = np.dtype(DTYPES[dtype])
    if size % dt.itemsize:
        raise TokenError(
            f"{size} bytes is not a whole number of {dtype} ids ({dt.itemsize} bytes each): "
            "a truncated or different file",
            "check that the file was written whole, and data.dtype",
        )
    return Layout(0, dt, size // dt.itemsize)


class TokenError(ValueError):
    """A token file that cannot be read as the spec says: ``str`` says why, ``fix`` what
    to change, ``field`` the spec field to change (None: the file's own)."""

    def __init__(self, why: str, fix: str, field: str | None = None) -> None:
        super().__init__(why)
        self.fix, self.field = fix, field


SAMPLE_IDS = 1 << 16  # ids read from each of the start, middle and end of a token file
UINT16_IDS = 1 << 16  # a uint16 holds ids 0-65535


def sample_spans(n: int) -> list[tuple[int, int]]:
    """The start, middle and end ``SAMPLE_IDS`` of ``n`` ids (fewer where they overlap)."""
    starts = sorted({0, max(0, n // 2), max(0, n - SAMPLE_IDS)})
    return [(a, min(n, a + SAMPLE_IDS)) for a in starts]


def prove_dtype(size: int, vocab: int, read32) -> str:  # noqa: ANN001 - spans -> arrays
    """``dtype: auto`` of a ``.bin`` file of ``size`` bytes for a model of ``vocab`` ids:
    what the file proves, or ``TokenError`` with both readings. ``read32(spans)`` reads
    uint32 ids by span (called only where uint32 is possible)."""
    if vocab > UINT16_IDS:
        return "uint32"  # a uint16 holds no id of the upper part of the vocabulary
    if size % 4:
        return "uint16"
    parts = read32(sample_spans(size // 4))
    top = max((int(part.max()) for part in parts if part.size), default=0)
    if top >= vocab:
        return "uint16"  # read as uint32, pairs of uint16 ids make ids past the vocab
    raise TokenError(
        f"data.dtype auto cannot tell this file's id type: read as uint32 it is "
        f"{size // 4} ids, all inside model.vocab {vocab}; read as uint16 it is "
        f"{size // 2} ids, every second one 0 where sampled (uint32 ids below 65,536 "
        "look like that)",
        "set data.dtype: uint32 (or uint16, if that is how the file was written)",
        "data.dtype",
    )


class TokenFile:
    """The token ids of one file, local (memory-mapped) or remote (byte ranges); with
    ``vocab``, ``dtype: auto`` is what the file proves and every read checks its ids."""

    def __init__(self, path: str, dtype: str = "uint16", vocab: int | None = None):
        self.path, self.vocab = path, vocab
        if is_url(path):
            import fsspec

            self.fs, self.key = fsspec.core.url_to_fs(path)
            size = int(self.fs.size(self.key))
            head = self.fs.cat_file(self.key, 0, min(size, NPY_HEADER_BYTES))
        else:
            self.fs, self.key = None, local_path(path)
            with open(self.key, "rb") as f:
                head = f.read(NPY_HEADER_BYTES)
            size = _size(self.key)
        if path.endswith(".npy"):
            self._open(npy_layout(head, size))
        else:
            if dtype == "auto":
                dtype = self._proved(size)
            self._open(bin_layout(size, dtype))

    def _proved(self, size: int) -> str:
        if self.vocab is None:
            raise ValueError("data.dtype auto needs the model's vocab to read a .bin file")

        def read32(spans: list[tuple[int, int]]) -> list[np.ndarray]:
            self._open(Layout(0, np.dtype(np.uint32), size // 4))
            return self.read_raw(spans)

        return prove_dtype(size, self.vocab, read32)

    def _open(self, layout: Layout) -> None:
        self.layout, self._map = layout, None
        if self.fs is None:
            self._map = np.memmap(self.key, layout.dtype, "r", layout.offset, (layout.count,))

    def __len__(self) -> int:
        return self.layout.count

    @property
    def dtype(self) -> np.dtype:
        return self.layout.dtype

    def read(self, start: int, stop: int) -> np.ndarray:
        """Ids ``[start, stop)`` as a fresh array (the memory map stays read-only)."""
        return self.read_many([(start, stop)])[0]

    def read_many(self, spans: list[tuple[int, int]]) -> list[np.ndarray]:
        """Ids of each ``[start, stop)`` span; remote spans are fetched concurrently
        (``TokenError``: an id outside ``vocab``, with its place in the file)."""
        parts = self.read_raw(spans)
        if self.vocab is not None:
            for (a, _), part in zip(spans, parts, strict=True):
                if part.size and int(part.max()) >= self.vocab:
                    k = int(np.argmax(part >= self.vocab))  # the first id outside
                    self._outside(a + k, int(part[k]))
        return parts

    def read_raw(self, spans: list[tuple[int, int]]) -> list[np.ndarray]:
        """``read_many`` without the vocabulary check (``validate`` reports what it finds)."""
        if self._map is not None:
            return [np.array(self._map[a:b]) for a, b in spans]
        lay, item = self.layout, self.layout.dtype.itemsize
        starts = [lay.offset + a * item for a, _ in spans]
        ends = [lay.offset + b * item for _, b in spans]
        blobs = self.fs.cat_ranges([self.key] * len(spans), starts, ends)
        return [np.frombuffer(blob, dtype=lay.dtype) for blob in blobs]

    def _outside(self, at: int, token: int) -> None:
        lay = self.layout
        raise TokenError(
            f"{self.path}: token id {token} at id {at} (byte "
            f"{lay.offset + at * lay.dtype.itemsize}, read as {lay.dtype}) is outside "
            f"model.vocab {self.vocab} (ids 0-{self.vocab - 1})",
            "check data.path and data.dtype, or raise model.vocab",
        )


def _size(path: str) -> int:
    return os.stat(path).st_size
