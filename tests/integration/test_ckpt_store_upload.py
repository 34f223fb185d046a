"""Checkpoint uploads on S3: a writer killed mid-upload, and retention beside another
writer's process (tests/unit/test_ckpt_store_upload.py: retries, status, coalescing, close)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest

from jobctl.engine.checkpoint.store.checkpoint_store import CheckpointStore
from jobctl.engine.checkpoint.upload import Uploader

from ..ckpt_stores import ONE_PART, make_files, save_one_part

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
    save_one_part(store, tmp_path, 10)
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
    fast.submit(4, "fast", local, make_files(local, ONE_PART), then_commit=(["fast"], {}))
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
