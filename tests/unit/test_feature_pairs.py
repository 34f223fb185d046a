"""Which features compose: every pair of 13 features validated on the builtin GPT and on
a Hugging Face Llama, and the refused set held to the documented list
(``docs/composability.md``: each refused pair with its reason), so a refusal can only
be added or lifted together with its documentation. Two schedules are one field, so
their pairs are not combinations a spec can write and are not counted."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import numpy as np
import pytest

from jobctl.spec import SpecError, load_spec

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "composability.md"
MODELS = {"gpt": ROOT / "jobs" / "quickstart.yaml", "llama": ROOT / "jobs" / "hf-llama.yaml"}
#: One node of 4 processes, P = 2 x D = 2: room for every feature but Mobius (S > N).
BASE = {
    "hardware.nodes": 1,
    "hardware.processes_per_node": 4,
    "parallelism.pipeline_stages": 2,
    "parallelism.data_parallel": 2,
    "training.steps": 10,
}


def features(tokens: str) -> dict[str, dict]:
    """Each feature as the spec fields that turn it on."""
    return {
        "zb_h1": {"parallelism.schedule": "zb_h1"},
        "zb_v": {"parallelism.schedule": "zb_v"},
        "varuna": {"parallelism.schedule": "varuna"},
        "mobius": {
            "parallelism.schedule": "mobius",
            "parallelism.pipeline_stages": 4,
            "parallelism.data_parallel": 1,
            "hardware.processes_per_node": 2,
        },
        "tensor_parallel": {"parallelism.tensor_parallel": 2, "parallelism.data_parallel": 1},
        "averaging": {"parallelism.averaging": "elastic", "parallelism.parallel_pipelines": 2},
        "pruning": {
            "pruning.enabled": True,
            "pruning.start_step": 2,
            "pruning.end_step": 6,
            "pruning.frequency": 2,
        },
        "rebalancing": {"rebalancing.enabled": True},
        "elasticity": {"elasticity.enabled": True},
        "eval": {
            "data.source": "tokens",
            "data.path": tokens,
            "data.eval": 0.1,
            "training.eval_every": 5,
        },
        "stage_aware": {"parallelism.recompute": "stage_aware"},
        "fp16": {"training.precision": "fp16"},
        "bf16": {"training.precision": "bf16"},
    }


def documented() -> set[tuple[str, str, str]]:
    """(model, feature, feature) of each row of the doc's refused-pairs table."""
    rows = re.findall(r"^\| (gpt|llama|both) \| `(\w+)` \| `(\w+)` \|", DOC.read_text(), re.M)
    out = set()
    for model, a, b in rows:
        for m in ("gpt", "llama") if model == "both" else (model,):
            out.add((m, *sorted((a, b))))
    return out


def _refused(path: Path, overrides: dict) -> bool:
    try:
        load_spec(path, overrides=overrides)
    except SpecError:
        return True
    return False


@pytest.fixture(scope="module")
def refusals(tmp_path_factory) -> tuple[set, set]:
    tokens = tmp_path_factory.mktemp("pairs") / "tokens.bin"
    np.random.default_rng(0).integers(0, 256, 4000).astype(np.uint16).tofile(tokens)
    feats = features(str(tokens))
    singles, pairs = set(), set()
    for model, path in MODELS.items():
        for name, on in feats.items():
            if _refused(path, {**BASE, **on}):
                singles.add((model, name))
        for a, b in itertools.combinations(sorted(feats), 2):
            fa, fb = feats[a], feats[b]
            if "parallelism.schedule" in fa and "parallelism.schedule" in fb:
                continue
            if _refused(path, {**BASE, **fa, **fb}):
                pairs.add((model, a, b))
    return singles, pairs


def test_every_feature_runs_alone_on_both_models(refusals):
    assert refusals[0] == set()


def test_the_refused_pairs_are_exactly_the_documented_ones(refusals):
    assert refusals[1] == documented()
