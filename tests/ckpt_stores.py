"""Checkpoint files and stores shared by the checkpoint tests in tests/unit and
tests/integration: shard files, committed steps, and the storage contract, tests that
every store URL must pass; tests/unit runs them on local paths and memory
(``store_url_fixture("file", "path", "memory")``), tests/integration on S3."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from jobctl.engine.checkpoint.store.checkpoint_store import (
    CheckpointStore,
    CheckpointWarning,
    CorruptCheckpointError,
    IncompleteCheckpointError,
)

SHARDS = {
    "rank0": {"layers/0.pt": b"layer zero " * 100, "rng/0.pt": b"rng0"},
    "rank1": {"layers/1.pt": b"layer one " * 200, "rng/1.pt": b"rng1"},
}
"""Two parts of a checkpoint, by part name."""
ONE_PART = SHARDS["rank0"]
"""The files of a one-part checkpoint (part ``rank0``)."""


def make_files(directory: Path, files: dict[str, bytes]) -> list[str]:
    for name, data in files.items():
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_bytes(data)
    return sorted(files)


def save_step(store: CheckpointStore, tmp_path: Path, step: int, commit: bool = True) -> None:
    """Both parts of `step` (content depends on the step), committed unless told not to."""
    for part, files in SHARDS.items():
        local = tmp_path / f"local-{step}-{part}"
        names = make_files(local, {n: d + str(step).encode() for n, d in files.items()})
        store.write_part(step, part, local, names)
    if commit:
        assert store.commit(step, list(SHARDS), {"global_step": step})


def save_one_part(store: CheckpointStore, tmp_path: Path, step: int) -> None:
    """A complete one-part checkpoint of `step`."""
    local = tmp_path / f"saved-{step}"
    store.write_part(step, "rank0", local, make_files(local, ONE_PART))
    assert store.commit(step, ["rank0"], {})


def store_url_fixture(*kinds):
    """A ``store_url`` fixture over ``kinds`` (``file``, ``path``, ``memory``, or an ``s3``
    ``pytest.param`` that carries its marker); assign it to ``store_url`` in a test module."""

    @pytest.fixture(params=kinds)
    def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
        if request.param == "s3":
            return request.getfixturevalue("s3_url")
        if request.param == "file":
            return f"file://{tmp_path / 'remote'}"
        if request.param == "path":
            return str(tmp_path / "remote")
        return f"memory://ckpt-{uuid.uuid4().hex}"

    return store_url


# ---- the storage contract: a test module runs these on its store_url by importing them


def test_write_part_commit_latest_and_download(store_url: str, tmp_path: Path) -> None:
    store = CheckpointStore(store_url)
    assert store.steps() == [] and store.latest_complete() is None
    save_step(store, tmp_path, 10)
    local = tmp_path / "local-20-rank0"
    store.write_part(20, "rank0", local, make_files(local, SHARDS["rank0"]))
    assert store.commit(20, list(SHARDS), {}) is False  # rank1 not uploaded yet
    local = tmp_path / "local-20-rank1"
    store.write_part(20, "rank1", local, make_files(local, SHARDS["rank1"]))
    assert store.commit(20, list(SHARDS), {"global_step": 20}) is True
    assert store.steps() == [10, 20]
    assert store.latest_complete(verify=True) == 20
    manifest = store.manifest(20)
    assert manifest.parts == ["rank0", "rank1"] and manifest.meta == {"global_step": 20}
    assert sorted(manifest.files) == ["layers/0.pt", "layers/1.pt", "rng/0.pt", "rng/1.pt"]
    out = store.download(20, tmp_path / "restore")
    assert out == tmp_path / "restore" / "step-00000020"
    assert (out / "layers/1.pt").read_bytes() == SHARDS["rank1"]["layers/1.pt"]
    assert CheckpointStore(str(tmp_path / "restore")).latest_complete(verify=True) == 20


def test_no_manifest_means_incomplete_and_previous_stays_latest(
    store_url: str, tmp_path: Path
) -> None:
    store = CheckpointStore(store_url)
    save_step(store, tmp_path, 10)
    save_step(store, tmp_path, 20, commit=False)  # every file up, manifest never written
    assert store.steps() == [10, 20]
    assert not store.is_complete(20)
    with pytest.raises(IncompleteCheckpointError):
        store.manifest(20)
    with pytest.warns(CheckpointWarning, match=r"step 20: no manifest\.json"):
        assert store.latest_complete() == 10


def test_corrupted_file_is_skipped_with_warning_and_download_raises(
    store_url: str, tmp_path: Path
) -> None:
    store = CheckpointStore(store_url)
    save_step(store, tmp_path, 10)
    save_step(store, tmp_path, 20)
    path = f"{store.root}/step-00000020/layers/1.pt"
    data = bytearray(store.fs.cat_file(path))
    data[5] ^= 0xFF  # same size: only the sha256 can tell
    store.fs.pipe_file(path, bytes(data))
    assert store.latest_complete(verify=False) == 20
    with pytest.warns(CheckpointWarning, match=r"step 20: file layers/1\.pt .*sha256"):
        assert store.latest_complete(verify=True) == 10
    with pytest.raises(CorruptCheckpointError, match=r"layers/1\.pt"):
        store.download(20, tmp_path / "restore")
    assert not (tmp_path / "restore" / "step-00000020").exists()
    store.fs.pipe_file(path, bytes(data[:-1]))  # truncated: the cheap check sees it
    with pytest.warns(CheckpointWarning, match=r"layers/1\.pt has"):
        assert store.latest_complete(verify=False) == 10


def test_retention_keeps_policy_and_newest_complete(store_url: str, tmp_path: Path) -> None:
    store = CheckpointStore(store_url)
    for step in range(100, 1001, 100):
        save_step(store, tmp_path, step)
    save_step(store, tmp_path, 350, commit=False)  # stale: older than the newest complete
    save_step(store, tmp_path, 1100, commit=False)  # may still be uploading: kept
    deleted = store.apply_retention(keep_last=2, keep_every=500)
    assert deleted == [100, 200, 300, 350, 400, 600, 700, 800]
    assert store.steps() == [500, 900, 1000, 1100]
    assert store.apply_retention(keep_last=1) == [500, 900]
    assert store.steps() == [1000, 1100]
    with pytest.warns(CheckpointWarning, match="step 1100: no manifest"):
        assert store.latest_complete() == 1000
