"""Re-forming survivors in place (issue #25): the new plan laid on the surviving nodes
(engine/supervise/reform.py) and the word and answers through a real TCPStore, as
the survivors' side (engine/worker/reform.py) reads and writes them."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
import torch.distributed as dist

from jobctl.engine.planner.resolver import make_plan
from jobctl.engine.supervise.reform import (
    EPOCH_KEY,
    KEY,
    Reformation,
    stored_epoch,
    survivor_layout,
)
from jobctl.engine.worker.reform import Reform, answer, await_word
from tests.jobrun import tiny_spec


def _plan(devices: int, per_node: int, P: int, D: int):
    spec = tiny_spec(
        **{
            "hardware.nodes": devices // per_node,
            "hardware.processes_per_node": per_node,
            "parallelism.pipeline_stages": P,
            "parallelism.data_parallel": D,
            "parallelism.placement": "pipeline_major",
        }
    )
    return make_plan(spec, devices)


def test_the_new_plan_runs_on_the_surviving_nodes_in_order():
    old = _plan(6, 2, 2, 3)  # nodes 0, 1, 2 of 2 ranks: a replica each
    new = _plan(4, 2, 2, 2)  # node 1 lost: new node 0 on old node 0, new node 1 on 2
    nodes, ranks = survivor_layout(old, new, [1])
    assert nodes == [0, 2]
    at = {r.rank: (r.node, r.local_rank) for r in old.ranks}
    back = {r.rank: (r.node, r.local_rank) for r in new.ranks}
    assert sorted(ranks) == [0, 1, 4, 5] and sorted(ranks.values()) == [0, 1, 2, 3]
    for o, n in ranks.items():  # the same local slot, on the node the new one maps to
        assert at[o] == ({0: 0, 1: 2}[back[n][0]], back[n][1])


def test_a_plan_that_does_not_fit_the_surviving_nodes_is_refused():
    old = _plan(4, 2, 2, 2)
    assert survivor_layout(old, _plan(3, 1, 1, 3), [1]) == ([], {})  # 3 nodes of 1
    assert survivor_layout(old, _plan(4, 2, 2, 2), [1]) == ([], {})  # more than left


@pytest.fixture
def store():
    server = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=5)
    )
    yield dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=5))
    del server


def test_the_word_and_the_answers_meet_in_the_store(store, tmp_path, monkeypatch):
    new = _plan(2, 2, 1, 2)
    (tmp_path / "plan.json").write_text(new.model_dump_json())
    word = {
        "plan": str(tmp_path / "plan.json"),
        "ranks": {"0": 1, "1": 0},
        "prefix": "p",
        "resume": str(tmp_path / "ckpt"),
    }
    store.set(f"{KEY}0", json.dumps(word))
    got = await_word(store, 0, lambda: False)
    assert got == Reform(new, 1, tmp_path / "ckpt", "p", 0)
    assert await_word(store, 7, lambda: False) is None  # not a survivor: it leaves
    now = [0.0]
    waiting = Reformation(store, 0, {0: 1, 1: 0}, 4, 0, 10.0, lambda: now[0])
    assert waiting.settled() is None
    answer(store, got)
    assert waiting.settled() is None  # rank 0 has not answered
    answer(store, Reform(new, 0, tmp_path, "p", 0))
    assert waiting.settled() == ""
    answer(store, Reform(new, 0, tmp_path, "p", 1), "rank 0: OSError: disk full")
    later = Reformation(store, 1, {0: 1, 1: 0}, 4, 0, 10.0, lambda: now[0])
    assert later.settled() == "rank 0: OSError: disk full"  # a failure ends it at once
    now[0] = 11.0
    late = Reformation(store, 2, {0: 0}, 4, 0, 10.0, lambda: now[0])
    assert "did not re-form" in late.settled()


def test_leave_is_a_word_too(store, monkeypatch):
    monkeypatch.setenv("JOBCTL_EPOCH", "3")  # a later loss: its own epoch's key
    store.set(f"{KEY}3", json.dumps({"leave": "no layout fits"}))
    assert await_word(store, 0, lambda: False) is None


def test_the_epoch_lives_in_the_run_hosts_store(store, tmp_path, monkeypatch):
    import jobctl.engine.supervise.reform as reform

    monkeypatch.setattr(reform, "connect_store", lambda run_dir: store)
    assert stored_epoch(tmp_path) == 0  # fresh processes
    store.set(EPOCH_KEY, "1")  # set with a re-formation's word
    assert stored_epoch(tmp_path) == 1  # what an adopting supervisor reads
    monkeypatch.setattr(reform, "connect_store", lambda run_dir: None)
    assert stored_epoch(tmp_path) == 0  # no run host: no re-formation to continue


def test_a_re_formed_attempt_reads_its_own_records():
    """The old trainers' last records (an earlier epoch's sender) are the previous
    attempt's; a node script's records name the script's node, mapped to the plan's."""
    from jobctl.engine.supervise.in_place_watch import InPlaceWatch

    watch = InPlaceWatch()
    watch._init_in_place()
    watch.epoch, watch.script_nodes = 1, [1, 2]  # node 0 lost: scripts 1, 2 are nodes 0, 1
    recs = [
        {"kind": "alive", "src": "rank-2-77-0", "node": 1},  # the old trainer's
        {"kind": "step", "src": "rank-0-77-1", "step": 5},
        {"kind": "node_sigterm", "node": 2},
        {"kind": "node_sigterm", "node": 0},  # the lost node's script, ending
    ]
    assert watch._this_epoch(recs) == [recs[1], {"kind": "node_sigterm", "node": 1}]
