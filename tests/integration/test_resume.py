"""Layout-independent checkpoints: resume into another layout, from local or S3."""

from __future__ import annotations

import logging

import pytest
import s3fs
import torch

from jobctl.engine.checkpoint.resume import find_resume_point
from jobctl.engine.checkpoint.store.checkpoint_store import CheckpointStore
from jobctl.engine.state.db import StateDB
from jobctl.engine.supervise.run_requests import request_stop
from jobctl.engine.worker.reference import reference_train

from ..jobrun import (
    events,
    final_weights,
    run_job,
    start_apply,
    step_losses,
    tiny_spec,
    wait_for,
    write_spec,
)

SGD = {"training.optimizer": "sgd", "training.lr": 0.3, "training.momentum": 0.9}


def _spec(steps: int, P: int, D: int, **extra):
    return tiny_spec(
        **{
            **SGD,
            "training.steps": steps,
            "checkpoint.interval": 1,
            "parallelism.pipeline_stages": P,
            "parallelism.data_parallel": D,
            **extra,
        }
    )


@pytest.fixture(scope="module")
def first_half(tmp_path_factory):
    """Two steps as 2x2; returns its step-2 checkpoint folder and losses."""
    home = tmp_path_factory.mktemp("first")
    run, outcome = run_job(_spec(2, 2, 2), home)
    assert outcome.ok, outcome.message
    return run.dir / "checkpoints" / "step-00000002", step_losses(run.dir)


@pytest.fixture(scope="module")
def reference():
    return reference_train(_spec(4, 1, 1))


@pytest.mark.multiproc
@pytest.mark.parametrize(("P", "D"), [(1, 2), (2, 1), (4, 1)])
def test_resume_into_another_layout(tmp_path, first_half, reference, P, D):
    ckpt, first_losses = first_half
    ref_losses, ref_weights = reference
    assert first_losses == pytest.approx(ref_losses[:2], abs=1e-5)
    run, outcome = run_job(_spec(4, P, D), tmp_path, resume_dir=ckpt)
    assert outcome.ok, outcome.message
    assert step_losses(run.dir) == pytest.approx(ref_losses[2:], abs=1e-5)
    weights = final_weights(run.dir, 4)
    for name, w in ref_weights.items():
        torch.testing.assert_close(weights[name], w, atol=1e-5, rtol=0, msg=name)


