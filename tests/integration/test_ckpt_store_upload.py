"""Checkpoint uploads: retries, status, coalescing, close, and a writer killed mid-upload."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings
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

SHARDS = {"layers/0.pt": b"layer zero " * 100, "rng/0.pt": b"rng0"}


def make_files(directory: Path, files: dict[str, bytes]) -> list[str]:
    for name, data in files.items():
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_bytes(data)
    return sorted(files)


def save_step(store: CheckpointStore, tmp_path: Path, step: int) -> None:
    """A complete one-part checkpoint of `step`."""
    local = tmp_path / f"saved-{step}"
    store.write_part(step, "rank0", local, make_files(local, SHARDS))
    assert store.commit(step, ["rank0"], {})


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
    save_step(store, tmp_path, 10)
    fs.failures = 100
    local = tmp_path / "l"
    with pytest.raises(OSError, match="flaky"):
        store.write_part(20, "rank0", local, make_files(local, SHARDS))
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
    names = make_files(local, SHARDS)
    total = sum(len(d) for d in SHARDS.values())
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
    save_step(store, tmp_path, 10)
    local = tmp_path / "l"
    names = make_files(local, SHARDS)
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
    published = publish_local(root, 10, "rank0", make_files(stage_dir(root, 10), SHARDS))
    assert published is not None
    local = CheckpointStore(str(root)).manifest(10)

    def no_hashing(path: Any) -> None:
        raise AssertionError(f"{path} hashed again")

    monkeypatch.setattr(ckpt_store_transfer.FileEntry, "of_local", no_hashing)
    store = CheckpointStore(str(tmp_path / "remote"))
    with Uploader(store, max_retries=0) as uploader:
        uploader.submit(10, "rank0", published, sorted(SHARDS), then_commit=(["rank0"], {}))
        assert uploader.wait_idle(timeout=30)
        assert store.manifest(10).files == local.files
        with open(published / "rng/0.pt", "ab") as handle:  # changed after publishing
            handle.write(b"!")
        uploader.submit(20, "rank0", published, sorted(SHARDS), then_commit=(["rank0"], {}))
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


# ---- a writer killed mid-upload ----------------------------------------------------

CHILD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from jobctl.engine.checkpoint.store.checkpoint_store import CheckpointStore
    from jobctl.engine.checkpoint.upload import Uploader

    url, local = sys.argv[1], Path(sys.argv[2])
    store = CheckpointStore(url, workers=1)
    put_file = store.fs.put_file

    def slow_put_file(*args, **kwargs):
        time.sleep(0.4)
        return put_file(*args, **kwargs)

    store.fs.put_file = slow_put_file
    files = sorted(p.name for p in local.iterdir())
    with Uploader(store) as uploader:
        uploader.submit(20, "rank0", local, files, then_commit=(["rank0"], {}))
    """
)


@pytest.mark.s3
@pytest.mark.chaos
def test_sigkill_during_upload_leaves_previous_checkpoint_latest(
    s3_url: str, tmp_path: Path
) -> None:
    store = CheckpointStore(s3_url)
    save_step(store, tmp_path, 10)
    local = tmp_path / "big"
    make_files(local, {f"layer{i}.pt": os.urandom(2 * 2**20) for i in range(6)})
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    child = subprocess.Popen(
        [sys.executable, str(script), s3_url, str(local)], start_new_session=True
    )
    step_dir = f"{store.root}/step-00000020"
    try:
        deadline = time.monotonic() + 60
        while not store.fs.find(step_dir) and child.poll() is None:
            assert time.monotonic() < deadline, "the child never started uploading"
            time.sleep(0.02)
            store.fs.invalidate_cache()
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL
    store.fs.invalidate_cache()
    uploaded = store.fs.find(step_dir)
    assert 1 <= len(uploaded) < 6 and not any("parts/" in p for p in uploaded)
    assert store.steps() == [10, 20]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert store.latest_complete(verify=True) == 10
    assert any("step 20" in str(w.message) for w in caught)
    assert store.apply_retention(keep_last=1) == []  # a newer incomplete step may be live
    assert store.download(10, tmp_path / "restore").is_dir()


