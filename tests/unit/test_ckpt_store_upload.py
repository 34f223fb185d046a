"""Checkpoint uploads: retries, status, coalescing and close, on a local filesystem
(tests/integration/test_ckpt_store_upload.py: a writer killed mid-upload, and retention
beside another writer's process, on S3)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from fsspec.implementations.local import LocalFileSystem

from jobctl.engine.checkpoint.store import transfer as ckpt_store_transfer
from jobctl.engine.checkpoint.store.checkpoint_store import (
    CheckpointStore,
    CheckpointWarning,
    RetryPolicy,
    publish_local,
    stage_dir,
)
from jobctl.engine.checkpoint.upload import Uploader

from ..ckpt_stores import ONE_PART, make_files, save_one_part


class FlakyFS(LocalFileSystem):
    """Local filesystem whose first `failures` put_file calls fail like a network would."""

    cachable = False

    def __init__(self, failures: int) -> None:
        super().__init__(auto_mkdir=True)
        self.failures = failures
        self.puts = 0

    def put_file(self, lpath: str, rpath: str, callback: Any = None, **kwargs: Any) -> None:
        self.puts += 1
        if self.failures > 0:
            self.failures -= 1
            raise OSError("flaky network: connection reset")
        return super().put_file(lpath, rpath, callback=callback, **kwargs)


def no_sleep(_: float) -> None:
    pass


def test_failed_file_upload_writes_no_part_record(tmp_path: Path) -> None:
    fs = FlakyFS(failures=0)
    store = CheckpointStore(str(tmp_path / "remote"), fs=fs, retry=RetryPolicy(sleep=no_sleep))
    save_one_part(store, tmp_path, 10)
    fs.failures = 100
    local = tmp_path / "l"
    with pytest.raises(OSError, match="flaky"):
        store.write_part(20, "rank0", local, make_files(local, ONE_PART))
    assert not (tmp_path / "remote/step-00000020/parts/rank0.json").exists()
    assert store.commit(20, ["rank0"], {}) is False
    assert store.latest_complete() == 10


# ---- uploader ----------------------------------------------------------------------


def test_uploader_retries_with_backoff_and_reports_status(tmp_path: Path) -> None:
    fs = FlakyFS(failures=3)
    store = CheckpointStore(str(tmp_path / "remote"), fs=fs, workers=1)
    sleeps: list[float] = []
    progress: list[tuple[int, int, int]] = []
    local = tmp_path / "l"
    names = make_files(local, ONE_PART)
    total = sum(len(d) for d in ONE_PART.values())
    uploader = Uploader(
        store,
        max_retries=5,
        backoff_base=0.5,
        backoff_cap=1.5,
        sleep=sleeps.append,
        on_progress=lambda *args: progress.append(args),
    )
    uploader.submit(10, "rank0", local, names, then_commit=(["rank0"], {"epoch": 1}))
    assert uploader.wait_idle(timeout=30)
    status = uploader.status()
    assert sleeps == [0.5, 1.0, 1.5]
    assert status["failures"] == 3 and status["failed_jobs"] == 0
    assert "flaky network" in status["last_error"]
    assert status["last_committed_step"] == 10
    assert (status["bytes_done"], status["bytes_total"]) == (total, total)
    assert status["queued_steps"] == [] and status["current_step"] is None
    assert progress[-1] == (10, total, total)
    assert store.manifest(10).meta == {"epoch": 1}
    assert uploader.close(timeout=5)


def test_uploader_gives_up_keeps_previous_and_goes_on(tmp_path: Path) -> None:
    fs = FlakyFS(failures=0)
    store = CheckpointStore(str(tmp_path / "remote"), fs=fs, workers=2)
    save_one_part(store, tmp_path, 10)
    local = tmp_path / "l"
    names = make_files(local, ONE_PART)
    with Uploader(store, max_retries=2, sleep=no_sleep) as uploader:
        fs.failures = 1000
        uploader.submit(20, "rank0", local, names, then_commit=(["rank0"], {}))
        assert uploader.wait_idle(timeout=30)
        status = uploader.status()
        assert status["failed_jobs"] == 1 and "step 20" in status["last_error"]
        assert store.latest_complete() == 10 and not store.is_complete(20)
        fs.failures = 0
        uploader.submit(30, "rank0", local, names, then_commit=(["rank0"], {}))
        assert uploader.wait_idle(timeout=30)
    assert store.latest_complete() == 30


def test_uploader_reuses_digests_of_a_published_local_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "local"
    published = publish_local(root, 10, "rank0", make_files(stage_dir(root, 10), ONE_PART))
    assert published is not None
    local = CheckpointStore(str(root)).manifest(10)

    def no_hashing(path: Any) -> None:
        raise AssertionError(f"{path} hashed again")

    monkeypatch.setattr(ckpt_store_transfer.FileEntry, "of_local", no_hashing)
    store = CheckpointStore(str(tmp_path / "remote"))
    with Uploader(store, max_retries=0) as uploader:
        uploader.submit(10, "rank0", published, sorted(ONE_PART), then_commit=(["rank0"], {}))
        assert uploader.wait_idle(timeout=30)
        assert store.manifest(10).files == local.files
        with open(published / "rng/0.pt", "ab") as handle:  # changed after publishing
            handle.write(b"!")
        uploader.submit(20, "rank0", published, sorted(ONE_PART), then_commit=(["rank0"], {}))
        assert uploader.wait_idle(timeout=30)
        assert "CorruptCheckpointError" in uploader.status()["last_error"]
    with pytest.warns(CheckpointWarning, match="step 20: no manifest"):
        assert store.latest_complete(verify=True) == 10


class GatedFS(LocalFileSystem):
    """Local filesystem whose put_file waits for `gate` (to hold an upload in flight)."""

    cachable = False

    def __init__(self) -> None:
        super().__init__(auto_mkdir=True)
        self.gate = threading.Event()
        self.entered = threading.Event()

    def put_file(self, lpath: str, rpath: str, callback: Any = None, **kwargs: Any) -> None:
        self.entered.set()
        self.gate.wait(30)
        return super().put_file(lpath, rpath, callback=callback, **kwargs)


def test_uploader_coalesces_waiting_steps_and_applies_retention(tmp_path: Path) -> None:
    fs = GatedFS()
    store = CheckpointStore(str(tmp_path / "remote"), fs=fs, workers=1)
    uploader = Uploader(store, keep_last=1, sleep=no_sleep)
    local = tmp_path / "l"
    names = make_files(local, {"w.pt": b"weights"})
    start = time.monotonic()
    for step in (10, 20, 30):
        uploader.submit(step, "rank0", local, names, then_commit=(["rank0"], {}))
        if step == 10:
            assert fs.entered.wait(10)
    assert time.monotonic() - start < 5  # submit never waits for the upload
    assert uploader.status()["current_step"] == 10
    assert uploader.status()["queued_steps"] == [20, 30]
    fs.gate.set()
    assert uploader.wait_idle(timeout=30)
    status = uploader.status()
    assert status["skipped_steps"] == [20] and status["last_committed_step"] == 30
    assert store.steps() == [30]  # keep_last=1 deleted step 10 after 30 committed
    assert uploader.close(timeout=5)
    with pytest.raises(RuntimeError):
        uploader.submit(40, "rank0", local, names)


def test_uploader_close_timeout_cancels_pending_work(tmp_path: Path) -> None:
    fs = GatedFS()
    store = CheckpointStore(str(tmp_path / "remote"), fs=fs, workers=1)
    uploader = Uploader(store)
    local = tmp_path / "l"
    names = make_files(local, {"a.pt": b"a", "b.pt": b"b"})
    uploader.submit(10, "rank0", local, names, then_commit=(["rank0"], {}))
    uploader.submit(10, "rank1", local, names, then_commit=(["rank0", "rank1"], {}))
    assert fs.entered.wait(10)
    assert uploader.close(timeout=0.2) is False  # a.pt is still held in flight
    fs.gate.set()  # a.pt completes; b.pt and rank1 are cancelled
    assert uploader.wait_idle(timeout=10)
    assert uploader.status()["abandoned_steps"] == [10]
    assert not store.is_complete(10)
    assert not (tmp_path / "remote/step-00000010/parts/rank0.json").exists()