@pytest.mark.multiproc
@pytest.mark.s3
def test_remote_checkpoints_resume_and_skip_corruption(
    tmp_path, s3_url, monkeypatch, reference, caplog
):
    secret = "s3cr3t-value-never-stored-0xC0FFEE"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    spec = _spec(
        3,
        2,
        2,
        **{"checkpoint.remote": s3_url, "checkpoint.keep_last": 3, "checkpoint.coalesce": False},
    )
    run, outcome = run_job(spec, tmp_path / "home")
    assert outcome.ok, outcome.message
    remote = CheckpointStore(s3_url)
    steps = remote.steps()
    # Every step is uploaded (no coalescing), but each by the rank that published it, so
    # an older upload still in flight when a newer step commits can be cleared as stale.
    assert steps[-1] == 3 and len(steps) >= 2, steps
    assert remote.latest_complete(verify=True) == 3
    assert sorted(remote.manifest(3).files) == sorted(
        [f"block-{b:04d}.pt" for b in range(6)] + ["meta.json"]
    )
    row = StateDB(tmp_path / "home").get_run(run.id)
    assert row["last_upload"] == 3
    for path in (tmp_path / "home").rglob("*"):  # credentials never reach files or state
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path

    # Corrupt the newest remote checkpoint: resuming on a fresh machine falls back to 2.
    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    target = f"{s3_url}/step-00000003/block-0004.pt"
    data = bytearray(fs.cat(target))
    data[len(data) // 2] ^= 0xFF
    fs.pipe(target, bytes(data))
    fresh_root = tmp_path / "fresh" / "checkpoints"
    with caplog.at_level(logging.WARNING, logger="jobctl.engine.checkpoint.resume"):
        point = find_resume_point(spec.checkpoint, fresh_root)
    assert point is not None and point.step == steps[-2] and point.source == s3_url
    assert any("step 3" in r.getMessage() for r in caplog.records)

    # Continue that download for the remaining step in another layout: same numbers.
    spec4 = _spec(4, 1, 2, **{"checkpoint.remote": s3_url})
    run2, outcome2 = run_job(spec4, tmp_path / "home2", resume_dir=point.path)
    assert outcome2.ok, outcome2.message
    assert step_losses(run2.dir) == pytest.approx(reference[0][point.step :], abs=1e-5)


@pytest.mark.multiproc
def test_resume_into_zb_v_and_back(tmp_path, first_half, reference):
    # 1F1B 2x2's step-2 checkpoint resumes as ZB-V (2 ranks, 4 stages in V shape, each
    # rank's blocks from two stages), whose step-3 checkpoint resumes as 1F1B 2x1.
    ckpt, _ = first_half
    ref_losses, ref_weights = reference
    v_spec = _spec(3, 2, 1, **{"parallelism.schedule": "zb_v"})
    run, outcome = run_job(v_spec, tmp_path / "v", resume_dir=ckpt)
    assert outcome.ok, outcome.message
    assert run.plan.placement == [[0, 3], [1, 2]]
    assert step_losses(run.dir) == pytest.approx(ref_losses[2:3], abs=1e-5)
    back = run.dir / "checkpoints" / "step-00000003"
    run2, outcome2 = run_job(_spec(4, 2, 1), tmp_path / "back", resume_dir=back)
    assert outcome2.ok, outcome2.message
    assert run2.plan.placement is None
    assert step_losses(run2.dir) == pytest.approx(ref_losses[3:], abs=1e-5)
    weights = final_weights(run2.dir, 4)
    for name, w in ref_weights.items():
        torch.testing.assert_close(weights[name], w, atol=1e-5, rtol=0, msg=name)


def _mobius(steps: int, **extra):
    """S = 4 Mobius stages on 2 ranks of one node (``parallelism.schedule: mobius``)."""
    one_node = {"hardware.nodes": 1, "hardware.processes_per_node": 2}
    return _spec(steps, 4, 1, **{"parallelism.schedule": "mobius", **one_node, **extra})


@pytest.mark.multiproc
def test_mobius_run_stops_and_resumes_under_1f1b(tmp_path):
    # `jobctl apply` of Mobius (4 stages swapped through files on 2 ranks) trains like
    # one process; a stop (`jobctl stop`'s request) checkpoints the step the ranks agree
    # on, in the block format, which resumes as 1F1B 2x1 for one more step, equal to
    # one process too.
    spec, home = _mobius(300, **{"checkpoint.interval": 1000}), tmp_path / "home"
    proc = start_apply(write_spec(spec, tmp_path / "mobius.yaml"), home, output=True)
    runs = home / "runs"
    run_dir = wait_for(lambda: runs.exists() and next(runs.glob("*"), None), what="the run")
    wait_for(lambda: step_losses(run_dir), what="a first step")
    db = StateDB(home)
    assert request_stop(db, db.get_run(run_dir.name)).how == "asked"  # as `jobctl stop`
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0 and "stopped at step" in out, out
    row = StateDB(home).get_run(run_dir.name)
    k = row["step"]
    assert row["phase"] == "stopped" and row["last_checkpoint"] == k < 300
    assert not list((run_dir / "mobius").glob("rank-*/*.bin"))  # the tier files went
    beats = [e for e in events(run_dir) if e["kind"] == "heartbeat"]
    assert {e["rank"] for e in beats} == {0, 1} and all(e["max_rss_mb"] > 0 for e in beats)
    ref_losses, ref_weights = reference_train(_spec(k + 1, 1, 1))
    assert step_losses(run_dir) == pytest.approx(ref_losses[:k], abs=1e-5)
    ckpt = run_dir / "checkpoints" / f"step-{k:08d}"
    run2, outcome2 = run_job(_spec(k + 1, 2, 1), tmp_path / "back", resume_dir=ckpt)
    assert outcome2.ok, outcome2.message
    assert step_losses(run2.dir) == pytest.approx(ref_losses[k:], abs=1e-5)
    weights = final_weights(run2.dir, k + 1)
    for name, w in ref_weights.items():
        torch.testing.assert_close(weights[name], w, atol=1e-5, rtol=0, msg=name)


@pytest.mark.multiproc
def test_when_every_checkpoint_is_damaged_the_run_says_so_instead_of_step_0(tmp_path):
    """#46 item 11: with every checkpoint corrupt, a run that shares them (the same
    checkpoint.local_dir) silently trained again from step 0; it fails now, saying which
    steps it found and what to do, and launches nothing."""
    shared = tmp_path / "ckpt"
    spec = _spec(4, 1, 1, **{"checkpoint.interval": 2, "checkpoint.local_dir": str(shared)})
    first, outcome = run_job(spec, tmp_path / "a", 1)
    assert outcome.ok, outcome.message
    for step_dir in sorted(shared.glob("step-*")):
        shard = step_dir / "block-0000.pt"
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0xFF  # the same size: only the sha256 can tell
        shard.write_bytes(bytes(data))
    run, outcome = run_job(spec, tmp_path / "b", 1)
    assert not outcome.ok
    assert "no checkpoint can be resumed from: 2 committed (steps 2, 4)" in outcome.message
    assert f"move them out of {shared}" in outcome.message
    assert StateDB(tmp_path / "b").get_run(run.id)["phase"] == "failed"
    assert not [e for e in events(run.dir) if e["kind"] == "step"]  # nothing trained
