"""One rank's side of checkpointing: local write, atomic publish, background upload.

Training blocks only for writing this rank's block files to local disk. Every rank
records its part; the part that completes the set of a local group (the ranks that
share one local disk) publishes the step atomically, applies local retention and
queues the upload of the group's files to the remote store, where the group is one
part of the remote manifest. Upload progress and commits are reported as events in
the run's ``metrics.jsonl``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from .ckpt_store import CheckpointStore
from .ckpt_store_format import Manifest
from .ckpt_store_local import clear_staging, publish_local, stage_dir
from .ckpt_upload import Uploader
from .plan import Plan


class EventLog:
    """Appends JSON lines to the run's ``metrics.jsonl`` (small atomic appends)."""

    def __init__(self, path: Path):
        self.path = path

    def write(self, kind: str, **fields) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps({"kind": kind, "ts": time.time(), **fields}) + "\n")


def local_groups(plan: Plan, shared_disk: bool) -> dict[int, str]:
    """Rank -> local group name: one group if all nodes share the checkpoint disk."""
    return {r.rank: "all" if shared_disk else f"node-{r.node}" for r in plan.ranks}


class CheckpointManager:
    """Writes, publishes and uploads the checkpoints of one rank."""

    def __init__(
        self, spec, plan: Plan, rank: int, root: Path, events: EventLog, shared_disk: bool = True
    ):
        self.spec, self.plan, self.rank, self.root, self.events = spec, plan, rank, root, events
        groups = local_groups(plan, shared_disk)
        self.group = groups[rank]
        self.local_parts = [f"rank-{r}" for r, g in sorted(groups.items()) if g == self.group]
        self.remote_parts = sorted(set(groups.values()))
        self.uploader = self._uploader()
        self._committed: int | None = None
        self._reported_error: str | None = None
        self._last_progress = 0.0

    def _uploader(self) -> Uploader | None:
        ck = self.spec.checkpoint
        if not ck.remote:
            return None
        return Uploader(
            CheckpointStore(ck.remote),
            keep_last=ck.keep_last,
            keep_every=ck.keep_every,
            max_retries=ck.upload_retries,
            on_progress=self._progress,
        )

    def clear_stale_staging(self) -> None:
        """Remove staging folders a killed run left (call before any rank stages)."""
        for path in clear_staging(self.root):
            self.events.write("staging_cleared", path=str(path))

    def staging(self, step: int) -> Path:
        return stage_dir(self.root, step)

    def publish(self, step: int, files: list[str], meta: dict) -> Path | None:
        """Record this rank's files; if that completes the local group, publish + upload."""
        published = publish_local(
            self.root, step, f"rank-{self.rank}", files, meta, self.local_parts
        )
        if published is None:
            return None
        ck = self.spec.checkpoint
        CheckpointStore(str(self.root)).apply_retention(ck.keep_last, ck.keep_every)
        self.events.write("checkpoint", step=step, path=str(published))
        if self.uploader is not None:
            names = sorted(Manifest.from_json((published / "manifest.json").read_bytes()).files)
            self.uploader.submit(
                step, self.group, published, names, then_commit=(self.remote_parts, meta)
            )
        return published

    def _progress(self, step: int, done: int, total: int) -> None:
        now = time.monotonic()
        if now - self._last_progress >= 0.5 or done >= total:
            self._last_progress = now
            self.events.write("upload", step=step, bytes_done=done, bytes_total=total)

    def poll(self) -> None:
        """Report a newly committed remote step or an upload error (cheap, per step)."""
        if self.uploader is None:
            return
        st = self.uploader.status()
        if st["last_committed_step"] != self._committed and st["last_committed_step"] is not None:
            self._committed = st["last_committed_step"]
            self.events.write("uploaded", step=self._committed)
        if st["last_error"] and st["last_error"] != self._reported_error:
            self._reported_error = st["last_error"]
            self.events.write("upload_error", error=st["last_error"], failures=st["failures"])

    def close(self, timeout: float | None = None) -> bool:
        """Wait for queued uploads (end of training); False if some did not finish."""
        if self.uploader is None:
            return True
        ok = self.uploader.close(timeout)
        self.poll()
        return ok
