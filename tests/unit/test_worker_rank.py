"""A worker takes the plan's rank for the node script it runs under, not torchrun's."""

from __future__ import annotations

from jobctl.engine.planner.resolver import make_plan
from jobctl.engine.worker.process import plan_rank

from ..jobrun import tiny_spec


def _plan():
    spec = tiny_spec(**{"parallelism.pipeline_stages": 2, "parallelism.data_parallel": 2})
    plan = make_plan(spec, 4)
    assert plan.nodes == 2 and [r.node for r in plan.ranks] == [0, 0, 1, 1]
    return plan


def _env(rank, node, local, **extra):
    env = {
        "RANK": str(rank),
        "LOCAL_RANK": str(local),
        "WORLD_SIZE": "4",
        "LOCAL_WORLD_SIZE": "2",
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        **extra,
    }
    if node is not None:
        env["JOBCTL_NODE"] = str(node)
    return env


def test_rendezvous_order_does_not_move_a_rank_off_its_plan_node():
    plan = _plan()
    # The agent of node-1.sh joined first: torchrun gave its workers ranks 0 and 1.
    got = [plan_rank(plan, _env(r, 1 if r < 2 else 0, r % 2)) for r in range(4)]
    assert got == [2, 3, 0, 1]
    assert [plan.rank(g).node for g in got] == [1, 1, 0, 0]
    # In plan order nothing changes.
    assert [plan_rank(plan, _env(r, r // 2, r % 2)) for r in range(4)] == [0, 1, 2, 3]


def test_torchruns_rank_stands_when_the_launch_does_not_match_the_plan():
    plan = _plan()
    assert plan_rank(plan, _env(3, None, 1)) == 3  # no node script (pods)
    assert plan_rank(plan, _env(3, 0, 1, WORLD_SIZE="6")) == 3  # another world size
    assert plan_rank(plan, _env(3, 0, 1, LOCAL_WORLD_SIZE="3")) == 3
    assert plan_rank(plan, _env(3, 7, 1)) == 3  # a node the plan lacks


def test_local_backend_ranks_on_other_nodes_share_memory_elsewhere_only_on_their_node():
    from jobctl.engine.runtime.engine import same_machine

    plan = _plan()  # ranks 0, 1 on node 0; 2, 3 on node 1
    local = tiny_spec(**{"parallelism.pipeline_stages": 2, "parallelism.data_parallel": 2})
    assert local.hardware.backend == "local"
    assert [same_machine(local.hardware.one_machine, plan, 1)(p) for p in range(4)] == [True] * 4
    slurm = local.model_copy(
        update={"hardware": local.hardware.model_copy(update={"backend": "slurm"})}
    )
    one = slurm.hardware.one_machine
    assert [same_machine(one, plan, 1)(p) for p in range(4)] == [
        True,
        True,
        False,
        False,
    ]
    assert [same_machine(one, plan, 2)(p) for p in range(4)] == [
        False,
        False,
        True,
        True,
    ]
