"""Checkpoint storage tier: layout, commit marker, verification, retention, on local
paths and memory (tests/integration/test_ckpt_store.py runs the storage contract on S3)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jobctl.engine.checkpoint.store.checkpoint_store import (
    CheckpointStore,
    Manifest,
    PartRecord,
    publish_local,
    sha256_file,
    stage_dir,
)
from jobctl.engine.checkpoint.store.format import FileEntry, check_file_name, plan_retention
from jobctl.engine.checkpoint.store.local import clear_staging, tree_sizes

from ..ckpt_stores import (  # noqa: F401  the storage contract, run here on store_url
    SHARDS,
    make_files,
    save_step,
    store_url_fixture,
    test_corrupted_file_is_skipped_with_warning_and_download_raises,
    test_no_manifest_means_incomplete_and_previous_stays_latest,
    test_retention_keeps_policy_and_newest_complete,
    test_write_part_commit_latest_and_download,
)

store_url = store_url_fixture("file", "path", "memory")


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
        100,
        200,
        300,
        350,
        400,
        600,
        700,
        800,
    ]
    assert plan_retention(complete, [], keep_last=3) == [100, 200, 300, 400, 500, 600, 700]
    assert plan_retention([], [5, 6], keep_last=1) == []
    assert plan_retention([10], [5, 20], keep_last=1, keep_every=3) == [5]
    with pytest.raises(ValueError):
        plan_retention(complete, [], keep_last=0)


# ---- store -----------------------------------------------------------------------


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


def test_a_local_listing_is_what_fsspec_finds_without_following_links(tmp_path: Path) -> None:
    # Retention lists a local root with os.walk (#55: fsspec's find cost more than the
    # checkpoint's own write); it must see what fsspec sees, and follow no link.
    import fsspec

    root = tmp_path / "root"
    (root / "step-00000010" / "parts").mkdir(parents=True)
    (root / "step-00000010" / "block-0000.pt").write_bytes(b"x" * 7)
    (root / "step-00000010" / "parts" / "rank-0.json").write_bytes(b"{}")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "big").write_bytes(b"y" * 100)
    (root / "step-00000020").symlink_to(outside)
    (root / "step-00000010" / "meta.json").symlink_to(outside / "big")
    found = fsspec.filesystem("file").find(str(root), detail=True)
    want = {
        p[len(str(root)) + 1 :]: -1 if info.get("islink") else int(info["size"])
        for p, info in found.items()
    }
    got = tree_sizes(str(root))
    assert got == want
    assert got["step-00000010/block-0000.pt"] == 7
    assert got["step-00000020"] == -1 and got["step-00000010/meta.json"] == -1
    assert not any(name.startswith("step-00000020/") for name in got)
    with pytest.raises(FileNotFoundError):
        tree_sizes(str(root / "step-00000020"))  # a linked folder is never listed


def test_retention_judges_every_step_from_one_listing(tmp_path: Path) -> None:
    # A step whose file shrank or vanished after its commit is incomplete: retention
    # deletes it (it is not counted among keep_last) and keeps the three complete ones.
    store = CheckpointStore(str(tmp_path))
    for step in (10, 20, 30, 40, 50):
        publish_local(tmp_path, step, "rank-0", [_write(tmp_path, step)], {"step": step})
    (tmp_path / "step-00000040" / "block.pt").write_bytes(b"short")
    (tmp_path / "step-00000020" / "block.pt").unlink()
    deleted = store.apply_retention(3, committed=50)
    assert sorted(deleted) == [20, 40]
    assert store.steps() == [10, 30, 50]


def _write(root: Path, step: int) -> str:
    (stage_dir(root, step) / "block.pt").write_bytes(b"z" * 64)
    return "block.pt"
