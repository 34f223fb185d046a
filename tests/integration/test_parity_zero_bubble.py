"""Zero-bubble schedules train exactly like one process: real multi-process runs of
ZB-H1 (backward split into B and W), with and without recompute, and ZB-V (two
stages per rank) with the eval pass."""

from __future__ import annotations

import pytest

from jobctl.engine.core.actions import Op
from jobctl.engine.data.dataset import make_eval_data

from ..jobrun import events, final_weights, plain_eval
from .test_data_sources import write_tokens
from .test_parity import SGD, STEPS, _run_and_compare, _spec


@pytest.mark.multiproc
@pytest.mark.parametrize("recompute", ["none", "all"])
def test_zb_h1_matches_single_process(tmp_path, recompute):
    spec = _spec(3, 1, "zb_h1", **SGD, **{"parallelism.recompute": recompute})
    run = _run_and_compare(tmp_path, spec, atol=1e-5)
    plan = run.plan
    assert plan.schedule == "zb_h1"
    for st in plan.stages:
        ops = [a.op for a in st.action_list()]
        assert ops.count(Op.WEIGHT) == plan.micro_batches
        assert (Op.RECOMPUTE in ops) == (recompute == "all") == st.recompute


@pytest.mark.multiproc
def test_zb_v_job_matches_single_process(tmp_path):
    # 2 ranks host 4 stages in V shape (rank 0: stages 0 and 3, rank 1: 1 and 2), a
    # real `apply` through the local backend; M = 8 >= 2P - 1, with recompute, on a
    # token file with a held-out split: the eval pass runs both stages of each rank.
    tokens = write_tokens(tmp_path / "tokens.bin")
    spec = _spec(
        2,
        1,
        "zb_v",
        **SGD,
        **{"hardware.nodes": 1, "hardware.processes_per_node": 2, "parallelism.recompute": "all"},
        **{"data.source": "tokens", "data.path": str(tokens), "data.eval": 0.1},
        **{"training.eval_every": STEPS},
    )
    run = _run_and_compare(tmp_path, spec, atol=1e-5)
    evals = [r for r in events(run.dir) if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [STEPS]
    weights, m = final_weights(run.dir, STEPS), run.plan.micro_batch_size
    want = plain_eval(spec, weights, make_eval_data(spec), m)
    assert evals[0]["eval_loss"] == pytest.approx(want, abs=1e-5)
    plan = run.plan
    assert (plan.schedule, plan.P, len(plan.stages)) == ("zb_v", 2, 4)
    assert plan.placement == [[0, 3], [1, 2]]
    for st in plan.stages:
        ops = [a.op for a in st.action_list()]
        assert ops.count(Op.WEIGHT) == ops.count(Op.RECOMPUTE) == plan.micro_batches
