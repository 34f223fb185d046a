"""On-storage format of checkpoints: layout names, part records, manifests, digests.

One layout on every tier (local disk, S3, any fsspec URL)::

    {root}/step-{step:08d}/<files...>             shards written by the ranks
    {root}/step-{step:08d}/parts/{part}.json      one per writer, after its files
    {root}/step-{step:08d}/manifest.json          written last: the commit marker

A checkpoint is complete when its manifest exists and every file it lists is present
with the recorded size (and, when verified, the recorded sha256). Nothing here does
I/O on a store; `checkpoint_store` moves the bytes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
PARTS_DIR = "parts"
STAGING_SUFFIX = ".tmp"
_STEP_RE = re.compile(r"^step-(\d{8,})$")
_PART_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_HASH_CHUNK = 8 * 2**20


class CorruptCheckpointError(RuntimeError):
    """A checkpoint file does not match the size or sha256 its manifest records."""


class IncompleteCheckpointError(FileNotFoundError):
    """The checkpoint has no readable manifest (never committed, or interrupted)."""


class CheckpointWarning(UserWarning):
    """A checkpoint was skipped while looking for the latest complete one."""


def step_dirname(step: int) -> str:
    """Directory name of `step`: ``step-00000042``."""
    if step < 0:
        raise ValueError(f"checkpoint step must be >= 0, got {step}")
    return f"step-{step:08d}"


def parse_step_dirname(name: str) -> int | None:
    """The step of a ``step-XXXXXXXX`` directory name, None for anything else."""
    match = _STEP_RE.match(name)
    return int(match.group(1)) if match else None


def check_part_name(part: str) -> str:
    """Return `part` if usable as a file name (letters, digits, ``_.-``), else raise."""
    if not _PART_RE.match(part):
        raise ValueError(f"invalid part name {part!r}: use letters, digits, '_', '.', '-'")
    return part


def check_file_name(name: str) -> str:
    """Return `name` as a normalised relative POSIX path inside a step, else raise.

    Rejects absolute paths, ``..`` and the names the layout reserves (the manifest and
    the parts folder), so a shard can never overwrite a commit marker.
    """
    path = PurePosixPath(str(name).replace(os.sep, "/"))
    if path.is_absolute() or not path.parts or ".." in path.parts or "." in path.parts:
        raise ValueError(f"checkpoint file names must be relative paths, got {name!r}")
    if path.parts[0] == PARTS_DIR or str(path) == MANIFEST_NAME:
        raise ValueError(f"{name!r} is reserved by the checkpoint layout")
    return str(path)


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of a local file, read in 8 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass(frozen=True)
class FileEntry:
    """Size in bytes and hex sha256 of one checkpoint file."""

    size: int
    sha256: str

    @classmethod
    def of_local(cls, path: str | os.PathLike[str]) -> FileEntry:
        """Measure a local file."""
        return cls(size=os.path.getsize(path), sha256=sha256_file(path))

    def to_dict(self) -> dict[str, Any]:
        return {"size": self.size, "sha256": self.sha256}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FileEntry:
        size = data["size"]
        if type(size) is not int or size < 0:
            raise ValueError(f"size must be an integer >= 0, got {str(size)[:40]}")
        return cls(size=size, sha256=str(data["sha256"]))


def _files_to_dict(files: Mapping[str, FileEntry]) -> dict[str, Any]:
    return {name: files[name].to_dict() for name in sorted(files)}


def _files_from_dict(data: Mapping[str, Any]) -> dict[str, FileEntry]:
    return {check_file_name(name): FileEntry.from_dict(entry) for name, entry in data.items()}


@dataclass(frozen=True)
class PartRecord:
    """What one writer stored for one step: ``parts/{part}.json``."""

    step: int
    part: str
    files: dict[str, FileEntry]

    def to_json(self) -> bytes:
        body = {
            "format": FORMAT_VERSION,
            "step": self.step,
            "part": self.part,
            "files": _files_to_dict(self.files),
        }
        return json.dumps(body, indent=1, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes | str) -> PartRecord:
        with _malformed_is_a_value_error():
            body = _json_object(data)
            return cls(
                step=_step(body["step"]),
                part=check_part_name(str(body["part"])),
                files=_files_from_dict(body["files"]),
            )


@dataclass(frozen=True)
class Manifest:
    """The commit marker of a step: every file with its digest, the parts, free `meta`."""

    step: int
    parts: list[str]
    files: dict[str, FileEntry]
    meta: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> bytes:
        body = {
            "format": FORMAT_VERSION,
            "step": self.step,
            "parts": list(self.parts),
            "files": _files_to_dict(self.files),
            "meta": self.meta,
        }
        return json.dumps(body, indent=1, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes | str) -> Manifest:
        """The manifest in ``data``; ValueError for anything else (any shape, any depth)."""
        with _malformed_is_a_value_error():
            body = _json_object(data)
            if body.get("format") != FORMAT_VERSION:
                raise ValueError(f"unsupported manifest format {body.get('format')!r}")
            return cls(
                step=_step(body["step"]),
                parts=[check_part_name(str(p)) for p in body["parts"]],
                files=_files_from_dict(body["files"]),
                meta=dict(body.get("meta") or {}),
            )


@contextlib.contextmanager
def _malformed_is_a_value_error() -> Iterator[None]:
    """A manifest or part record of the wrong shape (``[]``, ``{"files": []}``, a step of
    ``1e400``, JSON 100,000 levels deep) is as unreadable as bad JSON: a ValueError."""
    try:
        yield
    except (KeyError, TypeError, AttributeError, OverflowError, RecursionError) as e:
        raise ValueError(f"malformed: {type(e).__name__}: {e}") from None


def _json_object(data: bytes | str) -> dict[str, Any]:
    body = json.loads(data)
    if not isinstance(body, dict):
        raise ValueError(f"expected a JSON object, got {type(body).__name__}")
    return body


def _step(value: Any) -> int:
    if type(value) is not int or value < 0:
        raise ValueError(f"step must be an integer >= 0, got {str(value)[:40]}")
    return value


def measure_files(local_dir: str | os.PathLike[str], files: Iterable[str]) -> dict[str, FileEntry]:
    """FileEntry of every (relative) file under `local_dir`, keyed by its checked name."""
    base = Path(local_dir)
    return {check_file_name(name): FileEntry.of_local(base / name) for name in files}


def merge_parts(step: int, records: Iterable[PartRecord], meta: Mapping[str, Any]) -> Manifest:
    """Manifest of `step` from its part records.

    The same file may appear in several parts (replicas writing an identical shard) only
    with identical digests; anything else is two writers disagreeing, which is an error.
    """
    files: dict[str, FileEntry] = {}
    parts: list[str] = []
    for record in records:
        if record.step != step:
            raise ValueError(f"part {record.part!r} belongs to step {record.step}, not {step}")
        parts.append(record.part)
        for name, entry in record.files.items():
            if files.setdefault(name, entry) != entry:
                raise ValueError(f"parts disagree on {name!r} of step {step}")
    return Manifest(step=step, parts=parts, files=files, meta=dict(meta))


def plan_retention(
    complete: Iterable[int],
    incomplete: Iterable[int],
    keep_last: int,
    keep_every: int | None = None,
) -> list[int]:
    """Steps to delete: old complete ones outside the policy, stale incomplete ones.

    Keeps the newest `keep_last` complete steps and every complete step divisible by
    `keep_every`; deletes incomplete steps older than the newest complete one (they can
    no longer become the latest) and keeps newer ones (an upload may be in flight). The
    newest complete step is never deleted.
    """
    if keep_last < 1:
        raise ValueError(f"keep_last must be >= 1 (the newest checkpoint is kept), got {keep_last}")
    if keep_every is not None and keep_every < 1:
        raise ValueError(f"keep_every must be None or >= 1, got {keep_every}")
    done = sorted(set(complete))
    if not done:
        return []
    keep = set(done[-keep_last:])
    if keep_every:
        keep.update(step for step in done if step % keep_every == 0)
    stale = {step for step in incomplete if step < done[-1]} - set(done)
    return sorted({step for step in done if step not in keep} | stale)
