"""Moving many checkpoint files at once: retries with backoff, a thread pool, byte progress.

fsspec filesystems are safe to call from several threads (s3fs runs every call on its
own event loop), so a small pool of per-file transfers keeps as many requests in flight
as one batched ``fs.put`` would, while each file gets its own retries and progress.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from fsspec import AbstractFileSystem
from fsspec.callbacks import Callback

from jobctl.engine.checkpoint.store.format import CorruptCheckpointError, FileEntry

logger = logging.getLogger(__name__)

T = TypeVar("T")


class TransferCancelled(RuntimeError):
    """A transfer stopped early because its cancel event was set."""


@dataclass(frozen=True)
class RetryPolicy:
    """Retry a failing call `max_retries` times, sleeping min(cap, base * 2**attempt).

    `sleep` is injectable so tests do not wait; `on_error` sees every failed attempt
    (the uploader counts them). The last error is re-raised, never swallowed.
    """

    max_retries: int = 3
    base: float = 0.5
    cap: float = 30.0
    sleep: Callable[[float], object] = time.sleep
    on_error: Callable[[BaseException], None] | None = None

    def __post_init__(self) -> None:
        if self.max_retries < 0 or self.base < 0 or self.cap < 0:
            raise ValueError("max_retries, base and cap must be >= 0")

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number `attempt` (0-based)."""
        return min(self.cap, self.base * 2**attempt)

    def run(self, fn: Callable[[], T], what: str = "call") -> T:
        """Call `fn` until it succeeds or the retries are spent (then re-raise)."""
        for attempt in range(self.max_retries + 1):
            try:
                return fn()
            except TransferCancelled:
                raise
            except Exception as exc:  # any transport error is worth a retry; re-raised below
                if self.on_error is not None:
                    self.on_error(exc)
                if attempt == self.max_retries:
                    raise
                delay = self.delay(attempt)
                logger.warning("%s failed (%s); retry %d in %.1fs", what, exc, attempt + 1, delay)
                self.sleep(delay)
        raise AssertionError("unreachable: the loop returns or raises")


class ByteProgress(Callback):
    """fsspec callback for one file that forwards new bytes to `report` exactly once.

    A retried transfer restarts from zero; only bytes beyond what was already reported
    are forwarded, and `finish` tops up to the file size for filesystems (local copies)
    that never call back.
    """

    def __init__(self, report: Callable[[int], None] | None) -> None:
        super().__init__()
        self._report = report
        self._reported = 0

    def restart(self) -> None:
        self.value = 0

    def call(self, *args: object, **kwargs: object) -> None:
        new = self.value - self._reported
        if new > 0 and self._report is not None:
            self._reported = self.value
            self._report(new)

    def finish(self, size: int) -> None:
        self.value = max(self.value, size)
        self.call()


def run_parallel(
    tasks: Sequence[Callable[[], None]],
    workers: int,
    cancel: threading.Event | None = None,
) -> None:
    """Run `tasks` on up to `workers` threads; the first error stops the rest and is raised.

    Tasks not yet started when an error happens, or when `cancel` is set, do not run.
    """
    if not tasks:
        return
    stop = threading.Event()

    def guarded(task: Callable[[], None]) -> None:
        if stop.is_set() or (cancel is not None and cancel.is_set()):
            raise TransferCancelled("transfer cancelled")
        task()

    if workers <= 1 or len(tasks) == 1:  # in this thread: no pool to start
        for task in tasks:
            guarded(task)
        return
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(tasks)))) as pool:
        futures = [pool.submit(guarded, task) for task in tasks]
        wait(futures, return_when=FIRST_EXCEPTION)
        stop.set()  # returns early only on an error: tasks not yet started are skipped
    errors = [exc for exc in (f.exception() for f in futures) if exc is not None]
    if errors:
        raise next((e for e in errors if not isinstance(e, TransferCancelled)), errors[0])


@dataclass
class FileUploads:
    """Per-file upload tasks of one part: measure (or look up), put with retries, report.

    `remote` maps a relative file name to its path on `fs`; `digests` holds entries
    already measured (a local manifest), of which only the size is re-checked.
    `entries` collects what was uploaded.
    """

    fs: AbstractFileSystem
    remote: Callable[[str], str]
    local_dir: Path
    policy: RetryPolicy
    progress: Callable[[int], None] | None = None
    cancel: threading.Event | None = None
    digests: Mapping[str, FileEntry] = field(default_factory=dict)
    entries: dict[str, FileEntry] = field(default_factory=dict)

    def put(self, name: str) -> None:
        """Upload `name` (relative to `local_dir`) and record its entry."""
        local = self.local_dir / name
        self.entries[name] = entry = self._entry(local, name)
        callback = ByteProgress(self.progress)
        what = f"upload of {self.remote(name)}"

        def attempt() -> None:
            if self.cancel is not None and self.cancel.is_set():
                raise TransferCancelled(f"{what} cancelled")
            callback.restart()
            self.fs.put_file(str(local), self.remote(name), callback=callback)

        self.policy.run(attempt, what)
        callback.finish(entry.size)

    def _entry(self, local: Path, name: str) -> FileEntry:
        known = self.digests.get(name)
        if known is None:
            return FileEntry.of_local(local)
        size = local.stat().st_size
        if size != known.size:
            raise CorruptCheckpointError(
                f"{local} has {size} bytes, its local manifest says {known.size}"
            )
        return known
