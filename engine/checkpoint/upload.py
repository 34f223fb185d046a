"""Background upload of local checkpoints to a `CheckpointStore` while training goes on.

Training calls `Uploader.submit` after publishing a checkpoint locally and continues at
once: `submit` only appends to an unbounded queue. One worker thread (non-daemon, so
pending uploads finish before the interpreter exits; started on demand and gone when the
queue is empty) uploads jobs in submission order, file by file in parallel, each file
retried with exponential backoff. When `local_dir` is a checkpoint published by
`publish_local`, the sha256 recorded in its manifest are reused instead of hashing
again. After a job's part is up it may commit the step (`then_commit`), and after a
successful commit it applies the retention policy.

Coalescing policy: when the worker picks its next job and the queue already holds a
newer step, every waiting job of an older step is skipped (reported in
``status()["skipped_steps"]``); the job being uploaded is never interrupted. Uploads
that fall behind training thus catch up on the newest checkpoint instead of a backlog.
Every writer should pass `then_commit`: `CheckpointStore.commit` is idempotent and the
writer whose part completes the set commits, so no rank has to wait for the others.

While a job uploads, an in-flight marker in the store (`InflightMarkers`) keeps every
writer's retention from deleting its step; the marker goes when the job ends.

A job that fails after its retries leaves no part record, hence no manifest: the
previous complete checkpoint stays intact and the latest. The worker records the error
in `status()` and goes on with the next job.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from jobctl.engine.checkpoint.inflight import DEFAULT_STALE_AFTER_S, InflightMarkers
from jobctl.engine.checkpoint.store.checkpoint_store import CheckpointStore
from jobctl.engine.checkpoint.store.format import PartRecord, check_file_name, check_part_name
from jobctl.engine.checkpoint.store.local import local_digests
from jobctl.engine.checkpoint.store.transfer import RetryPolicy, TransferCancelled

logger = logging.getLogger(__name__)

ProgressCallback = Callable[[int, int, int], None]
"""Called as ``on_progress(step, bytes_done, bytes_total)`` from upload threads."""


# The name of the uploader's thread: a worker that trained to the end waits for it
# before it leaves (engine/worker/process.py), and for no other thread.
UPLOAD_THREAD = "ckpt-upload"


def wait_for_uploads(timeout: float | None = None) -> None:
    """Wait for this process's checkpoint uploads still running (each thread up to
    ``timeout`` seconds; None: to its end)."""
    for thread in threading.enumerate():
        if thread.name == UPLOAD_THREAD and thread is not threading.current_thread():
            thread.join(timeout)


@dataclass(frozen=True)
class UploadJob:
    """One writer's files of one step, and optionally the commit to attempt after."""

    step: int
    part: str
    local_dir: Path
    files: tuple[str, ...]
    then_commit: tuple[tuple[str, ...], dict[str, Any]] | None = None


def lower_thread_priority(nice: int) -> None:
    """Raise the calling thread's nice value by ``nice`` (Linux: per-thread priority)."""
    if nice > 0 and hasattr(os, "setpriority"):
        current = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), min(19, current + nice))


