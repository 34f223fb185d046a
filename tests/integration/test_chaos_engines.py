"""A lost node under the step engines whose survivors hand no step over: AvgPipe's
averaged models, ZB-V's two stages a rank and Mobius's swapped stages morph from
their newest checkpoint.

The one loop traps the lost peer for every engine; the engine says why its step
cannot be handed over (``hand_over_refusal``: the survivors' emergency checkpoint is
one model's blocks, and a Mobius stage's state lives in its rank's tier), so the run
falls back to its newest complete checkpoint, re-plans on the nodes left and
finishes. Every recorded step, those trained twice included, has the loss of the
uninterrupted reference: AvgPipe's rule in plain torch (``tests/unit/elastic_reference``)
and one process for Mobius.
"""

from __future__ import annotations

import pytest
import torch

from jobctl.engine.core.plan import Plan
from jobctl.engine.worker.reference import reference_train

from ..jobrun import events, final_weights, tiny_spec
from .test_chaos_handover import STEPS, _data, _run
from .test_elastic_averaging import _reference

SGD = {"training.optimizer": "sgd", "training.lr": 0.3, "training.momentum": 0.9}
ELASTIC = {"training.steps": STEPS, "checkpoint.interval": 3, "elasticity.enabled": True}


def _fell_back(db, run_id, run_dir, why: str, devices: int) -> list[dict]:
    """The morph's records: no step handed over (``why`` says why), a new plan on the
    ``devices`` left, the resume from a checkpoint; the step records of both attempts."""
    handed = _data(db, run_id, "emergency")
    assert handed["step"] is None and why in handed["why"], handed
    plan = Plan.model_validate_json((run_dir / "plan.json").read_text())  # the last attempt's
    assert plan.world_size == devices and {r.node for r in plan.ranks} == {0}, plan.summary()
    recovery = _data(db, run_id, "recovery")
    assert recovery["source"] == "checkpoint" and recovery["resumed"] in (0, 3, 6)
    steps = [e for e in events(run_dir) if e["kind"] == "step"]
    assert steps[-1]["step"] == STEPS
    return steps


@pytest.mark.multiproc
@pytest.mark.chaos
def test_averaging_morphs_from_its_checkpoint_after_a_lost_node(tmp_path, monkeypatch):
    # N = 2 averaged pipelines, P = 2 x D = 2 on 2 nodes (a replica a node); node 1 dies
    # in step 5's forward; the run resumes the reference and both parallel models on
    # node 0's 2 devices (the planner picks P x D), the same rule: model i's share of
    # each batch is fixed, whatever the layout.
    spec = tiny_spec(
        **SGD,
        **ELASTIC,
        **{
            "parallelism.schedule": "advance_forward",
            "parallelism.averaging": "elastic",
            "parallelism.parallel_pipelines": 2,
            "parallelism.placement": "pipeline_major",
        },
    )
    losses, reference, _ = _reference(spec)
    db, run_id, run_dir = _run(tmp_path, monkeypatch, spec, "3:5:forward")
    steps = _fell_back(db, run_id, run_dir, "AvgPipe", 2)
    for e in steps:
        assert e["loss"] == pytest.approx(losses[e["step"] - 1], abs=1e-5), e
    got = final_weights(run_dir, STEPS)  # the checkpoint's model is the reference
    for name, w in reference.named_parameters():
        torch.testing.assert_close(got[name], w.detach(), atol=1e-5, rtol=0, msg=name)


@pytest.mark.multiproc
@pytest.mark.chaos
def test_mobius_morphs_onto_the_devices_left(tmp_path, monkeypatch):
    # S = 4 swapped stages on N = 2 (a rank a node); node 1 dies in a stage's forward
    # at step 5; the run re-plans S = 4 onto node 0's one device and resumes there.
    spec = tiny_spec(
        **SGD,
        **ELASTIC,
        **{
            "parallelism.schedule": "mobius",
            "parallelism.pipeline_stages": 4,
            "parallelism.data_parallel": 1,
            "hardware.processes_per_node": 1,
        },
    )
    ref, _ = reference_train(spec)
    db, run_id, run_dir = _run(tmp_path, monkeypatch, spec, "1:5:forward")
    # D = 1: the supervisor knows before any survivor answers that stage 1 has no copy
    for e in _fell_back(db, run_id, run_dir, "no live replica of stage(s) [1]", 1):
        assert e["loss"] == pytest.approx(ref[e["step"] - 1], abs=1e-5), e


@pytest.mark.multiproc
@pytest.mark.chaos
def test_zb_v_morphs_from_its_checkpoint_after_a_lost_node(tmp_path, monkeypatch):
    # ZB-V at P = 2 x D = 2 on 2 nodes (a replica a node: each rank two stages of the
    # V); node 1 dies in a forward at step 5; the run re-plans zb_v on node 0.
    spec = tiny_spec(
        **SGD,
        **ELASTIC,
        **{"parallelism.schedule": "zb_v", "parallelism.placement": "pipeline_major"},
    )
    ref, _ = reference_train(spec)
    db, run_id, run_dir = _run(tmp_path, monkeypatch, spec, "3:5:forward")
    for e in _fell_back(db, run_id, run_dir, "ZB-V", 2):
        assert e["loss"] == pytest.approx(ref[e["step"] - 1], abs=1e-5), e
