"""Checkpoint store over any fsspec URL: write parts, commit, find, verify, fetch, retain.

The storage tier of Varuna-style continuous checkpoints (sec. 4.5): every writer
(a data-parallel replica holding some layers) puts its files and then its part record;
``commit`` writes the manifest last, once every expected part is there. Readers trust a
step only if its manifest lists files that are present with the recorded sizes (and,
when asked to verify, sha256), so an interrupted upload is never mistaken for a
checkpoint and the previous complete one stays the latest. Layout and manifest format
live in `format`; the local staging tier in `local`; the parallel transfers in
`transfer`; background uploads in engine/checkpoint/upload.py.

URLs: ``file:///abs``, plain local paths, ``s3://bucket/prefix``, ``memory://x``, or
anything else fsspec knows. For S3 the endpoint, region and credentials come from the
standard AWS environment (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ...): botocore
reads ``AWS_ENDPOINT_URL`` itself (since 1.31; checked with botocore 1.43 and s3fs
2026.9 against a moto server), so nothing is mapped here. The store keeps no copy of
the options and its repr shows only the URL, so credentials are never logged.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import threading
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

from fsspec import AbstractFileSystem
from fsspec.core import url_to_fs
from fsspec.utils import get_protocol

from jobctl.engine.checkpoint.store.format import (
    MANIFEST_NAME,
    PARTS_DIR,
    STAGING_SUFFIX,
    CheckpointWarning,
    CorruptCheckpointError,
    FileEntry,
    IncompleteCheckpointError,
    Manifest,
    PartRecord,
    check_file_name,
    check_part_name,
    merge_parts,
    parse_step_dirname,
    plan_retention,
    sha256_file,
    step_dirname,
)
from jobctl.engine.checkpoint.store.local import (
    publish_local,
    replace_dir,
    stage_dir,
    tree_sizes,
    unlink_planted,
)
from jobctl.engine.checkpoint.store.transfer import FileUploads, RetryPolicy, run_parallel

__all__ = [
    "CheckpointStore",
    "CheckpointWarning",
    "CorruptCheckpointError",
    "FileEntry",
    "IncompleteCheckpointError",
    "Manifest",
    "PartRecord",
    "RetryPolicy",
    "publish_local",
    "sha256_file",
    "stage_dir",
]

logger = logging.getLogger(__name__)

_READ_CHUNK = 8 * 2**20


class CheckpointStore:
    """Checkpoints under one fsspec URL, in the ``{root}/step-XXXXXXXX/`` layout.

    `workers` bounds the parallel file transfers; `retry` is the default per-file retry
    policy; `fs` injects a ready filesystem (tests, wrappers), `url` then being a path
    on it. Instance caching is skipped so every store reads the current environment.
    """

    def __init__(
        self,
        url: str,
        storage_options: Mapping[str, Any] | None = None,
        *,
        fs: AbstractFileSystem | None = None,
        workers: int = 8,
        retry: RetryPolicy | None = None,
    ) -> None:
        if fs is None:
            options = dict(storage_options or {})
            if get_protocol(url) == "file":
                options.setdefault("auto_mkdir", True)  # object stores need no folders
            fs, root = url_to_fs(url, skip_instance_cache=True, **options)
        else:
            root = fs._strip_protocol(url)
        self.url = url
        self.fs = fs
        self.root = root.rstrip("/") or root
        self.workers = workers
        self.retry = retry or RetryPolicy()

    def __repr__(self) -> str:
        return f"CheckpointStore({self.url!r})"

    def _path(self, step: int, *rest: str) -> str:
        return "/".join((self.root, step_dirname(step), *rest))

    # ---- writing -------------------------------------------------------------------

    def write_part(
        self,
        step: int,
        part: str,
        local_dir: str | os.PathLike[str],
        files: Iterable[str],
        *,
        retry: RetryPolicy | None = None,
        progress: Callable[[int], None] | None = None,
        cancel: threading.Event | None = None,
        digests: Mapping[str, FileEntry] | None = None,
    ) -> PartRecord:
        """Upload `files` (relative to `local_dir`) of `step`, then ``parts/{part}.json``.

        Files go up in parallel, each retried by `retry` (default: the store's) and
        hashed on the way unless `digests` already has it (a local manifest: only the
        size is re-checked). `progress` receives byte increments; setting the `cancel`
        event stops before the next file. The part record is written only after every
        file succeeded, so a failed or killed upload leaves no record behind.
        """
        check_part_name(part)
        names = sorted({check_file_name(name) for name in files})
        policy = retry or self.retry
        if self._local():
            unlink_planted(Path(self._path(step)))
        upload = FileUploads(
            fs=self.fs,
            remote=partial(self._path, step),
            local_dir=Path(local_dir),
            policy=policy,
            progress=progress,
            cancel=cancel,
            digests=digests or {},
        )
        run_parallel([partial(upload.put, name) for name in names], self._threads, cancel)
        record = PartRecord(step=step, part=part, files={n: upload.entries[n] for n in names})
        part_path = self._path(step, PARTS_DIR, f"{part}.json")
        policy.run(partial(self.fs.pipe_file, part_path, record.to_json()), f"write {part_path}")
        return record

    def commit(
        self,
        step: int,
        parts: Sequence[str],
        meta: Mapping[str, Any] | None = None,
        *,
        known: Mapping[str, PartRecord] | None = None,
    ) -> bool:
        """Write the manifest of `step` if every part in `parts` is uploaded; say whether.

        A part record is written only after all its files were stored, so the records
        are the proof of upload and no listing is needed. `known` holds records the
        caller just wrote (not read back). Idempotent: every writer may call it after its
        own part, and whichever finds all parts present commits (concurrent commits
        write the same manifest).
        """
        records = []
        for part in parts:
            if known is not None and part in known:
                records.append(known[part])
                continue
            path = self._path(step, PARTS_DIR, f"{check_part_name(part)}.json")
            try:
                records.append(PartRecord.from_json(self.fs.cat_file(path)))
            except FileNotFoundError:
                logger.info("step %d: part %s not uploaded yet, not committing", step, part)
                return False
        manifest = merge_parts(step, records, meta or {})
        self.fs.pipe_file(self._path(step, MANIFEST_NAME), manifest.to_json())
        return True

    # ---- reading -------------------------------------------------------------------

    def steps(self) -> list[int]:
        """Every step with a folder under the root, complete or not, ascending."""
        return sorted(self._entries()[0])

    def _entries(self) -> tuple[set[int], set[int]]:
        """Steps with a folder, and steps with a local staging folder."""
        self.fs.invalidate_cache()  # other processes write here: never trust listings
        try:
            if self._local():
                names = os.listdir(self.root)
            else:
                listed = self.fs.ls(self.root, detail=False)
                names = [p.rstrip("/").rsplit("/", 1)[-1] for p in listed]
        except FileNotFoundError:
            return set(), set()
        found = [parse_step_dirname(name) for name in names if not self._linked(name)]
        staged = [
            parse_step_dirname(name.removesuffix(STAGING_SUFFIX))
            for name in names
            if name.endswith(STAGING_SUFFIX)
        ]
        return {s for s in found if s is not None}, {s for s in staged if s is not None}

    def _local(self) -> bool:
        protocol = self.fs.protocol
        return "file" in (protocol if isinstance(protocol, tuple) else (protocol,))

    @property
    def _threads(self) -> int:
        """Parallel transfers: ``workers`` to an object store (each request waits on
        the network), one on a local disk (a thread costs more than it saves there)."""
        return 1 if self._local() else self.workers

    def _linked(self, name: str) -> bool:
        """A symbolic link under a local root: never followed (it may lead out of the
        root: resuming from it, or retention deleting there), so never a step."""
        path = f"{self.root}/{name}"
        if self._local() and os.path.islink(path):
            logger.warning("skipping %s: a symbolic link, not followed", path)
            return True
        return False

    def manifest(self, step: int) -> Manifest:
        """The manifest of `step`; IncompleteCheckpointError if absent, Corrupt if unreadable."""
        path = self._path(step, MANIFEST_NAME)
        try:  # a local one read directly: fsspec's call costs ten times the read
            data = Path(path).read_bytes() if self._local() else self.fs.cat_file(path)
        except FileNotFoundError:
            raise IncompleteCheckpointError(
                f"step {step}: no {MANIFEST_NAME} (never committed, or upload interrupted)"
            ) from None
        try:
            manifest = Manifest.from_json(data)
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptCheckpointError(f"step {step}: unreadable {MANIFEST_NAME}: {exc}") from exc
        if manifest.step != step:
            raise CorruptCheckpointError(
                f"step {step}: {MANIFEST_NAME} is for step {manifest.step}"
            )
        return manifest

    def is_complete(self, step: int, verify: bool = False) -> bool:
        """Manifest present and every file present with its size (and sha256 if `verify`)."""
        return self.problem(step, verify) is None

    def latest_complete(self, verify: bool = False) -> int | None:
        """Newest complete step, warning about (and skipping) newer incomplete or corrupt ones.

        `verify` also checks the sha256 of every file of the candidates (reads them all).
        """
        for step in reversed(self.steps()):
            problem = self.problem(step, verify)
            if problem is None:
                return step
            warnings.warn(
                f"skipping checkpoint in {self.url}: {problem}",
                CheckpointWarning,
                stacklevel=2,
            )
        return None

    def problem(
        self, step: int, verify: bool = False, listing: dict[str, int] | None = None
    ) -> str | None:
        """Why `step` is not a usable checkpoint, or None if it is (``listing``: the
        root's files and sizes, one listing for many steps; default: list the step)."""
        try:
            manifest = self.manifest(step)
            problem = self._listing_problem(step, manifest, listing)
            if problem is None and verify:
                self._verify_digests(step, manifest)
        except (IncompleteCheckpointError, CorruptCheckpointError) as exc:
            return str(exc)
        return problem

    def _listing(self, base: str) -> dict[str, int]:
        """Every file under ``base`` (relative name -> size); a symbolic link's size is
        -1 (never a file of a checkpoint)."""
        if self._local():
            return tree_sizes(base)
        self.fs.invalidate_cache()
        found = self.fs.find(base, detail=True)
        return {
            path[len(base) + 1 :]: -1 if info.get("islink") else int(info["size"])
            for path, info in found.items()
        }

    def _listing_problem(
        self, step: int, manifest: Manifest, listing: dict[str, int] | None = None
    ) -> str | None:
        """First file of `manifest` missing or of the wrong size in one listing of the
        step (or in ``listing``, the root's)."""
        where = step_dirname(step)
        if listing is None:
            sizes = self._listing(self._path(step))
        else:
            inside = f"{where}/"
            sizes = {n[len(inside) :]: v for n, v in listing.items() if n.startswith(inside)}
        linked = sorted(name for name, size in sizes.items() if size < 0)
        if linked or self._linked(f"{where}/{MANIFEST_NAME}"):
            return f"step {step}: {(linked or [MANIFEST_NAME])[0]} is a symbolic link"
        for name, entry in sorted(manifest.files.items()):
            if name not in sizes:
                return f"step {step}: file {name} is missing"
            if sizes[name] != entry.size:
                return (
                    f"step {step}: file {name} has {sizes[name]} bytes, manifest says {entry.size}"
                )
        return None

    def _verify_digests(self, step: int, manifest: Manifest) -> None:
        tasks = [
            partial(self._check_remote, step, name, entry) for name, entry in manifest.files.items()
        ]
        run_parallel(tasks, self._threads)

    def _check_remote(self, step: int, name: str, entry: FileEntry) -> None:
        digest = hashlib.sha256()
        with self.fs.open(self._path(step, name), "rb", block_size=_READ_CHUNK) as handle:
            while chunk := handle.read(_READ_CHUNK):
                digest.update(chunk)
        if digest.hexdigest() != entry.sha256:
            raise CorruptCheckpointError(f"step {step}: file {name} does not match its sha256")

    # ---- fetching ------------------------------------------------------------------

    def download(self, step: int, dest_dir: str | os.PathLike[str]) -> Path:
        """Fetch `step` into ``dest_dir/step-XXXXXXXX`` (files plus manifest) and return it.

        Every file is checked against the manifest's size and sha256; a mismatch raises
        CorruptCheckpointError naming the file. The folder appears atomically and only
        when every file verified, so ``CheckpointStore(dest_dir)`` can read it.
        """
        manifest = self.manifest(step)
        problem = self._listing_problem(step, manifest)
        if problem is not None:
            raise CorruptCheckpointError(problem)
        target = Path(dest_dir) / step_dirname(step)
        staging = target.with_name(f"{target.name}.download")
        if staging.exists():
            shutil.rmtree(staging)  # left by an interrupted download
        try:
            tasks = [partial(self._fetch, step, n, e, staging) for n, e in manifest.files.items()]
            run_parallel(tasks, self._threads)
            (staging / MANIFEST_NAME).write_bytes(manifest.to_json())
            replace_dir(staging, target)
        except BaseException:
            if staging.exists():
                shutil.rmtree(staging)
            raise
        return target

    def _fetch(self, step: int, name: str, entry: FileEntry, staging: Path) -> None:
        local = staging / name
        local.parent.mkdir(parents=True, exist_ok=True)
        self.retry.run(
            partial(self.fs.get_file, self._path(step, name), str(local)),
            f"download of {name} (step {step})",
        )
        size = local.stat().st_size
        if size != entry.size:
            raise CorruptCheckpointError(
                f"step {step}: file {name} has {size} bytes, manifest says {entry.size}"
            )
        if sha256_file(local) != entry.sha256:
            raise CorruptCheckpointError(f"step {step}: file {name} does not match its sha256")

    # ---- removing ------------------------------------------------------------------

    def delete(self, step: int) -> None:
        """Remove `step`, manifest first, so a half-deleted step never looks complete."""
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(self._path(step, MANIFEST_NAME))
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm(self._path(step), recursive=True)
        self.fs.invalidate_cache()

    def _problems(self, steps: list[int], committed: int | None) -> dict[int, str | None]:
        """Each step's problem (None: complete), from one listing of the root; the
        sha256 check for the steps newer than ``committed``, the cheap one for the
        others. Manifests are read in parallel from an object store, in turn from a
        local disk (threads would cost more than the reads)."""
        ahead = {step for step in steps if committed is not None and step > committed}
        try:
            listing = self._listing(self.root)
        except FileNotFoundError:
            listing = {}

        def check(step: int) -> str | None:
            return self.problem(step, verify=step in ahead, listing=listing)

        if self._local() or len(steps) <= 1:
            return {step: check(step) for step in steps}
        with ThreadPoolExecutor(max_workers=max(1, self.workers)) as pool:
            return dict(zip(steps, pool.map(check, steps), strict=True))

    def apply_retention(
        self,
        keep_last: int,
        keep_every: int | None = None,
        protect: Callable[[int], bool] | None = None,
        committed: int | None = None,
    ) -> list[int]:
        """Delete checkpoints outside the policy (see `plan_retention`); return their steps.

        Completeness is the cheap check (manifest and sizes), except for steps newer than
        ``committed`` (the step its caller just committed): a run commits in order, so
        those were written by another life of the root, and they count only once every
        file matches its sha256 (#46 item 11: corrupt newer steps were counted as kept
        and the new step deleted). Stale local staging folders older than the newest
        complete step are removed too. The newest complete checkpoint is never deleted,
        nor any step for which ``protect(step)`` is true (e.g. a local checkpoint whose
        upload has not finished).
        """
        found, staged = self._entries()
        problems = self._problems(sorted(found), committed)
        complete = [step for step, problem in problems.items() if problem is None]
        doomed = plan_retention(complete, set(problems) - set(complete), keep_last, keep_every)
        doomed = [step for step in doomed if protect is None or not protect(step)]
        for step in doomed:
            logger.info(
                "retention: deleting checkpoint step %d (%s)", step, problems[step] or "old"
            )
            self.delete(step)
        newest = max(complete, default=None)
        for step in sorted(staged):
            if newest is not None and step < newest:
                self.fs.rm(f"{self._path(step)}{STAGING_SUFFIX}", recursive=True)
        return doomed
