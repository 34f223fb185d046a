"""A lost node under tensor parallelism: the run morphs with its T groups (issue 28).

Tiny GPT-2 (a traced Hugging Face model) at T = 2 x D = 2 on 2 nodes x 2 processes:
each node holds one replica's T group. Rank 2 SIGKILLs node 1 inside a forward
(``JOBCTL_CHAOS``). The survivors do not hand their step over (each holds a T-shard of
the stage, not whole blocks: ``worker.survival`` says why), so the run falls back to
its newest complete checkpoint, says how many steps that lost, re-plans on node 0
keeping T = 2 (T = 2 x P = 1 x D = 1) and finishes; every recorded step's loss, those
trained twice included, is the uninterrupted single process's.
"""

from __future__ import annotations

import pytest

from jobctl.engine.worker.reference import reference_train

from ..jobrun import events
from .test_chaos_handover import STEPS, _data, _run
from .test_graph_models import GPT2, hf_spec


@pytest.mark.multiproc
@pytest.mark.chaos
def test_lost_node_at_T2_morphs_and_rolls_back(tmp_path, monkeypatch):
    spec = hf_spec(
        GPT2,
        1,
        2,
        **{
            "parallelism.tensor_parallel": 2,
            "hardware.processes_per_node": 2,
            "training.steps": STEPS,
            "checkpoint.interval": 3,
            "elasticity.enabled": True,
        },
    )
    db, run_id, run_dir = _run(tmp_path, monkeypatch, spec, "2:5:forward")
    handed = _data(db, run_id, "emergency")
    assert handed["step"] is None and "T > 1" in handed["why"], handed
    assert db.get_run(run_id)["plan"].startswith("T=2 P=1 D=1")  # T kept, on node 0
    resumed, recovery = _data(db, run_id, "resume"), _data(db, run_id, "recovery")
    start = resumed["step"]  # step 3's checkpoint (its writer may lag: then none, 0)
    assert recovery["source"] == "checkpoint" and recovery["resumed"] == start in (0, 3)
    relaunched = next(e["ts"] for e in db.events(run_id) if e["kind"] == "resume")
    trained = max(
        e["step"]
        for e in events(run_dir)
        if e["kind"] in ("step", "heartbeat") and e["ts"] < relaunched
    )
    assert trained >= 5 and recovery["steps_lost"] == trained - start
    ref, _ = reference_train(spec)
    steps = [e for e in events(run_dir) if e["kind"] == "step"]
    again = [e["step"] for e in steps if e["ts"] >= relaunched]
    assert again == list(range(start + 1, STEPS + 1))  # each step after it once
    for e in steps:  # the first attempt's too (its commit summed one loss per T group)
        assert e["loss"] == pytest.approx(ref[e["step"] - 1], abs=1e-5), e