SLOW_CHILD = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from jobctl.engine.checkpoint.store.checkpoint_store import CheckpointStore
    from jobctl.engine.checkpoint.upload import Uploader

    url, local, release = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])

    def hold(step, done, total):  # after the first file: wait to be released (bounded)
        deadline = time.monotonic() + 120
        while not release.exists() and time.monotonic() < deadline:
            time.sleep(0.05)

    store = CheckpointStore(url, workers=1)  # one file at a time
    writer = Uploader(store, on_progress=hold)
    files = sorted(p.name for p in local.iterdir())
    writer.submit(2, "slow", local, files, then_commit=(["slow"], {}))
    writer.wait_idle(120)
    writer.close(60)
    print(json.dumps(writer.status()))
    """
)


def _slow_writer(tmp_path: Path, s3_url: str, store: CheckpointStore):
    """Another process uploads part ``slow`` of step 2 and stops after its first file
    until ``release`` exists (a slow rank, or an old layout's uploader still finishing)."""
    local, release = tmp_path / "slow", tmp_path / "release"
    files = make_files(local, {f"{i}.pt": bytes([i]) * 2000 for i in range(4)})
    (tmp_path / "slow_child.py").write_text(SLOW_CHILD)
    child = subprocess.Popen(
        [sys.executable, str(tmp_path / "slow_child.py"), s3_url, str(local), str(release)],
        stdout=subprocess.PIPE,
        text=True,
    )
    first = f"{store.root}/step-00000002/{files[0]}"
    deadline = time.monotonic() + 60
    while not store.fs.exists(first):
        if time.monotonic() > deadline or child.poll() is not None:
            child.kill()
            raise AssertionError("the slow writer never started uploading")
        time.sleep(0.05)
        store.fs.invalidate_cache()
    return child, release, files


def _commit_newer(s3_url: str, tmp_path: Path, **kwargs) -> None:
    """This writer commits step 4 with keep_last=1, so its retention runs."""
    local = tmp_path / "fast"
    fast = Uploader(CheckpointStore(s3_url), keep_last=1, **kwargs)
    fast.submit(4, "fast", local, make_files(local, SHARDS), then_commit=(["fast"], {}))
    assert fast.wait_idle(60) and fast.status()["last_committed_step"] == 4
    fast.close()


def test_retention_spares_a_step_another_writer_still_uploads(s3_url: str, tmp_path: Path) -> None:
    store = CheckpointStore(s3_url)
    child, release, files = _slow_writer(tmp_path, s3_url, store)
    try:
        _commit_newer(s3_url, tmp_path)
        # Retention after step 4's commit ran while step 2 was half up: its bytes stay.
        store.fs.invalidate_cache()
        assert store.fs.exists(f"{store.root}/step-00000002/{files[0]}")
        assert store.fs.exists(f"{store.root}/step-00000002/inflight/slow.json")
    finally:
        release.touch()
        out, _ = child.communicate(timeout=120)
    status = json.loads(out.splitlines()[-1])
    assert (status["failed_jobs"], status["last_committed_step"]) == (0, 2)
    assert store.is_complete(2, verify=True)  # every byte sent was kept
    assert sorted(store.manifest(2).files) == files
    store.fs.invalidate_cache()
    assert not store.fs.exists(f"{store.root}/step-00000002/inflight/slow.json")


def test_retention_ignores_a_stale_in_flight_marker(s3_url: str, tmp_path: Path) -> None:
    store = CheckpointStore(s3_url)
    child, release, files = _slow_writer(tmp_path, s3_url, store)
    try:
        # This writer takes markers older than 0 s for dead writers: step 2 goes.
        _commit_newer(s3_url, tmp_path, inflight_stale_s=0.0)
        store.fs.invalidate_cache()
        assert not store.fs.exists(f"{store.root}/step-00000002/{files[0]}")
    finally:
        release.touch()
        child.communicate(timeout=120)
