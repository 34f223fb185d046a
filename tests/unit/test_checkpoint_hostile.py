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
