"""#55: a checkpoint's snapshot copies into host tensors reused from the last checkpoint
(engine/checkpoint/buffers.py): the second snapshot lands in the same memory and
holds the new values, the files written from it equal a fresh snapshot's, and the
checkpoint manager hands a set back to its pool once written or coalesced away."""

from __future__ import annotations

import threading
from pathlib import Path

import torch

from jobctl.engine.checkpoint.blocks import snapshot_blocks, snapshot_bytes, write_snapshot
from jobctl.engine.checkpoint.buffers import BufferPool, Buffers, Scoped
from jobctl.engine.checkpoint.manager import CheckpointManager, Copied
from jobctl.engine.core.events import EventLog, read_metrics
from jobctl.engine.model.blocks import Stage, model_def
from jobctl.engine.planner.resolver import make_plan
from jobctl.spec import CheckpointSpec

from ..jobrun import tiny_spec


def _trained():
    spec = tiny_spec()
    mdef = model_def(spec.model, spec.training.seed)
    stage = Stage(mdef, range(mdef.num_blocks))
    opt = torch.optim.AdamW(stage.parameters(), lr=1e-3)
    return spec, mdef, stage, opt


def _step(stage, opt, vocab: int) -> None:
    stage(torch.randint(0, vocab, (2, 8))).sum().backward()
    opt.step()
    opt.zero_grad()


def test_a_second_snapshot_refills_the_first_ones_memory(tmp_path):
    spec, mdef, stage, opt = _trained()
    blocks = list(range(mdef.num_blocks))
    _step(stage, opt, spec.model.vocab)
    into = Buffers()
    snapshot_blocks(stage, opt, blocks, mdef.ties, into=into)
    ptrs = {k: t.data_ptr() for k, t in into.tensors.items()}
    _step(stage, opt, spec.model.vocab)  # new weights and Adam moments
    again = snapshot_blocks(stage, opt, blocks, mdef.ties, into=into)
    assert {k: t.data_ptr() for k, t in into.tensors.items()} == ptrs  # no new pages
    fresh = snapshot_blocks(stage, opt, blocks, mdef.ties)
    reused, new = tmp_path / "reused", tmp_path / "fresh"
    reused.mkdir()
    new.mkdir()
    assert write_snapshot(again, reused) == write_snapshot(fresh, new)
    for f in sorted(reused.iterdir()):
        got, want = torch.load(f), torch.load(new / f.name)
        assert got["params"].keys() == want["params"].keys()
        for n, t in want["params"].items():
            assert torch.equal(got["params"][n], t), n
            assert got["optim"][n].keys() == want["optim"][n].keys()
            for k, v in want["optim"][n].items():
                assert torch.equal(got["optim"][n][k], v), (n, k)


def test_the_pool_keeps_one_idle_set_and_makes_new_ones_only_when_none_is_idle():
    pool = BufferPool()
    a, b = pool.take(), pool.take()
    assert a is not b
    pool.give(a)
    pool.give(b)  # one idle set is kept; b is dropped
    assert pool.take() is a and pool.take() is not b


def _manager(tmp_path: Path) -> CheckpointManager:
    one = {"hardware.nodes": 1, "hardware.processes_per_node": 1}
    spec = tiny_spec(**one, **{"parallelism.pipeline_stages": 1, "parallelism.data_parallel": 1})
    plan = make_plan(spec, home=tmp_path)
    cfg = CheckpointSpec(interval=1)
    return CheckpointManager(cfg, plan, 0, tmp_path / "ckpt", EventLog(tmp_path / "m.jsonl"))


def test_the_manager_hands_written_and_coalesced_sets_back(tmp_path):
    spec, mdef, stage, opt = _trained()
    blocks = list(range(mdef.num_blocks))
    manager = _manager(tmp_path)
    _step(stage, opt, spec.model.vocab)  # AdamW's moments and step exist
    into = manager.buffers()
    snap = snapshot_blocks(stage, opt, blocks, mdef.ties, into=into)
    copied = Copied(0.004, snapshot_bytes(snap))
    manager.save(1, snap, {"step": 1, "global_batch_size": 16}, buffers=into, copied=copied)
    manager.close()
    assert manager.buffers() is into  # written: the next snapshot refills it
    params = sum(p.numel() for p in stage.parameters()) * 4
    assert 3 * params <= copied.nbytes <= 3 * params + 4 * 64  # weights, two moments, steps
    (rec,) = [r for r in read_metrics(tmp_path / "m.jsonl", 0)[0] if r["kind"] == "checkpoint"]
    assert (rec["snapshot_s"], rec["snapshot_bytes"]) == (0.004, copied.nbytes)
    # A slow writer: step 2 is being written, 3 waits, 4 replaces 3, whose set is back.
    gate, writing = threading.Event(), threading.Event()
    manager._write = lambda job: (writing.set(), gate.wait())
    sets = [Buffers() for _ in range(3)]
    manager.save(2, {}, {"step": 2}, buffers=sets[0])
    assert writing.wait(10)
    manager.save(3, {}, {"step": 3}, buffers=sets[1])
    manager.save(4, {}, {"step": 4}, buffers=sets[2])
    assert manager._pool._idle == [sets[1]]
    gate.set()
    manager.close()
    assert manager.buffers() is sets[1]  # one idle set kept; the others were dropped


def test_copies_of_the_same_blocks_fill_one_set_side_by_side():
    # AvgPipe's reference and parallel models hold the same blocks under the same
    # names; each snapshots under its own prefix, so none overwrites another.
    spec, mdef, a, opt_a = _trained()
    _, _, b, opt_b = _trained()
    _step(b, opt_b, spec.model.vocab)  # b's weights differ from a's
    blocks, into = list(range(mdef.num_blocks)), Buffers()
    snap_a = snapshot_blocks(a, None, blocks, mdef.ties, into=Scoped(into, "reference"))
    snap_b = snapshot_blocks(b, opt_b, blocks, mdef.ties, into=Scoped(into, 0))
    for blk in blocks:
        for n, p in dict(a.named_parameters()).items():
            if n in snap_a[blk]["params"]:
                assert torch.equal(snap_a[blk]["params"][n], p), n
                assert not torch.equal(snap_b[blk]["params"][n], p), n
    assert snapshot_bytes(snap_b) > snapshot_bytes(snap_a)  # b's Adam moments besides
    assert len(into.tensors) > sum(len(s["params"]) for s in snap_a.values())


def test_block_files_skip_zip_crcs_and_load_whole(tmp_path):
    """The block files carry no zip CRC-32 (torch.load never checks one; the manifest's
    sha256 verifies a file): every record's CRC field is 0, the files load back equal,
    and the process's own torch.save keeps computing CRCs."""
    import zipfile

    from torch.utils.serialization import config

    spec, _, stage, opt = _trained()
    _step(stage, opt, spec.model.vocab)
    snap = snapshot_blocks(stage, opt, [0, 1], [])
    for name in write_snapshot(snap, tmp_path):
        records = zipfile.ZipFile(tmp_path / name).infolist()
        assert records and all(r.CRC == 0 for r in records)
    back = torch.load(tmp_path / "block-0001.pt", weights_only=True)
    assert all(torch.equal(v, snap[1]["params"][n]) for n, v in back["params"].items())
    assert config.save.compute_crc32
    torch.save({"w": torch.ones(3)}, tmp_path / "other.pt")
    assert zipfile.ZipFile(tmp_path / "other.pt").testzip() is None
