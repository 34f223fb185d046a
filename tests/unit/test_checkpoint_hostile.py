"""Tampered checkpoints (#24 item 15): a malformed manifest is skipped like any other
corruption, with a one-line logged reason; symbolic links are never followed out of the
checkpoint root, and retention never deletes outside it.

Before: manifests shaped ``[]``, ``{"files": []}``, with a step of ``1e400`` or 100,000
levels deep crashed `resume` (exit 1); a symlinked step folder was resumed from and
retention deleted the ``manifest.json`` it led to.
"""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path

import pytest

from jobctl.engine.checkpoint.resume import find_resume_point
from jobctl.engine.checkpoint.store.checkpoint_store import CheckpointStore
from jobctl.engine.checkpoint.store.format import FORMAT_VERSION, Manifest, step_dirname
from jobctl.spec import CheckpointSpec

from ..ckpt_stores import save_step

LOG = "jobctl.engine.checkpoint"
GOOD = {"format": FORMAT_VERSION, "step": 2, "parts": [], "files": {}}


@pytest.mark.parametrize(
    "manifest",
    [
        b"[]",
        json.dumps({"files": []}).encode(),
        json.dumps({**GOOD, "files": []}).encode(),
        json.dumps(GOOD).replace('"step": 2', '"step": 1e400').encode(),
        json.dumps({**GOOD, "files": {"a.pt": {"size": 1e400, "sha256": "0"}}}).encode(),
        json.dumps({**GOOD, "files": {"a.pt": {"size": "NaN", "sha256": "0"}}}).encode(),
        b"[" * 100_000 + b"]" * 100_000,
        json.dumps({**GOOD, "parts": 5}).encode(),
    ],
    ids=[
        "list",
        "no-format",
        "files-list",
        "step-1e400",
        "size-1e400",
        "size-nan",
        "deep",
        "parts",
    ],
)
def test_a_malformed_manifest_is_skipped_with_a_one_line_reason(tmp_path, caplog, manifest):
    with pytest.raises(ValueError):
        Manifest.from_json(manifest)
    root = tmp_path / "ckpt"
    store = CheckpointStore(str(root))
    save_step(store, tmp_path, 1)
    save_step(store, tmp_path, 2)
    (root / step_dirname(2) / "manifest.json").write_bytes(manifest)
    with caplog.at_level(logging.WARNING, logger=LOG), warnings.catch_warnings():
        warnings.simplefilter("error")  # a Python warning (with its source line) fails
        point = find_resume_point(CheckpointSpec(), root)
    assert point is not None and point.step == 1
    [line] = [r.getMessage() for r in caplog.records if "step 2" in r.getMessage()]
    assert "\n" not in line and "manifest.json" in line


def _outside_step(tmp_path: Path, step: int) -> Path:
    """A complete checkpoint of ``step`` in a store outside the root under test."""
    outside = CheckpointStore(str(tmp_path / "outside"))
    save_step(outside, tmp_path, step)
    return tmp_path / "outside" / step_dirname(step)


def test_a_symlinked_step_folder_is_neither_resumed_nor_deleted_through(tmp_path, caplog):
    root = tmp_path / "ckpt"
    store = CheckpointStore(str(root))
    for step in (1, 2, 3):
        save_step(store, tmp_path, step)
    target = _outside_step(tmp_path, 9)
    (root / step_dirname(9)).symlink_to(target, target_is_directory=True)
    with caplog.at_level(logging.WARNING, logger=LOG):
        point = find_resume_point(CheckpointSpec(), root)
    assert point is not None and point.step == 3 and point.path.parent == root
    assert any("symbolic link" in r.getMessage() for r in caplog.records)
    assert store.apply_retention(keep_last=1) == [1, 2]
    assert (target / "manifest.json").exists()  # outside the root: untouched
    assert (root / step_dirname(9)).is_symlink() and (root / step_dirname(3)).is_dir()


def test_a_symlinked_file_inside_a_step_makes_it_incomplete(tmp_path):
    root = tmp_path / "ckpt"
    store = CheckpointStore(str(root))
    save_step(store, tmp_path, 1)
    save_step(store, tmp_path, 2)
    victim = root / step_dirname(2) / "layers" / "0.pt"
    outside = tmp_path / "secret.pt"
    outside.write_bytes(victim.read_bytes())
    victim.unlink()
    victim.symlink_to(outside)
    assert "symbolic link" in (store.problem(2) or "")
    point = find_resume_point(CheckpointSpec(), root)
    assert point is not None and point.step == 1
    manifest_link = root / step_dirname(1) / "manifest.json"
    real = tmp_path / "manifest-copy.json"
    real.write_bytes(manifest_link.read_bytes())
    manifest_link.unlink()
    manifest_link.symlink_to(real)
    assert "symbolic link" in (store.problem(1) or "")


def _corrupt(root: Path, step: int) -> None:
    """Flip a byte of one shard of ``step``: same size, wrong sha256."""
    shard = next(p for p in sorted((root / step_dirname(step)).rglob("*.pt")) if p.is_file())
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))


def test_retention_counts_newer_steps_only_once_verified(tmp_path):
    """#46 item 11: with corrupt steps 10 and 20 in the root (a run that restarted from
    nothing beside them), retention counted them as complete and deleted the new step 8.
    Steps newer than the one just committed now count only when every sha256 matches."""
    root = tmp_path / "ckpt"
    store = CheckpointStore(str(root))
    for step in (10, 20):
        save_step(store, tmp_path, step)
        _corrupt(root, step)
    save_step(store, tmp_path, 8)
    assert store.apply_retention(keep_last=1, committed=8) == []
    assert store.steps() == [8, 10, 20]  # the corrupt ones kept for a look, not counted
    save_step(store, tmp_path, 30)
    save_step(store, tmp_path, 9)  # 30 verifies, so it counts, and 8 is the oldest
    assert store.apply_retention(keep_last=2, committed=9) == [8, 10, 20]
    assert store.steps() == [9, 30]


@pytest.mark.parametrize("name", ["final", "staging"])
def test_a_link_planted_at_the_next_step_is_removed_not_written_through(tmp_path, name):
    """#46 item 11: a symbolic link planted at the next step's name (or its staging
    folder's) made the final checkpoint fail, or would be written through out of the
    root. It is removed with a warning; its target is untouched."""
    from jobctl.engine.checkpoint.store.local import publish_local, stage_dir

    root, outside = tmp_path / "ckpt", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "keep.txt").write_text("theirs")
    link = root / (step_dirname(4) + (".tmp" if name == "staging" else ""))
    link.symlink_to(outside, target_is_directory=True)
    staging = stage_dir(root, 4)
    (staging / "w.pt").write_bytes(b"weights")
    published = publish_local(root, 4, "rank-0", ["w.pt"], {"global_step": 4})
    assert published == root / step_dirname(4) and not published.is_symlink()
    assert CheckpointStore(str(root)).problem(4, verify=True) is None
    assert sorted(p.name for p in outside.iterdir()) == ["keep.txt"]
    store = CheckpointStore(str(root))
    (root / step_dirname(5)).symlink_to(outside, target_is_directory=True)
    save_step(store, tmp_path, 5)  # through the store's own writer too
    assert not (root / step_dirname(5)).is_symlink() and store.problem(5) is None
    assert sorted(p.name for p in outside.iterdir()) == ["keep.txt"]
