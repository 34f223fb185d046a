"""#46 item 2: a checkpoint that passes the manifest check but cannot be loaded (a shard
with wrong tensor shapes, a foreign pickle, a nonsense meta.json, each re-signed in the
manifest) failed the run in every worker; resume now skips it with a one-line warning
and continues from the step before, as for other corruption."""

from __future__ import annotations

import json
import logging
import pickle
from pathlib import Path

import pytest
import torch

from jobctl.engine.checkpoint.blocks import snapshot_blocks, write_meta, write_snapshot
from jobctl.engine.checkpoint.contents import content_problem
from jobctl.engine.checkpoint.resume import find_resume_point
from jobctl.engine.checkpoint.store.checkpoint_store import CheckpointStore
from jobctl.engine.checkpoint.store.format import step_dirname
from jobctl.engine.model.blocks import Stage, model_def
from jobctl.spec import CheckpointSpec

from ..jobrun import tiny_spec


def _save(store: CheckpointStore, tmp_path: Path, step: int, tamper=None) -> Path:
    """A real checkpoint of the quickstart GPT at ``step`` (AdamW state included), as
    the workers write one; ``tamper(folder)`` edits its files before the manifest is
    written, which is what re-signing a tampered checkpoint amounts to."""
    spec = tiny_spec()
    mdef = model_def(spec.model, spec.training.seed)
    stage = Stage(mdef, range(mdef.num_blocks))
    opt = torch.optim.AdamW(stage.parameters(), lr=1e-3)
    stage(torch.randint(0, spec.model.vocab, (2, spec.model.seq_len))).sum().backward()
    opt.step()
    local = tmp_path / f"local-{step}"
    local.mkdir()
    names = write_snapshot(snapshot_blocks(stage, opt, list(range(mdef.num_blocks)), []), local)
    names.append(write_meta(local, {"step": step}))
    if tamper is not None:
        tamper(local)
    store.write_part(step, "rank0", local, names)
    assert store.commit(step, ["rank0"], {})
    return store_root(store) / step_dirname(step)


def store_root(store: CheckpointStore) -> Path:
    return Path(store.url)


def _wrong_shape(folder: Path) -> None:
    payload = torch.load(folder / "block-0001.pt", weights_only=True)
    name = next(iter(payload["params"]))
    payload["params"][name] = torch.zeros(3, 7)
    torch.save(payload, folder / "block-0001.pt")


class Foreign:  # noqa: D101 - what a foreign pickle holds
    pass


def _foreign_pickle(folder: Path) -> None:
    (folder / "block-0002.pt").write_bytes(pickle.dumps(Foreign()))


def _nonsense_meta(folder: Path) -> None:
    (folder / "meta.json").write_text(json.dumps({"format": None, "step": "x"}))


@pytest.mark.parametrize(
    ("tamper", "says"),
    [
        (_wrong_shape, ("block-0001.pt: layers.1.",)),
        (_foreign_pickle, ("block-0002.pt: not a checkpoint shard",)),
        (_nonsense_meta, ("meta.json: ", "checkpoint format None, expected 1")),
    ],
)
def test_a_resigned_unloadable_checkpoint_is_skipped(tmp_path, caplog, tamper, says):
    root = tmp_path / "ckpt"
    store = CheckpointStore(str(root))
    for step in (10, 20):
        _save(store, tmp_path, step)
    _save(store, tmp_path, 30, tamper)
    assert store.problem(30, verify=True) is None  # the manifest vouches for it
    with caplog.at_level(logging.WARNING, logger="jobctl.engine.checkpoint"):
        point = find_resume_point(CheckpointSpec(), root)
    assert point is not None and point.step == 20
    [line] = [r.getMessage() for r in caplog.records if "step 30" in r.getMessage()]
    assert all(part in line for part in says) and "\n" not in line


def test_a_good_checkpoint_loads_and_reports_its_shapes(tmp_path):
    folder = _save(CheckpointStore(str(tmp_path / "ckpt")), tmp_path, 10)
    why, shapes = content_problem(folder)
    assert why is None and shapes["layers.0.wte.weight"] == (256, 64)
    other = {**shapes, "layers.0.wte.weight": (255, 64)}
    why, _ = content_problem(folder, other)
    assert why == "layers.0.wte.weight has shape (256, 64), (255, 64) at the run's other checkpoint"
