"""The survivors' decision (engine/checkpoint/emergency.py), the step commit's bookkeeping
(engine/runtime/failure.py), an emergency checkpoint written in parts, and the steps
lost that recoveries report (engine/supervise/recovery.py, ``jobctl status RUN``)."""

from __future__ import annotations

import json

import torch

from jobctl.engine.checkpoint.blocks import load_full_state, read_meta
from jobctl.engine.checkpoint.emergency import decide, survivors_of, write_part
from jobctl.engine.checkpoint.resume import find_resume_point
from jobctl.engine.planner.resolver import make_plan
from jobctl.engine.runtime.failure import StepLedger, is_peer_failure
from jobctl.engine.runtime.p2p.shm import PeerGone
from jobctl.engine.supervise.figures import recoveries, steps_lost
from jobctl.engine.supervise.recovery import LossClock
from tests.jobrun import tiny_spec


def _plan(P=2, D=2, placement="pipeline_major"):
    spec = tiny_spec(
        **{
            "parallelism.pipeline_stages": P,
            "parallelism.data_parallel": D,
            "parallelism.placement": placement,
            "hardware.processes_per_node": P * D // 2,
        }
    )
    return spec, make_plan(spec, None)


def _held(done, ready=False, losses=None, reported=0):
    losses = losses or {}
    committed = max([done, *losses])
    losses = {str(k): v for k, v in losses.items()}
    return {
        "done": done,
        "ready": ready,
        "committed": committed,
        "losses": losses,
        "reported": reported,
    }


def test_survivors_of_a_lost_node_cover_every_stage_pipeline_major():
    _, plan = _plan()
    assert survivors_of(plan, [1]) == [0, 1]
    d = decide(plan, {0: _held(5, losses={5: 2.5}), 1: _held(5, losses={5: 2.5})})
    assert d.step == 5 and d.loss == 2.5
    assert sorted(b for bs in d.blocks.values() for b in bs) == list(range(6))  # each once
    assert d.parts == ["emergency-rank-0", "emergency-rank-1"] and d.leader == 0


def test_a_lost_stage_falls_back():
    _, plan = _plan(placement="stage_major")  # node 1 holds both replicas of stage 1
    d = decide(plan, {r: _held(5) for r in survivors_of(plan, [1])})
    assert d.step is None and d.why == "no live replica of stage(s) [1]"


def test_a_committed_step_is_completed_by_the_survivor_that_had_not_updated():
    _, plan = _plan()
    # rank 0 got through step 6's commit and updated; rank 1 summed its gradients but
    # its commit failed: it can update itself, so step 6 is kept
    d = decide(plan, {0: _held(6, losses={6: 1.5}), 1: _held(5, ready=True)})
    assert d.step == 6 and d.loss == 1.5
    # without its gradients summed it could not: the survivors disagree, fall back
    d = decide(plan, {0: _held(6, losses={6: 1.5}), 1: _held(5, ready=False)})
    assert d.step is None and "rank(s) [1] cannot reach step 6" in d.why
    # nobody got through the commit: the previous step, nothing to complete
    assert decide(plan, {0: _held(5, ready=True), 1: _held(5, ready=True)}).step == 5


def test_blocks_are_dealt_over_the_surviving_replicas():
    _, plan = _plan(P=1, D=4)  # one stage, 6 blocks, four replicas, two survive
    d = decide(plan, {0: _held(3), 1: _held(3)})
    assert d.blocks == {0: [0, 2, 4], 1: [1, 3, 5]}


def test_ledger_keeps_what_a_trap_needs():
    ledger = StepLedger(4)
    ledger.begin()
    ledger.ready = True
    ledger.committed(5, 3.25)
    held = ledger.held(RuntimeError("Connection closed by peer"), apply_pending=lambda: None)
    assert (held.done, held.ready, held.committed()) == (4, True, 5)
    assert held.apply_pending is not None and held.as_record()["losses"] == {"5": 3.25}
    ledger.applied(5)
    assert ledger.held(PeerGone("x"), lambda: None).apply_pending is None  # nothing pending


def test_peer_failures_are_told_from_bugs():
    assert is_peer_failure(RuntimeError("[pair.cc:553] Connection closed by peer [::1]:4"))
    assert is_peer_failure(PeerGone("the peer closed its end"))
    assert not is_peer_failure(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not is_peer_failure(KeyError("x"))


def test_parts_publish_one_checkpoint_that_resume_finds(tmp_path):
    spec, plan = _plan()
    d = decide(plan, {0: _held(7, losses={7: 1.0}), 1: _held(7, losses={7: 1.0})})
    meta = {"step": 7, "next_sample": 7 * 16, "global_batch_size": 16}
    out = None
    for rank, blocks in sorted(d.blocks.items(), reverse=True):  # the leader last
        snap = {
            b: {"params": {f"layers.{b}.w": torch.full((2,), float(b))}, "optim": {}}
            for b in blocks
        }
        got = write_part(tmp_path, d, rank, snap, meta)
        out = out or got
        assert (got is None) == (rank != 0)  # published by the part that completes it
    assert read_meta(out)["emergency"] is True and read_meta(out)["step"] == 7
    state = load_full_state(out)
    assert sorted(state) == [f"layers.{b}.w" for b in range(6)]
    point = find_resume_point(spec.checkpoint, tmp_path)
    assert point.step == 7 and point.path == out
    assert write_part(tmp_path, d, 1, {}, meta) == out  # published already: nothing to do


def test_steps_lost_count_completed_steps_trained_again():
    clock = LossClock()
    clock.saw(1, 100.0)
    for step in (7, 8, 6):  # heartbeats of completed steps, any order
        clock.stepped(step)
    loss = clock.loss([1])
    assert loss.trained == 8 and loss.steps_lost is None  # the resume is not known yet
    fell_back = loss.resumed_at(6, handed_over=None)
    assert (fell_back.steps_lost, fell_back.source) == (2, "checkpoint")
    handed = loss.resumed_at(8, handed_over=8)
    assert (handed.steps_lost, handed.source) == (0, "emergency checkpoint")


def test_steps_a_survivor_reports_after_the_loss_was_taken_still_count():
    """The loss is taken when the attempt is judged ended; a survivor's heartbeats of
    the steps it finished meanwhile (the lost node's own records died with it) land
    later and are folded in when the attempt closes (``Monitor.trained_by_end``): a
    clean-clone CI saw 0 steps lost said where 2 (steps 7 and 8) were trained again."""
    clock = LossClock()
    clock.saw(1, 100.0)
    clock.stepped(6)
    loss = clock.loss([1])
    later = loss.with_trained(8).with_trained(7)  # the newest counts, never lowered
    assert (loss.trained, later.trained) == (6, 8)
    assert later.resumed_at(6, handed_over=None).steps_lost == 2


def test_each_recovery_says_its_steps_lost():
    evs = [
        {"kind": "recovery", "data": json.dumps({"seconds": 3.9})},  # before #25
        {"kind": "recovery", "data": json.dumps({"seconds": 1.24, "steps_lost": 0})},
    ]
    assert recoveries(evs) == [3.9, 1.24] and steps_lost(evs) == [None, 0]
