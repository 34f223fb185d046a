"""Morphs change T like P and D (Merak 4.1 with elasticity): under
``tensor_parallel: auto`` the supervisor's re-plan after a lost node
(``scaling.next_attempt``) runs the planner's T x P x D search on the devices left,
so a memory cap that T = 1 meets only on four stages turns two devices into one
T = 2 group."""

from __future__ import annotations

import json

from jobctl.engine.planner import tp_search
from jobctl.engine.planner.resolver import make_plan
from jobctl.engine.state.db import StateDB
from jobctl.engine.supervise.monitor import Outcome
from jobctl.engine.supervise.scaling import next_attempt
from jobctl.spec import load_spec

from ..jobrun import quickstart_with

GPT2 = (
    "  huggingface:\n    class: GPT2LMHeadModel\n    config: {n_layer: 2, n_embd: 32, "
    "n_head: 4, vocab_size: 256, n_positions: 16}"
)


def _fixed(spec, T: int, P: int, D: int):
    par = spec.parallelism.model_copy(
        update={"tensor_parallel": T, "pipeline_stages": P, "data_parallel": D}
    )
    return spec.model_copy(update={"parallelism": par})


def _peak(spec, T: int, P: int, D: int) -> float:
    """The largest stage's predicted memory (GiB) of the layout T x P x D."""
    return max(make_plan(_fixed(spec, T, P, D)).prediction.memory_per_stage_gb)


def _admissible(spec, plan, G: int, cap_gib: float) -> None:
    """``plan`` is one the T search may pick on G devices: T among its options, the
    layout on G devices, each T group inside one node, every stage under the cap."""
    assert plan.T in tp_search.options(spec, G)[0], (plan.T, G)
    assert plan.T * plan.P * plan.D == plan.world_size <= G
    for rank in range(plan.world_size):
        assert len({plan.ranks[r].node for r in plan.tp_ranks(rank)}) == 1
    assert max(plan.prediction.memory_per_stage_gb) <= cap_gib


def test_a_lost_node_morphs_T1_on_four_stages_into_one_T2_group(tmp_path):
    path = quickstart_with(
        tmp_path / "job.yaml",
        (
            "  pipeline_stages: 2\n  data_parallel: 2",
            "  pipeline_stages: auto\n  data_parallel: auto\n  tensor_parallel: auto",
        ),
        ("  family: gpt", GPT2),
        ("  seq_len: 32", "  seq_len: 16"),
        ("  interval: 30", "  interval: 30\nelasticity:\n  enabled: true"),
    )
    base = load_spec(path)  # 2 nodes x 2 processes
    # T = 1 on 4 stages is below T = 2 on one stage, which is below T = 1 on 2 stages:
    # a cap between the last two fits T = 1 only at P = 4 (4 devices)
    t1_p4, t2_p1, t1_p2 = _peak(base, 1, 4, 1), _peak(base, 2, 1, 1), _peak(base, 1, 2, 1)
    assert t1_p4 < t2_p1 < t1_p2
    cap = (t2_p1 + t1_p2) / 2
    hw = base.hardware.model_copy(update={"memory_gb": cap * 2**30 / 1e9})  # GiB -> GB
    spec = base.model_copy(update={"hardware": hw})
    first = make_plan(spec)
    assert (first.T, first.P, first.D, first.nodes) == (1, 4, 1, 2)  # T = 1 is faster
    _admissible(spec, first, 4, cap)

    db = StateDB(tmp_path / "home")
    (db.runs_dir / "run-1").mkdir(parents=True)
    db.create_run("run-1", "job", db.runs_dir / "run-1", total_steps=60, devices=4)
    lost = Outcome(ok=False, exit_code=1, message="node 1 lost", kind="preempted", lost_nodes=[1])
    morphed = next_attempt(spec, first, lost, db, "run-1", "local")
    assert morphed is not None
    assert (morphed.T, morphed.P, morphed.D, morphed.world_size) == (2, 1, 1, 2)
    _admissible(spec, morphed, 2, cap)
    assert any("T = 1: no layout fits" in x for x in morphed.t_search), morphed.t_search
    morph = [e for e in db.events("run-1") if e["kind"] == "morph"]
    assert [(json.loads(e["data"])["from"], json.loads(e["data"])["to"]) for e in morph] == [(4, 2)]
