"""Local tier of checkpoints: stage on local disk, then publish atomically.

Ranks write their shards into ``{root}/step-XXXXXXXX.tmp/`` (`stage_dir`), then call
`publish_local`. Each call records its part (``parts/{part}.json`` with sizes and
sha256); the call that completes the list of expected parts writes ``manifest.json``
and renames the staging folder to ``{root}/step-XXXXXXXX`` in one ``os.replace``. A
crash at any point leaves either the previous checkpoints untouched plus a stale
``.tmp`` folder (`clear_staging` removes those at restart), or the complete new one:
never a half checkpoint under its final name.
The layout and manifest are the remote ones, so ``CheckpointStore(root)`` reads them.

A symbolic link planted by a step's name (``step-X`` or ``step-X.tmp``) is removed, never
written through (it may lead out of the root) and never a reason to fail (#46 item 11).
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from jobctl.engine.checkpoint.store.format import (
    MANIFEST_NAME,
    PARTS_DIR,
    STAGING_SUFFIX,
    FileEntry,
    Manifest,
    PartRecord,
    check_part_name,
    measure_files,
    merge_parts,
    step_dirname,
)

logger = logging.getLogger(__name__)


def unlink_planted(path: Path) -> None:
    """Remove a symbolic link at ``path``, a name that only jobctl's own folders take:
    writing through it could land outside the root, and its target is not touched."""
    if path.is_symlink():
        logger.warning("removing %s: a symbolic link where a step folder goes", path)
        path.unlink()


def tree_sizes(base: str) -> dict[str, int]:
    """Every entry under the local folder ``base`` that is a file or a symbolic link
    (relative POSIX name -> size; a link -1: never followed), in one ``os.walk``: what
    an fsspec ``find`` of a local path gives, at a fraction of its cost (retention lists
    the root after every checkpoint, #55)."""
    if not os.path.isdir(base) or os.path.islink(base):
        raise FileNotFoundError(base)
    out: dict[str, int] = {}
    for folder, dirs, files in os.walk(base):
        rel = os.path.relpath(folder, base)
        prefix = "" if rel == "." else rel.replace(os.sep, "/") + "/"
        for name in dirs + files:
            path = os.path.join(folder, name)
            if os.path.islink(path):
                out[prefix + name] = -1
            elif name in files:
                out[prefix + name] = os.stat(path).st_size
    return out


def stage_dir(root: str | os.PathLike[str], step: int) -> Path:
    """Create (if needed) and return the staging folder ``{root}/step-XXXXXXXX.tmp``.

    Existing content is kept: several local ranks may stage into the same folder.
    """
    path = Path(root) / f"{step_dirname(step)}{STAGING_SUFFIX}"
    unlink_planted(path)
    path.mkdir(parents=True, exist_ok=True)
    return path


def clear_staging(root: str | os.PathLike[str]) -> list[Path]:
    """Remove every staging folder under `root`; returns what was removed.

    A run killed while staging step S leaves ``step-S.tmp`` with part records of the
    dead run; if the restarted run stages S again, those stale records could complete
    the manifest early. Call this once per node at (re)start, before any rank stages.
    """
    base = Path(root)
    stale = sorted(base.glob(f"step-*{STAGING_SUFFIX}")) if base.is_dir() else []
    for path in stale:
        shutil.rmtree(path)
    return stale


def local_digests(local_dir: str | os.PathLike[str]) -> dict[str, FileEntry]:
    """File digests from the manifest of a published local checkpoint ({} if none).

    Lets an upload reuse the sha256 computed at publish time instead of hashing again;
    the digest then covers the bytes as training wrote them, end to end.
    """
    path = Path(local_dir) / MANIFEST_NAME
    return Manifest.from_json(path.read_bytes()).files if path.is_file() else {}


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` via a temporary sibling and ``os.replace``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def replace_dir(staging: Path, target: Path) -> None:
    """Make `staging` appear as `target` atomically, replacing an older `target`.

    ``os.replace`` cannot overwrite a non-empty folder, so an existing target (the same
    step published again after a restart) is first renamed aside and removed after.
    """
    unlink_planted(target)
    if not target.exists():
        os.replace(staging, target)
        return
    old = target.with_name(f"{target.name}.replaced-{os.getpid()}")
    os.replace(target, old)
    os.replace(staging, target)
    shutil.rmtree(old)


@contextmanager
def _locked(root: Path) -> Iterator[None]:
    """Exclusive lock on the root folder, so concurrent local publishers do not race."""
    fd = os.open(root, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the flock


def publish_local(
    root: str | os.PathLike[str],
    step: int,
    part: str,
    files: Iterable[str],
    meta: Mapping[str, Any] | None = None,
    parts: Sequence[str] | None = None,
) -> Path | None:
    """Record `part` of `step` (its `files`, relative to the staging folder) and publish.

    `parts` lists every part the step needs (default: just `part`); every writer must
    pass the same list and `meta`. Returns the published folder once the last expected
    part arrives, None while parts are still missing. Hashing runs outside the lock.
    """
    check_part_name(part)
    expected = list(parts) if parts is not None else [part]
    if part not in expected:
        raise ValueError(f"part {part!r} is not among the expected parts {expected}")
    base = Path(root)
    staging = stage_dir(base, step)
    record = PartRecord(step=step, part=part, files=measure_files(staging, files))
    target = base / step_dirname(step)
    with _locked(base):
        # No fsync, no rename: readers read records under this lock, and a crash before
        # the manifest leaves a staging folder that restart clears (only the manifest,
        # written last and synced, makes a step; #55: a sync per part cost 0.3 ms CPU).
        records_dir = staging / PARTS_DIR
        records_dir.mkdir(exist_ok=True)
        (records_dir / f"{part}.json").write_bytes(record.to_json())
        part_paths = [staging / PARTS_DIR / f"{name}.json" for name in expected]
        if not all(path.exists() for path in part_paths):
            return None
        records = [PartRecord.from_json(path.read_bytes()) for path in part_paths]
        manifest = merge_parts(step, records, meta or {})
        write_bytes_atomic(staging / MANIFEST_NAME, manifest.to_json())
        replace_dir(staging, target)
    return target
