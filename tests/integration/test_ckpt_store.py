"""Checkpoint storage tier: layout, commit marker, verification, retention, uploads."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from jobctl.engine.checkpoint.store.checkpoint_store import (
    CheckpointStore,
    CheckpointWarning,
    CorruptCheckpointError,
    IncompleteCheckpointError,
    Manifest,
    PartRecord,
    publish_local,
    sha256_file,
    stage_dir,
)
from jobctl.engine.checkpoint.store.format import FileEntry, check_file_name, plan_retention
from jobctl.engine.checkpoint.store.local import clear_staging

SHARDS = {
    "rank0": {"layers/0.pt": b"layer zero " * 100, "rng/0.pt": b"rng0"},
    "rank1": {"layers/1.pt": b"layer one " * 200, "rng/1.pt": b"rng1"},
}


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


@pytest.fixture(params=["file", "path", "memory", pytest.param("s3", marks=pytest.mark.s3)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "s3":
        return request.getfixturevalue("s3_url")
    if request.param == "file":
        return f"file://{tmp_path / 'remote'}"
    if request.param == "path":
        return str(tmp_path / "remote")
    return f"memory://ckpt-{uuid.uuid4().hex}"


# ---- format -----------------------------------------------------------------------


def test_manifest_and_part_roundtrip(tmp_path: Path) -> None:
    (tmp_path / "x").write_bytes(b"abc")
    entry = FileEntry.of_local(tmp_path / "x")
    assert entry == FileEntry(3, sha256_file(tmp_path / "x"))
    manifest = Manifest(step=7, parts=["r0"], files={"a/x": entry}, meta={"loss": 1.5})
    assert Manifest.from_json(manifest.to_json()) == manifest
    record = PartRecord(step=7, part="r0", files={"a/x": entry})
    assert PartRecord.from_json(record.to_json()) == record
    body = json.loads(manifest.to_json())
    assert body["files"]["a/x"] == {"size": 3, "sha256": entry.sha256}


@pytest.mark.parametrize("bad", ["../x", "/abs", "manifest.json", "parts/r0.json", "a/../b", ""])
def test_reserved_or_escaping_file_names_are_rejected(bad: str) -> None:
    with pytest.raises(ValueError):
        check_file_name(bad)


def test_plan_retention_exact() -> None:
    complete = [100, 200, 300, 400, 500, 600, 700, 800, 900, 1000]
    assert plan_retention(complete, [350, 1100], keep_last=2, keep_every=500) == [
        100, 200, 300, 350, 400, 600, 700, 800
    ]  # fmt: skip
    assert plan_retention(complete, [], keep_last=3) == [100, 200, 300, 400, 500, 600, 700]
    assert plan_retention([], [5, 6], keep_last=1) == []
    assert plan_retention([10], [5, 20], keep_last=1, keep_every=3) == [5]
    with pytest.raises(ValueError):
        plan_retention(complete, [], keep_last=0)


# ---- store: write, commit, read ----------------------------------------------------


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


def test_delete_removes_manifest_first(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path / "remote"))
    save_step(store, tmp_path, 10)
    store.delete(10)
    store.delete(10)  # idempotent
    assert store.steps() == []


def test_repr_never_shows_credentials() -> None:
    store = CheckpointStore("s3://bucket/x", {"key": "AKIAEXAMPLE", "secret": "sekrit"})
    assert "sekrit" not in repr(store) and "AKIA" not in repr(store)


# ---- local tier --------------------------------------------------------------------


def test_publish_local_appears_atomically_when_all_parts_are_in(tmp_path: Path) -> None:
    root = tmp_path / "local"
    staging = stage_dir(root, 30)
    assert staging.name == "step-00000030.tmp"
    names0 = make_files(staging, SHARDS["rank0"])
    names1 = make_files(staging, SHARDS["rank1"])
    assert publish_local(root, 30, "rank0", names0, {"k": 1}, parts=["rank0", "rank1"]) is None
    assert not (root / "step-00000030").exists()
    assert CheckpointStore(str(root)).steps() == []
    out = publish_local(root, 30, "rank1", names1, {"k": 1}, parts=["rank0", "rank1"])
    assert out == root / "step-00000030" and not staging.exists()
    store = CheckpointStore(str(root))
    assert store.latest_complete(verify=True) == 30
    assert store.manifest(30).parts == ["rank0", "rank1"]
    again = stage_dir(root, 30)  # the same step published again replaces the old one
    names = make_files(again, {"w.pt": b"new"})
    assert publish_local(root, 30, "rank0", names) == out
    assert sorted(store.manifest(30).files) == ["w.pt"]
    make_files(stage_dir(root, 40), {"half.pt": b"x"})
    assert clear_staging(root) == [root / "step-00000040.tmp"]


def test_retention_clears_stale_local_staging(tmp_path: Path) -> None:
    root = tmp_path / "local"
    for step in (10, 20):
        publish_local(root, step, "r0", make_files(stage_dir(root, step), {"a": b"x"}))
    make_files(stage_dir(root, 15), {"a": b"x"})
    make_files(stage_dir(root, 25), {"a": b"x"})
    assert CheckpointStore(str(root)).apply_retention(keep_last=1) == [10]
    assert sorted(p.name for p in root.iterdir()) == ["step-00000020", "step-00000025.tmp"]
