"""The planner's answers stay put when its search gets faster.

``tests/golden/planner/answers.json`` holds, per spec below, the plan the planner chose
before the speed-up (recorded from that code with ``python -m tests.unit.test_planner_answers``):
layout, per-stage blocks, recompute and schedule (hashed), prediction, the
alternatives and the explanation. The speed-ups (closed-form peaks, cached
schedules, a leaner search) must give the same plan, floats to 1e-9.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import pytest

from jobctl.engine.planner.resolver import make_plan
from jobctl.spec import load_spec_text

from ..jobrun import tiny_spec

GOLDEN = Path(__file__).parent.parent / "golden" / "planner" / "answers.json"
GPT = """
name: gpt
model: {{family: gpt, layers: {layers}, hidden: {hidden}, heads: 16, seq_len: 1024,
         vocab: 50257}}
training: {{global_batch_size: {batch}, micro_batch_size: auto, steps: 10, precision: bf16}}
hardware:
  backend: slurm
  nodes: 2048
  processes_per_node: 4
  device: cuda
  memory_gb: {memory}
  flops_tflops: 125
  interconnect: {{intra_node_gbps: 128, inter_node_gbps: 25, latency_us: 30}}
parallelism: {{pipeline_stages: auto, data_parallel: auto, schedule: auto,
              recompute: auto}}
"""
# name: (spec text or None for the quickstart, devices G)
SPECS = {
    "gpt8b-16gb-1024": (dict(layers=72, hidden=3072, batch=8192, memory=16), 1024),
    "gpt8b-80gb-256": (dict(layers=72, hidden=3072, batch=2048, memory=80), 256),
    "gpt1b-24gb-64": (dict(layers=24, hidden=2048, batch=512, memory=24), 64),
    "gpt1b-40gb-48": (dict(layers=24, hidden=2048, batch=500, memory=40), 48),
    "quickstart-auto-4": (None, 4),
}


def _spec(shape):
    if shape is None:
        return tiny_spec(
            **{
                "parallelism.pipeline_stages": "auto",
                "parallelism.data_parallel": "auto",
                "parallelism.schedule": "auto",
                "training.micro_batch_size": "auto",
            }
        )
    return load_spec_text(GPT.format(**shape))


def answer(name: str) -> dict:
    """What the planner answers for ``SPECS[name]``, as JSON data (ranks left out: they
    follow from the layout; schedules hashed: they are long)."""
    shape, G = SPECS[name]
    got = make_plan(_spec(shape), G).model_dump(mode="json")
    got.pop("ranks")
    placement, lists = got.pop("placement"), got.pop("device_actions")
    if placement is not None:  # ZB-V: each rank's two stages, its action list hashed
        got["placement"] = placement
        got["device_actions"] = hashlib.sha256(json.dumps(lists).encode()).hexdigest()[:16]
    else:
        assert lists == []
    assert got.pop("T") == 1  # no tensor parallelism here (recorded before it existed)
    assert got.pop("t_search") == []  # T = 1 fixed: no T searched
    assert got.pop("tp_subpipeline") is False  # only a T > 1 stage is sub-pipelined
    assert got.pop("mobius") is None  # nothing here needs stages swapped to a lower tier
    for key in ("finish_s", "finish_usd", "hourly_usd"):  # planner.cost's, not the search's
        got["prediction"].pop(key, None)
    for stage in got["stages"]:
        stage["actions"] = hashlib.sha256(stage["actions"].encode()).hexdigest()[:16]
        for key in ("keep_blocks", "alpha"):  # stage-aware recomputation's, unset here
            assert stage.pop(key) is None
    return got


def _same(a, b, where="plan") -> None:
    if isinstance(a, float) or isinstance(b, float):
        assert a is not None and b is not None, where
        assert math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12), f"{where}: {a} != {b}"
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), f"{where}: {len(a)} != {len(b)} items"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


@pytest.mark.parametrize("name", sorted(SPECS))
def test_plan_is_the_recorded_one(name):
    recorded = json.loads(GOLDEN.read_text())[name]
    _same(answer(name), recorded, name)


if __name__ == "__main__":  # record (run from the code whose answers are the reference)
    GOLDEN.write_text(json.dumps({n: answer(n) for n in SPECS}, indent=1, sort_keys=True))
