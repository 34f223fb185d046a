"""One rank's side of checkpointing: snapshot, local write, atomic publish, upload.

Training waits only for a snapshot: copies of this rank's block tensors (a memcpy, or
a device-to-host copy on GPU). A low-priority background thread writes the snapshot
to local disk, records this rank's part, and the part that completes a local group
(the ranks sharing one disk) publishes the step atomically, applies local retention
and queues the group's upload to the remote store, where the group is one part of
the remote manifest. Events (checkpoint, upload progress, uploaded, errors) go to the
run's ``metrics.jsonl``.

If the writer falls behind, a waiting snapshot is replaced by a newer one (the newest
checkpoint is what a resume needs; memory stays bounded at two snapshots) unless
``checkpoint.coalesce`` is false, which makes training wait instead. The final
checkpoint is never replaced, and ``close`` waits for it. A snapshot's host tensors
come from the manager's pool (``buffers``) and go back to it once written or replaced,
so the next snapshot copies into memory already mapped (``checkpoint.buffers``).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from jobctl.engine.checkpoint.blocks import Snapshot, write_meta, write_snapshot
from jobctl.engine.checkpoint.buffers import BufferPool, Buffers
from jobctl.engine.checkpoint.store.checkpoint_store import CheckpointStore
from jobctl.engine.checkpoint.store.format import Manifest
from jobctl.engine.checkpoint.store.local import (
    clear_staging,
    publish_local,
    stage_dir,
    write_bytes_atomic,
)
from jobctl.engine.checkpoint.upload import Uploader, lower_thread_priority
from jobctl.engine.core.events import EventLog, Kind
from jobctl.engine.core.plan import Plan
from jobctl.spec.phases import CheckpointSpec

BACKGROUND_NICE = 10  # writes, uploads and retention yield the CPU to training
EVENT_FLUSH_S = 30.0  # longest a checkpoint part waits for this rank's events to be archived


def local_groups(plan: Plan, shared_disk: bool) -> dict[int, str]:
    """Rank -> local group name: one group if all nodes share the checkpoint disk."""
    return {r.rank: "all" if shared_disk else f"node-{r.node}" for r in plan.ranks}


@dataclass(frozen=True)
class Copied:
    """A snapshot's copy: the seconds training waited for it and the bytes copied
    (the ``checkpoint`` event carries them; the planner prices snapshots with them)."""

    seconds: float
    nbytes: int


@dataclass
class _Job:
    step: int
    snap: Snapshot
    meta: dict
    final: bool
    buffers: Buffers | None = None  # the snapshot's host tensors, back to the pool after
    copied: Copied | None = None


class CheckpointManager:
    """Writes, publishes and uploads the checkpoints of one rank in the background."""

    def __init__(
        self,
        checkpoint: CheckpointSpec,
        plan: Plan,
        rank: int,
        root: Path,
        events: EventLog,
        shared_disk: bool = True,
    ):
        self.cfg, self.plan, self.rank, self.root = checkpoint, plan, rank, root
        self.events = events
        groups = local_groups(plan, shared_disk)
        self.group = groups[rank]
        self.local_parts = [f"rank-{r}" for r, g in sorted(groups.items()) if g == self.group]
        self.remote_parts = sorted(set(groups.values()))
        self.uploader = self._uploader()
        self._committed: int | None = None
        self._reported_error: str | None = None
        self._last_progress = 0.0
        self._cond = threading.Condition()
        self._pending: _Job | None = None
        self._busy = False
        self._pool = BufferPool()
        self._error: BaseException | None = None
        self._worker = threading.Thread(target=self._run, name="ckpt-writer", daemon=True)
        self._worker.start()

    def _uploader(self) -> Uploader | None:
        ck = self.cfg
        if not ck.remote:
            return None
        store = CheckpointStore(ck.remote)
        return Uploader(
            store,
            keep_last=ck.keep_last,
            keep_every=ck.keep_every,
            max_retries=ck.upload_retries,
            on_progress=self._progress,
            nice=BACKGROUND_NICE,
            coalesce=ck.coalesce,  # false: every checkpoint is uploaded, as the spec says
        )

    def clear_stale_staging(self) -> None:
        """Remove staging folders a killed run left (call before any rank stages)."""
        for path in clear_staging(self.root):
            self.events.write(Kind.STAGING_CLEARED, path=str(path))

    def buffers(self) -> Buffers:
        """Host tensors for the next snapshot (``snapshot_blocks(into=...)``); hand them
        to ``save`` with it."""
        return self._pool.take()

    def save(
        self,
        step: int,
        snap: Snapshot,
        meta: dict,
        final: bool = False,
        buffers: Buffers | None = None,
        copied: Copied | None = None,
    ) -> None:
        """Queue a snapshot (copied into ``buffers``, if it was, as ``copied`` says) for
        writing; returns at once (raises an earlier write error)."""
        with self._cond:
            self._raise_error()
            coalesce = self.cfg.coalesce
            if self._pending is not None and coalesce and not self._pending.final:
                self.events.write(Kind.CHECKPOINT_SKIPPED, step=self._pending.step, newer=step)
                self._pool.give(self._pending.buffers)
                self._pending = None
            self._cond.wait_for(lambda: self._pending is None)  # backpressure otherwise
            self._pending = _Job(step, snap, meta, final, buffers, copied)
            self._cond.notify_all()

    def _raise_error(self) -> None:
        if self._error is not None:
            raise RuntimeError("writing a checkpoint failed") from self._error

    def _run(self) -> None:
        lower_thread_priority(BACKGROUND_NICE)
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending is not None)
                job, self._pending, self._busy = self._pending, None, True
                self._cond.notify_all()
            try:
                self._write(job)
            except BaseException as e:  # surfaced to the training thread by save/close
                with self._cond:
                    self._error = e
            finally:
                self._pool.give(job.buffers)  # written (or failed): refill it next time
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _write(self, job: _Job) -> None:
        staging = stage_dir(self.root, job.step)
        files = write_snapshot(job.snap, staging)
        if self.rank == 0:
            files.append(write_meta(staging, job.meta))
        part = f"rank-{self.rank}"
        # Events first: a step's loss is archived before any checkpoint of that step can
        # be published (all parts needed), so a node lost right after cannot lose it.
        flush = getattr(self.events, "flush", None)
        if flush is not None:
            flush(EVENT_FLUSH_S)
        published = publish_local(self.root, job.step, part, files, job.meta, self.local_parts)
        if published is None:
            return
        ck = self.cfg
        uploaded = self.uploaded_through()
        # A local checkpoint stays until a remote one at least as new exists.
        protect = None if self.uploader is None else (lambda step: step > uploaded)
        CheckpointStore(str(self.root)).apply_retention(
            ck.keep_last, ck.keep_every, protect, committed=job.step
        )
        copied = {}
        if job.copied is not None:
            copied = {"snapshot_s": job.copied.seconds, "snapshot_bytes": job.copied.nbytes}
        self.events.write(Kind.CHECKPOINT, step=job.step, path=str(published), **copied)
        if self.uploader is not None:
            names = sorted(Manifest.from_json((published / "manifest.json").read_bytes()).files)
            self.uploader.submit(
                job.step, self.group, published, names, then_commit=(self.remote_parts, job.meta)
            )

    @property
    def _marker(self) -> Path:
        return self.root / "uploaded-through.json"

    def uploaded_through(self) -> int:
        """Newest step committed remotely by any rank sharing this disk (-1: none)."""
        try:
            return int(json.loads(self._marker.read_text())["step"])
        except (FileNotFoundError, ValueError, KeyError):
            return -1

    def _mark_uploaded(self, step: int) -> None:
        with self._cond:  # ranks race on the file; only ever raise the value
            if step > self.uploaded_through():
                write_bytes_atomic(self._marker, json.dumps({"step": step}).encode())

    def _progress(self, step: int, done: int, total: int) -> None:
        """An ``upload`` event: bytes of this local group's part of ``step`` sent so far
        (at most every 0.5 s, and always the last one, done == total)."""
        now = time.monotonic()
        if now - self._last_progress >= 0.5 or done >= total:
            self._last_progress = now
            self.events.write(
                Kind.UPLOAD,
                step=step,
                part=self.group,
                rank=self.rank,
                bytes_done=done,
                bytes_total=total,
            )

    def poll(self) -> None:
        """Report a newly committed remote step or an upload error (cheap, per step)."""
        if self.uploader is None:
            return
        st = self.uploader.status()
        if st["last_committed_step"] not in (None, self._committed):
            self._committed = st["last_committed_step"]
            self._mark_uploaded(self._committed)
            self.events.write(Kind.UPLOADED, step=self._committed, rank=self.rank)
        if st["last_error"] and st["last_error"] != self._reported_error:
            self._reported_error = st["last_error"]
            self.events.write(Kind.UPLOAD_ERROR, error=st["last_error"], failures=st["failures"])

    def close(self, timeout: float | None = None) -> bool:
        """Wait for the last write and the queued uploads; False if uploads did not finish."""
        with self._cond:
            self._cond.wait_for(lambda: self._pending is None and not self._busy)
            self._raise_error()
        if self.uploader is None:
            return True
        ok = self.uploader.close(timeout)
        self.poll()
        return ok