class Uploader:
    """Upload queued checkpoint parts to `store` in the background (see module doc).

    Retention (`keep_last`, `keep_every`) runs after each commit when `keep_last` is set;
    it spares steps any writer is still uploading (markers younger than
    `inflight_stale_s`).
    Retries: `max_retries` per file, sleeping min(`backoff_cap`, `backoff_base` * 2**n)
    through `sleep` (default: a wait that `close` can interrupt). `nice` lowers the
    worker thread's CPU priority, so uploads yield the CPU to training.
    """

    def __init__(
        self,
        store: CheckpointStore,
        *,
        keep_last: int | None = None,
        keep_every: int | None = None,
        max_retries: int = 5,
        backoff_base: float = 1.0,
        backoff_cap: float = 60.0,
        sleep: Callable[[float], object] | None = None,
        on_progress: ProgressCallback | None = None,
        coalesce: bool = True,
        nice: int = 0,
        inflight_stale_s: float = DEFAULT_STALE_AFTER_S,
    ) -> None:
        self._store = store
        self._inflight = InflightMarkers(store, inflight_stale_s)
        self._nice = nice
        self._keep = (keep_last, keep_every)
        self._on_progress = on_progress
        self._coalesce = coalesce
        self._abort = threading.Event()
        self._retry = RetryPolicy(
            max_retries=max_retries,
            base=backoff_base,
            cap=backoff_cap,
            sleep=sleep or self._abort.wait,
            on_error=self._record_attempt_error,
        )
        self._cond = threading.Condition()
        self._queue: deque[UploadJob] = deque()
        self._worker: threading.Thread | None = None
        self._closing = False
        self._current: UploadJob | None = None
        self._clear_status()

    def _clear_status(self) -> None:
        """What ``status`` reports before the first upload."""
        self._bytes = (0, 0)
        self._last_committed: int | None = None
        self._last_error: str | None = None
        self._failures = 0
        self._failed_jobs = 0
        self._skipped: list[int] = []
        self._abandoned: list[int] = []

    # ---- producer side -------------------------------------------------------------

    def submit(
        self,
        step: int,
        part: str,
        local_dir: str | os.PathLike[str],
        files: Iterable[str],
        then_commit: tuple[Sequence[str], Mapping[str, Any]] | None = None,
    ) -> None:
        """Queue `files` (relative to `local_dir`) as `part` of `step`; never blocks.

        `then_commit` = (parts, meta): after this part is up, commit the step if all
        `parts` are there.
        """
        commit = None
        if then_commit is not None:
            parts, meta = then_commit
            commit = (tuple(check_part_name(p) for p in parts), dict(meta))
        job = UploadJob(
            step=step,
            part=check_part_name(part),
            local_dir=Path(local_dir),
            files=tuple(check_file_name(name) for name in files),
            then_commit=commit,
        )
        with self._cond:
            if self._closing:
                raise RuntimeError("Uploader.submit after close()")
            self._queue.append(job)
            if self._worker is None:
                self._worker = threading.Thread(target=self._run, name=UPLOAD_THREAD, daemon=False)
                self._worker.start()
            self._cond.notify_all()

    def status(self) -> dict[str, Any]:
        """Snapshot: queue, current step and its bytes, last commit, errors, skips.

        ``failures`` counts failed transfer attempts (retried or not), ``failed_jobs``
        the jobs given up after their retries, ``skipped_steps`` those coalesced away,
        ``abandoned_steps`` those dropped by a `close` that timed out.
        """
        with self._cond:
            return {
                "queued_steps": sorted({job.step for job in self._queue}),
                "current_step": self._current.step if self._current else None,
                "bytes_done": self._bytes[0],
                "bytes_total": self._bytes[1],
                "last_committed_step": self._last_committed,
                "last_error": self._last_error,
                "failures": self._failures,
                "failed_jobs": self._failed_jobs,
                "skipped_steps": list(self._skipped),
                "abandoned_steps": list(self._abandoned),
                "running": self._worker is not None,
            }

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until nothing is queued or uploading; False if `timeout` ran out first."""
        with self._cond:
            return self._cond.wait_for(self._idle, timeout)

    def close(self, timeout: float | None = None) -> bool:
        """Stop accepting jobs, let queued ones finish for up to `timeout` seconds.

        If they have not finished by then, cancel: queued jobs are dropped, the running
        one stops before its next file (a file in flight completes), backoff sleeps are
        cut short; then wait up to `timeout` again. True iff all submitted work finished.
        """
        with self._cond:
            self._closing = True
            worker = self._worker
        if worker is None:
            return not self._abort.is_set()
        worker.join(timeout)
        if worker.is_alive():
            logger.warning("checkpoint uploads unfinished after %ss: cancelling", timeout)
            self._abort.set()
            worker.join(timeout)
        return not worker.is_alive() and not self._abort.is_set()

    def __enter__(self) -> Uploader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ---- worker side ---------------------------------------------------------------

    def _idle(self) -> bool:
        return not self._queue and self._current is None

    def _run(self) -> None:
        lower_thread_priority(self._nice)
        while (job := self._next_job()) is not None:
            try:
                self._process(job)
            finally:
                with self._cond:
                    self._current = None
                    self._cond.notify_all()

    def _next_job(self) -> UploadJob | None:
        """Pop the next job (after coalescing), or retire the worker when none is left."""
        with self._cond:
            if self._abort.is_set() and self._queue:
                abandoned = sorted({job.step for job in self._queue})
                logger.warning(
                    "close(): abandoning queued checkpoint uploads of steps %s", abandoned
                )
                self._abandoned.extend(abandoned)
                self._queue.clear()
            if not self._queue:
                self._worker = None
                self._cond.notify_all()
                return None
            if self._coalesce:
                self._drop_superseded()
            self._current = self._queue.popleft()
            self._bytes = (0, 0)
            return self._current

    def _drop_superseded(self) -> None:
        newest = max(job.step for job in self._queue)
        dropped = sorted({job.step for job in self._queue if job.step < newest})
        if dropped:
            logger.info(
                "skipping checkpoint uploads of steps %s: step %d is queued", dropped, newest
            )
            self._skipped.extend(dropped)
            self._queue = deque(job for job in self._queue if job.step >= newest)

    def _process(self, job: UploadJob) -> None:
        marked = self._mark(job)
        try:
            self._upload(job)
        finally:
            if marked:
                self._clear_marker(job)

    def _mark(self, job: UploadJob) -> bool:
        try:
            self._inflight.mark(job.step, job.part)
        except Exception as exc:  # protection is best effort: upload unprotected
            logger.warning("step %d: in-flight marker not written: %r", job.step, exc)
            return False
        return True

    def _clear_marker(self, job: UploadJob) -> None:
        try:
            self._inflight.clear(job.step, job.part)
        except Exception as exc:  # a leftover marker only delays retention (stale later)
            logger.warning("step %d: in-flight marker not removed: %r", job.step, exc)

    def _upload(self, job: UploadJob) -> None:
        try:
            total = sum((job.local_dir / name).stat().st_size for name in job.files)
            with self._cond:
                self._bytes = (0, total)
            record = self._store.write_part(
                job.step,
                job.part,
                job.local_dir,
                job.files,
                retry=self._retry,
                progress=partial(self._advance, job.step),
                cancel=self._abort,
                digests=local_digests(job.local_dir),
            )
            if job.then_commit is not None:
                self._commit(record, *job.then_commit)
        except TransferCancelled:
            logger.warning("upload of step %d part %s cancelled by close()", job.step, job.part)
        except Exception as exc:  # the worker outlives one failed job: record it, go on
            self._record_job_error(job, exc)

    def _record_job_error(self, job: UploadJob, exc: Exception) -> None:
        logger.error("upload of step %d part %s failed: %r", job.step, job.part, exc)
        with self._cond:
            self._failed_jobs += 1
            self._last_error = f"step {job.step} part {job.part}: {exc!r}"

    def _commit(self, record: PartRecord, parts: tuple[str, ...], meta: dict[str, Any]) -> None:
        step = record.step
        commit = partial(self._store.commit, step, parts, meta, known={record.part: record})
        committed = self._retry.run(commit, f"commit of step {step}")
        if not committed:
            logger.info("step %d: part uploaded; another writer will commit", step)
            return
        with self._cond:
            self._last_committed = step
        keep_last, keep_every = self._keep
        if keep_last is not None:
            # No ``committed``: uploads finish out of order (step 2's may commit after
            # step 3's), and verifying a newer remote step would download all of it.
            deleted = self._store.apply_retention(
                keep_last, keep_every, protect=self._inflight.protected
            )
            if deleted:
                logger.info("retention deleted checkpoint steps %s", deleted)

    def _advance(self, step: int, nbytes: int) -> None:
        with self._cond:
            done, total = self._bytes[0] + nbytes, self._bytes[1]
            self._bytes = (done, total)
        if self._on_progress is not None:
            self._on_progress(step, done, total)

    def _record_attempt_error(self, exc: BaseException) -> None:
        with self._cond:
            self._failures += 1
            self._last_error = repr(exc)
