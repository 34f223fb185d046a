"""In-flight upload markers: retention leaves a step alone while a writer still uploads it.

Every publishing rank has its own `Uploader`, and a rank's commit of a newer step runs
retention, which deletes incomplete steps older than the newest complete one. Another
writer may still be uploading such a step (a slow rank, or the previous layout's
uploader finishing while the morphed run already commits newer steps): deleting it
under that writer wastes every byte it sends and leaves a half-written folder behind.

So each upload job first writes a marker object ``<step>/inflight/<part>.json`` in the
remote store (step, part, host, pid, and the writer's wall-clock time) and removes it
when the job ends, however it ends. Retention skips a step with a marker younger than
``stale_after_s``; an older marker is a writer that died mid-upload, and no longer
protects anything. The timeout is generous (default one hour) because a slow link may
take long over one part, and because writers' clocks may differ by a little.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
from collections.abc import Callable

from jobctl.engine.checkpoint.store.checkpoint_store import CheckpointStore
from jobctl.engine.checkpoint.store.format import step_dirname

logger = logging.getLogger(__name__)

INFLIGHT_DIR = "inflight"
DEFAULT_STALE_AFTER_S = 3600.0


class InflightMarkers:
    """Marks, clears and reads the in-flight markers of one store."""

    def __init__(
        self,
        store: CheckpointStore,
        stale_after_s: float = DEFAULT_STALE_AFTER_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store, self.stale_after_s, self.clock = store, stale_after_s, clock

    def _dir(self, step: int) -> str:
        return f"{self.store.root}/{step_dirname(step)}/{INFLIGHT_DIR}"

    def mark(self, step: int, part: str) -> None:
        """Record that ``part`` of ``step`` is being uploaded now."""
        record = {
            "step": step,
            "part": part,
            "ts": self.clock(),
            "host": socket.gethostname(),
            "pid": os.getpid(),
        }
        self.store.fs.pipe_file(f"{self._dir(step)}/{part}.json", json.dumps(record).encode())

    def clear(self, step: int, part: str) -> None:
        """Remove the marker (the job ended); a marker already gone is fine."""
        with contextlib.suppress(FileNotFoundError):
            self.store.fs.rm(f"{self._dir(step)}/{part}.json")

    def active(self, step: int) -> list[dict]:
        """The fresh markers of ``step``: uploads still in flight."""
        fs = self.store.fs
        fs.invalidate_cache()  # other writers add and remove markers
        try:
            paths = fs.ls(self._dir(step), detail=False)
        except FileNotFoundError:
            return []
        fresh = []
        for path in paths:
            try:
                record = json.loads(fs.cat_file(path))
            except (FileNotFoundError, ValueError):
                continue  # removed meanwhile, or half-written by a writer that died
            if self.clock() - float(record.get("ts", 0)) <= self.stale_after_s:
                fresh.append(record)
            else:
                logger.info("step %d: ignoring stale in-flight marker %s", step, record)
        return fresh

    def protected(self, step: int) -> bool:
        """Retention's guard: True while some writer still uploads ``step``."""
        return bool(self.active(step))
