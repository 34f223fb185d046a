"""A slowed worker of a real run is flagged in status (tests/unit/test_stragglers.py: the
detector and the heartbeat fields)."""

from __future__ import annotations

import json
import math
import statistics

import pytest

from jobctl.engine.state.db import StateDB

from ..jobrun import events, run_job, tiny_spec


@pytest.mark.multiproc
@pytest.mark.chaos
def test_slowed_worker_is_flagged_in_status(tmp_path):
    steps = 25
    spec = tiny_spec(
        **{
            "model.import": "tests.slowmodel:factory",
            # 50 ms of sleep per forward on rank 1, against ~1-3 ms of compute per
            # micro-batch: a sleep costs no CPU, so sharing 2 cores with 3 other ranks
            # and other jobs stretches the peers' compute far less than this.
            "model.import_args": {"slow_rank": 1, "delay_s": 0.05},
            "model.family": None,
            "training.steps": steps,
            "parallelism.pipeline_stages": 2,
            "parallelism.data_parallel": 2,
        }
    )
    assert spec.elasticity.straggler_threshold == 0.15  # the default, not a looser one
    run, outcome = run_job(spec, tmp_path)
    assert outcome.ok, outcome.message
    db = StateDB(tmp_path)
    row = db.get_run(run.id)
    assert row["phase"] == "completed" and row["step"] == steps
    recs = events(run.dir)
    losses = {e["step"]: e["loss"] for e in recs if e["kind"] == "step"}
    assert sorted(losses) == list(range(1, steps + 1))
    assert all(math.isfinite(v) for v in losses.values())
    first, last = [losses[s] for s in range(1, 6)], [losses[s] for s in range(steps - 4, steps + 1)]
    assert sum(last) / 5 < sum(first) / 5 - 0.5, losses  # it trained
    # Every heartbeat carries per-micro-batch forward and backward time and memory.
    beats = [e for e in recs if e["kind"] == "heartbeat"]
    assert len(beats) == 4 * steps
    for b in beats:
        assert b["fwd_ms"] > 0 and b["bwd_ms"] > 0 and b["mem_mb"] > 10
        assert b["mem_kind"] == "rss"
        assert b["compute_s"] == pytest.approx((b["fwd_ms"] + b["bwd_ms"]) / 1e3)
    slow = [b["fwd_ms"] for b in beats if b["rank"] == 1]
    peer = [b["fwd_ms"] for b in beats if b["rank"] == 0]
    assert min(slow) > 50 and statistics.median(slow) > 3 * statistics.median(peer)
    # Under heavy CPU contention a peer of the slowed pipeline can be flagged too; the
    # slowed rank must always be, and its stage peer (the rank it is compared with,
    # which the sleep does not slow) never: a detector flagging every rank fails here.
    listed = {int(r) for r in row["stragglers"].split(",")}
    flagged = [e for e in db.events(run.id) if e["kind"] == "straggler"]
    ever = {r for e in flagged for r in json.loads(e["data"])["ranks"]}
    assert 1 in listed and 1 in ever
    slow = next(r for r in run.plan.ranks if r.rank == 1)
    peers = {r.rank for r in run.plan.ranks if r.stage == slow.stage and r.rank != 1}
    assert peers == {0}
    assert not (listed | ever) & peers, (listed, ever)
