"""Flat token files: ``.bin`` (raw uint16 or uint32 ids) and ``.npy``, read by range.

A local file is memory-mapped; any other fsspec URL (``s3://``, ``gs://``, ...) is read
by byte ranges (``cat_ranges``, concurrent on async filesystems such as s3fs), never
downloaded whole. Both answer ``read(start, stop)`` in token ids, so the packing above
them does not care where the file lives.
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
    """A raw ``.bin`` file is nothing but ids of ``dtype``."""
    dt = np.dtype(DTYPES[dtype])
    return Layout(0, dt, size // dt.itemsize)


class TokenFile:
    """The token ids of one file, local (memory-mapped) or remote (byte ranges)."""

    def __init__(self, path: str, dtype: str = "uint16"):
        self.path = path
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
        npy = path.endswith(".npy")
        self.layout = npy_layout(head, size) if npy else bin_layout(size, dtype)
        self._map = None
        if self.fs is None:
            lay = self.layout
            self._map = np.memmap(self.key, lay.dtype, "r", lay.offset, (lay.count,))

    def __len__(self) -> int:
        return self.layout.count

    @property
    def dtype(self) -> np.dtype:
        return self.layout.dtype

    def read(self, start: int, stop: int) -> np.ndarray:
        """Ids ``[start, stop)`` as a fresh array (the memory map stays read-only)."""
        return self.read_many([(start, stop)])[0]

    def read_many(self, spans: list[tuple[int, int]]) -> list[np.ndarray]:
        """Ids of each ``[start, stop)`` span; remote spans are fetched concurrently."""
        if self._map is not None:
            return [np.array(self._map[a:b]) for a, b in spans]
        lay, item = self.layout, self.layout.dtype.itemsize
        starts = [lay.offset + a * item for a, _ in spans]
        ends = [lay.offset + b * item for _, b in spans]
        blobs = self.fs.cat_ranges([self.key] * len(spans), starts, ends)
        return [np.frombuffer(blob, dtype=lay.dtype) for blob in blobs]


def _size(path: str) -> int:
    return os.stat(path).st_size
