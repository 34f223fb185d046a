"""The Mobius record on a Plan (``core.plan.MobiusLayout``): its shape and its trip
through ``plan.json``."""

from jobctl.engine.core.plan import MobiusLayout, Plan, RankPlan, StagePlan


def _plan(layout: MobiusLayout) -> Plan:
    ranks = [RankPlan(rank=r, node=0, local_rank=r, stage=r, replica=0) for r in range(2)]
    stages = [
        StagePlan(
            index=r,
            blocks=sorted(b for j in layout.hosted(r) for b in layout.stages[j]),
            ranks=[r],
            actions="",
        )
        for r in range(2)
    ]
    return Plan(
        P=2,
        D=1,
        micro_batch_size=2,
        micro_batches=2,
        global_batch_size=4,
        schedule="mobius",
        nodes=1,
        processes_per_node=2,
        device="cpu",
        block_names=[f"b{i}" for i in range(6)],
        stages=stages,
        ranks=ranks,
        mobius=layout,
    )


def test_layout_hosts_stages_by_rank_and_survives_plan_json():
    lay = MobiusLayout(S=4, stages=[[0, 1], [2], [3, 4], [5]], ranks=[0, 1, 1, 0])
    assert lay.N == 2
    assert lay.hosted(0) == [0, 3] and lay.hosted(1) == [1, 2]
    plan = _plan(lay)
    back = Plan.model_validate_json(plan.model_dump_json())
    assert back.mobius == lay
    assert back.stages[0].blocks == [0, 1, 5] and back.stages[1].blocks == [2, 3, 4]
    assert back.world_size == 2


def test_plans_without_mobius_read_as_before():
    plan = _plan(MobiusLayout(S=3, stages=[[0, 1], [2, 3], [4, 5]], ranks=[0, 1, 0]))
    data = plan.model_dump(mode="json")
    del data["mobius"]
    assert Plan.model_validate(data).mobius is None
